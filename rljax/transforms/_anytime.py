"""BRPO: AnytimeReasoner's budget-relative advantage over forced summaries.

AnytimeReasoner (Qi et al., 2025, arXiv 2505.13438; official code
sail-sg/AnytimeReasoner) cuts each thinking trace at token budgets
b_1 < ... < b_S, forces a summary (an answer) after each cut and rewards
it. The group strategy `rljax.rollouts.AnytimeBudgets` lays a group out as
N thinking rows followed by N x S x A summary rows (A summaries per cut)
and hands the layout to the batch:

* ``anytime_trace_PG`` int32: the trace i a row belongs to (-1: none);
* ``anytime_budget_PG`` int32: a summary row's budget index s (0-based),
  -1 on thinking rows;
* ``anytime_length_PG`` int32: the thinking tokens a summary row follows
  (summaries of one trace that share a cut share their prefix);
* ``anytime_chunk_PGT`` int32: on thinking rows the budget index of each
  thinking token (token t is in chunk s when b_{s-1} <= t < b_s), -1
  elsewhere.

The rewards of the summary rows (``rewards_PG``, scored by the trainer on
the summary text only) are the dense rewards r_{i,s,a}; the rewards the
trainer gives thinking rows are not read.
"""

from collections.abc import Sequence
from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare

PRIORS = ("uniform", "linear", "base")
BASELINES = ("brpo", "v1", "v2", "none")
SUMMARY_BASELINES = ("prefix", "budget")
SUMMARIES = ("all", "last")

#: the Batch.extra names `rljax.rollouts.AnytimeBudgets` writes
EXTRA = (
  "anytime_trace_PG",
  "anytime_budget_PG",
  "anytime_length_PG",
  "anytime_chunk_PGT",
)


def budget_prior(
  budgets: Sequence[int], kind: str | Sequence[float] = "uniform"
) -> np.ndarray:
  """The prior p_s over the S thinking budgets (sums to 1).

  ``"uniform"``: 1/S each; ``"linear"``: p_s = b_s / sum_j b_j; ``"base"``:
  all mass on the largest budget (plain outcome RL on the full thinking):
  the official ``set_training_split_plan``'s three choices. A sequence of
  S non-negative weights is normalised.
  """
  budgets = np.asarray(budgets, np.float64)
  if budgets.ndim != 1 or budgets.size < 1:
    raise ValueError(f"budgets={budgets!r}; give S >= 1 token budgets.")
  if isinstance(kind, str):
    checks.one_of("prior", kind, PRIORS)
    if kind == "uniform":
      weights = np.ones_like(budgets)
    elif kind == "linear":
      weights = budgets
    else:
      weights = np.zeros_like(budgets)
      weights[-1] = 1.0
  else:
    weights = np.asarray(kind, np.float64)
    if weights.shape != budgets.shape or np.any(weights < 0):
      raise ValueError(
        f"prior={kind!r}; give {budgets.size} non-negative weights, one per"
        " budget, or one of 'uniform', 'linear', 'base'."
      )
  if weights.sum() <= 0:
    raise ValueError(f"prior={kind!r} has no mass; give a positive weight.")
  return (weights / weights.sum()).astype(np.float32)


def _trace_budget_rewards(r, summary, trace_PG, budget_PG, n, s):
  """[P, N, S] mean reward of each trace's summaries at each budget, and
  [P, N] whether trace n has any summary."""
  at_trace = stats.f32(
    trace_PG[..., None] == jnp.arange(n)[None, None]
  )  # [P, G, N]
  at_budget = stats.f32(
    budget_PG[..., None] == jnp.arange(s)[None, None]
  )  # [P, G, S]
  w = (
    at_trace[..., :, None] * at_budget[..., None, :] * summary[..., None, None]
  )
  total = jnp.einsum("pgns,pg->pns", w, r)
  count = jnp.sum(w, axis=1)
  return stats.safe_div(total, count), jnp.sum(count, -1) > 0


def brpo_chunk_advantages(
  rewards_NS: ArrayLike,
  prior: ArrayLike,
  trace_mask_N: Optional[ArrayLike] = None,
  *,
  baseline: str = "brpo",
  discount: float = 2.0,
) -> jax.Array:
  """BRPO's advantage of each thinking chunk (arXiv 2505.13438).

  With r_{i,s} trace i's mean summary reward at budget s (0-based, S
  budgets), p the budget prior and the N traces of a group:

    G_{i,s}  = sum_{j >= s} p_j r_{i,j}
    V1_{i,s} = (sum_{j < s} d^j r_{i,j} / sum_{j < s} d^j) sum_{j >= s} p_j
               (0 at s = 0; d = `discount`, 2)
    V2_s     = mean_i G_{i,s}   (0 for a group of one trace)
    A_{i,s}  = G_{i,s} - (s V1_{i,s} + (S - s) V2_s) / S      ("brpo")

  The thinking tokens of chunk s (b_{s-1} <= t < b_s) take A_{i,s}.
  ``baseline``: "brpo", "v1" (G - V1), "v2" (G - V2: GRPO's group
  baseline on the dense return) or "none" (G), the code's
  ``variance_reduction`` choices "brpo", "v1only", "v2only", "none".

  What was checked: the official ``compute_cot_advantage``
  (verl/trainer/ppo/brpo.py at sail-sg/AnytimeReasoner 7e3f5bb): the return,
  the 2^j-discounted mean of the earlier budgets' scores scaled by the
  remaining prior mass, the group mean of the returns, the s/S mixing and
  no std normalisation; r_{i,s} is the mean over the A summaries of a cut.
  The paper's body (its equations) could not be read here, only its
  abstract, so the code's estimator is the one implemented.

  Args:
    rewards_NS: [..., N, S] r_{i,s}.
    prior: [S] p_s (normalised here).
    trace_mask_N: [..., N] which traces exist (default all); absent traces
      get 0 and stay out of V2.
    baseline: "brpo", "v1", "v2" or "none".
    discount: d of V1's discounted mean.

  Returns:
    [..., N, S] float32 A_{i,s}.
  """
  checks.one_of("baseline", baseline, BASELINES)
  checks.positive(discount=discount)
  r = stats.f32(rewards_NS)
  if r.ndim < 2:
    raise ValueError(
      f"rewards_NS has shape {r.shape}; give [..., N, S] rewards (traces x"
      " budgets)."
    )
  s = r.shape[-1]
  p = stats.f32(prior)
  if p.shape != (s,):
    raise ValueError(
      f"prior has shape {p.shape}; give one weight per budget ({s},)."
    )
  row = lambda x: jnp.reshape(x, (1,) * (r.ndim - 1) + (s,))  # noqa: E731
  p = row(p / jnp.sum(p))
  valid = (
    jnp.ones(r.shape[:-1], jnp.float32)
    if trace_mask_N is None
    else stats.f32(jnp.asarray(trace_mask_N) != 0)
  )
  j = jnp.arange(s)
  at_or_after = stats.f32(j[:, None] >= j[None, :])  # [j, s]: j >= s
  before = stats.f32(j[:, None] < j[None, :])  # [j, s]: j < s
  ret = (r * p) @ at_or_after  # G_{i,s}
  tail = p @ at_or_after  # sum_{j >= s} p_j
  d = row(jnp.asarray(discount, jnp.float32) ** stats.f32(j))
  v1 = stats.safe_div((r * d) @ before, d @ before) * tail
  n = jnp.sum(valid, -1, keepdims=True)[..., None]  # [..., 1, 1]
  v2 = jnp.sum(ret * valid[..., None], -2, keepdims=True)
  v2 = jnp.where(n > 1, stats.safe_div(v2, n), 0.0)  # [..., 1, S]
  if baseline == "brpo":
    k = row(stats.f32(j))
    base = (k * v1 + (s - k) * v2) / s
  elif baseline == "v1":
    base = v1
  elif baseline == "v2":
    base = v2
  else:
    base = jnp.zeros_like(ret)
  return (ret - base) * valid[..., None]


def brpo_advantages_of(
  rewards_PG: ArrayLike,
  trace_PG: ArrayLike,
  budget_PG: ArrayLike,
  length_PG: ArrayLike,
  chunk_PGT: ArrayLike,
  prior: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  baseline: str = "brpo",
  summary_baseline: str = "prefix",
  summaries: str = "all",
  discount: float = 2.0,
) -> jax.Array:
  """AnytimeReasoner's per-token advantages [P, G, T] (arXiv 2505.13438).

  Thinking rows (``budget_PG`` -1): token t of trace i in chunk
  c = ``chunk_PGT`` takes `brpo_chunk_advantages`' A_{i,c}, with r_{i,s}
  the mean reward of trace i's summary rows at budget s.

  Summary rows (the decoupled summary policy): A = r_{i,s,a} - b with
  ``summary_baseline``:

  * ``"prefix"``: b = the mean reward of the summaries that follow the
    same thinking prefix (same trace, same ``length_PG``; budgets past a
    trace's end share its whole thinking), 0 when it is alone (the code
    with A > 1 summaries per cut);
  * ``"budget"``: b = the mean over the group's summaries at the same
    budget (the code with A = 1).

  ``summaries="last"`` (the code's ``summary_method="grpo"``) trains only
  the last summary row of each trace (A 0 on the others; the GRPO
  baseline of the paper); ``"all"`` (``"brpo"``) trains every summary.

  What was checked: ``compute_summary_advantage``,
  ``get_grpo_metrics_dict`` and ``compute_token_level_advantage`` of
  sail-sg/AnytimeReasoner (verl/trainer/ppo/brpo.py): thinking tokens of
  chunk s take the chunk advantage, the forced text after a cut is not
  trained, summary tokens take the summary advantage, no std division.

  Args:
    rewards_PG: [P, G] row rewards (summary rows' are read).
    trace_PG, budget_PG, length_PG: [P, G] int layout (module docstring).
    chunk_PGT: [P, G, T] int chunk of each thinking token, -1 elsewhere.
    prior: [S] budget prior p_s.
    sample_mask_PG: [P, G] validity (default all valid).
    baseline: the chunk baseline ("brpo", "v1", "v2", "none").
    summary_baseline: "prefix" or "budget".
    summaries: "all" or "last".
    discount: V1's discount d.

  Returns:
    [P, G, T] float32 advantages: thinking rows per token (0 where
    ``chunk_PGT`` is -1), summary rows' value on every position (multiply
    by the loss mask), 0 on invalid rows.
  """
  checks.one_of("summary_baseline", summary_baseline, SUMMARY_BASELINES)
  checks.one_of("summaries", summaries, SUMMARIES)
  s = _check_layout(
    rewards_PG, trace_PG, budget_PG, length_PG, chunk_PGT, prior
  )
  p_, g = np.shape(rewards_PG)
  valid = (
    jnp.ones((p_, g), jnp.float32)
    if sample_mask_PG is None
    else stats.f32(jnp.asarray(sample_mask_PG) != 0)
  )
  r = stats.f32(rewards_PG) * valid
  trace = jnp.asarray(trace_PG, jnp.int32)
  budget = jnp.asarray(budget_PG, jnp.int32)
  chunk = jnp.asarray(chunk_PGT, jnp.int32)
  summary = valid * stats.f32((budget >= 0) & (trace >= 0))
  thinking = valid * stats.f32((budget < 0) & (trace >= 0))
  r_ns, has = _trace_budget_rewards(r, summary, trace, budget, g, s)
  adv_ns = brpo_chunk_advantages(
    r_ns, prior, has, baseline=baseline, discount=discount
  )
  tok = _thinking_advantages(adv_ns, trace, chunk, thinking)
  sum_adv = _summary_advantages(
    r,
    summary,
    trace,
    budget,
    jnp.asarray(length_PG, jnp.int32),
    summary_baseline,
    summaries,
  )
  return tok + sum_adv[..., None] * stats.f32(chunk < 0)


def _check_layout(
  rewards_PG, trace_PG, budget_PG, length_PG, chunk_PGT, prior
) -> int:
  """Check `brpo_advantages_of`'s layout arrays; S, the number of budgets."""
  checks.rank("rewards_PG", rewards_PG, 2, "[P, G]")
  checks.same_shape(
    ["rewards_PG", "trace_PG", "budget_PG", "length_PG"],
    rewards_PG,
    trace_PG,
    budget_PG,
    length_PG,
  )
  checks.rank("chunk_PGT", chunk_PGT, 3, "[P, G, T]")
  checks.leading_shape("chunk_PGT", chunk_PGT, np.shape(rewards_PG), "[P, G]")
  s = int(np.shape(prior)[0]) if np.ndim(prior) == 1 else -1
  if s < 1:
    raise ValueError(f"prior must be [S] weights; got shape {np.shape(prior)}.")
  return s


def _thinking_advantages(adv_ns, trace, chunk, thinking) -> jax.Array:
  """[P, G, T] thinking tokens: A[trace(row), chunk(token)], 0 off chunks."""
  s = adv_ns.shape[-1]
  rows_ns = jnp.take_along_axis(adv_ns, jnp.clip(trace, 0)[..., None], axis=1)
  tok = jnp.take_along_axis(rows_ns, jnp.clip(chunk, 0, s - 1), axis=-1)
  return jnp.where(chunk >= 0, tok, 0.0) * thinking[..., None]


def _summary_advantages(
  r, summary, trace, budget, length, summary_baseline: str, summaries: str
) -> jax.Array:
  """[P, G] summary rows: r - the mean of their baseline group."""
  same_trace = trace[:, :, None] == trace[:, None, :]
  if summary_baseline == "prefix":
    same = same_trace & (length[:, :, None] == length[:, None, :])
  else:
    same = budget[:, :, None] == budget[:, None, :]
  same = stats.f32(same) * summary[:, :, None] * summary[:, None, :]
  n = jnp.sum(same, -1)
  mean = stats.safe_div(jnp.einsum("pij,pj->pi", same, r), n)
  if summary_baseline == "prefix":
    mean = jnp.where(n > 1, mean, 0.0)
  sum_adv = (r - mean) * summary
  if summaries == "last":  # the last summary row of each trace only
    idx = jnp.arange(r.shape[-1])
    later = same_trace & (idx[None, None, :] > idx[None, :, None])
    later = jnp.sum(stats.f32(later) * summary[:, None, :], -1)
    sum_adv = jnp.where(later > 0, 0.0, sum_adv)
  return sum_adv


def brpo_advantages(
  prior: Sequence[float],
  *,
  baseline: str = "brpo",
  summary_baseline: str = "prefix",
  summaries: str = "all",
  discount: float = 2.0,
) -> Transform:
  """BRPO (arXiv 2505.13438): `brpo_advantages_of` on the batch.

  Reads ``rewards_PG`` and the layout `rljax.rollouts.AnytimeBudgets`
  writes into ``Batch.extra`` (`EXTRA`), and writes ``advantages_PGT``
  (times the loss mask). `prior` is p_s over the strategy's budgets
  (`budget_prior`).
  """
  prior = np.asarray(prior, np.float32)
  if prior.ndim != 1 or prior.size < 1 or np.any(prior < 0) or prior.sum() <= 0:
    raise ValueError(
      f"prior={prior.tolist()}; give S non-negative weights with positive"
      " sum, e.g. transforms.budget_prior(budgets, 'uniform')."
    )
  checks.one_of("baseline", baseline, BASELINES)
  checks.one_of("summary_baseline", summary_baseline, SUMMARY_BASELINES)
  checks.one_of("summaries", summaries, SUMMARIES)

  def fn(batch: Batch) -> Batch:
    batch.require("rewards_PG", by="brpo_advantages")
    by = "brpo_advantages (the rljax.rollouts.AnytimeBudgets layout)"
    trace, budget, length, chunk = (batch.get(k, by=by) for k in EXTRA)
    adv = brpo_advantages_of(
      batch.rewards_PG,
      trace,
      budget,
      length,
      chunk,
      prior,
      batch.samples(),
      baseline=baseline,
      summary_baseline=summary_baseline,
      summaries=summaries,
      discount=discount,
    )
    return batch._replace(advantages_PGT=adv * batch.loss_mask())

  return stateless_prepare(fn)
