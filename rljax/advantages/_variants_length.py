"""Length rewards over [..., G] groups: Kimi k1.5, L-GRPO and GRPO-lambda.

Conventions (validity, correctness ``correct_PG``, lengths ``lengths_PG``)
as in `rljax.advantages._variants`, whose helpers this module shares.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats
from rljax.advantages import _group
from rljax.advantages._variants import _masked_max
from rljax.advantages._variants import _masked_min
from rljax.advantages._variants import _same
from rljax.advantages._variants import _valid


def kimi_length_reward(
  lengths_PG: ArrayLike,
  correct_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
) -> jax.Array:
  """Kimi k1.5's length reward over the k samples of a prompt.

    lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len),
    reward_i = lambda_i if correct, min(0, lambda_i) if wrong,

  min / max over the valid samples of the group; a group whose lengths are
  all equal gets 0 (the ratio is undefined there: a choice). It lies in
  [-0.5, 0.5]: the shortest correct answer gets +0.5, the longest -0.5.

  References:
    Kimi Team 2025, Kimi k1.5, arXiv 2501.12599, Sec. 2.3.3 "Length
    Penalty". Checked: the formula against the catalog and a secondary
    summary ("normalised between min/max lengths"); the paper's warm-up
    schedule of the reward's weight is left to the caller.
  """
  _same("lengths_PG", lengths_PG, correct_PG)
  length, valid = _group._prepare(lengths_PG, sample_mask_PG, minimum=1)
  lo = _masked_min(length, valid)
  hi = _masked_max(length, valid)
  lam = 0.5 - stats.safe_div(length - lo, hi - lo)
  lam = jnp.where(hi > lo, lam, 0.0)
  correct = jnp.asarray(correct_PG) != 0
  out = jnp.where(correct, lam, jnp.minimum(lam, 0.0))
  return jnp.where(valid > 0, out, 0.0)


def l_grpo_bonus(
  lengths_PG: ArrayLike,
  correct_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  max_length: float,
  alpha: float = 1.0,
) -> jax.Array:
  """ConciseR's L-GRPO length bonus, paid only when the whole group is
  correct: 1[all valid samples correct] * alpha * (1 - L_i / L_max).

  The reward is then r_i = 1[correct_i] + this bonus (add it to a 0/1
  reward). Invalid samples get 0.

  Args:
    lengths_PG, correct_PG: [..., G] lengths and correctness.
    sample_mask_PG: [..., G] validity (default: all valid).
    max_length: L_max (> 0), the generation limit.
    alpha: bonus scale (>= 0). Default 1.0 (a choice).

  References:
    Song & Zheng 2025, Walk Before You Run! Concise LLM Reasoning via RL
    (ConciseR), arXiv 2505.21178. Checked: not verified (catalog [REC]).
  """
  checks.positive(max_length=max_length)
  checks.non_negative(alpha=alpha)
  _same("lengths_PG", lengths_PG, correct_PG)
  length, valid = _group._prepare(lengths_PG, sample_mask_PG, minimum=1)
  correct = valid * stats.f32(jnp.asarray(correct_PG) != 0)
  n = jnp.sum(valid, -1, keepdims=True)
  all_ok = (jnp.sum(correct, -1, keepdims=True) == n) & (n > 0)
  bonus = alpha * (1.0 - length / max_length)
  return jnp.where(all_ok & (valid > 0), bonus, 0.0)


def top_groups(
  score_P: ArrayLike, fraction: float, valid_P: Optional[ArrayLike] = None
) -> jax.Array:
  """Bool [P]: the ceil(fraction * #valid) valid rows of highest score
  (ties broken by position, earlier first)."""
  checks.in_range("fraction", fraction, 0.0, 1.0)
  score = stats.f32(score_P)
  checks.rank("score_P", score, 1, "[prompts]")
  valid = jnp.ones_like(score) if valid_P is None else stats.f32(valid_P)
  k = jnp.ceil(fraction * jnp.sum(valid)).astype(jnp.int32)
  key = jnp.where(valid > 0, -score, jnp.inf)
  rank = jnp.argsort(jnp.argsort(key, stable=True), stable=True)
  return (rank < k) & (valid > 0)


def grpo_lambda_mask(
  correct_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  fraction: float = 0.2,
) -> jax.Array:
  """GRPO-lambda's switch: bool [P], True for the groups in the top
  ``fraction`` of the batch by correctness ratio c_g = #correct / n_g;
  those get the length-penalised reward, the others the 0/1 reward.

  Args:
    correct_PG: [P, G] correctness.
    sample_mask_PG: [P, G] validity (default: all valid).
    fraction: lambda in [0, 1]. Default 0.2 (a choice: the paper's value
      was not read).

  References:
    Dai, Liu & Si 2025, Stable Reinforcement Learning for Efficient
    Reasoning (GRPO-lambda), arXiv 2505.18086. Checked: abstract and
    summaries (batch-wise top-lambda selection by group correctness ratio,
    Kimi-style length penalty for the selected groups, 0/1 otherwise).
  """
  checks.rank("correct_PG", correct_PG, 2, "[prompts, samples]")
  valid = _valid("correct_PG", correct_PG, sample_mask_PG)
  correct = valid * stats.f32(jnp.asarray(correct_PG) != 0)
  n = jnp.sum(valid, -1)
  ratio = stats.safe_div(jnp.sum(correct, -1), n)
  return top_groups(ratio, fraction, n > 0)
