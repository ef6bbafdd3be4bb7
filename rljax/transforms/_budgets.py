"""HBPO's budget-aware reward and hierarchical advantage over the budget
subgroups of `rljax.rollouts.BudgetSubgroups` (``Batch.extra["stream_PG"]``
= 10 + the subgroup's budget index)."""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax import advantages
from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare

#: ``stream_PG`` of budget subgroup i (`rljax.rollouts.BUDGET_STREAM`)
BUDGET_STREAM = 10

_REWARDS = ("paper", "min")


def _check_budgets(budgets: Sequence[float], max_length: float) -> tuple:
  budgets = tuple(float(b) for b in budgets)
  if not budgets or not all(0 < b <= max_length for b in budgets):
    raise ValueError(
      f"budgets={budgets} must be non-empty, each in (0, max_length="
      f"{max_length}]; give the budgets of rljax.rollouts.BudgetSubgroups."
    )
  return budgets


def hbpo_budget_reward(
  budget: ArrayLike, *, max_length: float, beta: float = 4.0
) -> jax.Array:
  """f2(b) = beta cos(pi b / (2 L_max)): a correct in-budget sample's reward
  and subgroup b's baseline in the intra-subgroup advantage."""
  return beta * jnp.cos(jnp.pi * stats.f32(budget) / (2.0 * max_length))


def hbpo_reward(
  correct: ArrayLike,
  lengths: ArrayLike,
  budget: ArrayLike,
  *,
  max_length: float,
  beta: float = 4.0,
  alpha: float | None = None,
  reward: str = "paper",
) -> jax.Array:
  """HBPO's piecewise reward R(n | b) (elementwise; float32).

  paper (Eq. 1-3)::

    R = f1(n, b)  if correct, b < n <= L_max
        f2(b)     if correct, n <= b (and n <= L_max)
        0         otherwise (incorrect, or n > L_max)
    f1(n, b) = beta cos(pi n / 2 L_max) - alpha |n - b|
    f2(b)    = beta cos(pi b / 2 L_max)

  ``reward="min"``: the official code's ``min(f1, f2)`` for every correct
  sample with n <= L_max (equal to the paper above the budget; below it,
  f1 < f2 when the deviation penalty alpha (b - n) outweighs the cosine's
  rise, so the code's reward can fall under f2 inside the budget).

  Args:
    correct: whether each sample is correct (bool or 0/1).
    lengths: generated tokens n.
    budget: each sample's budget b.
    max_length: L_max, the context length of the cosine (the paper's
      4096-token training window).
    beta: the scale (4 in the official code).
    alpha: the deviation penalty per token; None: 1 / L_max (the paper's
      "reciprocal of the context window", and the code's 1/4096).
    reward: "paper" or "min".
  """
  checks.one_of("reward", reward, _REWARDS)
  alpha = 1.0 / max_length if alpha is None else alpha
  n, b = stats.f32(lengths), stats.f32(budget)
  f1 = beta * jnp.cos(jnp.pi * n / (2.0 * max_length)) - alpha * jnp.abs(n - b)
  f2 = hbpo_budget_reward(b, max_length=max_length, beta=beta)
  value = jnp.where(n > b, f1, f2) if reward == "paper" else jnp.minimum(f1, f2)
  ok = (stats.f32(correct) > 0) & (n <= max_length)
  return jnp.where(ok, value, 0.0)


def hbpo_advantage(
  rewards_PG: ArrayLike,
  budget_PG: ArrayLike,
  sample_mask_PG: ArrayLike | None = None,
  *,
  max_length: float,
  beta: float = 4.0,
  intra_weight: float = 1.0,
  eps: float = 1e-6,
) -> jax.Array:
  """HBPO's hierarchical advantage, [P, G]:

    A_ij = w (mu_i - f2(b_i)) + (R_ij - mean_g R) / (std_g R + eps)

  mu_i the mean reward of the valid samples of subgroup i (the samples of
  the group with the same budget), f2 as in `hbpo_budget_reward`, the
  z-score over the whole group's valid samples (unbiased std, as
  `rljax.advantages.grpo`), w = `intra_weight` (1 in the paper; the
  official code adds the intra term twice, w = 2). Invalid samples get 0;
  a group with one valid sample gets only its intra term w (R - f2(b)).
  """
  checks.non_negative(eps=eps, intra_weight=intra_weight)
  r, b = stats.f32(rewards_PG), stats.f32(budget_PG)
  valid = (
    jnp.ones_like(r) if sample_mask_PG is None else stats.f32(sample_mask_PG)
  )
  same = (b[..., :, None] == b[..., None, :]) * valid[..., None, :]
  mu = stats.safe_div(jnp.sum(same * r[..., None, :], -1), jnp.sum(same, -1))
  intra = mu - hbpo_budget_reward(b, max_length=max_length, beta=beta)
  inter = advantages.grpo(r, valid, eps=eps)
  return (intra_weight * intra + inter) * valid


def _budgets_PG(batch: Batch, budgets: tuple, max_length: float, by: str):
  """Each sample's budget from its stream (10 + i -> budgets[i]); samples
  of another stream get L_max."""
  stream = jnp.asarray(batch.get("stream_PG", by=by)) - BUDGET_STREAM
  table = jnp.asarray(budgets + (max_length,), jnp.float32)
  inside = (stream >= 0) & (stream < len(budgets))
  return table[jnp.where(inside, stream, len(budgets))]


def _first_reward(batch: Batch) -> jax.Array:
  return (
    batch.rewards_PG if batch.rewards_PGK is None else batch.rewards_PGK[..., 0]
  )


def hbpo_rewards(
  *,
  budgets: Sequence[float] = (512, 1024, 2048, 2560),
  max_length: float = 4096,
  beta: float = 4.0,
  alpha: float | None = None,
  reward: str = "paper",
) -> Transform:
  """HBPO's budget-aware reward: ``rewards_PG`` <- `hbpo_reward` of each
  sample's correctness (the task's first reward > 0, ``rewards_PGK[...,
  0]`` or ``rewards_PG``), its length in tokens (``mask_PGT``) and its
  subgroup's budget (``extra["stream_PG"]`` = 10 + i -> ``budgets[i]``, as
  `rljax.rollouts.BudgetSubgroups` writes; another stream counts as the
  budget L_max).

  References:
    HBPO, arXiv 2507.15844 (catalog row 1.74), Eq. 1-3 (see `hbpo_reward`).
    Checked against the paper and ZJU-REAL/HBPO (``rllm/rewards/
    math_reward.py``): beta 4, L_max 4096 (cos(pi n / 8192)), alpha 1/4096,
    incorrect 0, longer than 4096 not correct (our defaults); the code's
    reward is min(f1, f2) for every correct sample (``reward="min"``) and
    gives format errors -1 (left to the task's rewards here).
  """
  checks.positive(max_length=max_length, beta=beta)
  if alpha is not None:
    checks.non_negative(alpha=alpha)
  checks.one_of("reward", reward, _REWARDS)
  budgets = _check_budgets(budgets, max_length)
  by = "transforms.hbpo_rewards"

  def fn(batch: Batch) -> Batch:
    batch.require("rewards_PG", by=by)
    b = _budgets_PG(batch, budgets, max_length, by)
    r = hbpo_reward(
      _first_reward(batch) > 0,
      stats.sequence_lengths(batch.mask_PGT),
      b,
      max_length=max_length,
      beta=beta,
      alpha=alpha,
      reward=reward,
    )
    return batch._replace(rewards_PG=r * batch.samples())

  return stateless_prepare(fn)


def hbpo_advantages(
  *,
  budgets: Sequence[float] = (512, 1024, 2048, 2560),
  max_length: float = 4096,
  beta: float = 4.0,
  intra_weight: float = 1.0,
  eps: float = 1e-6,
) -> Transform:
  """HBPO's advantage (`hbpo_advantage`) of ``rewards_PG`` over each
  group's budget subgroups (``extra["stream_PG"]``, as `hbpo_rewards`),
  written per token to ``advantages_PGT``.

  References:
    HBPO, arXiv 2507.15844, Algorithm 1 and Section 3.3: A^intra_i = mu_i -
    R_{b_i} (R_b = f2(b), Eq. 3), A^inter_ij = (R_ij - mean R) / std(R)
    over the group's n samples, A_ij = A^intra_i + A^inter_ij. Checked
    against ZJU-REAL/HBPO (``verl/trainer/ppo/core_algos.py``,
    ``compute_grpo_outcome_advantage``): subgroup means by budget, the
    baseline 4 cos(pi b / 8192), torch's unbiased std plus 1e-6 (ours);
    the code adds the intra term twice (``intra_weight=2``) while the paper
    adds it once (our default).
  """
  checks.positive(max_length=max_length, beta=beta)
  checks.non_negative(eps=eps, intra_weight=intra_weight)
  budgets = _check_budgets(budgets, max_length)
  by = "transforms.hbpo_advantages"

  def fn(batch: Batch) -> Batch:
    batch.require("rewards_PG", by=by)
    if batch.shape[1] < 2:
      raise ValueError(
        f"{by} needs at least 2 samples per prompt (a group of budget"
        f" subgroups); this batch has G = {batch.shape[1]}. Set"
        " sampler.num_samples >= 2."
      )
    adv = hbpo_advantage(
      batch.rewards_PG,
      _budgets_PG(batch, budgets, max_length, by),
      batch.samples(),
      max_length=max_length,
      beta=beta,
      intra_weight=intra_weight,
      eps=eps,
    )
    return batch._replace(advantages_PGT=adv[..., None] * batch.loss_mask())

  return stateless_prepare(fn)
