"""Reward shaping: transforms of outcome or per-token rewards.

Pure array functions that run on the host (numpy inputs) or on device under
`jax.jit`. Outcome rewards have any shape ([P, G], [B], ...); per-token
rewards are [..., T]. Results are float32 whatever the input dtype.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats


def overlong_penalty(
  lengths_B: ArrayLike, *, max_length: int, buffer: int, factor: float = 1.0
) -> jax.Array:
  """DAPO soft overlong punishment, to ADD to the outcome reward.

  p(L) = -factor * min(max(L - (L_max - b), 0), b) / b: 0 up to L_max - b
  tokens, then linear down to -factor at L_max (and -factor beyond).

  Args:
    lengths_B: completion lengths in tokens (e.g. `stats.sequence_lengths`).
    max_length: L_max, the generation limit in tokens.
    buffer: b in (0, max_length], the length of the penalty ramp (verl
      `overlong_buffer.len`, OpenRLHF `--reward.overlong_buffer_len`; DAPO
      scripts use 4096 with L_max = 20480).
    factor: the penalty at L_max (verl/OpenRLHF `penalty_factor`, 1.0).

  Returns:
    float32 penalties (<= 0) with the shape of `lengths_B`.

  References:
    Yu et al., "DAPO", arXiv 2503.14476; verl `DAPORewardManager`, OpenRLHF
    `apply_overlong_penalty`.
  """
  checks.positive(max_length=max_length, buffer=buffer)
  if buffer > max_length:
    raise ValueError(
      f"buffer must be in (0, max_length={max_length!r}]; got {buffer!r}."
    )
  checks.non_negative(factor=factor)
  exceed = stats.f32(lengths_B) - (max_length - buffer)
  return -factor * jnp.clip(exceed, 0.0, buffer) / buffer


def stop_properly_penalty(
  rewards_B: ArrayLike, truncated_B: ArrayLike, *, coef: float
) -> jax.Array:
  """ProRL "stop properly" penalty for completions that hit the length limit.

  For truncated samples r <- coef * r if 0 <= coef <= 1, r <- coef if
  coef < 0; other samples keep r.

  Args:
    rewards_B: outcome rewards, any shape.
    truncated_B: bool or 0/1 of the same shape (finish_reason == "length").
    coef: the scale in [0, 1] or the replacement reward (< 0) (OpenRLHF
      `--reward.stop_properly_penalty_coef`).

  Returns:
    float32 rewards with the shape of `rewards_B`.

  References:
    Liu et al., "ProRL", arXiv 2505.24864; OpenRLHF
    `apply_stop_properly_penalty`.
  """
  if not coef <= 1.0:
    raise ValueError(
      f"coef must be <= 1 (a scale in [0, 1], or a negative replacement"
      f" reward); got {coef!r}."
    )
  checks.same_shape(["rewards_B", "truncated_B"], rewards_B, truncated_B)
  r = stats.f32(rewards_B)
  shaped = coef * r if coef >= 0 else jnp.full_like(r, coef)
  return jnp.where(jnp.asarray(truncated_B) != 0, shaped, r)


def weighted_sum(
  rewards_BK: ArrayLike, weights: ArrayLike | None = None
) -> jax.Array:
  """Combine K reward functions: R = sum_k w_k r_k, NaN terms count as 0.

  A reward function that does not apply to a sample reports NaN (TRL's None);
  like TRL's `nansum` it then contributes nothing.

  Args:
    rewards_BK: rewards of K functions, [..., K].
    weights: w, shape [K]; default all ones (TRL `reward_weights`).

  Returns:
    float32 rewards [...].

  References:
    TRL `GRPOTrainer._generate_and_score_completions` (`reward_weights`).
  """
  if jnp.ndim(rewards_BK) < 1:
    raise ValueError("rewards_BK must have a last axis K (reward functions).")
  r = stats.f32(rewards_BK)
  k = r.shape[-1]
  w = jnp.ones((k,), jnp.float32) if weights is None else stats.f32(weights)
  if w.shape != (k,):
    raise ValueError(
      f"weights must have shape ({k},), one per reward function (the last"
      f" axis of rewards_BK {r.shape}); got {w.shape}."
    )
  terms = r * w.reshape((1,) * (r.ndim - 1) + (k,))
  return jnp.sum(jnp.where(jnp.isnan(r), 0.0, terms), axis=-1)


def kl_in_reward(
  token_rewards_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  ref_logp_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  coef: ArrayLike,
  estimator: Callable[[jax.Array, jax.Array], jax.Array],
) -> jax.Array:
  """Fold a KL penalty into per-token rewards: r_t - beta * KL_t * m_t.

  KL_t = estimator(l^old_t, l^ref_t). Everything is detached: the penalty
  enters the advantages, not the loss gradient.

  Args:
    token_rewards_BT: per-token rewards (scores), [..., T].
    old_logp_BT: behaviour-policy log-probs recomputed by the trainer.
    ref_logp_BT: reference-policy log-probs, [..., T].
    mask_BT: valid completion tokens, [..., T].
    coef: beta >= 0 (verl `kl_ctrl.kl_coef` 0.001, OpenRLHF
      `--algo.kl.init_coef` 0.01); may be a traced scalar (adaptive control).
    estimator: (logp_BT, ref_logp_BT) -> per-token KL; verl and OpenRLHF
      default to k1 (logp - ref_logp) here.

  Returns:
    Detached float32 token rewards [..., T].

  References:
    verl `apply_kl_penalty`; OpenRLHF `compute_reward`.
  """
  if isinstance(coef, (int, float)):
    checks.non_negative(coef=coef)
  checks.same_shape(
    ["token_rewards_BT", "old_logp_BT", "ref_logp_BT", "mask_BT"],
    token_rewards_BT,
    old_logp_BT,
    ref_logp_BT,
    mask_BT,
  )
  sg = jax.lax.stop_gradient
  kl = stats.f32(
    estimator(sg(stats.f32(old_logp_BT)), sg(stats.f32(ref_logp_BT)))
  )
  m = stats.f32(mask_BT)
  kl = jnp.where(m > 0, kl * m, 0.0)
  return sg(stats.f32(token_rewards_BT) - stats.f32(coef) * kl)


def clip_rewards(
  rewards: ArrayLike, *, low: float = -10.0, high: float = 10.0
) -> jax.Array:
  """Clip rewards to [low, high].

  Args:
    rewards: rewards of any shape.
    low: lower bound (OpenRLHF `--reward.clip_range`, -10).
    high: upper bound (OpenRLHF, 10).

  Returns:
    float32 rewards clipped elementwise.

  References:
    OpenRLHF `--reward.clip_range`; TRL RLOO `reward_clip_range`.
  """
  if not low < high:
    raise ValueError(f"high must be > low; got low={low!r}, high={high!r}.")
  return jnp.clip(stats.f32(rewards), low, high)
