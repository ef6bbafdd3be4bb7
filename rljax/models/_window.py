"""Sliding-window attention (Gemma 2 / 3): the window mask, and the ring
buffers a windowed `KVCache` keeps for sliding-window layers.

Slots are cache slots (or token indices without a cache). A row's real
tokens occupy consecutive slots (a left-padded prompt, then what follows),
so a window of W slots is the row's last W tokens, as in transformers'
sliding-window mask. Shapes: B batch, S new tokens, T keys, W window
slots, N key/value heads, K head dim.
"""

from collections.abc import Callable
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


def within_window(q_slots, k_slots, window: int) -> jax.Array:
  """[B or 1, S, T] whether each key slot is one of the `window` slots up to
  and including the query's (HF's sliding-window mask). A row's real
  tokens occupy consecutive slots (left-padded prompt, then what follows),
  so this is its last `window` tokens."""
  return q_slots[:, :, None] - k_slots[:, None, :] < window


def store_index(sliding: tuple[bool, ...]) -> np.ndarray:
  """[L] each layer's index among the layers of its kind (full or sliding):
  where a windowed `KVCache` keeps it."""
  seen = {True: 0, False: 0}
  out = []
  for x in sliding:
    out.append(seen[x])
    seen[x] += 1
  return np.asarray(out, np.int32)


def ring_masks(cache_mask_BM, mask_BS, slots, width: int):
  """[B, S, W + S] what the new tokens at slots [slots, slots + S) may
  attend in a sliding-window layer: its ring buffer of `width` slots
  (before the write; ring slot r holds the latest slot a < `slots` with
  a = r mod W), then the new tokens themselves (causal, in the window)."""
  q = slots + jnp.arange(mask_BS.shape[1])
  held = slots - 1 - (slots - 1 - jnp.arange(width)) % width  # [W]
  real = jnp.take(cache_mask_BM, jnp.maximum(held, 0), axis=1) > 0
  ring = (held >= 0)[None] & real  # [B, W]
  ring = ring[:, None, :] & (q[:, None] - held[None, :] < width)[None]
  fresh = (q[None, :] <= q[:, None]) & (q[:, None] - q[None, :] < width)
  fresh = fresh[None] & (mask_BS[:, None, :] > 0)
  return jnp.concatenate([ring, fresh], axis=-1)


def _ring_write(ring, j, new_BSNK, slots):
  """Write the last min(S, W) new keys (or values) at their ring slots
  (slot mod W) of sliding layer j, in place."""
  s, width = new_BSNK.shape[1], ring.shape[2]
  n = min(s, width)
  at = (slots + s - n + jnp.arange(n)) % width
  rows = jnp.arange(ring.shape[1])[:, None]
  new = new_BSNK[:, s - n :].astype(ring.dtype)
  return ring.at[j, rows, at[None]].set(new, mode="promise_in_bounds")


def windowed_io(dense_io, slots, full_allowed, ring_allowed, all_sliding: bool):
  """The io of a windowed `KVCache`: a full layer reads and writes its
  [max_length] slots through `dense_io` (the decoder's), a sliding one its
  ring buffer (a `lax.cond` on the scanned flag picks the store). Returns
  (attention, stores)."""

  def full(j, attend, k, v, stores):
    k_all, v_all, k_ring, v_ring = stores
    k, v, k_all, v_all, _ = dense_io(j, k_all, v_all, k, v)
    return attend(k, v, full_allowed), (k_all, v_all, k_ring, v_ring)

  def local(j, attend, k, v, stores):
    k_all, v_all, k_ring, v_ring = stores
    ring = (
      jax.lax.dynamic_index_in_dim(k_ring, j, keepdims=False),
      jax.lax.dynamic_index_in_dim(v_ring, j, keepdims=False),
    )
    out = attend((ring[0], k), (ring[1], v), ring_allowed)
    k_ring = _ring_write(k_ring, j, k, slots)
    v_ring = _ring_write(v_ring, j, v, slots)
    return out, (k_all, v_all, k_ring, v_ring)

  def io(j, sliding, stores, k, v, attend):
    if all_sliding:
      return local(j, attend, k, v, stores)
    return jax.lax.cond(
      sliding,
      functools.partial(local, j, attend, k, v),
      functools.partial(full, j, attend, k, v),
      stores,
    )

  return io


class Windowed(NamedTuple):
  """`_layer`'s io for a windowed `KVCache` (see `windowed_io`)."""

  io: Callable
