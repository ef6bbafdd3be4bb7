"""The decoder: embeddings, a `lax.scan` over stacked layers, the LM head.

Layer weights are stacked on a leading layer axis L, so the scan compiles one
layer whatever the depth (or `ModelConfig.scan_unroll` layers). Every parameter carries ``logical_axes`` metadata
(e.g. ``("layers", "embed", "heads", "head_dim")``) that `rljax.sharding`
maps to mesh axes. Shapes: B batch, S sequence (or new tokens), D width,
H query heads, N key/value heads, K head dim, F MLP width, V vocabulary.

Padding: ``attention_mask_BS`` is 1 on real tokens and 0 on padding (prompts
are left-padded). Padding keys are never attended to, and positions count
real tokens only, so a padded row computes exactly what it would alone.
Who attends to whom, and the caches' reads and writes, are `_attention`'s.
"""

import math
from typing import NamedTuple, Optional

from flax import nnx
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax.models import _attention
from rljax.models import _lora
from rljax.models import _moe
from rljax.models import _window
from rljax.models._config import REMAT_POLICIES
from rljax.models._config import LinearRopeScaling
from rljax.models._config import ModelConfig
from rljax.sharding._rules import BATCH_AXES
from rljax.sharding._rules import _axis_size


class KVCache(NamedTuple):
  """Keys and values of every layer for `max_length` slots.

  Windowed (``k_local`` set, see `init_cache`): ``k`` / ``v`` hold the
  full-attention layers only, in layer order, and each sliding-window layer
  keeps a ring buffer of W = min(sliding_window, max_length) slots: slot s
  lives at ring slot s % W, so its memory does not grow with max_length.
  """

  k: jax.Array  # [L (full layers when windowed), B, max_length, N, K]
  v: jax.Array  # [L (full layers when windowed), B, max_length, N, K]
  mask: jax.Array  # [B, max_length] 1 where a slot holds a real token
  k_local: Optional[jax.Array] = None  # [L sliding, B, W, N, K]
  v_local: Optional[jax.Array] = None  # [L sliding, B, W, N, K]


class PagedCache(NamedTuple):
  """Keys and values in fixed-size pages that many sequences share.

  Row b's logical token j lives in page ``pages_BM[b, j // page_size]`` at
  offset ``j % page_size``. Rows that fork from one prefix list the same
  pages, so the prefix is stored once. Page 0 is scratch: padding tokens
  are written there and no row reads it as one of its own.

  Sliding-window layers (Gemma 2 / 3) read the same pages as the others and
  mask the keys outside their window: a row's pages hold every layer's
  keys, so the pool is as large as without windows (the full-attention
  layers need every token's keys; only the dense `KVCache` has ring
  buffers for the windowed layers).
  """

  k: jax.Array  # [L, D shards, pages per shard, page_size, N, K]
  v: jax.Array  # [L, D shards, pages per shard, page_size, N, K]
  pages_BM: jax.Array  # int32 [B, M] each row's pages (ids in its shard)
  lengths_B: jax.Array  # int32 [B] tokens already cached per row


def init_pages(
  config: ModelConfig, num_pages: int, page_size: int, shards: int = 1
):
  """An empty page pool: (k, v), each [L, shards, num_pages, page_size, N,
  K] (`num_pages` per shard)."""
  shape = (
    config.num_layers,
    shards,
    num_pages,
    page_size,
    config.num_kv_heads,
    config.head_dim,
  )
  zeros = jnp.zeros(shape, config.dtype)
  return zeros, zeros


def init_cache(
  config: ModelConfig, batch: int, max_length: int, *, windowed: bool = True
) -> KVCache:
  """An empty cache for `batch` rows of up to `max_length` tokens.

  With sliding-window layers (Gemma 2 / 3) and `windowed`, those layers get
  ring buffers of min(sliding_window, max_length) slots (`KVCache`); else
  every layer gets `max_length` slots (what a read-only ``prefix`` needs).
  """
  sliding = config.sliding_layers
  windowed = windowed and any(sliding)
  n_full = sum(not x for x in sliding) if windowed else config.num_layers
  rest = (batch, max_length, config.num_kv_heads, config.head_dim)
  zeros = jnp.zeros((n_full, *rest), config.dtype)
  mask = jnp.zeros((batch, max_length), jnp.int32)
  if not windowed:
    return KVCache(zeros, zeros, mask)
  width = min(config.sliding_window, max_length)
  ring = jnp.zeros((sum(sliding), batch, width, *rest[2:]), config.dtype)
  return KVCache(zeros, zeros, mask, ring, ring)


def cache_bytes(cache: KVCache | PagedCache) -> int:
  """Bytes of a cache's key / value buffers (all layers, k and v); works on
  `jax.eval_shape`'s abstract caches too."""
  return sum(
    math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
    for x in jax.tree.leaves(cache)
    if x.ndim >= 5
  )


def positions_from_mask(attention_mask_BS: ArrayLike) -> jax.Array:
  """Position of each token counting real tokens only (0 on left padding)."""
  mask = jnp.asarray(attention_mask_BS, jnp.int32)
  return jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)


def positions_from_segments(segment_ids_BS: ArrayLike) -> jax.Array:
  """Position of each token within its segment (0 at a segment's first
  token), for packed rows whose segments are contiguous runs of one id;
  padding (id 0) counts as a segment of its own."""
  seg = jnp.asarray(segment_ids_BS, jnp.int32)
  index = jnp.broadcast_to(jnp.arange(seg.shape[-1]), seg.shape)
  starts = jnp.concatenate(
    [jnp.ones_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], axis=1
  )
  return index - jax.lax.cummax(jnp.where(starts, index, 0), axis=1)


def rope_frequencies(config: ModelConfig) -> jax.Array:
  """[K/2] inverse frequencies, with Llama-3 or linear scaling when
  configured (the full-attention layers' frequencies)."""
  k = config.head_dim
  inv = 1.0 / config.rope_theta ** (jnp.arange(0, k, 2, jnp.float32) / k)
  s = config.rope_scaling
  if s is None:
    return inv
  if isinstance(s, LinearRopeScaling):
    return inv / s.factor
  wavelen = 2 * math.pi / inv
  low = s.original_max_position_embeddings / s.low_freq_factor
  high = s.original_max_position_embeddings / s.high_freq_factor
  scaled = jnp.where(wavelen > low, inv / s.factor, inv)
  smooth = (
    s.original_max_position_embeddings / wavelen - s.low_freq_factor
  ) / (s.high_freq_factor - s.low_freq_factor)
  smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
  medium = (wavelen >= high) & (wavelen <= low)
  return jnp.where(medium, smoothed, scaled)


def layer_frequencies(config: ModelConfig) -> jax.Array:
  """[L, K/2] each layer's inverse frequencies: sliding-window layers use
  ``local_rope_theta`` unscaled when it is set (Gemma 3), the rest
  `rope_frequencies`."""
  full = rope_frequencies(config)
  if config.local_rope_theta is None:
    return jnp.broadcast_to(full, (config.num_layers, full.size))
  k = config.head_dim
  local = 1.0 / config.local_rope_theta ** (
    jnp.arange(0, k, 2, jnp.float32) / k
  )
  sliding = np.asarray(config.sliding_layers)[:, None]
  return jnp.where(sliding, local[None], full[None])


def apply_rope(
  x_BSHK: jax.Array, positions_BS: jax.Array, inv_freq
) -> jax.Array:
  """Rotate halves (the HF Llama convention, not interleaved pairs)."""
  angles = positions_BS[..., None].astype(jnp.float32) * inv_freq[None, None]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x = x_BSHK.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
  return rotated.astype(x_BSHK.dtype)


def rms_norm(
  x: jax.Array, weight: jax.Array, eps: float, offset: bool = False
) -> jax.Array:
  """x / rms(x) * w, normalised in float32 as HF does, cast back after.

  With `offset` (Gemma) it is x / rms(x) * (1 + w), all in float32 and cast
  back at the end, as HF's GemmaRMSNorm does.
  """
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps)
  # Explicit broadcast: callers may run with jax_numpy_rank_promotion="raise".
  shape = (1,) * (x.ndim - weight.ndim) + weight.shape
  if offset:
    w = 1.0 + weight.astype(jnp.float32).reshape(shape)
    return (normed * w).astype(x.dtype)
  w = weight.astype(x.dtype).reshape(shape)
  return w * normed.astype(x.dtype)


def _norm(config: ModelConfig, x: jax.Array, weight: jax.Array) -> jax.Array:
  """The family's RMSNorm (`rms_norm`, with Gemma's 1 + w offset)."""
  return rms_norm(x, weight, config.rms_norm_eps, config.norm_offset)


def _param(rngs, shape, axes, dtype, init=None) -> nnx.Param:
  init = init or jax.nn.initializers.normal(0.02)
  return nnx.Param(init(rngs.params(), shape, dtype), logical_axes=axes)


def _ones(shape, axes, dtype) -> nnx.Param:
  return nnx.Param(jnp.ones(shape, dtype), logical_axes=axes)


def _norm_weight(config, shape, axes) -> nnx.Param:
  """A norm's weight: ones, or zeros with Gemma's 1 + w (the identity)."""
  if config.norm_offset:
    return nnx.Param(jnp.zeros(shape, config.param_dtype), logical_axes=axes)
  return _ones(shape, axes, config.param_dtype)


class Layers(nnx.Module):
  """All decoder layers' weights, stacked on a leading layer axis."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c, dt = config, config.param_dtype
    L, D, H, N, K, F = (
      c.num_layers,
      c.hidden_size,
      c.num_heads,
      c.num_kv_heads,
      c.head_dim,
      c.intermediate_size,
    )
    self.attn_norm = _norm_weight(c, (L, D), ("layers", "embed"))
    self.q_proj = _param(
      rngs, (L, D, H, K), ("layers", "embed", "heads", "head_dim"), dt
    )
    self.k_proj = _param(
      rngs, (L, D, N, K), ("layers", "embed", "kv_heads", "head_dim"), dt
    )
    self.v_proj = _param(
      rngs, (L, D, N, K), ("layers", "embed", "kv_heads", "head_dim"), dt
    )
    self.o_proj = _param(
      rngs, (L, H, K, D), ("layers", "heads", "head_dim", "embed"), dt
    )
    if c.qkv_bias:
      zeros = jax.nn.initializers.zeros
      self.q_bias = _param(
        rngs, (L, H, K), ("layers", "heads", "head_dim"), dt, zeros
      )
      self.k_bias = _param(
        rngs, (L, N, K), ("layers", "kv_heads", "head_dim"), dt, zeros
      )
      self.v_bias = _param(
        rngs, (L, N, K), ("layers", "kv_heads", "head_dim"), dt, zeros
      )
    if c.qk_norm:
      self.q_norm = _norm_weight(c, (L, K), ("layers", "head_dim"))
      self.k_norm = _norm_weight(c, (L, K), ("layers", "head_dim"))
    self.mlp_norm = _norm_weight(c, (L, D), ("layers", "embed"))
    if c.post_norms:
      self.post_attn_norm = _norm_weight(c, (L, D), ("layers", "embed"))
      self.post_mlp_norm = _norm_weight(c, (L, D), ("layers", "embed"))
    if c.num_experts:
      for name, param in _moe.expert_params(c, rngs).items():
        setattr(self, name, param)
      return
    self.gate_proj = _param(rngs, (L, D, F), ("layers", "embed", "mlp"), dt)
    self.up_proj = _param(rngs, (L, D, F), ("layers", "embed", "mlp"), dt)
    self.down_proj = _param(rngs, (L, F, D), ("layers", "mlp", "embed"), dt)


def _cast(x, dtype):
  """An array, or a tuple of parts (`_attention.attention`), cast to `dtype`."""
  if isinstance(x, tuple):
    return tuple(part.astype(dtype) for part in x)
  return x.astype(dtype)


def _proj(w, name, x, equation):
  """``einsum(equation, x, w[name])`` in x's dtype: every weight matrix of a
  layer is applied here (the one place adapters attach to), an int8 base
  dequantized and a LoRA adapter added on the activations (`_lora`)."""
  y = jnp.einsum(equation, x, _lora.base_weight(w, name, x.dtype))
  delta = _lora.adapter_delta(w, name, x, equation)
  return y if delta is None else y + delta


def _act(config, x):
  """The gate's activation: SiLU (SwiGLU) or tanh-approximate GELU (GeGLU,
  HF ``gelu_pytorch_tanh``)."""
  if config.activation == "gelu_tanh":
    return jax.nn.gelu(x, approximate=True)
  return jax.nn.silu(x)


def _mlp(config, w, h, experts=None):
  """The feed-forward block on normed hidden states [B, S, D] (SwiGLU, or
  GeGLU for Gemma) and its routing (None without experts; `experts`
  [B, S, K] replays one)."""
  if config.num_experts:
    return _moe.moe_mlp(config, w, h, experts)
  gate = _proj(w, "gate_proj", h, "bsd,df->bsf")
  up = _proj(w, "up_proj", h, "bsd,df->bsf")
  return _proj(w, "down_proj", _act(config, gate) * up, "bsf,fd->bsd"), None


def _layer(
  config, w, x, positions, inv_freq, kv, io, allowed, shared=None, experts=None
):
  """One decoder layer and its routing (`_mlp`; `experts` replays one);
  `kv` is (layer index, all layers' k, v) or None,
  and `io` stores this layer's new keys / values (or returns them, as
  `new`, to be stored later) and gives back the keys / values to attend.
  `shared` is this layer's read-only prefix (k, v), attended before the
  new tokens (`Transformer.hidden_states`'s ``prefix``). With a windowed
  `KVCache`, `io` is `_window.Windowed` and `kv` is (index in the layer's store,
  whether the layer is sliding, the stores); it attends as well."""
  c, dt = config, x.dtype
  x = _rows_split(x)
  h = _norm(c, x, w["attn_norm"])
  q = _proj(w, "q_proj", h, "bsd,dhk->bshk")
  k = _proj(w, "k_proj", h, "bsd,dnk->bsnk")
  v = _proj(w, "v_proj", h, "bsd,dnk->bsnk")
  if c.qkv_bias:
    q, k, v = (
      t + w[f"{n}_bias"].astype(dt)[None, None]
      for t, n in ((q, "q"), (k, "k"), (v, "v"))
    )
  if c.qk_norm:
    q = _norm(c, q, w["q_norm"])
    k = _norm(c, k, w["k_norm"])
  q = apply_rope(q, positions, inv_freq)
  k = apply_rope(k, positions, inv_freq)
  scale = c.query_pre_attn_scalar
  scale = None if scale is None else scale**-0.5

  def attend(k, v, mask):
    cap = c.attn_logit_softcap
    return _attention.attention(q, _cast(k, dt), _cast(v, dt), mask, scale, cap)

  new = None
  if isinstance(io, _window.Windowed):
    # A windowed KVCache: kv is (store index, sliding, stores).
    attn, kv = io.io(*kv, k, v, attend)
  elif kv is not None:
    # Dense: write this layer's new slots into the whole [L, ...] cache, in
    # place, then read the layer back: as a loop carry XLA updates the
    # buffer without copying it (as scan xs/ys it copied every layer every
    # step).
    k, v, k_all, v_all, new = io(*kv, k, v)
    kv = (k_all, v_all)
  if shared is not None:
    k, v = (shared[0], k), (shared[1], v)
  if not isinstance(io, _window.Windowed):
    attn = attend(k, v, allowed)
  out = _proj(w, "o_proj", attn, "bshk,hkd->bsd")
  if c.post_norms:
    out = _norm(c, out, w["post_attn_norm"])
  x = _rows_split(x + out)
  out, routing = _mlp(c, w, _norm(c, x, w["mlp_norm"]), experts)
  if c.post_norms:
    out = _norm(c, out, w["post_mlp_norm"])
  return _rows_split(x + out), kv, new, routing


def _rows_split(x_BSD: jax.Array) -> jax.Array:
  """`x_BSD` with its rows split over the batch axes of the mesh in
  context (`jax.set_mesh`; the trainer's programs and the engine's run in
  theirs), when there is one and the rows divide: the residual stream stays
  split by rows, so XLA gathers each layer's FSDP-split weights rather than
  the activations. Without it, Qwen3-8B's update on 16 v5p chips computed
  each micro-batch's MLP for all of its rows on every chip (the rows came
  out of the micro-batch slice whole) and all-reduced the [rows, tokens,
  12288] results."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not set(BATCH_AXES) <= set(mesh.axis_names):
    return x_BSD
  if x_BSD.shape[0] % _axis_size(mesh, BATCH_AXES):
    return x_BSD
  if x_BSD.shape[1] == 1:
    # A decode step's few rows: moving them is cheaper than gathering the
    # weights (Qwen3-8B on 64 v5e chips: 17 GB moved a step, 65 GB split).
    return x_BSD
  spec = jax.sharding.PartitionSpec(BATCH_AXES, None, None)
  return jax.lax.with_sharding_constraint(x_BSD, spec)


def _check_prefix(prefix, cache, rows: int) -> None:
  """A ``prefix`` is a `KVCache` whose rows divide the batch; no cache."""
  if cache is not None:
    raise ValueError(
      "pass either cache (decoding) or prefix (a read-only shared prefix),"
      " not both."
    )
  if not isinstance(prefix, KVCache):
    raise ValueError(
      f"prefix must be a KVCache (e.g. a prefill's); got {type(prefix)}."
    )
  if prefix.k_local is not None:
    raise ValueError(
      "prefix is a windowed KVCache (ring buffers for sliding layers); a"
      " prefix needs every layer's keys: prefill into init_cache(...,"
      " windowed=False)."
    )
  p = prefix.mask.shape[0]
  if rows % p:
    raise ValueError(
      f"tokens_BS has {rows} rows, not a multiple of the prefix's {p} rows:"
      " each prefix row serves B / P consecutive rows (a group)."
    )


def _check_segments(segment_ids_BS, tokens, cache, prefix) -> jax.Array:
  """Segment ids as int32 [B, S]; only for a plain (no cache) forward."""
  if cache is not None or prefix is not None:
    raise ValueError(
      "segment_ids_BS (packed rows) works only without a cache or prefix;"
      " run packed sequences through a plain forward."
    )
  segments = jnp.asarray(segment_ids_BS, jnp.int32)
  if segments.shape != tokens.shape:
    raise ValueError(
      f"segment_ids_BS has shape {segments.shape}; it must match tokens_BS"
      f" {tokens.shape} (one segment id per token, 0 on padding)."
    )
  return segments


def _positions_after(prefix_mask_PS, mask_BS) -> jax.Array:
  """Positions continuing after each row's prefix (real tokens only): what
  `positions_from_mask` gives on the concatenated row."""
  rows = mask_BS.shape[0]
  before = jnp.sum(_attention.shared_rows(prefix_mask_PS, rows), axis=1)
  return jnp.maximum(before[:, None] + jnp.cumsum(mask_BS, axis=1) - 1, 0)


def _check_routing(config, routing_LBSK, return_routing: bool, bs) -> None:
  """Routing replay and output need experts; a replay has shape [L, B, S,
  K] (checked here, not as a shape error inside the layer scan)."""
  if (routing_LBSK is not None or return_routing) and not config.num_experts:
    raise ValueError(
      "routing_LBSK / return_routing need a mixture-of-experts model"
      " (config.num_experts > 0); this model is dense."
    )
  if routing_LBSK is None:
    return
  expected = (config.num_layers, *bs, config.experts_per_token)
  if tuple(jnp.shape(routing_LBSK)) != expected:
    raise ValueError(
      f"routing_LBSK has shape {tuple(jnp.shape(routing_LBSK))}; it must be"
      f" [L, B, S, K] = {expected}: the expert ids of every layer and token"
      " (e.g. a forward's Routing.experts, or the sampler's record)."
    )


def _check_auto_mesh(tokens: jax.Array) -> None:
  """Explicit-axis meshes would need an out_sharding on every einsum."""
  mesh = jax.typeof(tokens).sharding.mesh
  if any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
    raise ValueError(
      "tokens are sharded over a mesh with AxisType.Explicit axes; rljax"
      " models run under Auto axes (XLA places the activations). Build the"
      " mesh with rljax.sharding.make_mesh, or jax.make_mesh(...,"
      " axis_types=(AxisType.Auto,) * n)."
    )


def _inputs(
  config,
  tokens_BS,
  attention_mask_BS,
  *,
  positions_BS,
  cache,
  prefix,
  segment_ids_BS,
  routing_LBSK,
  return_routing,
):
  """A forward's checked inputs: (int tokens, the int32 mask, the segment
  ids or None, the positions: given, or those the mode implies)."""
  tokens = jnp.asarray(tokens_BS)
  _check_auto_mesh(tokens)
  b, s = tokens.shape
  _check_routing(config, routing_LBSK, return_routing, (b, s))
  if prefix is not None:
    _check_prefix(prefix, cache, b)
  mask = (
    jnp.ones((b, s), jnp.int32)
    if attention_mask_BS is None
    else jnp.asarray(attention_mask_BS, jnp.int32)
  )
  segments = None
  if segment_ids_BS is not None:
    segments = _check_segments(segment_ids_BS, tokens, cache, prefix)
    mask = mask * (segments > 0)
    if positions_BS is None:
      positions_BS = positions_from_segments(segments)
  paged = isinstance(cache, PagedCache)
  if positions_BS is None and prefix is not None:
    positions_BS = _positions_after(prefix.mask, mask)
  if positions_BS is None and paged:
    positions_BS = cache.lengths_B[:, None] + jnp.arange(s)[None]
  if positions_BS is None:
    if cache is not None:
      raise ValueError("pass positions_BS when decoding with a cache.")
    positions_BS = positions_from_mask(mask)
  return tokens, mask, segments, positions_BS


def _updated_cache(cache, view, kvs, new, mask):
  """The cache after a forward: paged, the new keys / values written into
  their pages and the lengths advanced; dense, the scanned buffers."""
  if isinstance(cache, PagedCache):
    offset_BS = view.slot_BS % cache.k.shape[3]
    k_all, v_all = (
      _attention.write_pages(pool, n, view.page_BS, offset_BS)
      for pool, n in zip(kvs, new)
    )
    lengths = cache.lengths_B + jnp.sum(mask, axis=1)
    return PagedCache(k_all, v_all, cache.pages_BM, lengths)
  if cache is not None:
    return KVCache(kvs[0], kvs[1], view.key_mask, *kvs[2:])
  return cache


class Transformer(nnx.Module):
  """Decoder-only LM (Llama / Qwen2 / Qwen3 / Gemma 1-3, and Qwen3-MoE /
  Mixtral mixtures of experts)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    dt = config.param_dtype
    V, D = config.vocab_size, config.hidden_size
    self.embed = _param(rngs, (V, D), ("vocab", "embed"), dt)
    self.layers = Layers(config, rngs=rngs)
    self.final_norm = _ones((D,), ("embed",), dt)
    if not config.tie_embeddings:
      self.lm_head = _param(rngs, (D, V), ("embed", "vocab"), dt)

  def unembedding(self) -> jax.Array:
    """[D, V] output projection (the transposed embedding when tied)."""
    if self.config.tie_embeddings:
      return self.embed[...].T
    return self.lm_head[...]

  def hidden_states(
    self,
    tokens_BS: ArrayLike,
    attention_mask_BS: Optional[ArrayLike] = None,
    *,
    positions_BS: Optional[ArrayLike] = None,
    cache: Optional[KVCache | PagedCache] = None,
    cache_index: ArrayLike = 0,
    prefix: Optional[KVCache] = None,
    segment_ids_BS: Optional[ArrayLike] = None,
    routing_LBSK: Optional[ArrayLike] = None,
    return_routing: bool = False,
  ) -> tuple[jax.Array, Optional[KVCache | PagedCache]]:
    """Final-norm hidden states [B, S, D] and the updated cache.

    Without a cache the S tokens attend causally among themselves. With a
    `KVCache` they are written to slots [cache_index, cache_index + S) and
    attend to every earlier real slot. With a `PagedCache` row b's real
    tokens (``attention_mask_BS`` is right-padded there) become its logical
    tokens ``lengths_B[b] + s`` (positions default to those) and attend to
    every earlier token of the row; ``cache_index`` is unused.

    With a ``prefix`` (a `KVCache` of P rows, B a multiple of P: e.g. the
    prefill of P prompts) row b continues prefix row ``b // (B / P)``: its
    tokens attend to that row's real slots, shared and never copied, and
    causally among themselves; positions default to the prefix row's real
    length plus the real tokens before. The prefix is read, not updated
    (the returned cache is None), and gradients flow into it: the training
    forward of Prefix Grouper (`rljax.models.grouped_completion_logprobs`).

    With ``segment_ids_BS`` (packed rows, no cache or prefix) a token
    attends causally only to earlier real tokens with its own segment id;
    id 0 is padding (never attended to, whatever the mask says). Positions
    then default to `positions_from_segments` (restarting at 0 in each
    segment), so each segment computes what it would alone in its own row.

    Mixture of experts (``config.num_experts`` > 0): ``routing_LBSK``
    (int32 expert ids per layer and token) replays a routing, e.g. the
    sampler's, so the tokens run through those experts with gate weights
    from this forward's routers (routing replay); ``return_routing=True``
    returns a third value, the `rljax.models.Routing` of every layer
    (logits [L, B, S, E], experts [L, B, S, K]), for the load-balancing
    loss or to be replayed.
    """
    c = self.config
    tokens, mask, segments, positions_BS = _inputs(
      c,
      tokens_BS,
      attention_mask_BS,
      positions_BS=positions_BS,
      cache=cache,
      prefix=prefix,
      segment_ids_BS=segment_ids_BS,
      routing_LBSK=routing_LBSK,
      return_routing=return_routing,
    )
    x = self._embed(tokens)
    view = _attention.attention_view(
      c,
      mask,
      segments,
      cache,
      cache_index,
      prefix,
      paged=isinstance(cache, PagedCache),
      windowed=isinstance(cache, KVCache) and cache.k_local is not None,
    )
    x, kvs, new, routing = self._scan_layers(
      x, positions_BS, view, cache, prefix, routing_LBSK
    )
    x = _norm(c, x, self.final_norm[...])
    cache = _updated_cache(cache, view, kvs, new, mask)
    if return_routing:
      return x, cache, routing
    return x, cache

  def _embed(self, tokens: jax.Array) -> jax.Array:
    """[B, S, D] token embeddings in the compute dtype (scaled for Gemma)."""
    c = self.config
    x = self.embed[...].astype(c.dtype)[tokens]
    if c.embed_scale:
      # HF rounds sqrt(D) to the weights' dtype (Gemma's normalizer).
      scale = jnp.asarray(math.sqrt(c.hidden_size), c.param_dtype)
      x = x * scale.astype(c.dtype)
    return x

  def _scan_layers(self, x, positions_BS, view, cache, prefix, routing_LBSK):
    """Every layer over `x` in one `lax.scan`: (x, the caches' key / value
    buffers, each layer's new keys / values to store, the routing)."""
    c = self.config
    allowed, allowed_local, io, windowed = view[:4]
    # Every stacked variable: weights, adapters and their scales (`_lora`).
    weights = {
      k: v[...]
      for k, v in vars(self.layers).items()
      if isinstance(v, nnx.Variable)
    }
    positions = jnp.asarray(positions_BS)

    def body(carry, xs):
      x, kvs = carry
      w, i, shared, replay, inv_freq, sliding = xs
      kv = None if kvs is None else (i, *kvs)
      if windowed:
        kv = (i, sliding, kvs)
      mask = allowed
      if allowed_local is not None:
        mask = jnp.where(sliding, allowed_local, allowed)
      x, kvs, new, routing = _layer(
        c, w, x, positions, inv_freq, kv, io, mask, shared, replay
      )
      return (x, kvs), (new, routing)

    remat = REMAT_POLICIES[c.remat]
    if remat == "full":  # keep each layer's input; recompute the rest
      body = jax.checkpoint(body, prevent_cse=False)
    elif remat == "dots":  # keep the matmul outputs; recompute the rest
      body = jax.checkpoint(
        body,
        prevent_cse=False,
        policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
      )
    kvs = None if cache is None else (cache.k, cache.v)
    layer_ids = jnp.arange(c.num_layers)
    if windowed:
      kvs = (cache.k, cache.v, cache.k_local, cache.v_local)
      layer_ids = jnp.asarray(_window.store_index(c.sliding_layers))
    # The prefix's keys / values are scanned over as inputs (read-only).
    shared = None if prefix is None else (prefix.k, prefix.v)
    replay = None if routing_LBSK is None else jnp.asarray(routing_LBSK)
    # Per-layer inputs: RoPE frequencies and whether the layer is local.
    per_layer = (layer_frequencies(c), jnp.asarray(c.sliding_layers))
    (x, kvs), (new, routing) = jax.lax.scan(
      body,
      (x, kvs),
      (weights, layer_ids, shared, replay, *per_layer),
      # A forward without a cache (an update's, a scoring pass's) may
      # unroll further than the engine's decode steps.
      unroll=(c.update_unroll or c.scan_unroll)
      if cache is None
      else c.scan_unroll,
    )
    return x, kvs, new, routing

  def logits(self, hidden_BSD: jax.Array) -> jax.Array:
    """float32 logits [B, S, V] from hidden states (soft-capped when
    ``final_logit_softcap`` is set)."""
    w = self.unembedding()
    logits = jnp.einsum(
      "bsd,dv->bsv",
      hidden_BSD,
      w.astype(hidden_BSD.dtype),
      preferred_element_type=jnp.float32,
    )
    return _attention.softcap(logits, self.config.final_logit_softcap)

  def __call__(self, tokens_BS, attention_mask_BS=None, **kwargs):
    """float32 logits [B, S, V] and the cache (see `hidden_states`)."""
    hidden, cache = self.hidden_states(tokens_BS, attention_mask_BS, **kwargs)
    return self.logits(hidden), cache


class ValueModel(nnx.Module):
  """A transformer trunk with a scalar head: one value per token (PPO)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.trunk = Transformer(config, rngs=rngs)
    D = config.hidden_size
    self.head = _param(
      rngs, (D,), ("embed",), config.param_dtype, jax.nn.initializers.zeros
    )
    self.bias = nnx.Param(jnp.zeros((), config.param_dtype), logical_axes=())

  def __call__(self, tokens_BS, attention_mask_BS=None, **kwargs) -> jax.Array:
    """float32 values [B, S]."""
    hidden, _ = self.trunk.hidden_states(tokens_BS, attention_mask_BS, **kwargs)
    values = jnp.einsum(
      "bsd,d->bs",
      hidden.astype(jnp.float32),
      self.head[...].astype(jnp.float32),
    )
    return values + self.bias[...].astype(jnp.float32)
