"""Logit processing before sampling: temperature, top-k, top-p."""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks


def _top_p_threshold(sorted_BV: jax.Array, top_p: ArrayLike) -> jax.Array:
  """[B, 1] the smallest logit inside the nucleus of descending `sorted_BV`."""
  probs = jax.nn.softmax(sorted_BV, axis=-1)
  # A token stays while the mass ranked above it is < top_p; transformers
  # drops it once the ascending cumulative mass is <= 1 - top_p: the same set.
  cum = jnp.cumsum(probs, axis=-1)[..., :-1]
  above = jnp.concatenate([jnp.zeros_like(cum[..., :1]), cum], axis=-1)
  kept = jnp.sum(above < top_p, axis=-1, keepdims=True)  # >= 1
  return jnp.take_along_axis(sorted_BV, kept - 1, axis=-1)


def _process(
  logits_BV: jax.Array,
  temperature: ArrayLike,
  top_k: Optional[int],
  top_p: Optional[ArrayLike],
) -> jax.Array:
  """`process_logits` without checks; temperature and top_p may be traced."""
  z = jnp.asarray(logits_BV, jnp.float32) / temperature
  sorted_z = None
  if top_k is not None:
    sorted_z = jax.lax.top_k(z, min(int(top_k), z.shape[-1]))[0]
    z = jnp.where(z < sorted_z[..., -1:], -jnp.inf, z)
  if top_p is not None:
    if sorted_z is None:
      sorted_z = -jnp.sort(-z, axis=-1)
    # With top-k on, the nucleus lies inside the top-k: sort only those.
    z = jnp.where(z < _top_p_threshold(sorted_z, top_p), -jnp.inf, z)
  return z


def process_logits(
  logits_BV: ArrayLike,
  *,
  temperature: float = 1.0,
  top_k: Optional[int] = None,
  top_p: Optional[float] = None,
) -> jax.Array:
  """Logits of the sampling distribution: tempered, then top-k, then top-p.

  z = logits / temperature; top-k sets z_v = -inf where z_v < (k-th largest
  z); top-p then sets z_v = -inf outside the nucleus: sorted by z
  descending, token v stays iff the softmax mass of the tokens ranked before
  it is < top_p (the smallest set with mass >= top_p). softmax(result) is
  the distribution `generate` samples from. Ties at a threshold are kept.

  Args:
    logits_BV: [..., V] logits.
    temperature: > 0.
    top_k: >= 1, or None to keep all (values above V keep all).
    top_p: in (0, 1]; None or 1.0 keeps all.

  Returns:
    float32 [..., V] processed logits, -inf on removed tokens.

  References:
    transformers ``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
    ``TopPLogitsWarper`` (applied in that order by ``generate``).
  """
  checks.positive(temperature=temperature)
  if top_k is not None:
    checks.positive(top_k=top_k)
  if top_p is not None and not 0 < top_p <= 1:
    raise ValueError(f"top_p must be in (0, 1]; got {top_p!r}.")
  if top_p == 1:  # transformers skips the warper at 1.0 too
    top_p = None
  return _process(jnp.asarray(logits_BV), temperature, top_k, top_p)
