"""Advantage- and entropy-driven selection and shaping (pure jnp math).

D3S (arXiv 2509.22115, "Learning More with Less: A Dynamic Dual-Level
Down-Sampling Framework for Efficient Policy Optimization"):
`max_variance_subset` (sample level) and `adv_entropy_token_mask` (token
level). ARES / AEPO (arXiv 2510.08457, "ARES: Multimodal Adaptive Reasoning
via Difficulty-Aware Token-Level Entropy Shaping", code
github.com/shawn0728/ARES): `window_entropy`, `hwe_threshold`,
`hwe_trigger_count`, `ares_difficulty`, `ares_bucket_targets` and
`ares_entropy_reward`.

Everything computes in float32 whatever the input dtype and is detached
(these are batch statistics, never in the gradient path).
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats
from rljax.masks._tokens import _masked_quantile
from rljax.masks._tokens import _quantile_index

# ---------------------------------------------------------------------------
# D3S, sample level.
# ---------------------------------------------------------------------------


def max_variance_subset(
  values_PG: ArrayLike, sample_mask_PG: Optional[ArrayLike], k: ArrayLike
) -> jax.Array:
  """The size-k subset of each group's valid values with the largest variance.

  D3S's sample level (arXiv 2509.22115): keep the k rollouts of a group that
  maximise Var(A). For scalars the maximiser is always the j smallest plus
  the k - j largest values for some j in [0, k] (moving any kept value
  outward along the sorted order does not decrease the variance), so all
  k + 1 candidates are scored exactly with prefix sums of the sorted values:
  O(G log G) per group, static shapes, jit-friendly; `k` may be traced.

  Args:
    values_PG: per-sample scores (the sequence advantages), [..., G].
    sample_mask_PG: valid samples (None = all); invalid ones are never kept
      and do not enter any variance.
    k: samples to keep per group (int, scalar or [...] array, >= 1). A group
      with fewer than k valid samples keeps all of them.

  Returns:
    Float32 0/1 mask [..., G] of the kept samples. Ties between equally
    good j resolve to the smallest j; tied values keep the earlier sample.
  """
  v = stats.f32(jax.lax.stop_gradient(values_PG))
  if sample_mask_PG is None:
    valid = jnp.ones(v.shape, bool)
  else:
    checks.same_shape(["values_PG", "sample_mask_PG"], v, sample_mask_PG)
    valid = stats.f32(sample_mask_PG) > 0
  g = v.shape[-1]
  n = jnp.sum(valid, axis=-1, dtype=jnp.int32)
  kk = jnp.minimum(jnp.broadcast_to(jnp.asarray(k, jnp.int32), n.shape), n)
  kk = jnp.maximum(kk, 0)
  # Centre on the group mean: E[x^2] - E[x]^2 stays accurate in float32.
  centred = v - stats.masked_mean(v, valid, axis=-1, keepdims=True)
  order = jnp.argsort(jnp.where(valid, v, jnp.inf), axis=-1, stable=True)
  ordered = jnp.take_along_axis(jnp.where(valid, centred, 0.0), order, -1)
  zero = jnp.zeros((*v.shape[:-1], 1), jnp.float32)
  c1 = jnp.concatenate([zero, jnp.cumsum(ordered, -1)], -1)  # [..., G+1]
  c2 = jnp.concatenate([zero, jnp.cumsum(ordered**2, -1)], -1)
  # j smallest + (kk - j) largest of the n valid, for every j in [0, G].
  j = jnp.arange(g + 1).reshape((1,) * kk.ndim + (g + 1,))
  top = kk[..., None] - j
  feasible = top >= 0
  lo_top = jnp.clip(n[..., None] - top, 0, g)

  def pick(c, idx):
    return jnp.take_along_axis(c, jnp.clip(idx, 0, g), -1)

  j_idx = jnp.broadcast_to(j, top.shape)
  n_idx = jnp.broadcast_to(n[..., None], top.shape)
  s1 = pick(c1, j_idx) + pick(c1, n_idx) - pick(c1, lo_top)
  s2 = pick(c2, j_idx) + pick(c2, n_idx) - pick(c2, lo_top)
  den = jnp.maximum(kk, 1).astype(jnp.float32)[..., None]
  var = s2 / den - jnp.square(s1 / den)
  best = jnp.argmax(jnp.where(feasible, var, -jnp.inf), axis=-1)  # [...]
  rank = jnp.argsort(order, axis=-1)  # position of each sample when sorted
  low = rank < best[..., None]
  high = (rank >= (n - (kk - best))[..., None]) & (rank < n[..., None])
  return ((low | high) & valid).astype(jnp.float32)


# ---------------------------------------------------------------------------
# D3S, token level.
# ---------------------------------------------------------------------------


def adv_entropy_token_mask(
  adv_BT: ArrayLike,
  entropy_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  keep_fraction: ArrayLike = 0.5,
) -> jax.Array:
  """D3S's token level: keep the tokens with the largest |A_{i,t}| * H_{i,t}.

  s_t = |A_t| * H_t; tau = quantile_{1 - rho}(s over ALL valid tokens, every
  leading axis together; linear interpolation as numpy / torch.quantile);
  keep_t = 1[s_t >= tau] * 1[m_t > 0]. Call it on the whole batch (the
  Transform does, in prepare), so the threshold is the batch's whatever the
  micro-batching.

  Args:
    adv_BT: advantages A, [..., T].
    entropy_BT: behaviour-policy token entropies H, [..., T].
    mask_BT: valid tokens, [..., T].
    keep_fraction: rho in (0, 1], may be traced (a schedule); rounded to a
      multiple of 1e-4. rho = 1 keeps every valid token.

  Returns:
    Detached float32 0/1 mask [..., T] (0 wherever mask_BT is 0).
  """
  checks.same_shape(
    ["adv_BT", "entropy_BT", "mask_BT"], adv_BT, entropy_BT, mask_BT
  )
  if isinstance(keep_fraction, (int, float)):
    checks.positive(keep_fraction=keep_fraction)
    checks.in_range("keep_fraction", keep_fraction, 0.0, 1.0)
  valid = stats.f32(mask_BT) > 0
  a = jnp.where(valid, stats.f32(adv_BT), 0.0)
  h = jnp.where(valid, stats.f32(entropy_BT), 0.0)
  score = jax.lax.stop_gradient(jnp.abs(a) * h)
  rho = stats.f32(keep_fraction)
  tau = _masked_quantile(score, valid, 1.0 - rho)
  return ((score >= tau) & valid).astype(jnp.float32)


# ---------------------------------------------------------------------------
# ARES: window entropy and high-window-entropy (HWE) triggers.
# ---------------------------------------------------------------------------


def window_entropy(
  entropy_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  window: int = 4,
  lookahead: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """ARES's window entropy and where it is defined.

  lookahead=False (the paper): Hbar_t = (1/w) sum_{s=t}^{t+w-1} H_s.
  lookahead=True (the official code, `compute_reasoning_token_window_entropy`):
  Hbar_t = (1/w) sum_{s=t+1}^{t+w} H_s, the w tokens after t.
  Hbar_t is defined ("complete") only where t and every token of its window
  are valid; elsewhere it is 0.

  Args:
    entropy_BT: token entropies H, [..., T].
    mask_BT: valid tokens, [..., T].
    window: w >= 1 (code default 4, `worker.rollout.window_size`).
    lookahead: see above.

  Returns:
    (hwe_BT float32, complete_BT bool), both [..., T].
  """
  checks.same_shape(["entropy_BT", "mask_BT"], entropy_BT, mask_BT)
  if not isinstance(window, int) or window < 1:
    raise ValueError(f"window must be an int >= 1; got {window!r}.")
  valid = stats.f32(mask_BT) > 0
  h = jnp.where(valid, stats.f32(jax.lax.stop_gradient(entropy_BT)), 0.0)
  t = h.shape[-1]
  shift = 1 if lookahead else 0
  pad = [(0, 0)] * (h.ndim - 1) + [(0, window + shift)]
  hp = jnp.pad(h, pad)
  vp = jnp.pad(valid, pad)  # False past the end: such windows are incomplete
  # w shifted copies (w is small and static): no cumsum cancellation.
  total = sum(hp[..., shift + s : shift + s + t] for s in range(window))
  complete = valid
  for s in range(window):
    complete = complete & vp[..., shift + s : shift + s + t]
  return jnp.where(complete, total / window, 0.0), complete


def hwe_trigger_count(
  entropy_BT: ArrayLike,
  mask_BT: ArrayLike,
  threshold: ArrayLike,
  *,
  window: int = 4,
  lookahead: bool = False,
  candidates_BT: Optional[ArrayLike] = None,
) -> jax.Array:
  """Number of HWE triggers per sequence: sum_t 1[Hbar_t >= tau] * c_t.

  A token triggers when its window is complete (`window_entropy`), its
  window entropy reaches tau (the code's ``>=``) and it is a candidate
  (c_t = 1 everywhere by default, the paper's "HWE tokens"; the official
  code counts only reasoning-trigger words such as "wait", matched by token
  string: pass their 0/1 positions as `candidates_BT`).

  Returns:
    Float32 counts [...] (the leading axes of mask_BT).
  """
  hwe, complete = window_entropy(
    entropy_BT, mask_BT, window=window, lookahead=lookahead
  )
  fire = complete & (hwe >= stats.f32(threshold))
  if candidates_BT is not None:
    checks.same_shape(["candidates_BT", "mask_BT"], candidates_BT, mask_BT)
    fire = fire & (jnp.asarray(candidates_BT) != 0)
  return jnp.sum(fire, axis=-1, dtype=jnp.float32)


def _row_quantile(x: jax.Array, valid: jax.Array, q: float) -> jax.Array:
  """Per-row linear-interpolation quantile over the last axis (static q)."""
  ordered = jnp.sort(jnp.where(valid, x, jnp.inf), axis=-1)
  n = jnp.sum(valid, axis=-1, dtype=jnp.int32)
  last = jnp.maximum(n - 1, 0)
  lo, frac = _quantile_index(q, last)
  hi = jnp.minimum(lo + 1, last)
  a = jnp.take_along_axis(ordered, lo[..., None], -1)[..., 0]
  b = jnp.take_along_axis(ordered, hi[..., None], -1)[..., 0]
  return jnp.where(n > 0, a + frac * (b - a), 0.0), n > 0


def hwe_threshold(
  entropy_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  window: int = 4,
  lookahead: bool = False,
  percentile: float = 95.0,
) -> jax.Array:
  """One batch's HWE threshold: the median over sequences of each
  sequence's `percentile`-th percentile of its window entropies.

  The official code (`get_window_average_entropy_percentile_threshold_list`,
  percentile 95, then `np.median` over the batch in the trainer) also
  counts incomplete windows, filled with the running mean of the complete
  ones; here only complete windows count and sequences without one are left
  out of the median. NaN when no sequence has a complete window.
  """
  checks.in_range("percentile", percentile, 0.0, 100.0)
  hwe, complete = window_entropy(
    entropy_BT, mask_BT, window=window, lookahead=lookahead
  )
  per_seq, has = _row_quantile(hwe, complete, percentile / 100.0)
  med = _masked_quantile(per_seq, has, 0.5)
  return jnp.where(jnp.any(has), med, jnp.nan)


# ---------------------------------------------------------------------------
# ARES: difficulty buckets and the hierarchical entropy reward.
# ---------------------------------------------------------------------------

EASY, MEDIUM, HARD = 0, 1, 2


class AresRewardTable(NamedTuple):
  """Per-bucket constants of the entropy reward, (easy, medium, hard).

  Defaults are the official code's (`examples/reward_function/aepo.py`).
  """

  margin_frac: tuple[float, float, float] = (0.15, 0.25, 0.35)
  kappa: tuple[float, float, float] = (2.0, 3.0, 4.0)
  temp: tuple[float, float, float] = (2.0, 2.5, 3.0)
  cap_scale: tuple[float, float, float] = (1.0, 1.0, 1.2)
  wrong_gain: tuple[float, float, float] = (0.6, 0.8, 1.0)
  min_margin: float = 1.0


ARES_TABLE = AresRewardTable()


def ares_difficulty(
  correct_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  easy: float = 2.0 / 3.0,
  hard: float = 1.0 / 3.0,
) -> jax.Array:
  """Difficulty bucket per prompt from its group accuracy acc.

  0 (easy) if acc >= `easy`, 1 (medium) if acc >= `hard`, else 2 (hard);
  the official code's `update_difficulty_and_skip_gid_set` thresholds 2/3,
  1/3. Only valid samples count; a group without any is "hard".

  Returns:
    int32 [...] (the leading axes of correct_PG).
  """
  c = stats.f32(jnp.asarray(correct_PG) != 0)
  m = jnp.ones_like(c) if sample_mask_PG is None else sample_mask_PG
  acc = stats.masked_mean(c, m, axis=-1)
  return jnp.where(acc >= easy, EASY, jnp.where(acc >= hard, MEDIUM, HARD))


def ares_bucket_targets(
  counts_PG: ArrayLike,
  sample_mask_PG: ArrayLike,
  difficulty_P: ArrayLike,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per-bucket mean trigger count over the batch and its target.

  mean_d = mean over the prompts of bucket d (with >= 1 valid sample) of
  the group-mean trigger count; target_d = round(mean_d) (the code's
  ``round(1.0 * np.mean(values))``, round half to even).

  Returns:
    (mean_3, target_3, present_3): float32 [3], float32 [3], bool [3].
  """
  m = stats.f32(sample_mask_PG)
  group_mean = stats.masked_mean(counts_PG, m, axis=-1).reshape(-1)
  has = (jnp.sum(m, axis=-1) > 0).reshape(-1)
  onehot = jnp.asarray(difficulty_P).reshape(-1)[:, None] == jnp.arange(3)[None]
  member = stats.f32(onehot & has[:, None])  # [P, 3]
  num = jnp.sum(member, axis=0)
  mean = stats.safe_div(group_mean @ member, num)
  return mean, jnp.round(mean), num > 0


def _huber(x: jax.Array, kappa: jax.Array) -> jax.Array:
  x = jnp.maximum(x, 0.0)
  return jnp.where(x <= kappa, 0.5 * x * x / kappa, x - 0.5 * kappa)


def _sigmoid(x: jax.Array, temp: jax.Array) -> jax.Array:
  return jax.nn.sigmoid(x / jnp.maximum(temp, 1e-6))


def ares_entropy_reward(
  counts_PG: ArrayLike,
  target_PG: ArrayLike,
  difficulty_PG: ArrayLike,
  correct_PG: ArrayLike,
  alpha_PG: ArrayLike,
  table: AresRewardTable = ARES_TABLE,
) -> jax.Array:
  """ARES's hierarchical entropy reward r_ent (added to the accuracy reward).

  With n the sample's HWE trigger count, delta = n - target,
  margin = max(1, f_d * max(target, 1)), cap = alpha_d * c_d,
  hub(x) = x^2 / (2 kappa) for 0 <= x <= kappa else x - kappa/2 (x clipped
  at 0), sig(x) = 1 / (1 + exp(-x / temp_d)) and
  pen(x) = -min(cap, hub(x) / (margin + kappa) * cap):

  * easy, correct:    pen(delta - margin)      (too much exploration)
  * medium, correct:  pen(|delta| - margin)    (off target either way)
  * hard, correct:    sig(delta + margin) * cap if delta >= -margin, else
                      pen(-delta - margin) / 2 (clipped at cap)
  * any, wrong:       sig(max(delta - margin, 0)) * cap * g_d with
                      g = (0.6, 0.8, 1.0) for (easy, medium, hard).

  Transcribed from the official code (`examples/reward_function/aepo.py`,
  `compute_score`); note that sig(0) = 1/2, so a wrong answer always gets
  at least cap * g_d / 2.

  Returns:
    Float32 r_ent [...] (the shape of counts_PG).
  """
  d = jnp.asarray(difficulty_PG)
  n, target = stats.f32(counts_PG), stats.f32(target_PG)

  def per_bucket(values):
    return jnp.asarray(values, jnp.float32)[d]

  delta = n - target
  margin = jnp.maximum(
    table.min_margin, per_bucket(table.margin_frac) * jnp.maximum(target, 1.0)
  )
  kappa, temp = per_bucket(table.kappa), per_bucket(table.temp)
  cap = stats.f32(alpha_PG) * per_bucket(table.cap_scale)

  def pen(x, scale=1.0):
    return -jnp.minimum(cap, scale * _huber(x, kappa) / (margin + kappa) * cap)

  easy_ok = pen(delta - margin)
  medium_ok = pen(jnp.abs(delta) - margin)
  hard_ok = jnp.where(
    delta >= -margin,
    _sigmoid(delta + margin, temp) * cap,
    pen(-delta - margin, 0.5),
  )
  wrong = _sigmoid(jnp.maximum(delta - margin, 0.0), temp) * cap
  wrong = wrong * per_bucket(table.wrong_gain)
  ok = jnp.where(d == EASY, easy_ok, jnp.where(d == MEDIUM, medium_ok, hard_ok))
  return jnp.where(jnp.asarray(correct_PG) != 0, ok, wrong)
