"""The chunked pure-XLA schedule: the CPU default and the fallback everywhere.

Loops (`lax.scan`) over token blocks and, inside, over vocabulary blocks, so
only one [block_n, block_v] tile of logits exists at a time. The forward keeps
an online logsumexp (running max m, sum s = sum exp(z - m), and
t = sum exp(z - m) z, both rescaled when m grows); the backward recomputes each
tile from the saved lse and accumulates d_hidden per token block and d_unembed
in place across token blocks.

Ragged edges without padding: block k starts at min(k b, size - b), so the
last block overlaps the one before it instead of running past the end, and
the rows / columns it repeats are masked out ("stale"). Padding would copy
the [D, V] unembedding, which at a 151,936 vocabulary costs more temporary
memory than everything else here.
"""

import jax
from jax import lax
import jax.numpy as jnp

from pallas_kernels._contract import Stats

F32 = jnp.float32


def _grid(size: int, block: int) -> tuple[int, int]:
  """(block actually used, number of blocks) covering `size`."""
  b = min(block, size)
  return b, -(-size // b)


def _block_start(k, block: int, size: int):
  """(start, fresh) of block k: fresh[i] is False for repeated entries."""
  start = jnp.minimum(k * block, size - block)
  return start, jnp.arange(block) >= k * block - start


def _tile(h_bD, unembed_DV, vstart, bv: int, inv_temp) -> tuple:
  """(logits tile [bn, bv] float32, the unembedding columns used)."""
  w = lax.dynamic_slice_in_dim(unembed_DV, vstart, bv, axis=1)
  z = jnp.dot(h_bD, w, preferred_element_type=F32) * inv_temp
  return z, w


def _online_step(carry, z, fresh_V, onehot):
  """Fold one logits tile into (m, s, t, target_logit)."""
  m, s, t, tl = carry
  z_ok = jnp.where(fresh_V[None, :], z, -jnp.inf)
  m_new = jnp.maximum(m, jnp.max(z_ok, axis=-1))
  e = jnp.exp(z_ok - m_new[:, None])
  scale = jnp.exp(m - m_new)
  s = s * scale + jnp.sum(e, axis=-1)
  # e is 0 on stale columns but z_ok is -inf there: multiply by z instead.
  t = t * scale + jnp.sum(e * z, axis=-1)
  tl = tl + jnp.sum(jnp.where(onehot, z, 0.0), axis=-1)
  return m_new, s, t, tl


def _onehot(targets_b, vstart, fresh_V):
  """[bn, bv] True at each row's target column (fresh columns only)."""
  cols = vstart + jnp.arange(fresh_V.shape[0])
  return (cols[None, :] == targets_b[:, None]) & fresh_V[None, :]


def _block_stats(h_bD, t_b, unembed_DV, inv_temp, bv: int) -> Stats:
  """Stats of one token block, scanning over vocabulary blocks."""
  v = unembed_DV.shape[1]
  nv = -(-v // bv)
  bn = h_bD.shape[0]

  def step(carry, j):
    vstart, fresh = _block_start(j, bv, v)
    z, _ = _tile(h_bD, unembed_DV, vstart, bv, inv_temp)
    return _online_step(carry, z, fresh, _onehot(t_b, vstart, fresh)), None

  zeros = jnp.zeros((bn,), F32)
  init = (jnp.full((bn,), -jnp.inf, F32), zeros, zeros, zeros)
  (m, s, t, tl), _ = lax.scan(step, init, jnp.arange(nv))
  return Stats(tl, m + jnp.log(s), t / s)


def forward(
  hidden_ND, unembed_DV, targets_N, inv_temp, *, block_n=1024, block_v=2048
) -> Stats:
  """Contract forward: online logsumexp over [block_n, block_v] tiles."""
  n = hidden_ND.shape[0]
  bn, nn = _grid(n, block_n)
  bv, _ = _grid(unembed_DV.shape[1], block_v)
  inv_temp = jnp.asarray(inv_temp, F32)

  def step(out, i):
    # Repeated rows are recomputed identically, so plain overwrites are fine.
    start, _ = _block_start(i, bn, n)
    h = lax.dynamic_slice_in_dim(hidden_ND, start, bn)
    t = lax.dynamic_slice_in_dim(targets_N, start, bn)
    stats = _block_stats(h, t, unembed_DV, inv_temp, bv)
    out = [
      lax.dynamic_update_slice_in_dim(o, s, start, 0)
      for o, s in zip(out, stats)
    ]
    return out, None

  out, _ = lax.scan(step, [jnp.zeros((n,), F32)] * 3, jnp.arange(nn))
  return Stats(*out)


def _add_at(acc, update, start, axis: int):
  """acc with `update` added to the block at `start` along `axis`."""
  size = update.shape[axis]
  old = lax.dynamic_slice_in_dim(acc, start, size, axis)
  return lax.dynamic_update_slice_in_dim(acc, old + update, start, axis)


def _dlogits(z, onehot, lse, ez, a, b, fresh_V):
  """dz = a (onehot - p) - b p (z - ez) for one tile, 0 on stale columns."""
  p = jnp.where(fresh_V[None, :], jnp.exp(z - lse[:, None]), 0.0)
  da = a[:, None] * (onehot.astype(F32) - p)
  return da - b[:, None] * p * (z - ez[:, None])


def _block_grads(h_bD, rows, unembed_DV, inv_temp, bv: int, d_unembed):
  """d_hidden of one token block; adds its d_unembed share in place."""
  t_b, lse, ez, a, b = rows
  v = unembed_DV.shape[1]

  def step(carry, j):
    dh, dw = carry
    vstart, fresh = _block_start(j, bv, v)
    z, w = _tile(h_bD, unembed_DV, vstart, bv, inv_temp)
    onehot = _onehot(t_b, vstart, fresh)
    # Scaling the tile by inv_temp here saves a pass over [D, V] at the end.
    dz = _dlogits(z, onehot, lse, ez, a, b, fresh) * inv_temp
    dh = dh + jnp.dot(dz, w.T, preferred_element_type=F32)
    dw_tile = jnp.dot(h_bD.T, dz, preferred_element_type=F32)
    return (dh, _add_at(dw, dw_tile, vstart, 1)), None

  dh0 = jnp.zeros(h_bD.shape, F32)
  (dh, dw), _ = lax.scan(step, (dh0, d_unembed), jnp.arange(-(-v // bv)))
  return dh, dw


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
  block_n=1024,
  block_v=2048,
) -> tuple[jax.Array, jax.Array]:
  """Contract backward: recompute tiles, accumulate both gradients in f32."""
  n, d = hidden_ND.shape
  v = unembed_DV.shape[1]
  bn, nn = _grid(n, block_n)
  bv, _ = _grid(v, block_v)
  inv_temp = jnp.asarray(inv_temp, F32)

  def step(carry, i):
    dh_all, dw = carry
    start, fresh = _block_start(i, bn, n)
    h = lax.dynamic_slice_in_dim(hidden_ND, start, bn)
    rows = [
      lax.dynamic_slice_in_dim(x, start, bn)
      for x in (targets_N, lse_N, ez_N, a_N, b_N)
    ]
    # Zero cotangents on repeated rows so no token is counted twice.
    rows[3:] = [jnp.where(fresh, jnp.asarray(x, F32), 0.0) for x in rows[3:]]
    dh, dw = _block_grads(h, rows, unembed_DV, inv_temp, bv, dw)
    return (_add_at(dh_all, dh, start, 0), dw), None

  init = (jnp.zeros((n, d), F32), jnp.zeros((d, v), F32))
  (dh, dw), _ = lax.scan(step, init, jnp.arange(nn))
  return dh.astype(hidden_ND.dtype), dw.astype(unembed_DV.dtype)
