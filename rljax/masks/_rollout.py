"""Rollout-mismatch correction: per-token weights from sampler vs trainer.

The rollout engine (vLLM, SGLang) and the trainer compute slightly different
log-probs for the same sampled token. With lr = old_logp - rollout_logp (the
trainer's recomputed behaviour log-prob minus the sampler's), each function
returns a DETACHED float32 weight [..., T] that multiplies the per-token
policy surrogate; it is already multiplied by `mask_BT`, so masked positions
are 0 whatever the log-probs hold there (padding may contain garbage).

Log-ratios are clamped to [-20, 20] before `exp` (verl's SAFETY_BOUND), so no
weight overflows; this changes a value only where |lr| > 20.
"""

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats

_SAFETY_BOUND = 20.0


def _check_band(low: float, high: float) -> None:
  """Raise unless 0 <= low < high."""
  checks.non_negative(low=low)
  if not low < high:
    raise ValueError(f"high must be > low; got low={low!r}, high={high!r}.")


def _log_ratio(old_logp_BT, rollout_logp_BT, mask_BT) -> jax.Array:
  """old - rollout in float32, 0 where the mask is 0 (padding may be NaN)."""
  checks.same_shape(
    ["old_logp_BT", "rollout_logp_BT", "mask_BT"],
    old_logp_BT,
    rollout_logp_BT,
    mask_BT,
  )
  lr = stats.f32(old_logp_BT) - stats.f32(rollout_logp_BT)
  return jnp.where(stats.f32(mask_BT) > 0, lr, 0.0)


def _safe_exp(lr: jax.Array) -> jax.Array:
  return jnp.exp(jnp.clip(lr, -_SAFETY_BOUND, _SAFETY_BOUND))


def _masked(w: jax.Array, mask_BT: ArrayLike) -> jax.Array:
  """w * mask, detached; 0 (not NaN) where the mask is 0."""
  m = stats.f32(mask_BT)
  return jax.lax.stop_gradient(jnp.where(m > 0, w * m, 0.0))


def token_tis(
  old_logp_BT: ArrayLike,
  rollout_logp_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  threshold: float = 2.0,
) -> jax.Array:
  """Truncated importance sampling per token.

  w_t = min(exp(clip(lr_t, -20, 20)), C) * m_t, lr = old_logp - rollout_logp.

  Args:
    old_logp_BT: trainer's recomputed behaviour log-probs, [..., T].
    rollout_logp_BT: the sampler's log-probs of the same tokens, [..., T].
    mask_BT: valid completion tokens (0/1 or weights), [..., T].
    threshold: C, the truncation cap (verl `rollout_is_threshold`, 2.0).

  Returns:
    Detached float32 weights [..., T].

  References:
    Yao et al., "Your efficient RL framework secretly brings you off-policy RL
    training" (2025); verl `compute_rollout_correction_weights`
    (`rollout_is="token"`).
  """
  checks.positive(threshold=threshold)
  lr = _log_ratio(old_logp_BT, rollout_logp_BT, mask_BT)
  return _masked(jnp.minimum(_safe_exp(lr), threshold), mask_BT)


def sequence_tis(
  old_logp_BT: ArrayLike,
  rollout_logp_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  threshold: float = 2.0,
) -> jax.Array:
  """Truncated importance sampling per sequence, broadcast to its tokens.

  w_i = min(exp(clip(sum_t m_t lr_t, -20, 20)), C); w_{i,t} = w_i * m_t.

  Args:
    old_logp_BT: trainer's recomputed behaviour log-probs, [..., T].
    rollout_logp_BT: the sampler's log-probs of the same tokens, [..., T].
    mask_BT: valid completion tokens (0/1 or weights), [..., T].
    threshold: C, the truncation cap (verl `rollout_is_threshold`, 2.0).

  Returns:
    Detached float32 weights [..., T], constant along T within a sequence.

  References:
    verl `compute_rollout_correction_weights` (`rollout_is="sequence"`).
  """
  checks.positive(threshold=threshold)
  lr = _log_ratio(old_logp_BT, rollout_logp_BT, mask_BT)
  seq = stats.masked_sum(lr, mask_BT, axis=-1, keepdims=True)
  w = jnp.minimum(_safe_exp(seq), threshold)
  return _masked(jnp.broadcast_to(w, lr.shape), mask_BT)


def icepop(
  old_logp_BT: ArrayLike,
  rollout_logp_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  low: float = 0.5,
  high: float = 5.0,
) -> jax.Array:
  """IcePop / masked IS: keep rho where it lies in [low, high], else 0.

  rho_t = exp(lr_t); w_t = rho_t * 1[low <= rho_t <= high] * m_t. Unlike TIS,
  tokens outside the band are dropped, not clipped.

  Args:
    old_logp_BT: trainer's recomputed behaviour log-probs, [..., T].
    rollout_logp_BT: the sampler's log-probs of the same tokens, [..., T].
    mask_BT: valid completion tokens (0/1 or weights), [..., T].
    low: alpha, lower bound on rho (OpenRLHF `is_correction_threshold`, 0.5).
    high: beta, upper bound on rho (OpenRLHF, 5.0).

  Returns:
    Detached float32 weights [..., T].

  References:
    Ling Team, "Every Step Evolves: Scaling Reinforcement Learning for
    Trillion-Scale Thinking Model" (Ring-1T), arXiv 2510.18855; OpenRLHF `PolicyLoss`
    (`is_correction_type="icepop"`); TRL `vllm_importance_sampling_mode=
    "token_mask"`.
  """
  _check_band(low, high)
  lr = _log_ratio(old_logp_BT, rollout_logp_BT, mask_BT)
  # The band test uses the unclamped ratio (inf compares fine); only the kept
  # value is clamped, which matters only if high > e^20.
  rho = jnp.exp(lr)
  inside = (rho >= low) & (rho <= high)
  return _masked(jnp.where(inside, _safe_exp(lr), 0.0), mask_BT)


def sequence_masked_tis(
  old_logp_BT: ArrayLike,
  rollout_logp_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  low: float = 0.5,
  high: float = 5.0,
) -> jax.Array:
  """Token IS weights, gated per sequence by the geometric-mean ratio.

  rho_t = exp(lr_t) (not truncated); g_i = exp(sum_t m lr_t / sum_t m);
  w_{i,t} = rho_t * 1[low <= g_i <= high] * m_t.

  Args:
    old_logp_BT: trainer's recomputed behaviour log-probs, [..., T].
    rollout_logp_BT: the sampler's log-probs of the same tokens, [..., T].
    mask_BT: valid completion tokens (0/1 or weights), [..., T].
    low: lower bound on g_i (OpenRLHF `is_correction_threshold`, 0.5).
    high: upper bound on g_i (OpenRLHF, 5.0).

  Returns:
    Detached float32 weights [..., T].

  References:
    OpenRLHF `PolicyLoss` (`is_correction_type="seq-mask-tis"`); verl
    geometric rejection sampling (`rollout_rs="seq_mean_k1"`).
  """
  _check_band(low, high)
  lr = _log_ratio(old_logp_BT, rollout_logp_BT, mask_BT)
  geo = jnp.exp(stats.masked_mean(lr, mask_BT, axis=-1, keepdims=True))
  gate = (geo >= low) & (geo <= high)
  return _masked(jnp.where(gate, _safe_exp(lr), 0.0), mask_BT)


def normalize_weights(weights_BT: ArrayLike, mask_BT: ArrayLike) -> jax.Array:
  """Rescale weights so that their masked mean over the whole batch is 1.

  w <- w / (sum m w / sum m), left unchanged when that mean is <= 1e-8.

  Args:
    weights_BT: importance weights, [..., T].
    mask_BT: valid completion tokens, [..., T].

  Returns:
    Detached float32 weights [..., T] (times the mask).

  References:
    verl `compute_rollout_correction_weights` with
    `rollout_is_batch_normalize=True` (token mode).
  """
  checks.same_shape(["weights_BT", "mask_BT"], weights_BT, mask_BT)
  w = jnp.where(stats.f32(mask_BT) > 0, stats.f32(weights_BT), 0.0)
  mean = stats.masked_mean(w, mask_BT)
  scale = jnp.where(mean > 1e-8, mean, 1.0)
  return _masked(w / scale, mask_BT)
