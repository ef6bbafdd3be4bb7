"""Named algorithms, each a short composition of rljax pieces.

Defaults follow the paper, or the framework named in the docstring where the
paper leaves them open. Every preset is a plain `Algorithm`: extend one with
``algo._replace(transform=rljax.chain(algo.transform, extra))``.
"""

import functools
from typing import Optional

from rljax import advantages
from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import Transform
from rljax._src.base import chain
from rljax.algorithms import _agents
from rljax.algorithms import _anytime
from rljax.algorithms import _bounds
from rljax.algorithms import _budgets
from rljax.algorithms import _markovian
from rljax.algorithms import _offpolicy
from rljax.algorithms import _partial
from rljax.algorithms import _replay
from rljax.algorithms import _segments
from rljax.algorithms import _single_stream
from rljax.algorithms import _stateful
from rljax.algorithms import _streams
from rljax.algorithms import _teacher
from rljax.algorithms import _tokens
from rljax.algorithms import _trees
from rljax.algorithms import _variants
from rljax.algorithms._common import dapo_shaping


def _kl_loss(kl_coef: float) -> list[Transform]:
  if kl_coef == 0:
    return []
  return [objectives.kl_penalty(losses.kl_k3, coef=kl_coef)]


def _kl_reward(kl_coef: float) -> list[Transform]:
  if kl_coef == 0:
    return []
  return [transforms.kl_in_reward(losses.kl_k1, coef=kl_coef)]


def _ppo_clip(eps_low: float, eps_high: float) -> Transform:
  return objectives.policy(losses.ppo_clip, eps_low=eps_low, eps_high=eps_high)


def grpo(
  *, eps: float = 0.2, kl_coef: float = 0.0, tis_cap: Optional[float] = None
) -> Algorithm:
  """GRPO (arXiv 2402.03300): group mean/std advantages, PPO clip, each
  sequence's token mean averaged over sequences; k3 KL in the loss when
  ``kl_coef`` > 0 (the paper used 0.04; TRL's default is 0).

  ``tis_cap``: the off-policy correction of an asynchronous run
  (``train.async_mode``; verl's ``rollout_is=token``): each token's policy
  term weighed by exp(old - rollout log-prob) truncated at ``tis_cap``
  (`transforms.token_tis`), the ratio of the weights the update starts
  from to those that sampled it. None: off (a synchronous run's ratio is
  the sampler's numerical mismatch only)."""
  stages = [transforms.group_advantages(advantages.grpo)]
  if tis_cap is not None:
    stages.append(transforms.token_tis(threshold=tis_cap))
  return Algorithm(
    chain(*stages, _ppo_clip(eps, eps), *_kl_loss(kl_coef)),
    aggregate.seq_mean_token_mean,
  )


def dapo(
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.28,
  max_length: Optional[int] = None,
  overlong_buffer: Optional[int] = None,
  overlong_factor: float = 1.0,
  dynamic_sampling: bool = True,
) -> Algorithm:
  """DAPO (arXiv 2503.14476): clip-higher, dynamic sampling, token-level
  loss, and the soft overlong penalty when ``max_length`` and
  ``overlong_buffer`` are given (the paper: 20480 and 4096). No KL term."""
  stages = dapo_shaping(
    "dapo",
    max_length=max_length,
    overlong_buffer=overlong_buffer,
    overlong_factor=overlong_factor,
    dynamic_sampling=dynamic_sampling,
  )
  return Algorithm(
    chain(
      *stages,
      transforms.group_advantages(advantages.grpo),
      _ppo_clip(eps_low, eps_high),
    ),
    aggregate.token_mean,
  )


def dr_grpo(*, eps: float = 0.2, max_length: Optional[int] = None) -> Algorithm:
  """Dr.GRPO (arXiv 2503.20783): no std scaling, no per-sequence length
  normalisation: token sums over (sequences x max_length)."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.dr_grpo),
      _ppo_clip(eps, eps),
    ),
    functools.partial(aggregate.seq_mean_token_sum_norm, max_length=max_length),
  )


def bnpo(*, eps: float = 0.2) -> Algorithm:
  """BNPO (TRL `bnpo`): GRPO advantages, PPO clip, batch token mean."""
  return Algorithm(
    chain(transforms.group_advantages(advantages.grpo), _ppo_clip(eps, eps)),
    aggregate.token_mean,
  )


def gspo(*, eps_low: float = 3e-4, eps_high: float = 4e-4) -> Algorithm:
  """GSPO (arXiv 2507.18071): sequence-level ratio (geometric mean of token
  ratios) clipped per sequence; the paper's eps 3e-4 / 4e-4, no KL."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      objectives.policy(losses.gspo, eps_low=eps_low, eps_high=eps_high),
    ),
    aggregate.seq_mean_token_mean,
  )


def sapo(*, tau_pos: float = 1.0, tau_neg: float = 1.05) -> Algorithm:
  """SAPO (arXiv 2511.20347): a soft sigmoid gate instead of the hard clip,
  sharper for negative advantages (verl and TRL defaults)."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      objectives.policy(losses.sapo, tau_pos=tau_pos, tau_neg=tau_neg),
    ),
    aggregate.seq_mean_token_mean,
  )


def cispo(*, max_ratio: float = 5.0) -> Algorithm:
  """CISPO (MiniMax-M1, arXiv 2506.13585): REINFORCE weighted by the detached
  ratio capped at ``max_ratio`` (TRL/ScaleRL semantics, cap 5); token mean.
  For verl's two-sided clip use ``objectives.policy(losses.cispo, ...)``."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      objectives.policy(losses.cispo_capped, max_ratio=max_ratio),
    ),
    aggregate.token_mean,
  )


def gmpo(*, eps: float = 0.4) -> Algorithm:
  """GMPO (arXiv 2507.20673): geometric mean of token ratios clipped in log
  space (eps 0.4: paper, TRL, verl examples); mean over sequences."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      objectives.policy(losses.gmpo, eps_low=eps, eps_high=eps),
    ),
    aggregate.seq_mean_token_mean,
  )


def gpg() -> Algorithm:
  """GPG (arXiv 2504.02546): REINFORCE with GPG's batch-rescaled group
  advantages, no ratio, no clip; token mean (verl `gpg`)."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.gpg),
      objectives.policy(losses.reinforce),
    ),
    aggregate.token_mean,
  )


def ppo(
  *,
  eps: float = 0.2,
  gamma: float = 1.0,
  lam: float = 1.0,
  kl_coef: float = 0.0,
) -> Algorithm:
  """PPO for LLMs (Ouyang et al. 2022): GAE over the value model's
  `old_values_PGT`, whitened advantages, PPO clip, token mean; k1 KL folded
  into the rewards when ``kl_coef`` > 0 (OpenRLHF: 0.01). Train the critic
  with `rljax.objectives.value_loss`."""
  return Algorithm(
    chain(
      *_kl_reward(kl_coef),
      transforms.gae_advantages(gamma=gamma, lam=lam),
      _ppo_clip(eps, eps),
    ),
    aggregate.token_mean,
  )


def rloo(*, eps: float = 0.2, kl_coef: float = 0.0) -> Algorithm:
  """RLOO (arXiv 2402.14740): leave-one-out baseline, PPO clip, token mean
  (verl `rloo`); k1 KL in the reward when ``kl_coef`` > 0 (TRL: 0.05)."""
  return Algorithm(
    chain(
      *_kl_reward(kl_coef),
      transforms.group_advantages(advantages.rloo),
      _ppo_clip(eps, eps),
    ),
    aggregate.token_mean,
  )


def reinforce_pp(
  *, eps: float = 0.2, gamma: float = 1.0, kl_coef: float = 0.0
) -> Algorithm:
  """REINFORCE++ (arXiv 2501.03262): discounted token returns whitened over
  the batch, PPO clip, token mean; k1 KL in the reward when ``kl_coef`` > 0."""
  return Algorithm(
    chain(
      *_kl_reward(kl_coef),
      transforms.reinforce_pp_advantages(gamma=gamma),
      _ppo_clip(eps, eps),
    ),
    aggregate.token_mean,
  )


def remax(*, eps: float = 0.2) -> Algorithm:
  """ReMax (arXiv 2310.10505): the greedy completion's reward as baseline
  (`baseline_rewards_P`), PPO clip, token mean (verl `remax`)."""
  return Algorithm(
    chain(transforms.remax_advantages(), _ppo_clip(eps, eps)),
    aggregate.token_mean,
  )


PRESETS = {
  "bnpo": bnpo,
  "cispo": cispo,
  "dapo": dapo,
  "dr_grpo": dr_grpo,
  "gmpo": gmpo,
  "gpg": gpg,
  "grpo": grpo,
  "gspo": gspo,
  "ppo": ppo,
  "reinforce_pp": reinforce_pp,
  "remax": remax,
  "rloo": rloo,
  "sapo": sapo,
}


# The literature's presets, one module per family, join the registry.
_FAMILIES = (
  _agents,
  _anytime,
  _bounds,
  _budgets,
  _markovian,
  _offpolicy,
  _partial,
  _replay,
  _segments,
  _single_stream,
  _stateful,
  _streams,
  _teacher,
  _tokens,
  _trees,
  _variants,
)
for _family in _FAMILIES:
  PRESETS.update(_family.PRESETS)


def get(name: str, **kwargs) -> Algorithm:
  """The preset called `name`, built with `kwargs`."""
  if name not in PRESETS:
    raise ValueError(
      f"unknown algorithm preset {name!r}; choose one of {sorted(PRESETS)}."
    )
  return PRESETS[name](**kwargs)
