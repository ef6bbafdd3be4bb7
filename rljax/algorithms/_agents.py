"""Presets for multi-turn agent episodes (`rljax.envs`): turn-level credit.

Each reads the episode runner's side data (``Batch.extra``: turn ids, turn
counts, turn rewards, state ids; see `rljax.transforms` turn stages). The
runner's loss mask already keeps the policy's tokens only, so the loss,
the KL and the entropy terms never see observation tokens. Single-turn
presets (`grpo`, `rloo`, `dapo`, ...) also train on episodes: they use the
task's reward as the return and credit every action alike.
"""

from rljax import advantages
from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms
from rljax._src import checks
from rljax._src.base import Algorithm
from rljax._src.base import Transform
from rljax._src.base import chain

_BASELINES = {"grpo": advantages.grpo, "rloo": advantages.rloo}


def _kl_loss(kl_coef: float) -> list[Transform]:
  checks.non_negative(kl_coef=kl_coef)
  if kl_coef == 0:
    return []
  return [objectives.kl_penalty(losses.kl_k3, coef=kl_coef)]


def _kl_reward(kl_coef: float) -> list[Transform]:
  checks.non_negative(kl_coef=kl_coef)
  if kl_coef == 0:
    return []
  return [transforms.kl_in_reward(losses.kl_k1, coef=kl_coef)]


def _ppo_clip(eps_low: float, eps_high: float) -> Transform:
  return objectives.policy(losses.ppo_clip, eps_low=eps_low, eps_high=eps_high)


def episode_grpo(*, eps: float = 0.2, kl_coef: float = 0.0) -> Algorithm:
  """GRPO on agent episodes: group z-scores of the episode returns
  (`transforms.episode_advantages` of `advantages.grpo`) on every action
  token, PPO clip, each sequence's token mean averaged over sequences; k3
  KL in the loss when ``kl_coef`` > 0."""
  return Algorithm(
    chain(
      transforms.episode_advantages(advantages.grpo),
      _ppo_clip(eps, eps),
      *_kl_loss(kl_coef),
    ),
    aggregate.seq_mean_token_mean,
  )


def episode_rloo(*, eps: float = 0.2, kl_coef: float = 0.0) -> Algorithm:
  """RLOO on agent episodes: leave-one-out baseline of the episode returns
  on every action token, PPO clip, token mean; k1 KL in the reward when
  ``kl_coef`` > 0 (credited to the turn of each token)."""
  return Algorithm(
    chain(
      *_kl_reward(kl_coef),
      transforms.episode_advantages(advantages.rloo),
      _ppo_clip(eps, eps),
    ),
    aggregate.token_mean,
  )


def turn_grpo(
  *,
  gamma: float = 1.0,
  over: str = "position",
  eps: float = 0.2,
  kl_coef: float = 0.0,
) -> Algorithm:
  """Turn-level GRPO: the discounted return from each turn, normalised
  within the group's turns (`transforms.turn_advantages`, default: turns
  at the same position), on that turn's action tokens; PPO clip, token
  mean."""
  return Algorithm(
    chain(
      transforms.turn_advantages(gamma=gamma, over=over),
      _ppo_clip(eps, eps),
      *_kl_loss(kl_coef),
    ),
    aggregate.token_mean,
  )


def gigpo(
  *,
  gamma: float = 0.95,
  omega: float = 1.0,
  scale: str = "std",
  episode_stats: str = "episodes",
  eps: float = 0.2,
  kl_coef: float = 0.01,
) -> Algorithm:
  """GiGPO (arXiv 2505.10978): episode plus anchor-state step advantages
  (`transforms.gigpo_advantages`), PPO clip 0.2, token mean, k3 KL in the
  loss 0.01. Defaults of the official run scripts (langfengQ/verl-agent
  examples/gigpo_trainer: gamma 0.95, ``step_advantage_w`` 1,
  ``kl_loss_type`` low_var_kl with coefficient 0.01, verl's clip 0.2 and
  token-mean)."""
  return Algorithm(
    chain(
      transforms.gigpo_advantages(
        gamma=gamma, omega=omega, scale=scale, episode_stats=episode_stats
      ),
      _ppo_clip(eps, eps),
      *_kl_loss(kl_coef),
    ),
    aggregate.token_mean,
  )


def hgpo(
  *,
  gamma: float = 0.95,
  history: int = 2,
  alpha: float = 1.0,
  scale: str = "std",
  base_group: bool = False,
  eps: float = 0.2,
  kl_coef: float = 0.01,
) -> Algorithm:
  """HGPO (arXiv 2602.22817): hierarchical history-group step advantages
  (`transforms.hgpo_advantages`), PPO clip 0.2, token mean, k3 KL 0.01.
  Defaults of the official recipe (verl-agent recipe/hgpo: history 2,
  ``mean_std_norm``, alpha 1, no base group, gamma 0.95, low_var_kl
  0.01)."""
  return Algorithm(
    chain(
      transforms.hgpo_advantages(
        gamma=gamma,
        history=history,
        alpha=alpha,
        scale=scale,
        base_group=base_group,
      ),
      _ppo_clip(eps, eps),
      *_kl_loss(kl_coef),
    ),
    aggregate.token_mean,
  )


def salt(
  *, baseline: str = "grpo", eps: float = 0.2, kl_coef: float = 0.0
) -> Algorithm:
  """SALT (arXiv 2510.20022): trajectory advantages (``baseline`` "grpo"
  or "rloo" on the episode returns) averaged over the steps the group's
  trajectories share (`transforms.salt_advantages`), PPO clip, token mean.
  SALT's own hyperparameters were not available; these are GRPO's."""
  checks.one_of("baseline", baseline, _BASELINES)
  return Algorithm(
    chain(
      transforms.salt_advantages(_BASELINES[baseline]),
      _ppo_clip(eps, eps),
      *_kl_loss(kl_coef),
    ),
    aggregate.token_mean,
  )


def poad(
  *,
  gamma: float = 0.95,
  lam: float = 0.95,
  eps: float = 0.2,
  kl_coef: float = 0.0,
  entropy_coef: float = 0.0,
) -> Algorithm:
  """POAD (arXiv 2405.15821): PPO with the value model's token-level
  Bellman backup inside actions (`transforms.poad_advantages`: discount 1
  within an action, gamma between actions, observation tokens skipped),
  whitened, PPO clip, token mean; train the critic on ``returns_PGT``
  (the Trainer does). Defaults of the official code (morning9393/ADRL:
  gamma 0.95, lambda 0.95, clip 0.2); its entropy bonus 0.01 is
  ``entropy_coef`` (off by default: it needs the entropies in the loss)."""
  checks.non_negative(entropy_coef=entropy_coef)
  bonus = [objectives.entropy_bonus(coef=entropy_coef)] if entropy_coef else []
  return Algorithm(
    chain(
      *_kl_reward(kl_coef),
      transforms.poad_advantages(gamma=gamma, lam=lam),
      _ppo_clip(eps, eps),
      *bonus,
    ),
    aggregate.token_mean,
  )


def loop(*, eps: float = 0.1, abs_adv_threshold: float = 0.01) -> Algorithm:
  """LOOP (arXiv 2502.01600): leave-one-out advantages of the episode
  returns (not std-normalised), rollouts with |A| < 0.01 left out,
  per-token PPO clip of the ratio to [1 / (1 + eps), 1 + eps] with
  eps 0.1, each rollout's token mean averaged over rollouts, no KL and no
  value model. Environment tokens are masked by the runner's loss mask.
  Defaults of the official code (apple/ml-loop rl/conf params/default.yaml:
  ``baseline`` leave_one_out, ``adv_normalization`` false,
  ``loss_type`` pg_per_token, ``ppo_epsilon`` 0.1, ``abs_adv_threshold``
  0.01, ``rloo_kl_lambda`` 0; 6 rollouts per task, 2 epochs per
  iteration, gradient norm clipped at 0.1 are trainer settings)."""
  checks.positive(eps=eps)
  return Algorithm(
    chain(
      transforms.episode_advantages(advantages.rloo),
      transforms.drop_small_advantages(threshold=abs_adv_threshold),
      _ppo_clip(eps / (1.0 + eps), eps),
    ),
    aggregate.seq_mean_token_mean,
  )


def seeupo(
  *,
  minibatches: int = 1,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  ratio_clip: float = 0.2,
  adv_clip: float = 3.0,
  kl_coef: float = 0.002,
) -> Algorithm:
  """SeeUPO (arXiv 2602.06554): per-turn group advantages of the episode
  return (mean baseline, batch whitening, clip 3), trained one turn per
  epoch from the last turn back with GSPO on each turn
  (`transforms.seeupo_policy`, HAML ratio correction clipped at 0.2),
  seq-mean-token-mean, k3 KL 0.002 on the trained turn. Set the trainer's
  ``epochs`` to the environment's max_turns and its ``minibatches`` to
  `minibatches`. Defaults of the official launcher
  (AgentEvolver branch seeupo, qwen3-seeupo-appworld.yaml: GSPO with verl's
  clip 0.2, ``adv_clip_ratio`` 0.2, low_var_kl 0.002)."""
  return Algorithm(
    chain(
      transforms.seeupo_advantages(clip=adv_clip),
      *_kl_loss(kl_coef),
      transforms.seeupo_policy(
        losses.gspo,
        minibatches=minibatches,
        ratio_clip_low=ratio_clip,
        ratio_clip_high=ratio_clip,
        eps_low=eps_low,
        eps_high=eps_high,
      ),
    ),
    aggregate.seq_mean_token_mean,
  )


def aepo_agentic(
  *,
  alpha: float = 0.2,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  dual_clip: float = 3.0,
  preserve: str = "high",
  kl_coef: float = 0.0,
) -> Algorithm:
  """AEPO (agentic, arXiv 2510.14545) update: episode GRPO advantages and
  `objectives.aepo` (entropy-balanced clipping, A (1 + alpha z(H))), token
  mean; its entropy-balanced rollout is ``sampler.groups='aepo'``
  (`rljax.envs.aepo_episodes`, configs/aepo_agentic.py)."""
  return Algorithm(
    chain(
      transforms.episode_advantages(advantages.grpo),
      objectives.aepo(
        alpha=alpha,
        eps_low=eps_low,
        eps_high=eps_high,
        dual_clip=dual_clip,
        preserve=preserve,
      ),
      *_kl_loss(kl_coef),
    ),
    aggregate.token_mean,
  )


def portool(
  *,
  coef: float = 1.0,
  tool_weight: float = 0.1,
  descendants: str = "any",
  normalize: str = "std",
  eps: float = 0.2,
  kl_coef: float = 0.0,
) -> Algorithm:
  """PORTool (arXiv 2510.26020): A_traj + coef A_fork over the runner's
  tree of tool-call episodes (``node_ids_PG``), PPO clip, token mean; its
  rollout is ``sampler.groups='portool'`` (`rljax.envs.portool_episodes`,
  configs/portool.py)."""
  return Algorithm(
    chain(
      transforms.portool_advantages(
        tree="node_ids_PG",
        coef=coef,
        tool_weight=tool_weight,
        descendants=descendants,
        normalize=normalize,
      ),
      _ppo_clip(eps, eps),
      *_kl_loss(kl_coef),
    ),
    aggregate.token_mean,
  )


PRESETS = {
  "aepo_agentic": aepo_agentic,
  "portool": portool,
  "episode_grpo": episode_grpo,
  "episode_rloo": episode_rloo,
  "gigpo": gigpo,
  "hgpo": hgpo,
  "loop": loop,
  "poad": poad,
  "salt": salt,
  "seeupo": seeupo,
  "turn_grpo": turn_grpo,
}
