"""Token selection: 0/1 masks that decide which tokens train the policy.

Each function returns a DETACHED float32 mask [..., T], already multiplied by
`mask_BT` (0 wherever the input mask is 0). Multiply it into the policy term;
whether the loss normaliser also changes is the caller's choice (TRL keeps
the normaliser for the entropy and off-policy masks).
"""

import fractions

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import sharding
from rljax._src import stats


def _valid(mask_BT: ArrayLike) -> jax.Array:
  return stats.f32(mask_BT) > 0


def _masked(keep: jax.Array, mask_BT: ArrayLike) -> jax.Array:
  """keep * mask as detached float32 (0 where the mask is 0)."""
  m = stats.f32(mask_BT)
  return jax.lax.stop_gradient(jnp.where(keep & (m > 0), m, 0.0))


def _quantile_index(q, m: jax.Array) -> tuple[jax.Array, jax.Array]:
  """floor(q * m) and its fraction, exact in int32.

  A static q is its nearest fraction with denominator <= 10^4; a traced q
  (a schedule) is rounded to a multiple of 10^-4.
  """
  # In float32, q * m drifts once m is large (with 10^6 tokens the fraction is
  # off by ~0.03; past 2^24 tokens even the index); a rational q stays exact.
  if isinstance(q, (int, float)):
    ratio = fractions.Fraction(q).limit_denominator(10_000)
    num, den = ratio.numerator, ratio.denominator
  else:
    den = 10_000
    num = jnp.clip(jnp.round(stats.f32(q) * den), 0, den).astype(jnp.int32)
  whole, rest = jnp.divmod(m, den)
  lo = num * whole + (num * rest) // den
  return lo, ((num * rest) % den).astype(jnp.float32) / den


def _masked_quantile(x: ArrayLike, valid: jax.Array, q) -> jax.Array:
  """Linear-interpolation quantile (numpy default) of x[valid], static shapes.

  Invalid entries sort last as +inf; the interpolation position q * (n - 1)
  uses the traced count n of valid entries (hi never reaches a pad while
  n > 0). Returns NaN when n == 0, which no comparison keeps.
  """
  padded = jnp.where(valid, stats.f32(x), jnp.inf)
  ordered = jnp.sort(sharding.replicated(padded).reshape(-1))
  n = jnp.sum(valid, dtype=jnp.int32)
  last = jnp.maximum(n - 1, 0)
  lo, frac = _quantile_index(q, last)
  hi = jnp.minimum(lo + 1, last)
  a, b = ordered[lo], ordered[hi]
  return a + frac * (b - a)


def top_entropy_mask(
  entropy_BT: ArrayLike, mask_BT: ArrayLike, *, keep_fraction: float = 0.2
) -> jax.Array:
  """Keep the highest-entropy tokens ("80/20 rule", forking tokens).

  tau = quantile_{1 - rho}(H over ALL valid tokens of the batch) with linear
  interpolation (numpy / torch.quantile); keep_t = 1[H_t >= tau] * m_t.
  The quantile is taken over every leading axis together (TRL gathers the
  entropies of all processes), so call it on the whole batch.

  The interpolation position q * (n - 1) is computed exactly in integer
  arithmetic, for any number of tokens (numpy uses float64, e.g. 0.3 * 10 =
  3.0000000000000004, which moves tau by ~1e-16 of a gap: below float32
  resolution, so the kept tokens are the same).

  Args:
    entropy_BT: per-token policy entropies, [..., T] (treated as constants).
    mask_BT: valid completion tokens, [..., T].
    keep_fraction: rho in (0, 1], the fraction of valid tokens kept (paper:
      0.2; TRL `top_entropy_quantile`, whose default 1.0 keeps every token).

  Returns:
    Detached float32 0/1 mask [..., T] (times the mask).

  References:
    Wang et al., "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
    Effective Reinforcement Learning for LLM Reasoning", arXiv 2506.01939;
    TRL `GRPOTrainer.get_high_entropy_mask`.
  """
  checks.positive(keep_fraction=keep_fraction)
  checks.in_range("keep_fraction", keep_fraction, 0.0, 1.0)
  checks.same_shape(["entropy_BT", "mask_BT"], entropy_BT, mask_BT)
  h = stats.f32(jax.lax.stop_gradient(entropy_BT))
  valid = _valid(mask_BT)
  tau = _masked_quantile(h, valid, 1.0 - keep_fraction)
  return _masked(h >= tau, mask_BT)


def off_policy_sequence_mask(
  logp_BT: ArrayLike,
  sampler_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  delta: float = 0.5,
) -> jax.Array:
  """Drop negative-advantage sequences that drifted too far off-policy.

  M_i = 1[A_i >= 0 or (1/n_i) sum_t m (l^samp_t - sg[l_t]) <= delta], with
  A_i the masked mean of `adv_BT` over T; broadcast to the tokens.

  Args:
    logp_BT: current-policy log-probs l, [..., T] (no gradient flows).
    sampler_logp_BT: log-probs of the sampler l^samp (the rollout engine's,
      else the recomputed behaviour policy's), [..., T].
    adv_BT: advantages, [..., T] (a per-sequence value broadcast over T).
    mask_BT: valid completion tokens, [..., T].
    delta: the KL threshold (TRL `off_policy_mask_threshold`; its docs
      suggest 0.5).

  Returns:
    Detached float32 0/1 mask [..., T] (times the mask).

  References:
    DeepSeek-AI, "DeepSeek-V3.2: Pushing the Frontier of Open Large Language
    Models", arXiv 2512.02556; TRL `GRPOTrainer.get_off_policy_mask`.
  """
  checks.same_shape(
    ["logp_BT", "sampler_logp_BT", "adv_BT", "mask_BT"],
    logp_BT,
    sampler_logp_BT,
    adv_BT,
    mask_BT,
  )
  valid = _valid(mask_BT)
  kl = stats.f32(sampler_logp_BT) - stats.f32(jax.lax.stop_gradient(logp_BT))
  kl = jnp.where(valid, kl, 0.0)
  seq_kl = stats.masked_mean(kl, mask_BT, axis=-1, keepdims=True)
  adv = jnp.where(valid, stats.f32(adv_BT), 0.0)
  seq_adv = stats.masked_mean(adv, mask_BT, axis=-1, keepdims=True)
  keep = (seq_adv >= 0) | (seq_kl <= delta)
  return _masked(jnp.broadcast_to(keep, valid.shape), mask_BT)


def truncated_mask(truncated_B: ArrayLike, mask_BT: ArrayLike) -> jax.Array:
  """Zero the whole mask of completions that hit the length limit.

  m'_{i,t} = m_{i,t} * (1 - 1[truncated_i]).

  Args:
    truncated_B: bool or 0/1 per completion (no EOS / finish_reason ==
      "length"), shape mask_BT.shape[:-1].
    mask_BT: valid completion tokens, [..., T].

  Returns:
    Detached float32 mask [..., T].

  References:
    DAPO (overlong filtering), arXiv 2503.14476; TRL
    `mask_truncated_completions`.
  """
  checks.rank(
    "truncated_B", truncated_B, jnp.ndim(mask_BT) - 1, "mask_BT without T"
  )
  checks.leading_shape(
    "mask_BT", mask_BT, jnp.shape(truncated_B), of="truncated_B"
  )
  kept = jnp.asarray(truncated_B) == 0
  return _masked(jnp.broadcast_to(kept[..., None], jnp.shape(mask_BT)), mask_BT)
