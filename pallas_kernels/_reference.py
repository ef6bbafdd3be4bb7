"""The dense reference schedule: materialises the [N, V] logits.

This is the oracle every other schedule is tested against, written as plainly
as possible. `logprob_entropy` is differentiated by ordinary autodiff (the
"dense" schedule of the public API); `forward` / `backward` implement the
contract (`pallas_kernels._contract`) with the backward formula written out,
so the formula itself is checked against autodiff.
"""

import jax
import jax.numpy as jnp

from pallas_kernels._contract import Stats


def _logits(hidden_ND, unembed_DV, inv_temp) -> jax.Array:
  """z = (hidden @ unembed) * inv_temp in float32, [N, V]."""
  h = jnp.asarray(hidden_ND, jnp.float32)
  w = jnp.asarray(unembed_DV, jnp.float32)
  return jnp.dot(h, w) * jnp.asarray(inv_temp, jnp.float32)


def _target_logit(z_NV: jax.Array, targets_N) -> jax.Array:
  """z[n, targets[n]]."""
  idx = jnp.asarray(targets_N)[:, None]
  return jnp.take_along_axis(z_NV, idx, axis=-1)[:, 0]


def logprob_entropy(
  hidden_ND, unembed_DV, targets_N, inv_temp
) -> tuple[jax.Array, jax.Array]:
  """Dense (logp_N, entropy_N) of softmax((hidden @ unembed) * inv_temp).

    logp = z[target] - logsumexp(z),  entropy = -sum_j p_j log p_j

  Args:
    hidden_ND: [N, D]; unembed_DV: [D, V]; targets_N: [N] int ids;
    inv_temp: 1 / temperature, scalar.

  Returns:
    (logp_N, entropy_N), float32.
  """
  z = _logits(hidden_ND, unembed_DV, inv_temp)
  logp_NV = jax.nn.log_softmax(z, axis=-1)
  entropy = -jnp.sum(jnp.exp(logp_NV) * logp_NV, axis=-1)
  return _target_logit(logp_NV, targets_N), entropy


def forward(
  hidden_ND, unembed_DV, targets_N, inv_temp, *, block_n=None, block_v=None
) -> Stats:
  """Contract forward, dense (block sizes are ignored)."""
  del block_n, block_v
  z = _logits(hidden_ND, unembed_DV, inv_temp)
  lse = jax.nn.logsumexp(z, axis=-1)
  ez = jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
  return Stats(_target_logit(z, targets_N), lse, ez)


def backward(
  hidden_ND,
  unembed_DV,
  targets_N,
  inv_temp,
  lse_N,
  ez_N,
  a_N,
  b_N,
  *,
  block_n=None,
  block_v=None,
) -> tuple[jax.Array, jax.Array]:
  """Contract backward, dense, with dz written out (block sizes ignored)."""
  del block_n, block_v
  z = _logits(hidden_ND, unembed_DV, inv_temp)
  p = jnp.exp(z - lse_N[:, None])
  onehot = jax.nn.one_hot(targets_N, z.shape[-1], dtype=jnp.float32)
  dz = a_N[:, None] * (onehot - p) - b_N[:, None] * p * (z - ez_N[:, None])
  dz = dz * jnp.asarray(inv_temp, jnp.float32)
  w = jnp.asarray(unembed_DV, jnp.float32)
  d_hidden = jnp.dot(dz, w.T).astype(jnp.result_type(hidden_ND))
  d_unembed = jnp.dot(jnp.asarray(hidden_ND, jnp.float32).T, dz)
  return d_hidden, d_unembed.astype(jnp.result_type(unembed_DV))
