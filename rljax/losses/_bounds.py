"""Policy losses with per-token or adaptive clip bounds, and their penalties.

BAPO (adaptive ratio bounds searched over the minibatch), DCPO (bounds from
the old token probability, smoothed per-prompt advantages), DISPO (CISPO
bounds chosen by correctness), ETR (per-sample eps), HAPO-het
(entropy-driven bounds and advantages), AEPO (entropy-aware advantage,
gradient-preserving clip), R^2VPO (ratio-variance penalty) and LLDS
(likelihood-drop penalty). The surrogates follow the `rljax.losses`
convention ``f(logp_BT, old_logp_BT, adv_BT, mask_BT, **hyper) -> TokenLoss``
(see `rljax.losses.ppo_clip`); per-token hyperparameters (bounds, entropy
scores) are arrays that broadcast against [..., T] WITHOUT rank promotion
(pass [..., 1] for a per-sequence value). All arithmetic is float32.
"""

from collections.abc import Callable
from typing import Optional

import jax
from jax import lax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax import advantages
from rljax._src import checks
from rljax._src import stats
from rljax.losses._policy import _LOG_RATIO_CLAMP
from rljax.losses._policy import TokenLoss
from rljax.losses._policy import _check_dual_clip
from rljax.losses._policy import _check_optional_positive
from rljax.losses._policy import _clipped_surrogate
from rljax.losses._policy import _log_ratio
from rljax.losses._policy import _prepare


def _per_token(name: str, value: ArrayLike, shape) -> jax.Array:
  """`value` as float32 broadcast to `shape`; a clear error otherwise."""
  value = jnp.asarray(value, jnp.float32)
  if value.ndim not in (0, len(shape)):
    raise ValueError(
      f"{name} has shape {value.shape}; pass a scalar or an array of rank"
      f" {len(shape)} that broadcasts to {tuple(shape)} (e.g. [..., 1] for"
      " one value per sequence)."
    )
  try:
    np.broadcast_shapes(value.shape, tuple(shape))
  except ValueError:
    raise ValueError(
      f"{name} has shape {value.shape}, which does not broadcast to the"
      f" token shape {tuple(shape)}."
    ) from None
  return jnp.broadcast_to(value, shape)


# --------------------------------------------------------------------------
# PPO clip with per-token ratio bounds (BAPO, DCPO, ETR, HAPO share it).


def ppo_clip_bounds(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  ratio_low: ArrayLike,
  ratio_high: ArrayLike,
  dual_clip: Optional[float] = None,
  log_ratio_clamp: Optional[float] = _LOG_RATIO_CLAMP,
) -> TokenLoss:
  """PPO clip with explicit, per-token ratio bounds [lo, hi].

    L = max(-A r, -A clip(r, lo, hi)),  then min(L, -c A) where A < 0.

  ``ratio_low`` / ``ratio_high`` are RATIO bounds (``1 - eps_low`` and
  ``1 + eps_high`` give `ppo_clip`), scalars or arrays broadcasting to
  [..., T]. The bounds are constants (no gradient flows through them).

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see `rljax.losses.ppo_clip`.
    ratio_low: lower ratio bound(s); a token with A < 0 and r < lo is cut.
    ratio_high: upper ratio bound(s); a token with A > 0 and r > hi is cut.
    dual_clip: c > 1 caps the loss of A < 0 tokens at -c A; None disables.
    log_ratio_clamp: clamp of d before exp (20); None disables it.

  Returns:
    TokenLoss with `ppo_clip`'s indicators.
  """
  _check_optional_positive(log_ratio_clamp=log_ratio_clamp)
  _check_dual_clip(dual_clip)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  shape = x.logp.shape
  lo = lax.stop_gradient(_per_token("ratio_low", ratio_low, shape))
  hi = lax.stop_gradient(_per_token("ratio_high", ratio_high, shape))
  r = jnp.exp(_log_ratio(x, log_ratio_clamp))
  clipped = jnp.minimum(jnp.maximum(r, lo), hi)
  return _clipped_surrogate(r, clipped, x.adv, dual_clip)


# --------------------------------------------------------------------------
# BAPO (arXiv 2510.18927).


def bapo_candidates(
  *,
  low_start: float = 0.6,
  low_max: float = 0.9,
  low_step: float = 0.05,
  high_start: float = 1.2,
  high_max: float = 3.0,
  high_step: float = 0.1,
) -> tuple[np.ndarray, np.ndarray]:
  """BAPO's bound pairs (c_lo, c_hi) in search order, as float32 [K] arrays.

  First c_lo = start, start + step, ... up to ``low_max`` (the last step is
  cut at the max) with c_hi at its start; then c_hi raised the same way with
  c_lo at its max: exactly the sequence the official while-loops visit
  (WooooDyy/BAPO ``recipe/bapo/policy_loss.py``). A zero step (or
  max = start) leaves that bound fixed.
  """
  checks.positive(low_start=low_start, high_start=high_start)
  checks.non_negative(low_step=low_step, high_step=high_step)
  if low_max < low_start or high_max < high_start:
    raise ValueError(
      "bapo bounds: need low_max >= low_start and high_max >= high_start;"
      f" got low [{low_start}, {low_max}], high [{high_start}, {high_max}]."
    )
  if not low_start < 1.0 < high_start:
    raise ValueError(
      f"bapo bounds: need low_start < 1 < high_start (ratio bounds, not"
      f" eps); got {low_start}, {high_start}."
    )

  def walk(start, stop, step):
    values = [start]
    while step > 0 and values[-1] < stop:
      values.append(min(values[-1] + step, stop))
    return values

  lows = walk(low_start, low_max, low_step)
  highs = walk(high_start, high_max, high_step)
  pairs = [(lo, highs[0]) for lo in lows] + [(lows[-1], h) for h in highs[1:]]
  lo, hi = zip(*pairs, strict=True)
  return np.asarray(lo, np.float32), np.asarray(hi, np.float32)


_CONTRIBUTIONS = ("clamped", "unclipped")


def bapo_contributions(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  ratio_lows: ArrayLike,
  ratio_highs: ArrayLike,
  *,
  contribution: str = "clamped",
  log_ratio_clamp: Optional[float] = _LOG_RATIO_CLAMP,
) -> tuple[jax.Array, jax.Array]:
  """Positive and negative contributions P[K], N[K] of K candidate bounds.

  ``contribution="clamped"`` (the official code): with the effective ratio
  r~ = min(r, c_hi) where A >= 0 and max(r, c_lo) where A < 0,

    P = sum m max(r~ A, 0),   N = sum m max(-r~ A, 0)

  summed over every token of the input. ``"unclipped"``: only the tokens
  that keep their PPO gradient count (A > 0 with r <= c_hi, A < 0 with
  r >= c_lo), with weight r |A|: raising c_lo then lowers N and raising c_hi
  raises P (see `rljax.objectives.bapo`).

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see `rljax.losses.ppo_clip`.
    ratio_lows, ratio_highs: [K] candidate bounds (`bapo_candidates`).
    contribution: ``"clamped"`` or ``"unclipped"``.
    log_ratio_clamp: clamp of d before exp (20, as the code); None disables.

  Returns:
    (P, N), each [K] float32 sums; they add over disjoint parts of a batch.
  """
  checks.one_of("contribution", contribution, _CONTRIBUTIONS)
  lows = jnp.asarray(ratio_lows, jnp.float32)
  highs = jnp.asarray(ratio_highs, jnp.float32)
  checks.rank("ratio_lows", lows, 1, "[candidates]")
  checks.same_shape(["ratio_lows", "ratio_highs"], lows, highs)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  r = lax.stop_gradient(jnp.exp(_log_ratio(x, log_ratio_clamp)))
  adv = x.adv

  def one(lo, hi):
    if contribution == "clamped":
      eff = jnp.where(adv >= 0, jnp.minimum(r, hi), jnp.maximum(r, lo))
      signed = eff * adv
    else:
      keep = jnp.where(adv > 0, r <= hi, r >= lo)
      signed = jnp.where(keep, r * adv, 0.0)
    pos = stats.masked_sum(jnp.maximum(signed, 0.0), x.mask)
    neg = stats.masked_sum(jnp.maximum(-signed, 0.0), x.mask)
    return pos, neg

  return jax.vmap(one)(lows, highs)


def bapo_select(
  positive: ArrayLike,
  negative: ArrayLike,
  *,
  rho0: float = 0.5,
  eps: float = 1e-8,
) -> jax.Array:
  """Index of the first candidate with P / (N + eps) >= rho0 (int32).

  N <= 0 counts as an infinite ratio (the official code). When no candidate
  reaches rho0 the last one (both bounds at their max) is chosen, as the
  code's loops end there.
  """
  checks.non_negative(rho0=rho0, eps=eps)
  p = stats.f32(positive)
  n = stats.f32(negative)
  ratio = jnp.where(n <= 0, jnp.inf, p / (n + eps))
  ok = ratio >= rho0
  last = p.shape[-1] - 1
  return jnp.where(jnp.any(ok), jnp.argmax(ok), last).astype(jnp.int32)


# --------------------------------------------------------------------------
# DCPO (arXiv 2509.02333).


def dcpo_bounds(
  old_logp_BT: ArrayLike,
  *,
  eps_low: float = 0.16,
  eps_high: float = 0.2,
  max_high: Optional[float] = 10.0,
) -> tuple[jax.Array, jax.Array]:
  """DCPO's dynamic-adaptive ratio bounds from the old token probability q.

    r_lo(q) = 1/2 + 1/2 sqrt(max(1 - 4 eps_low / q, 0))
    r_hi(q) = min(1/2 + 1/2 sqrt(1 + 4 eps_high / q), max_high)

  from |(r - 1) r| q <= eps, q = exp(old_logp). Low-probability tokens get
  wider bounds (r_lo -> 1/2, r_hi grows like sqrt(eps / q)). ``max_high``:
  the official code caps r_hi at max(clip_ratio_c, 10) (10 with its default
  c = 3); None removes the cap. At q -> 0 this gives r_lo = 1/2 (the code
  special-cases q == 0 exactly to r_lo = 1).
  """
  checks.positive(eps_low=eps_low, eps_high=eps_high)
  _check_optional_positive(max_high=max_high)
  inv_q = jnp.exp(-stats.f32(old_logp_BT))  # 1 / q, +inf when q underflows
  lo = 0.5 + 0.5 * jnp.sqrt(jnp.maximum(1.0 - 4.0 * eps_low * inv_q, 0.0))
  hi = 0.5 + 0.5 * jnp.sqrt(1.0 + 4.0 * eps_high * inv_q)
  if max_high is not None:
    hi = jnp.minimum(hi, max_high)
  return lax.stop_gradient(lo), lax.stop_gradient(hi)


def dcpo_clip(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  eps_low: float = 0.16,
  eps_high: float = 0.2,
  max_high: Optional[float] = 10.0,
  dual_clip: Optional[float] = 3.0,
  log_ratio_clamp: Optional[float] = None,
) -> TokenLoss:
  """DCPO's dynamic clip: PPO clip with the per-token `dcpo_bounds`.

    L = max(-A r, -A clip(r, r_lo(q), r_hi(q))),  min(L, -c A) where A < 0.

  Defaults: eps 0.16 / 0.2 (the paper's table, lime-RL/DCPO README), dual
  clip c = 3 and no log-ratio clamp (the official ``compute_policy_loss_dcpo``
  with ``clip_type="dynamic"``; its clamp is commented out).

  Checked: the bound formula against the README (section 4.1) and
  ``get_clip_low_high`` in lime-RL/DCPO ``verl/trainer/ppo/core_algos.py``;
  the README's example q = 0.9 -> r in [0.69, 1.10].
  """
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  lo, hi = dcpo_bounds(
    x.old_logp, eps_low=eps_low, eps_high=eps_high, max_high=max_high
  )
  return ppo_clip_bounds(
    logp_BT,
    old_logp_BT,
    adv_BT,
    mask_BT,
    ratio_low=lo,
    ratio_high=hi,
    dual_clip=dual_clip,
    log_ratio_clamp=log_ratio_clamp,
  )


def dcpo_sas(
  rewards_PG: ArrayLike,
  sample_mask_PG: ArrayLike,
  count_P: ArrayLike,
  mean_P: ArrayLike,
  std_P: ArrayLike,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """DCPO's Smooth Advantage Standardization for one step of each prompt.

  With i = count + 1 (the times the prompt has been seen, this step
  included), the step's group mean / unbiased std (mu_new, s_new) and the
  cumulative statistics updated as in the official ``get_mean_std``
  (each past step weighs the same):

    i = 1:  mu_tot = mu_new, s_tot = s_new
    i > 1:  mu_tot = ((i-1) mu_old + mu_new) / i
            s_tot^2 = ((i-1) s_old^2 + s_new^2 + (i-1)/i (mu_new - mu_old)^2)
                      / i
    A_new = (R - mu_new) / s_new,  A_tot = (R - mu_tot) / s_tot  (0 if s = 0)
    SA_new = (i-1)/i A_new + 1/i A_tot,   SA_tot = 1/i A_new + (i-1)/i A_tot
    A = SA_new if |SA_new| < |SA_tot| else SA_tot

  A group with fewer than 2 valid samples gets A = 0 and keeps its
  statistics (the code raises there).

  Args:
    rewards_PG: [P, G] rewards; G is the group.
    sample_mask_PG: [P, G] validity of each sample.
    count_P, mean_P, std_P: the prompt's past steps and statistics.

  Returns:
    (advantages [P, G], count, mean, std) after this step.
  """
  checks.rank("rewards_PG", rewards_PG, 2, "[prompts, samples]")
  checks.same_shape(
    ["rewards_PG", "sample_mask_PG"], rewards_PG, sample_mask_PG
  )
  r = stats.f32(rewards_PG)
  valid = stats.f32(sample_mask_PG) > 0
  n = jnp.sum(valid, axis=-1, dtype=jnp.float32)
  ok = n >= 2
  mu_new = stats.masked_mean(r, valid, axis=-1)
  s_new = stats.masked_std(r, valid, axis=-1)
  old_n = stats.f32(count_P)
  mu_old, s_old = stats.f32(mean_P), stats.f32(std_P)
  i = old_n + 1.0
  first = old_n == 0
  mu_tot = jnp.where(first, mu_new, (old_n * mu_old + mu_new) / i)
  var_tot = (
    old_n * s_old**2 + s_new**2 + old_n / i * (mu_new - mu_old) ** 2
  ) / i
  s_tot = jnp.where(first, s_new, stats.safe_sqrt(var_tot))

  def z(mu, s):
    return jnp.where(
      s[:, None] > 0, stats.safe_div(r - mu[:, None], s[:, None]), 0.0
    )

  a_new, a_tot = z(mu_new, s_new), z(mu_tot, s_tot)
  w = (1.0 / i)[:, None]
  sa_new = (1.0 - w) * a_new + w * a_tot
  sa_tot = w * a_new + (1.0 - w) * a_tot
  adv = jnp.where(jnp.abs(sa_new) < jnp.abs(sa_tot), sa_new, sa_tot)
  adv = jnp.where(valid & ok[:, None], adv, 0.0)
  return (
    adv,
    jnp.where(ok, old_n + 1.0, old_n),
    jnp.where(ok, mu_tot, mu_old),
    jnp.where(ok, s_tot, s_old),
  )


# --------------------------------------------------------------------------
# DISPO (arXiv 2602.00983).

_DISPO_MODES = ("clip", "mask")


def dispo(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  eps_low_pos: float = 0.2,
  eps_high_pos: float = 0.2,
  eps_low_neg: float = 0.2,
  eps_high_neg: float = 0.2,
  mode: str = "clip",
  correct_BT: Optional[ArrayLike] = None,
  log_ratio_clamp: Optional[float] = _LOG_RATIO_CLAMP,
) -> TokenLoss:
  """DISPO: REINFORCE with a detached IS weight, bounds by correctness.

    [lo, hi] = [1 - eps_low_pos, 1 + eps_high_pos] on correct responses,
               [1 - eps_low_neg, 1 + eps_high_neg] on incorrect ones
    mode "clip":  L = -sg(clip(r, lo, hi)) A logp      (CISPO-like)
    mode "mask":  L = -sg(r) 1[lo <= r <= hi] A logp   (outside: no gradient)

  Correct = ``correct_BT`` > 0 when given (e.g. reward > 0, see
  `rljax.objectives.dispo`), else A > 0. With all four eps equal, mode
  "clip" is `rljax.losses.cispo`. Defaults 0.2 everywhere (that special
  case); the paper tunes the four separately and warns that over-tight
  bounds on incorrect responses collapse training.

  Not verified: the paper's equations were not read (only its abstract).
  The "mask" mode follows the abstract's criticism of CISPO's "non-zero
  gradients outside the trust region"; it masks both sides of the band.

  Returns:
    TokenLoss; clip_low / clip_high mark valid tokens with r < lo / r > hi.
  """
  checks.positive(
    eps_low_pos=eps_low_pos,
    eps_high_pos=eps_high_pos,
    eps_low_neg=eps_low_neg,
    eps_high_neg=eps_high_neg,
  )
  checks.one_of("mode", mode, _DISPO_MODES)
  _check_optional_positive(log_ratio_clamp=log_ratio_clamp)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  if correct_BT is None:
    correct = x.adv > 0
  else:
    correct = _per_token("correct_BT", correct_BT, x.logp.shape) > 0
  lo = jnp.where(correct, 1.0 - eps_low_pos, 1.0 - eps_low_neg)
  hi = jnp.where(correct, 1.0 + eps_high_pos, 1.0 + eps_high_neg)
  r = lax.stop_gradient(jnp.exp(_log_ratio(x, log_ratio_clamp)))
  below, above = x.valid & (r < lo), x.valid & (r > hi)
  if mode == "clip":
    weight = jnp.minimum(jnp.maximum(r, lo), hi)
  else:
    weight = jnp.where(below | above, 0.0, r)
  return TokenLoss(-weight * x.adv * x.logp, stats.f32(below), stats.f32(above))


# --------------------------------------------------------------------------
# ETR (arXiv 2601.03723).


def etr_micro(abs_adv: ArrayLike, *, alpha: float = 0.5) -> jax.Array:
  """ETR's default micro factor g(|A|) = 1 + alpha |A| (a documented choice)."""
  return 1.0 + alpha * stats.f32(abs_adv)


def etr_macro(group_var: ArrayLike, *, beta: float = 1.0) -> jax.Array:
  """ETR's default macro factor h(s^2) = 1 + beta 4 s^2 (a documented
  choice): for 0/1 rewards 4 s^2 = 4 p (1 - p) peaks at pass rate 1/2."""
  return 1.0 + beta * 4.0 * stats.f32(group_var)


def etr_eps(
  adv_PG: ArrayLike,
  rewards_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  eps0: float = 0.2,
  g: Callable[[jax.Array], jax.Array] = etr_micro,
  h: Callable[[jax.Array], jax.Array] = etr_macro,
) -> jax.Array:
  """ETR's per-sample clip range eps_i = eps0 g(|A_i|) h(s^2_group).

  s^2_group is the population variance of the valid rewards of the sample's
  group (last axis). Returns [..., G] float32 (0 for invalid samples).
  """
  checks.positive(eps0=eps0)
  r = stats.f32(rewards_PG)
  valid = (
    jnp.ones_like(r, bool)
    if sample_mask_PG is None
    else stats.f32(sample_mask_PG) > 0
  )
  checks.same_shape(["adv_PG", "rewards_PG"], adv_PG, rewards_PG)
  var = stats.masked_var(r, valid, axis=-1, keepdims=True, ddof=0)
  eps = eps0 * g(jnp.abs(stats.f32(adv_PG))) * h(var)
  return jnp.where(valid, stats.f32(eps), 0.0)


# --------------------------------------------------------------------------
# HAPO, heterogeneous (arXiv 2509.16591; code starriver030515/HAPO).

_HAPO_SIGNS = ("paper", "code")


def _masked_quantile(x: jax.Array, valid: jax.Array, q: float) -> jax.Array:
  """torch.quantile(..., interpolation="nearest") over the valid entries."""
  flat = jnp.where(valid, x, jnp.inf).reshape(-1)
  n = jnp.sum(valid, dtype=jnp.int32)
  idx = jnp.round(q * (jnp.maximum(n, 1) - 1)).astype(jnp.int32)
  return jnp.where(n > 0, jnp.sort(flat)[idx], 0.0)


def hapo_entropy_scores(
  entropy_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  pivot: float = 0.8,
  eps: float = 1e-6,
  sign: str = "paper",
) -> jax.Array:
  """HAPO's normalised token entropy h^ in [-1, 1].

    u = log max(H, eps),  m = the ``pivot`` quantile of u (nearest rank),
    s = sqrt(mean (u - m)^2),  h = (u - m) / s,
    h^ = h / max h+ for h > 0,  h / |min h-| for h <= 0

  over the valid tokens of the input (official ``compute_entropy_h``;
  ``entropy_pivot`` 0.8 in every recipe script). ``sign="code"`` reproduces
  the official ``scale_neg = 1 / neg_min`` (negative), which flips h <= 0 to
  h^ >= 0; the default keeps the sign, as the paper's clip(., -1, 1) and
  its low-/high-entropy branches need.
  """
  checks.in_range("pivot", pivot, 0.0, 1.0)
  checks.positive(eps=eps)
  checks.one_of("sign", sign, _HAPO_SIGNS)
  checks.same_shape(["entropy_BT", "mask_BT"], entropy_BT, mask_BT)
  valid = stats.f32(mask_BT) > 0
  u = jnp.log(jnp.maximum(stats.f32(entropy_BT), eps))
  m = _masked_quantile(u, valid, pivot)
  d = jnp.where(valid, u - m, 0.0)
  n = jnp.maximum(jnp.sum(valid, dtype=jnp.float32), 1.0)
  s = jnp.sqrt(jnp.maximum(jnp.sum(d * d) / n, eps))
  h = d / s
  pos_max = jnp.maximum(jnp.max(jnp.where(valid & (h > 0), h, 0.0)), eps)
  neg_min = jnp.minimum(jnp.min(jnp.where(valid & (h < 0), h, 0.0)), -eps)
  neg_scale = 1.0 / neg_min if sign == "code" else -1.0 / neg_min
  out = jnp.where(h > 0, h / pos_max, h * neg_scale)
  return lax.stop_gradient(jnp.where(valid, jnp.clip(out, -1.0, 1.0), 0.0))


def hapo_token_advantages(
  rewards_PG: ArrayLike,
  lengths_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  eps: float = 1e-6,
  fallback_at: float = 5.0,
) -> jax.Array:
  """HAPO's token-level group normalisation of outcome rewards.

    mu = sum_g n_g R_g / sum_g n_g,  s^2 = sum_g n_g (R_g - mu)^2 / sum_g n_g
    A_g = (R_g - mu) / (s + eps)

  (each token of a response counts once: n_g its length). A group whose
  |A| reaches ``fallback_at`` on a valid sample uses the GRPO advantage
  instead (official ``compute_hapo_outcome_advantage``; the code also
  tests padded positions, whose value (0 - mu)/s is not an advantage).
  """
  checks.positive(fallback_at=fallback_at)
  checks.non_negative(eps=eps)
  r = stats.f32(rewards_PG)
  valid = (
    jnp.ones_like(r, bool)
    if sample_mask_PG is None
    else stats.f32(sample_mask_PG) > 0
  )
  checks.same_shape(["rewards_PG", "lengths_PG"], rewards_PG, lengths_PG)
  w = jnp.where(valid, stats.f32(lengths_PG), 0.0)
  mu = stats.masked_mean(r, w, axis=-1, keepdims=True)
  var = stats.masked_mean(jnp.square(r - mu), w, axis=-1, keepdims=True)
  adv = (r - mu) / (jnp.sqrt(var) + eps)
  bad = jnp.any((w > 0) & (jnp.abs(adv) >= fallback_at), -1, keepdims=True)
  grpo = advantages.grpo(r, valid, eps=eps)
  return jnp.where(valid, jnp.where(bad, grpo, adv), 0.0)


def hapo_het(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  entropy_scores_BT: ArrayLike,
  eps_low: float = 0.2,
  eps_high: float = 0.28,
  alpha: float = 1.0,
  beta: float = 1.0,
  adaptive_clip: bool = True,
  adaptive_advantage: bool = True,
  dual_clip: Optional[float] = 3.0,
) -> TokenLoss:
  """HAPO's entropy-adaptive clip and advantage redistribution.

  With h^ = ``entropy_scores_BT`` (`hapo_entropy_scores`):

    eps_low'  = eps_low (1 - alpha h^)  where h^ <= 0, else eps_low
    eps_high' = eps_high (1 + alpha h^) where h^ > 0,  else eps_high
    A_ent = A (1 + beta h^); in the neutral zone
      1 - eps_low'/2 < r < 1 + eps_high'/2
    a token with h^ > 0 keeps A (A_ent outside), h^ <= 0 uses A_ent
      (A outside)
    L = PPO clip with [1 - eps_low', 1 + eps_high'] and A', dual clip c.

  Defaults: alpha = beta = 1, dual clip 3 (official ``compute_policy_loss``
  and recipes); eps 0.2 / 0.28 (the recipes' clip-higher setting). No
  log-ratio clamp (as the code).

  Checked: against starriver030515/HAPO ``recipe/train.md`` and
  ``verl/trainer/ppo/core_algos.py`` (``ada_clip``, ``ada_advantage``).
  """
  checks.positive(eps_low=eps_low, eps_high=eps_high)
  checks.non_negative(alpha=alpha, beta=beta)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  h = lax.stop_gradient(
    _per_token("entropy_scores_BT", entropy_scores_BT, x.logp.shape)
  )
  low = jnp.full_like(h, eps_low)
  high = jnp.full_like(h, eps_high)
  if adaptive_clip:
    low = jnp.where(h <= 0, eps_low * (1.0 - alpha * h), low)
    high = jnp.where(h > 0, eps_high * (1.0 + alpha * h), high)
  r = jnp.exp(_log_ratio(x, None))
  adv = x.adv
  if adaptive_advantage:
    r_sg = lax.stop_gradient(r)
    neutral = (r_sg > 1.0 - low / 2) & (r_sg < 1.0 + high / 2)
    adv_ent = adv * (1.0 + beta * h)
    adv = jnp.where((h > 0) == neutral, adv, adv_ent)
  return ppo_clip_bounds(
    x.logp,
    x.old_logp,
    adv,
    x.mask,
    ratio_low=1.0 - low,
    ratio_high=1.0 + high,
    dual_clip=dual_clip,
    log_ratio_clamp=None,
  )


# --------------------------------------------------------------------------
# AEPO, agentic (arXiv 2510.14545).

_AEPO_PRESERVE = ("high", "low")


def aepo(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  entropy_z_BT: ArrayLike,
  alpha: float = 0.2,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  dual_clip: Optional[float] = 3.0,
  preserve: str = "high",
) -> TokenLoss:
  """AEPO's entropy-balanced clip with an entropy-aware advantage.

    A' = A (1 + alpha z),  z = ``entropy_z_BT`` (token entropy z-score)
    hi = (1 + eps_high) r / sg(r) on preserved tokens, 1 + eps_high elsewhere
    L = max(-A' r, -A' clip(r, 1 - eps_low, hi)),  min(L, -c A') where A' < 0

  A preserved token clipped at the upper bound keeps the gradient
  -A' (1 + eps_high) grad logp (GPPO-style) instead of 0. ``preserve="high"``
  (z > 0) follows the paper's abstract ("stop-gradient ... to preserve and
  properly rescale gradients on high-entropy tokens");
  ``preserve="low"`` (z <= 0) is the third-party verl port
  (``compute_policy_loss_aepo``), which detaches the ratio in the bound
  where z <= 0. alpha = 0.2 and c = 3 are the port's; no log-ratio clamp.

  Checked: the port's code; the paper's text beyond its abstract was not
  read (the official RUC-NLPIR/ARPO snapshot holds no AEPO loss).
  """
  checks.non_negative(alpha=alpha)
  checks.positive(eps_low=eps_low, eps_high=eps_high)
  checks.one_of("preserve", preserve, _AEPO_PRESERVE)
  _check_dual_clip(dual_clip)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  z = lax.stop_gradient(_per_token("entropy_z_BT", entropy_z_BT, x.logp.shape))
  adv = x.adv * (1.0 + alpha * z)
  r = jnp.exp(_log_ratio(x, None))
  unit = r / lax.stop_gradient(r)
  keep = z > 0 if preserve == "high" else z <= 0
  hi = jnp.where(keep, (1.0 + eps_high) * unit, 1.0 + eps_high)
  clipped = jnp.minimum(jnp.maximum(r, 1.0 - eps_low), hi)
  return _clipped_surrogate(r, clipped, adv, dual_clip)


# --------------------------------------------------------------------------
# R^2VPO (arXiv 2601.03320) and LLDS (arXiv 2512.04220): penalties.


def r2vpo_penalty(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  mean_ratio: ArrayLike,
  log_ratio_clamp: Optional[float] = _LOG_RATIO_CLAMP,
) -> jax.Array:
  """Per-token (r - sg(mu))^2, mu the batch mean ratio (a constant).

  Its token mean over a batch is the population variance Var_B[r] when mu
  is that batch's mean r, and then its gradient is exactly grad Var_B[r]
  (the mu term's gradient sums to 0 over the batch).
  """
  _check_optional_positive(log_ratio_clamp=log_ratio_clamp)
  x = _prepare(logp_BT, old_logp_BT, logp_BT, mask_BT)
  r = jnp.exp(_log_ratio(x, log_ratio_clamp))
  mu = lax.stop_gradient(jnp.asarray(mean_ratio, jnp.float32))
  return jnp.where(x.valid, jnp.square(r - mu), 0.0)


_LLDS_PRESERVE = ("nonnegative", "all")


def llds(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  preserve: str = "nonnegative",
) -> jax.Array:
  """LLDS per-token penalty (unscaled): gated likelihood drops.

    S = preserved tokens (A >= 0, or every valid token with ``"all"``)
    g_i = 1[sum_{t in S} (l_old - l) > 0]   (detached)
    P_it = g_i max(0, l_old - l) 1[t in S]

  Returns [..., T] float32 (0 at masked positions). ``"nonnegative"`` is
  the official response-level gate (``dp_actor.py``: ``positive_advantage_mask
  = advantages >= 0``); ``"all"`` is the catalog's formula without a
  preserving set. The paper's best "action-level" gate (per tool-call span)
  needs span ids and is not implemented.
  """
  checks.one_of("preserve", preserve, _LLDS_PRESERVE)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  keep = x.valid & (x.adv >= 0) if preserve == "nonnegative" else x.valid
  drop = x.old_logp - x.logp
  total = jnp.sum(jnp.where(keep, lax.stop_gradient(drop), 0.0), -1)
  gate = lax.stop_gradient(stats.f32(total > 0))[..., None]
  return jnp.where(keep, gate * jnp.maximum(drop, 0.0), 0.0)


__all__ = [
  "aepo",
  "bapo_candidates",
  "bapo_contributions",
  "bapo_select",
  "dcpo_bounds",
  "dcpo_clip",
  "dcpo_sas",
  "dispo",
  "etr_eps",
  "etr_macro",
  "etr_micro",
  "hapo_entropy_scores",
  "hapo_het",
  "hapo_token_advantages",
  "llds",
  "ppo_clip_bounds",
  "r2vpo_penalty",
]
