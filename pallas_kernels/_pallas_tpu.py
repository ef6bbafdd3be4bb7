"""The Pallas TPU (Mosaic) schedule of the token log-prob contract.

Three kernels, each a 2-D grid of [block_n, block_v] logits tiles whose outer
axis is "parallel" (split across TensorCores) and whose inner axis is
"arbitrary" (a sequential reduction into VMEM scratch):

* forward, grid (token blocks, vocab blocks): online logsumexp. Scratch keeps
  per row the running max m, l = sum exp(z - m), s = sum exp(z - m) z (both
  rescaled when m grows) and the target logit; the last vocab step writes
  Stats(target_logit, lse = m + log l, ez = s / l).
* d_hidden, grid (token blocks, vocab blocks): recomputes each tile from the
  saved lse, forms dz and accumulates dz @ unembed^T in an f32 [block_n, D]
  scratch.
* d_unembed, grid (vocab blocks, token blocks): the same tile, accumulating
  hidden^T @ dz in an f32 [D, block_v] scratch.

D is used whole: a [block_n, D] hidden block and a [D, block_v] unembedding
block stay in VMEM (double-buffered by the Pallas pipeline). inv_temp reaches
the kernels through scalar prefetch (SMEM). Per-token vectors travel as
[N, 1] columns so that they broadcast along lanes against [block_n, block_v]
tiles.

Ragged edges are masked rather than padded: padding would copy the [D, V]
unembedding (the largest array here). The grid covers cdiv(N, block_n) x
cdiv(V, block_v) tiles; Mosaic reads undefined values past the array end and
drops writes there, so vocab columns >= V are excluded from every sum (and
zeroed before they reach a matmul, since 0 * NaN = NaN), and token rows >= N
are zeroed before the d_unembed matmul, the only place rows mix.

References: Wijmans et al., Cut Your Losses in Large-Vocabulary Language
Models (arXiv:2411.09009); tokamax's TPU linear softmax cross-entropy kernel;
jax.experimental.pallas.ops.tpu.flash_attention (scratch accumulator idiom).
"""

import functools
import math

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp

from pallas_kernels import _dispatch
from pallas_kernels._contract import Stats

F32 = jnp.float32
_SUBLANE, _LANE = 8, 128  # TPU vreg tile: blocks are multiples of (8, 128).
_MIB = 2**20


def _check(hidden_ND, unembed_DV, targets_N, block_n: int, block_v: int):
  """Raise ValueError for inconsistent shapes or blocks Mosaic cannot tile."""
  hs, us, ts = jnp.shape(hidden_ND), jnp.shape(unembed_DV), jnp.shape(targets_N)
  if len(hs) != 2 or len(us) != 2 or hs[1] != us[0]:
    raise ValueError(
      "hidden_ND [N, D] and unembed_DV [D, V] must be 2-D and agree on D;"
      f" got shapes {hs} and {us}."
    )
  if ts != hs[:1]:
    raise ValueError(f"targets_N must have shape {hs[:1]}; got {ts}.")
  if block_n <= 0 or block_n % _SUBLANE:
    raise ValueError(
      f"block_n must be a positive multiple of 8; got {block_n}."
    )
  if block_v <= 0 or block_v % _LANE:
    raise ValueError(
      f"block_v must be a positive multiple of 128; got {block_v}."
    )


def _block(size: int, block: int) -> tuple[int, int]:
  """(block used, number of blocks); a block covering the whole axis is exact."""
  b = size if size <= block else block
  return b, pl.cdiv(size, b)


# VMEM a TensorCore has, by `jax.Device.device_kind`: what Mosaic (libtpu
# 0.0.42) reports when a kernel's scoped allocations exceed it ("would
# exceed memory (size=...)", compiled for each topology from a CPU host).
VMEM_BYTES = {
  "TPU v4": 16 * _MIB,
  "TPU v5 lite": 128 * _MIB,  # v5e
  "TPU v5": 64 * _MIB,  # v5p
  "TPU v6 lite": 128 * _MIB,  # v6e
}
_UNKNOWN_VMEM = 64 * _MIB  # another TPU: the smallest of the v5 and v6 chips


def vmem_bytes() -> int:
  """VMEM of the chip the kernels are compiled for: `compile_for`'s device
  kind, else the attached TPU's."""
  return VMEM_BYTES.get(_dispatch.target_device_kind(), _UNKNOWN_VMEM)


def _vmem_need(bn: int, bv: int, d: int, itemsize: int) -> int:
  """Bytes of VMEM a kernel's blocks take: double-buffered inputs and
  outputs (the backward's [bn, D] or [D, bv] gradient blocks), float32
  tiles, accumulators, and 4 MiB for Mosaic's own. Without the outputs it
  undercounted Llama-3.1-70B's width (8192): 47 MiB estimated, 67 used."""
  blocks = 2 * (bn * d + d * bv) * itemsize
  outputs = 2 * max(bn, bv) * d * itemsize
  tiles = 6 * bn * bv * 4  # z, p, dz and their masked / cast copies
  accumulators = max(bn, bv) * d * 4
  return blocks + outputs + tiles + accumulators + 4 * _MIB


def _fit(n: int, v: int, d: int, itemsize: int, block_n: int, block_v: int):
  """(bn, row blocks, bv, vocab blocks, VMEM to request): the requested
  blocks, halved (the larger first, kept multiples of (8, 128)) until they
  need at most 3/4 of the target chip's VMEM (`vmem_bytes`), the budget:
  the default 512 x 2048 blocks of a width-4096 model need 100 MiB, more
  than a v5p's 64."""
  capacity = vmem_bytes()
  bn, bv = min(n, block_n), min(v, block_v)
  while _vmem_need(bn, bv, d, itemsize) > capacity * 3 // 4:
    if bv > _LANE and (bv >= bn or bn <= _SUBLANE):
      bv = max(_LANE, bv // 2 // _LANE * _LANE)
    elif bn > _SUBLANE:
      bn = max(_SUBLANE, bn // 2 // _SUBLANE * _SUBLANE)
    else:  # the smallest blocks: Mosaic says what does not fit
      break
  # The request: the budget (or the blocks' need, or the 16-32 MiB default
  # scoped limit, when more). Mosaic's own stack comes on top of the
  # blocks: the 8B backward's fitted blocks ran out of a request of just
  # their estimate on v5p.
  need = math.ceil(_vmem_need(bn, bv, d, itemsize) / _MIB) * _MIB
  vmem = max(need, min(capacity, 32 * _MIB), capacity * 3 // 4)
  return (*_block(n, bn), *_block(v, bv), vmem)


def _cols(j, bn: int, bv: int):
  """[bn, bv] global vocab index of each tile column."""
  return j * bv + lax.broadcasted_iota(jnp.int32, (bn, bv), 1)


def _logits(h_ref, u_ref, inv_temp):
  """One [bn, bv] float32 logits tile; bf16 inputs feed the MXU directly."""
  z = jnp.dot(h_ref[...], u_ref[...], preferred_element_type=F32)
  return z * inv_temp


def _fwd_kernel(
  inv_ref, h_ref, u_ref, t_ref, tl_ref, lse_ref, ez_ref, *scratch, v
):
  """Fold one logits tile into the running (m, l, s, target) of its rows."""
  m_sc, l_sc, s_sc, t_sc = scratch
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _init():
    m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, F32)
    for ref in (l_sc, s_sc, t_sc):
      ref[...] = jnp.zeros(ref.shape, F32)

  z = _logits(h_ref, u_ref, inv_ref[0])
  cols = _cols(j, *z.shape)
  valid = cols < v
  z_max = jnp.where(valid, z, -jnp.inf)
  # Block 0 always holds a valid column, so m is finite from then on and
  # exp(m_old - m_new) never sees inf - inf.
  m_old = m_sc[...]
  m_new = jnp.maximum(m_old, jnp.max(z_max, axis=1, keepdims=True))
  scale = jnp.exp(m_old - m_new)
  e = jnp.exp(z_max - m_new)
  l_sc[...] = l_sc[...] * scale + jnp.sum(e, axis=1, keepdims=True)
  # e is 0 past V, but z there may be NaN (undefined reads): select, not mul.
  ez_tile = jnp.where(valid, e * z, 0.0)
  s_sc[...] = s_sc[...] * scale + jnp.sum(ez_tile, axis=1, keepdims=True)
  hit = jnp.where(cols == t_ref[...], z, 0.0)
  t_sc[...] = t_sc[...] + jnp.sum(hit, axis=1, keepdims=True)
  m_sc[...] = m_new

  @pl.when(j == pl.num_programs(1) - 1)
  def _finish():
    tl_ref[...] = t_sc[...]
    lse_ref[...] = m_sc[...] + jnp.log(l_sc[...])
    ez_ref[...] = s_sc[...] / l_sc[...]


def _rows(bn: int):
  """BlockSpec of an [N, 1] per-token column on a (token, vocab) grid."""
  return pl.BlockSpec((bn, 1), lambda i, j, s: (i, 0))


@functools.partial(jax.jit, static_argnames=("block_n", "block_v", "interpret"))
def forward(
  hidden_ND,
  unembed_DV,
  targets_N,
  inv_temp,
  *,
  block_n: int = 512,
  block_v: int = 2048,
  interpret=False,
) -> Stats:
  """Contract forward on TPU: online logsumexp over [block_n, block_v] tiles.

  z = (hidden @ unembed) * inv_temp tile by tile (float32 accumulation);
  returns Stats(target_logit = z[target], lse = logsumexp z,
  ez = sum softmax(z) z), three float32 [N] arrays.

  Args:
    hidden_ND: [N, D] float32 or bfloat16 final hidden states.
    unembed_DV: [D, V] unembedding, same dtype family as hidden_ND.
    targets_N: [N] int token ids in [0, V).
    inv_temp: float32 scalar 1 / temperature.
    block_n: token tile, a multiple of 8 (tokamax uses 1024).
    block_v: vocab tile, a multiple of 128 (tokamax uses 2048).
    interpret: False, True (the generic Pallas interpreter) or a
      pltpu.InterpretParams (the TPU interpreter, e.g. with race detection).

  Returns:
    Stats of three float32 [N] arrays.

  References: arXiv:2411.09009 (Cut Cross-Entropy); tokamax.
  """
  _check(hidden_ND, unembed_DV, targets_N, block_n, block_v)
  (n, d), v = hidden_ND.shape, unembed_DV.shape[1]
  dtype = jnp.result_type(hidden_ND, unembed_DV)
  itemsize = jnp.dtype(dtype).itemsize
  bn, nn, bv, nv, vmem = _fit(n, v, d, itemsize, block_n, block_v)
  col = jax.ShapeDtypeStruct((n, 1), F32)
  out = pl.pallas_call(
    functools.partial(_fwd_kernel, v=v),
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1,
      grid=(nn, nv),
      in_specs=[
        pl.BlockSpec((bn, d), lambda i, j, s: (i, 0)),
        pl.BlockSpec((d, bv), lambda i, j, s: (0, j)),
        _rows(bn),
      ],
      out_specs=[_rows(bn)] * 3,
      scratch_shapes=[pltpu.VMEM((bn, 1), F32)] * 4,
    ),
    out_shape=[col] * 3,
    compiler_params=pltpu.CompilerParams(
      dimension_semantics=("parallel", "arbitrary"),
      vmem_limit_bytes=vmem,
    ),
    interpret=interpret,
    name="token_logprob_fwd",
  )(
    jnp.reshape(jnp.asarray(inv_temp, F32), (1,)),
    hidden_ND.astype(dtype),
    unembed_DV.astype(dtype),
    jnp.reshape(targets_N.astype(jnp.int32), (n, 1)),
  )
  return Stats(*(o[:, 0] for o in out))


def _dlogits(z, cols, v: int, t, lse, ez, a, b):
  """dz = a (onehot - p) - b p (z - ez) on one tile, exactly 0 past V."""
  p = jnp.exp(z - lse)
  onehot = (cols == t).astype(F32)
  dz = a * (onehot - p) - b * p * (z - ez)
  return jnp.where(cols < v, dz, 0.0)


def _tile_grads(inv_ref, h_ref, u_ref, vec_refs, j, v: int):
  """(dz, vocab-valid [1, bv] mask) of this token block and vocab block j."""
  z = _logits(h_ref, u_ref, inv_ref[0])
  cols = _cols(j, *z.shape)
  t, lse, ez, a, b = (r[...] for r in vec_refs)
  return _dlogits(z, cols, v, t, lse, ez, a, b), cols[:1] < v


def _dh_kernel(inv_ref, h_ref, u_ref, *refs, v):
  """Accumulate dz @ unembed^T over the vocab blocks of one token block."""
  *vec_refs, dh_ref, acc_sc = refs
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _init():
    acc_sc[...] = jnp.zeros(acc_sc.shape, F32)

  dz, col_ok = _tile_grads(inv_ref, h_ref, u_ref, vec_refs, j, v)
  u = u_ref[...]
  # Columns past V are undefined and would turn 0 * NaN into NaN.
  u = jnp.where(col_ok, u, jnp.zeros_like(u))
  acc_sc[...] += lax.dot_general(
    dz.astype(u.dtype), u, (((1,), (1,)), ((), ())), preferred_element_type=F32
  )

  @pl.when(j == pl.num_programs(1) - 1)
  def _finish():
    dh_ref[...] = (acc_sc[...] * inv_ref[0]).astype(dh_ref.dtype)


def _du_kernel(inv_ref, h_ref, u_ref, *refs, n, v):
  """Accumulate hidden^T @ dz over the token blocks of one vocab block."""
  *vec_refs, du_ref, acc_sc = refs
  j, i = pl.program_id(0), pl.program_id(1)

  @pl.when(i == 0)
  def _init():
    acc_sc[...] = jnp.zeros(acc_sc.shape, F32)

  dz, _ = _tile_grads(inv_ref, h_ref, u_ref, vec_refs, j, v)
  bn = dz.shape[0]
  # Rows past N are undefined: zero both factors so they add exactly 0.
  row_ok = i * bn + lax.broadcasted_iota(jnp.int32, (bn, 1), 0) < n
  h = h_ref[...]
  h = jnp.where(row_ok, h, jnp.zeros_like(h))
  dz = jnp.where(row_ok, dz, 0.0).astype(h.dtype)
  acc_sc[...] += jnp.dot(h.T, dz, preferred_element_type=F32)

  @pl.when(i == pl.num_programs(1) - 1)
  def _finish():
    du_ref[...] = (acc_sc[...] * inv_ref[0]).astype(du_ref.dtype)


def _grad_call(kernel, grid, specs, out, acc, vmem: int, interpret):
  """pallas_call of a backward kernel: outer axis parallel, inner reduced."""
  h_spec, u_spec, row_spec, out_spec = specs
  return pl.pallas_call(
    kernel,
    grid_spec=pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1,
      grid=grid,
      in_specs=[h_spec, u_spec] + [row_spec] * 5,
      out_specs=out_spec,
      scratch_shapes=[pltpu.VMEM(acc, F32)],
    ),
    out_shape=out,
    compiler_params=pltpu.CompilerParams(
      dimension_semantics=("parallel", "arbitrary"), vmem_limit_bytes=vmem
    ),
    interpret=interpret,
    name=f"token_logprob_{kernel.func.__name__.strip('_')}",
  )


@functools.partial(jax.jit, static_argnames=("block_n", "block_v", "interpret"))
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
  block_n: int = 512,
  block_v: int = 2048,
  interpret=False,
) -> tuple[jax.Array, jax.Array]:
  """Contract backward on TPU: two kernels that recompute logits tiles.

  With p = exp(z - lse) and cotangents a (on logp) and b (on entropy):
  dz = a (onehot - p) - b p (z - ez); d_hidden = (dz @ unembed^T) * inv_temp
  and d_unembed = (hidden^T @ dz) * inv_temp, accumulated in float32 (dz is
  cast to the input dtype for the MXU).

  Args:
    hidden_ND, unembed_DV, targets_N, inv_temp: as in `forward`.
    lse_N, ez_N: float32 [N] from the forward Stats.
    a_N, b_N: float32 [N] cotangents of log-prob and entropy.
    block_n, block_v, interpret: as in `forward`.

  Returns:
    (d_hidden [N, D] in hidden's dtype, d_unembed [D, V] in unembed's dtype).

  References: arXiv:2411.09009 (Cut Cross-Entropy).
  """
  _check(hidden_ND, unembed_DV, targets_N, block_n, block_v)
  (n, d), v = hidden_ND.shape, unembed_DV.shape[1]
  dtype = jnp.result_type(hidden_ND, unembed_DV)
  itemsize = jnp.dtype(dtype).itemsize
  bn, nn, bv, nv, vmem = _fit(n, v, d, itemsize, block_n, block_v)
  inv = jnp.reshape(jnp.asarray(inv_temp, F32), (1,))
  cols = [jnp.reshape(targets_N.astype(jnp.int32), (n, 1))]
  cols += [
    jnp.reshape(jnp.asarray(x, F32), (n, 1)) for x in (lse_N, ez_N, a_N, b_N)
  ]
  args = (inv, hidden_ND.astype(dtype), unembed_DV.astype(dtype), *cols)
  dh = _grad_call(
    functools.partial(_dh_kernel, v=v),
    (nn, nv),
    (
      pl.BlockSpec((bn, d), lambda i, j, s: (i, 0)),
      pl.BlockSpec((d, bv), lambda i, j, s: (0, j)),
      pl.BlockSpec((bn, 1), lambda i, j, s: (i, 0)),
      pl.BlockSpec((bn, d), lambda i, j, s: (i, 0)),
    ),
    jax.ShapeDtypeStruct((n, d), hidden_ND.dtype),
    (bn, d),
    vmem,
    interpret,
  )(*args)
  du = _grad_call(
    functools.partial(_du_kernel, n=n, v=v),
    (nv, nn),
    (
      pl.BlockSpec((bn, d), lambda j, i, s: (i, 0)),
      pl.BlockSpec((d, bv), lambda j, i, s: (0, j)),
      pl.BlockSpec((bn, 1), lambda j, i, s: (i, 0)),
      pl.BlockSpec((d, bv), lambda j, i, s: (0, j)),
    ),
    jax.ShapeDtypeStruct((d, v), unembed_DV.dtype),
    (d, bv),
    vmem,
    interpret,
  )(*args)
  return dh, du
