"""The Pallas GPU (Triton) schedule of the token log-prob contract.

Triton programs own a block of one axis and loop over the other inside the
kernel (`lax.fori_loop`), carrying their accumulators in registers:

* forward, grid (token blocks,): each program loads its [block_n, D] hidden
  block once and walks the vocabulary in [D, block_v] slices with an online
  logsumexp (running max m, l = sum exp(z - m), s = sum exp(z - m) z);
* d_hidden, grid (token blocks,): the same walk, recomputing each logits tile
  from the saved lse and accumulating dz @ unembed^T in f32 [block_n, D];
* d_unembed, grid (vocab blocks,): each program walks the tokens, accumulating
  hidden^T @ dz in f32 [D, block_v].

Triton tensors must have power-of-2 sizes, so D is rounded up to a power of 2
inside the kernel and the blocks are powers of 2; nothing is padded in HBM.
Every load is masked (out-of-range hidden rows, D lanes and vocab columns read
as 0) and every store is masked, which keeps the [D, V] unembedding uncopied.
With zeros loaded there, the only extra care is that vocab columns >= V get
zero probability. inv_temp is passed as a [1] array.

The f32 accumulators ([block_n, D] and [D, block_v]) live in registers, so a
large D (thousands) wants smaller blocks or a D-blocked variant.

References: Wijmans et al., Cut Your Losses in Large-Vocabulary Language
Models (arXiv:2411.09009); Liger-Kernel's fused linear cross-entropy;
jax.experimental.pallas.ops.gpu.attention (masked-load idiom).
"""

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp

from pallas_kernels._contract import Stats

F32 = jnp.float32
_MIN_BLOCK = 16  # tl.dot needs every matmul dimension >= 16.
_NUM_WARPS, _NUM_STAGES = 4, 2


def _is_block(x: int) -> bool:
  """Whether x is a usable Triton block size."""
  return x >= _MIN_BLOCK and x & (x - 1) == 0


def _check(hidden_ND, unembed_DV, targets_N, block_n: int, block_v: int):
  """Raise ValueError for inconsistent shapes or blocks Triton cannot use."""
  hs, us, ts = jnp.shape(hidden_ND), jnp.shape(unembed_DV), jnp.shape(targets_N)
  if len(hs) != 2 or len(us) != 2 or hs[1] != us[0]:
    raise ValueError(
      "hidden_ND [N, D] and unembed_DV [D, V] must be 2-D and agree on D;"
      f" got shapes {hs} and {us}."
    )
  if ts != hs[:1]:
    raise ValueError(f"targets_N must have shape {hs[:1]}; got {ts}.")
  for name, b in (("block_n", block_n), ("block_v", block_v)):
    if not _is_block(b):
      raise ValueError(f"{name} must be a power of 2 and >= 16; got {b}.")


def _block(size: int, block: int) -> tuple[int, int]:
  """(power-of-2 block used, number of blocks): small axes get one block."""
  b = min(block, max(_MIN_BLOCK, pl.next_power_of_2(size)))
  return b, pl.cdiv(size, b)


def _compiler_params():
  """Triton launch settings for 64 x 128 tiles (as Pallas' GPU attention)."""
  return plgpu.CompilerParams(num_warps=_NUM_WARPS, num_stages=_NUM_STAGES)


def _span(k, block: int, size: int):
  """Global indices [block] of block k and whether each is < size."""
  idx = k * block + jnp.arange(block)
  return idx, idx < size


def _load_rows(ref, k, bn: int, n: int, d: int):
  """Token block k of an [N, D] ref as [bn, Dp], zeros outside [N, D]."""
  _, row_ok = _span(k, bn, n)
  _, d_ok = _span(0, ref.shape[1], d)
  mask = row_ok[:, None] & d_ok[None, :]
  return plgpu.load(ref.at[pl.ds(k * bn, bn), :], mask=mask, other=0.0)


def _load_cols(ref, k, bv: int, v: int, d: int):
  """Vocab block k of a [D, V] ref as [Dp, bv], zeros outside [D, V]."""
  _, col_ok = _span(k, bv, v)
  _, d_ok = _span(0, ref.shape[0], d)
  mask = d_ok[:, None] & col_ok[None, :]
  return plgpu.load(ref.at[:, pl.ds(k * bv, bv)], mask=mask, other=0.0)


def _fwd_kernel(
  inv_ref, h_ref, u_ref, t_ref, tl_ref, lse_ref, ez_ref, *, n, d, v, bv
):
  """Stats of one token block: online logsumexp over the vocabulary."""
  i, bn = pl.program_id(0), h_ref.shape[0]
  rest = n - i * bn  # rows of this block that lie inside N
  _, row_ok = _span(0, bn, rest)
  h = _load_rows(h_ref, 0, bn, rest, d)
  tgt = plgpu.load(t_ref, mask=row_ok, other=0)
  inv = inv_ref[0]

  def body(j, carry):
    m, l, s, t = carry
    cols, col_ok = _span(j, bv, v)
    z = plgpu.dot(h, _load_cols(u_ref, j, bv, v, d)) * inv
    # z is 0 past V (zero columns loaded); those must not count.
    z_ok = jnp.where(col_ok[None, :], z, -jnp.inf)
    # Block 0 always holds a valid column, so m is finite from then on.
    m_new = jnp.maximum(m, jnp.max(z_ok, 1))
    scale = jnp.exp(m - m_new)
    e = jnp.exp(z_ok - m_new[:, None])
    hit = jnp.where(cols[None, :] == tgt[:, None], z, 0.0)
    return (
      m_new,
      l * scale + jnp.sum(e, 1),
      s * scale + jnp.sum(e * z, 1),
      t + jnp.sum(hit, 1),
    )

  zeros = jnp.zeros((bn,), F32)
  init = (jnp.full((bn,), -jnp.inf, F32), zeros, zeros, zeros)
  m, l, s, t = lax.fori_loop(0, pl.cdiv(v, bv), body, init)
  for ref, x in ((tl_ref, t), (lse_ref, m + jnp.log(l)), (ez_ref, s / l)):
    plgpu.store(ref, x, mask=row_ok)


@functools.partial(jax.jit, static_argnames=("block_n", "block_v", "interpret"))
def forward(
  hidden_ND,
  unembed_DV,
  targets_N,
  inv_temp,
  *,
  block_n: int = 64,
  block_v: int = 128,
  interpret=False,
) -> Stats:
  """Contract forward on GPU: one Triton program per token block.

  z = (hidden @ unembed) * inv_temp slice by slice (float32 accumulation);
  returns Stats(target_logit = z[target], lse = logsumexp z,
  ez = sum softmax(z) z), three float32 [N] arrays.

  Args:
    hidden_ND: [N, D] float32 or bfloat16 final hidden states.
    unembed_DV: [D, V] unembedding.
    targets_N: [N] int token ids in [0, V).
    inv_temp: float32 scalar 1 / temperature.
    block_n: token block, a power of 2 >= 16.
    block_v: vocab slice per loop step, a power of 2 >= 16.
    interpret: run under the Pallas interpreter (True) instead of Triton.

  Returns:
    Stats of three float32 [N] arrays.

  References: arXiv:2411.09009 (Cut Cross-Entropy); Liger-Kernel.
  """
  _check(hidden_ND, unembed_DV, targets_N, block_n, block_v)
  (n, d), v = hidden_ND.shape, unembed_DV.shape[1]
  dtype = jnp.result_type(hidden_ND, unembed_DV)
  bn, nn = _block(n, block_n)
  bv, nv = _block(v, block_v)
  dp = max(_MIN_BLOCK, pl.next_power_of_2(d))
  row = pl.BlockSpec((bn,), lambda i: (i,))
  out = pl.pallas_call(
    functools.partial(_fwd_kernel, n=n, d=d, v=v, bv=bv),
    grid=(nn,),
    in_specs=[
      pl.BlockSpec((1,), lambda i: (0,)),
      pl.BlockSpec((bn, dp), lambda i: (i, 0)),
      # The whole (rounded-up) unembedding; the kernel walks it in slices.
      pl.BlockSpec((dp, nv * bv), lambda i: (0, 0)),
      row,
    ],
    out_specs=[row] * 3,
    out_shape=[jax.ShapeDtypeStruct((n,), F32)] * 3,
    compiler_params=_compiler_params(),
    interpret=interpret,
    name="token_logprob_fwd",
  )(
    jnp.reshape(jnp.asarray(inv_temp, F32), (1,)),
    jnp.asarray(hidden_ND, dtype),
    jnp.asarray(unembed_DV, dtype),
    jnp.asarray(targets_N, jnp.int32),
  )
  return Stats(*out)


def _dlogits(z, cols, t, lse, ez, a, b):
  """dz = a (onehot - p) - b p (z - ez) on one tile.

  Columns >= V get a finite, nonzero dz, which is harmless: their unembedding
  columns load as 0 (no d_hidden share) and their d_unembed is never stored.
  """
  p = jnp.exp(z - lse[:, None])
  onehot = (cols[None, :] == t[:, None]).astype(F32)
  return a[:, None] * (onehot - p) - b[:, None] * p * (z - ez[:, None])


def _load_vecs(refs, k, bn: int, n: int):
  """Token block k of the per-token refs (targets, lse, ez, a, b), 0 past N."""
  _, row_ok = _span(k, bn, n)
  return [
    plgpu.load(r.at[pl.ds(k * bn, bn)], mask=row_ok, other=0) for r in refs
  ]


def _dh_kernel(inv_ref, h_ref, u_ref, *refs, n, d, v, bv):
  """d_hidden of one token block: walk the vocabulary accumulating dz @ U^T."""
  *vec_refs, dh_ref = refs
  i, (bn, dp) = pl.program_id(0), h_ref.shape
  rest = n - i * bn  # rows of this block that lie inside N
  h = _load_rows(h_ref, 0, bn, rest, d)
  t, lse, ez, a, b = _load_vecs(vec_refs, 0, bn, rest)
  inv = inv_ref[0]

  def body(j, acc):
    cols, _ = _span(j, bv, v)
    u = _load_cols(u_ref, j, bv, v, d)
    dz = _dlogits(plgpu.dot(h, u) * inv, cols, t, lse, ez, a, b)
    return acc + plgpu.dot(dz.astype(u.dtype), u, trans_b=True)

  acc = lax.fori_loop(0, pl.cdiv(v, bv), body, jnp.zeros((bn, dp), F32))
  _, row_ok = _span(0, bn, rest)
  _, d_ok = _span(0, dp, d)
  mask = row_ok[:, None] & d_ok[None, :]
  plgpu.store(dh_ref, (acc * inv).astype(dh_ref.dtype), mask=mask)


def _du_kernel(inv_ref, h_ref, u_ref, *refs, n, d, v, bn):
  """d_unembed of one vocab block: walk the tokens accumulating h^T @ dz."""
  *vec_refs, du_ref = refs
  j, (dp, bv) = pl.program_id(0), u_ref.shape
  cols, col_ok = _span(j, bv, v)
  u = _load_cols(u_ref, 0, bv, v - j * bv, d)
  inv = inv_ref[0]

  def body(i, acc):
    h = _load_rows(h_ref, i, bn, n, d)
    t, lse, ez, a, b = _load_vecs(vec_refs, i, bn, n)
    # Rows past N load as h = 0 and a = b = 0, so they add exactly 0.
    dz = _dlogits(plgpu.dot(h, u) * inv, cols, t, lse, ez, a, b)
    return acc + plgpu.dot(h, dz.astype(h.dtype), trans_a=True)

  acc = lax.fori_loop(0, pl.cdiv(n, bn), body, jnp.zeros((dp, bv), F32))
  _, d_ok = _span(0, dp, d)
  mask = d_ok[:, None] & col_ok[None, :]
  plgpu.store(du_ref, (acc * inv).astype(du_ref.dtype), mask=mask)


def _grad_call(kernel, grid, specs, out, interpret, *args):
  """pallas_call of a backward kernel over one axis."""
  h_spec, u_spec, vec_spec, out_spec = specs
  return pl.pallas_call(
    kernel,
    grid=grid,
    in_specs=[pl.BlockSpec((1,), lambda k: (0,)), h_spec, u_spec]
    + [vec_spec] * 5,
    out_specs=out_spec,
    out_shape=out,
    compiler_params=_compiler_params(),
    interpret=interpret,
    name=f"token_logprob_{kernel.func.__name__.strip('_')}",
  )(*args)


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
  block_n: int = 64,
  block_v: int = 128,
  interpret=False,
) -> tuple[jax.Array, jax.Array]:
  """Contract backward on GPU: two Triton kernels that recompute logits.

  With p = exp(z - lse) and cotangents a (on logp) and b (on entropy):
  dz = a (onehot - p) - b p (z - ez); d_hidden = (dz @ unembed^T) * inv_temp
  (one program per token block) and d_unembed = (hidden^T @ dz) * inv_temp
  (one program per vocab block), accumulated in float32 (dz is cast to the
  input dtype for the tensor cores).

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
  bn, nn = _block(n, block_n)
  bv, nv = _block(v, block_v)
  dp = max(_MIN_BLOCK, pl.next_power_of_2(d))
  vecs = [jnp.asarray(targets_N, jnp.int32)]
  vecs += [jnp.asarray(x, F32) for x in (lse_N, ez_N, a_N, b_N)]
  args = (
    jnp.reshape(jnp.asarray(inv_temp, F32), (1,)),
    jnp.asarray(hidden_ND, dtype),
    jnp.asarray(unembed_DV, dtype),
    *vecs,
  )
  dh = _grad_call(
    functools.partial(_dh_kernel, n=n, d=d, v=v, bv=bv),
    (nn,),
    (
      pl.BlockSpec((bn, dp), lambda i: (i, 0)),
      pl.BlockSpec((dp, nv * bv), lambda i: (0, 0)),
      pl.BlockSpec((bn,), lambda i: (i,)),
      pl.BlockSpec((bn, dp), lambda i: (i, 0)),
    ),
    jax.ShapeDtypeStruct((n, d), hidden_ND.dtype),
    interpret,
    *args,
  )
  du = _grad_call(
    functools.partial(_du_kernel, n=n, d=d, v=v, bn=bn),
    (nv,),
    (
      pl.BlockSpec((nn * bn, dp), lambda j: (0, 0)),
      pl.BlockSpec((dp, bv), lambda j: (0, j)),
      pl.BlockSpec((nn * bn,), lambda j: (0,)),
      pl.BlockSpec((dp, bv), lambda j: (0, j)),
    ),
    jax.ShapeDtypeStruct((d, v), unembed_DV.dtype),
    interpret,
    *args,
  )
  return dh, du
