"""Presets built on judge-driven and stateful batch stages: RiskPO, EMPO
and HAPO (see `rljax.transforms._stateful` and `_group_rewards`)."""

from rljax import advantages
from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import chain
from rljax.transforms import _group_rewards
from rljax.transforms import _stateful


def riskpo(
  *,
  bundle_size: int = 5,
  alpha: float = 0.2,
  beta: float = 0.8,
  omega: float = 0.5,
  lr: float = 0.1,
  quantiles: str = "tracked",
  eps: float = 0.2,
) -> Algorithm:
  """RiskPO (arXiv 2510.00911): Mixed Value-at-Risk advantages over random
  B-question bundles with tracked quantiles (`transforms.riskpo_advantages`),
  PPO clip, token mean (verl's default ``loss_agg_mode``, which the
  official code keeps). Needs ``prepare(..., key=...)``."""
  return Algorithm(
    chain(
      _stateful.riskpo_advantages(
        bundle_size=bundle_size,
        alpha=alpha,
        beta=beta,
        omega=omega,
        lr=lr,
        quantiles=quantiles,
      ),
      objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps),
    ),
    aggregate.token_mean,
  )


def empo(*, eps: float = 0.2) -> Algorithm:
  """EMPO (arXiv 2504.05812): label-free cluster-frequency rewards from
  ``Batch.extra['answer_ids_PG']`` (``Trainer(annotate=rljax.rewards.
  cluster_annotate())``), GRPO advantages and loss (the official TRL
  implementation)."""
  return Algorithm(
    chain(
      _group_rewards.empo_rewards(),
      transforms.group_advantages(advantages.grpo),
      objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps),
    ),
    aggregate.seq_mean_token_mean,
  )


def hapo(
  *, num_prompts: int = 2**16, correct_threshold: float = 1.0, eps: float = 0.2
) -> Algorithm:
  """HAPO (arXiv 2505.11225): the history-aware length reward
  (`transforms.hapo_history_rewards`, a per-prompt `PromptTable` of the
  shortest correct length so far) added to the verifier's reward, then GRPO
  advantages and loss. Set ``num_prompts`` to ``len(task.train)`` (the
  `Trainer` refuses a smaller table); ``correct_threshold`` is the reward at
  which an answer counts as correct."""
  return Algorithm(
    chain(
      _stateful.hapo_history_rewards(
        num_prompts, correct_threshold=correct_threshold
      ),
      transforms.group_advantages(advantages.grpo),
      objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps),
    ),
    aggregate.seq_mean_token_mean,
  )


PRESETS = {"riskpo": riskpo, "empo": empo, "hapo": hapo}
