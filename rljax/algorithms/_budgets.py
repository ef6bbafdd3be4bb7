"""Presets over token budgets: HBPO's budget subgroups and Train Long,
Think Short's shrinking budget."""

from collections.abc import Sequence
from typing import Optional

from rljax import advantages
from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import chain


def hbpo(
  *,
  budgets: Sequence[float] = (512, 1024, 2048, 2560),
  max_length: float = 4096,
  beta: float = 4.0,
  alpha: Optional[float] = None,
  reward: str = "paper",
  intra_weight: float = 1.0,
  eps_low: float = 0.2,
  eps_high: float = 0.28,
) -> Algorithm:
  """HBPO (arXiv 2507.15844): the budget-aware piecewise reward
  (`transforms.hbpo_rewards`) and the intra- plus inter-subgroup advantage
  (`transforms.hbpo_advantages`) over the budget subgroups of the group
  strategy `rljax.rollouts.BudgetSubgroups` (``sampler.groups=
  "budget_subgroups"`` with the same `budgets`), DAPO's clip-higher
  (0.2 / 0.28, the paper's), token mean, no KL. Defaults of the paper:
  B = (512, 1024, 2048, 2560) in a 4096-token window, beta 4 (the code's)."""
  kwargs = {"budgets": budgets, "max_length": max_length, "beta": beta}
  return Algorithm(
    chain(
      transforms.hbpo_rewards(**kwargs, alpha=alpha, reward=reward),
      transforms.hbpo_advantages(**kwargs, intra_weight=intra_weight),
      objectives.policy(losses.ppo_clip, eps_low=eps_low, eps_high=eps_high),
    ),
    aggregate.token_mean,
  )


def tlts(
  *,
  initial: float = 256.0,
  final: float = 87.0,
  decay: float = 0.5,
  interval: int = 1,
  schedule: str = "exponential",
  steps: int = 100,
  weight: float = 1.0,
  shape: str = "within",
  eps: float = 0.2,
) -> Algorithm:
  """Train Long, Think Short (arXiv 2508.08940): GRPO with the decaying
  token budget's length reward (`transforms.length_budget_curriculum`,
  r += weight g(L, B_t)); give the sampler the same schedule with a
  `rljax.selection.Stages` prompt sampler whose stages' ``max_new_tokens``
  follow B_t (``configs/train_long_think_short.py``)."""
  return Algorithm(
    chain(
      transforms.length_budget_curriculum(
        initial=initial,
        final=final,
        decay=decay,
        interval=interval,
        schedule=schedule,
        steps=steps,
        weight=weight,
        shape=shape,
      ),
      transforms.group_advantages(advantages.grpo),
      objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps),
    ),
    aggregate.seq_mean_token_mean,
  )


PRESETS = {"hbpo": hbpo, "tlts": tlts}
