"""Masked reductions shared by every estimator, loss and metric.

A mask is 0/1 (or a non-negative weight) with the shape of the values. All
reductions compute in float32 whatever the input dtype, so bfloat16 inputs give
float32 statistics, and an empty selection gives 0 rather than NaN.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

Axis = Optional[int | tuple[int, ...]]


def f32(x: ArrayLike) -> jax.Array:
  """`x` as a float32 array (the dtype every statistic is computed in)."""
  return jnp.asarray(x, jnp.float32)


def safe_div(num: ArrayLike, den: ArrayLike) -> jax.Array:
  """num / den where den > 0, else 0; the gradient stays finite at den == 0."""
  num, den = f32(num), f32(den)
  positive = den > 0
  return jnp.where(positive, num / jnp.where(positive, den, 1.0), 0.0)


def masked_sum(
  x: ArrayLike, mask: ArrayLike, axis: Axis = None, keepdims: bool = False
) -> jax.Array:
  return jnp.sum(f32(x) * f32(mask), axis=axis, keepdims=keepdims)


def masked_mean(
  x: ArrayLike, mask: ArrayLike, axis: Axis = None, keepdims: bool = False
) -> jax.Array:
  """Mean of `x` over the entries where `mask` > 0 (weighted by `mask`)."""
  total = masked_sum(x, mask, axis, keepdims)
  count = jnp.sum(f32(mask), axis=axis, keepdims=keepdims)
  return safe_div(total, count)


def masked_var(
  x: ArrayLike,
  mask: ArrayLike,
  axis: Axis = None,
  keepdims: bool = False,
  ddof: int = 1,
) -> jax.Array:
  """Variance over the masked entries; `ddof=1` is Bessel's (unbiased) form.

  Returns 0 where fewer than `ddof + 1` entries are selected.
  """
  mean = masked_mean(x, mask, axis, keepdims=True)
  sq = jnp.square(f32(x) - mean)
  count = jnp.sum(f32(mask), axis=axis, keepdims=keepdims)
  return safe_div(masked_sum(sq, mask, axis, keepdims), count - ddof)


def masked_std(
  x: ArrayLike,
  mask: ArrayLike,
  axis: Axis = None,
  keepdims: bool = False,
  ddof: int = 1,
) -> jax.Array:
  return safe_sqrt(masked_var(x, mask, axis, keepdims, ddof))


def safe_sqrt(x: ArrayLike) -> jax.Array:
  """sqrt(x) whose gradient is 0 rather than NaN at x == 0."""
  x = f32(x)
  positive = x > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def sequence_lengths(mask_BT: ArrayLike) -> jax.Array:
  """Number of valid tokens per sequence, [...] from a [..., T] mask."""
  return jnp.sum(f32(mask_BT), axis=-1)
