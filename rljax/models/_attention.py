"""Attention: grouped-query attention over key parts, who attends to whom,
and where each layer's keys / values are read and written.

`attention_view` builds, once per forward, the masks and the cache I/O that
every layer of `rljax.models.Transformer.hidden_states` shares: a plain
causal forward, a dense or windowed `KVCache`, a `PagedCache`, a read-only
shared ``prefix`` and packed segments. Shapes: B batch, S new tokens, T
keys, H query heads, N key/value heads, K head dim.
"""

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import _window
from rljax.models._config import ModelConfig


def softcap(x: jax.Array, cap: Optional[float]) -> jax.Array:
  """``cap * tanh(x / cap)`` (Gemma 2's soft-capping); x when cap is None."""
  return x if cap is None else cap * jnp.tanh(x / cap)


def _part_scores(q_BSNGK, part_PTNK) -> jax.Array:
  """[B, N, G, S, T] scores against one key part. A part of P < B rows is
  shared: row p serves query rows [p B/P, (p + 1) B/P), by broadcasting
  in the einsum (never copied B/P times)."""
  b, p = q_BSNGK.shape[0], part_PTNK.shape[0]
  if p == b:
    return jnp.einsum("bsngk,btnk->bngst", q_BSNGK, part_PTNK)
  q = q_BSNGK.reshape(p, b // p, *q_BSNGK.shape[1:])
  scores = jnp.einsum("pcsngk,ptnk->pcngst", q, part_PTNK)
  return scores.reshape(b, *scores.shape[2:])


def _part_values(probs_BNGST, part_PTNK) -> jax.Array:
  """[B, S, N, G, K] the probability-weighted values of one part (a part
  of P < B rows is shared, as in `_part_scores`)."""
  b, p = probs_BNGST.shape[0], part_PTNK.shape[0]
  if p == b:
    return jnp.einsum("bngst,btnk->bsngk", probs_BNGST, part_PTNK)
  probs = probs_BNGST.reshape(p, b // p, *probs_BNGST.shape[1:])
  out = jnp.einsum("pcngst,ptnk->pcsngk", probs, part_PTNK)
  return out.reshape(b, *out.shape[2:])


def attention(
  q_BSHK, k_BTNK, v_BTNK, allowed_BST, scale=None, cap=None
) -> jax.Array:
  """Grouped-query attention; softmax in float32.

  Scores are q.k times `scale` (1 / sqrt(K) when None), then soft-capped
  at `cap` when it is set (Gemma 2).

  Keys and values may come in parts (a tuple, e.g. a paged cache's view
  and the new tokens): one softmax over all parts, without concatenating
  them. A part with fewer rows than the queries is shared by consecutive
  query rows (a prompt's keys for its G completions, Prefix Grouper).
  """
  ks = k_BTNK if isinstance(k_BTNK, tuple) else (k_BTNK,)
  vs = v_BTNK if isinstance(v_BTNK, tuple) else (v_BTNK,)
  b, s, h, k = q_BSHK.shape
  n = ks[0].shape[2]
  q = q_BSHK.reshape(b, s, n, h // n, k)
  scores = jnp.concatenate(
    [_part_scores(q, part) for part in ks], axis=-1
  ).astype(jnp.float32)
  scores = scores / math.sqrt(k) if scale is None else scores * scale
  scores = softcap(scores, cap)
  scores = jnp.where(
    allowed_BST[:, None, None], scores, jnp.finfo(jnp.float32).min
  )
  probs = jax.nn.softmax(scores, axis=-1).astype(vs[0].dtype)
  bounds = np.cumsum([0] + [part.shape[1] for part in vs])
  out = sum(
    _part_values(probs[..., lo:hi], part)
    for lo, hi, part in zip(bounds[:-1], bounds[1:], vs)
  )
  return out.reshape(b, s, h, k)


def dense_io(slots):
  """Write new keys / values at cache slots [slots, slots + S) of every row,
  then read the layer's whole cache back."""

  def io(i, k_all, v_all, k, v):
    """(k, v to attend, updated k_all, v_all, None)."""
    start = (i, 0, slots, 0, 0)
    k_all = jax.lax.dynamic_update_slice(
      k_all, k.astype(k_all.dtype)[None], start
    )
    v_all = jax.lax.dynamic_update_slice(
      v_all, v.astype(v_all.dtype)[None], start
    )
    k = jax.lax.dynamic_index_in_dim(k_all, i, keepdims=False)
    v = jax.lax.dynamic_index_in_dim(v_all, i, keepdims=False)
    return k, v, k_all, v_all, None

  return io


def _by_shard(x, d: int):
  """[B, ...] -> [D, B / D, ...]: rows ``[d B/D, (d + 1) B/D)`` use pool
  shard d."""
  return x.reshape(d, x.shape[0] // d, *x.shape[1:])


def _shard_index(d: int, ndim: int) -> jax.Array:
  """[D, 1, ...] (`ndim` axes) the shard of each block of rows: an iota
  along the axis that the pool's shard axis pairs with, so XLA's SPMD
  partitioner sees both as one parallel axis and each device reads and
  writes its own pages (an index computed from the row, such as
  row // (B / D), hides that: the partitioner then built every row's new
  keys on every device and all-reduced them, 9 GiB a chip for Qwen3-8B's
  prefill on 64 chips)."""
  return jax.lax.broadcasted_iota(jnp.int32, (d,) + (1,) * (ndim - 1), 0)


def paged_io(pages_BM):
  """Read each row's cached keys / values from its pages as a logical
  [B, M * page_size, N, K] view and put the new ones after it; the new ones
  are returned to be written into the pages after the last layer.

  Reading before writing keeps the pool read-only inside the layer scan.
  Gathers and scatters index the shard, page and offset axes directly
  (a `jax.vmap` over the shard axis made XLA copy the whole pool at every
  write on CPU).
  """

  def io(i, k_all, v_all, k, v):
    d = k_all.shape[1]
    pages = _by_shard(pages_BM, d)  # [D, B/D, M]

    def read(x_all):
      x = x_all.at[i, _shard_index(d, 3), pages].get(mode="promise_in_bounds")
      # [D, B/D, M, size, N, K] -> [B, M * size, N, K]
      return x.reshape(pages_BM.shape[0], -1, *x.shape[4:])

    new = (k.astype(k_all.dtype), v.astype(v_all.dtype))
    return (read(k_all), new[0]), (read(v_all), new[1]), k_all, v_all, new

  return io


def write_pages(pool, new_LBSNK, page_BS, offset_BS):
  """Scatter every layer's new keys (or values) into their pages, in place."""
  d = pool.shape[1]
  layers, rows = new_LBSNK.shape[:2]
  new = new_LBSNK.reshape(layers, d, rows // d, *new_LBSNK.shape[2:])
  return pool.at[
    :, _shard_index(d, 3), _by_shard(page_BS, d), _by_shard(offset_BS, d)
  ].set(new, mode="promise_in_bounds")


class AttentionView(NamedTuple):
  """What every layer attends with: the masks of allowed keys, the cache
  I/O, and what the updated cache needs after the last layer."""

  allowed: jax.Array  # bool [B, S, T] keys each new token attends to
  allowed_local: Optional[jax.Array]  # the same within the sliding window
  io: Any  # stores a layer's new keys / values, gives back those to attend
  windowed: bool  # a windowed KVCache (`_window.Windowed` io)
  key_mask: Optional[jax.Array]  # a dense cache's updated slot mask
  slot_BS: Optional[jax.Array]  # paged: each new token's logical slot
  page_BS: Optional[jax.Array]  # paged: the page it is written to


def attention_view(
  config: ModelConfig,
  mask,
  segments,
  cache,
  cache_index,
  prefix,
  *,
  paged: bool,
  windowed: bool,
) -> AttentionView:
  """The masks and cache I/O of a forward (`Transformer.hidden_states`)."""
  c = config
  slot_BS = page_BS = key_mask = None
  if paged:
    allowed, io, q_slots, k_slots, slot_BS, page_BS = _paged_view(cache, mask)
  else:
    allowed, io, q_slots, k_slots, key_mask = _dense_view(
      cache, cache_index, mask, segments
    )
  if prefix is not None:
    allowed, q_slots, k_slots = _after_prefix(
      prefix.mask, allowed, q_slots, k_slots
    )
  allowed_local = None
  if any(c.sliding_layers):
    allowed_local = allowed & _window.within_window(
      q_slots, k_slots, c.sliding_window
    )
  if windowed:
    ring = _window.ring_masks(
      cache.mask, mask, cache_index, cache.k_local.shape[2]
    )
    io = _window.Windowed(
      _window.windowed_io(
        dense_io(cache_index),
        cache_index,
        allowed,
        ring,
        all(c.sliding_layers),
      )
    )
  return AttentionView(
    allowed, allowed_local, io, windowed, key_mask, slot_BS, page_BS
  )


def _paged_view(cache, mask):
  """A `PagedCache`'s masks, I/O and slots: (allowed, io, query slots, key
  slots, each new token's slot, its page)."""
  b, s = mask.shape
  # Logical slot of each new token; padding goes to scratch page 0.
  size = cache.k.shape[3]
  slot_BS = cache.lengths_B[:, None] + jnp.arange(s)[None]
  block = jnp.minimum(slot_BS // size, cache.pages_BM.shape[1] - 1)
  page_BS = jnp.where(
    mask > 0, jnp.take_along_axis(cache.pages_BM, block, axis=1), 0
  )
  io = paged_io(cache.pages_BM)
  # Cached keys before the row's length, then the new ones causally.
  key_slots = jnp.arange(cache.pages_BM.shape[1] * size)
  cached = key_slots[None, None, :] < cache.lengths_B[:, None, None]
  causal = jnp.arange(s)[None, :] <= jnp.arange(s)[:, None]
  fresh = causal[None] & (mask[:, None, :] > 0)
  allowed = jnp.concatenate(
    [jnp.broadcast_to(cached, (b, s, key_slots.size)), fresh], axis=-1
  )
  q_slots = slot_BS
  k_slots = jnp.concatenate(
    [jnp.broadcast_to(key_slots, (b, key_slots.size)), slot_BS], axis=1
  )
  return allowed, io, q_slots, k_slots, slot_BS, page_BS


def _dense_view(cache, cache_index, mask, segments):
  """The masks, I/O and slots without a cache or with a dense `KVCache`:
  (allowed, io, query slots, key slots, the cache's updated slot mask)."""
  s = mask.shape[1]
  if cache is None:
    key_mask, query_slots, key_slots = mask, jnp.arange(s), jnp.arange(s)
  else:
    key_mask = jax.lax.dynamic_update_slice(cache.mask, mask, (0, cache_index))
    query_slots = cache_index + jnp.arange(s)
    key_slots = jnp.arange(cache.mask.shape[1])
  causal = key_slots[None, :] <= query_slots[:, None]  # [S, S_keys]
  allowed = causal[None] & (key_mask[:, None, :] > 0)
  if segments is not None:
    allowed = allowed & (segments[:, :, None] == segments[:, None, :])
  io = dense_io(cache_index)
  return allowed, io, query_slots[None], key_slots[None], key_mask


def _after_prefix(prefix_mask_PS, allowed, q_slots, k_slots):
  """The masks and slots with a shared ``prefix`` attended first."""
  b, s = allowed.shape[:2]
  shared = shared_rows(prefix_mask_PS, b)[:, None, :] > 0
  shared = jnp.broadcast_to(shared, (b, s, shared.shape[-1]))
  allowed = jnp.concatenate([shared, allowed], axis=-1)
  # The new tokens continue the prefix's slots (its real tokens end at
  # its last slot: prompts are left-padded).
  width = prefix_mask_PS.shape[1]
  q_slots = q_slots + width
  k_slots = jnp.concatenate([jnp.arange(width)[None], k_slots + width], 1)
  return allowed, q_slots, k_slots


def shared_rows(prefix_mask_PS: jax.Array, rows: int) -> jax.Array:
  """[B, S] the prefix mask seen by each of `rows` query rows."""
  return jnp.repeat(prefix_mask_PS, rows // prefix_mask_PS.shape[0], axis=0)
