"""Grouped matmuls (a mixture of experts' expert layers) on a TPU kernel.

`jax.lax.ragged_dot` is the portable op. On TPU, XLA's cost analysis counts
its weight gradient (the transposed, ragged-contracting form) as dense over
every group: E times the work of the tokens it has (16 times at 16
experts, measured on a v5e compile). The megablox grouped-matmul kernels
(`jax.experimental.pallas.ops.tpu.megablox.gmm`, whose backward is the
transposed `tgmm`; MaxText's MoE uses them) visit only the tiles of each
group's rows, and state their cost as 2 m k n.
"""

import jax
import jax.numpy as jnp

from pallas_kernels import _dispatch

# Row, contraction and output tile sizes of the megablox kernels; the rows
# are zero-padded to a multiple of the first.
TILING = (128, 128, 128)


def grouped_matmul(x_MD, w_EDF, group_sizes_E, *, interpret: bool = False):
  """``x[rows of group e] @ w[e]`` for each run of rows (the groups in
  order), in x's dtype.

  When the compile target is a TPU (`compile_for`, else the default
  backend), the megablox Mosaic kernel; elsewhere `jax.lax.ragged_dot`.
  Differentiable in `x_MD` and `w_EDF`. A Mosaic kernel cannot be
  partitioned by XLA: under a multi-device mesh, call this inside
  `jax.shard_map` (or call `jax.lax.ragged_dot`).

  Args:
    x_MD: [M, D] rows, grouped (float32 or bfloat16 for the kernel).
    w_EDF: [E, D, F] one matrix per group.
    group_sizes_E: [E] int32 rows per group, summing to M.
    interpret: run the TPU kernel under the Pallas interpreter, on any
      backend (tests).
  """
  w_EDF = w_EDF.astype(x_MD.dtype)
  usable = x_MD.dtype in (jnp.float32, jnp.bfloat16)
  if not usable or not (interpret or _dispatch._backend() == "tpu"):
    return jax.lax.ragged_dot(x_MD, w_EDF, group_sizes_E)
  from jax.experimental.pallas.ops.tpu import megablox

  m = x_MD.shape[0]
  rows = -(-m // TILING[0]) * TILING[0]
  padded = jnp.pad(x_MD, [(0, rows - m), (0, 0)])
  out = megablox.gmm(
    padded,
    w_EDF,
    group_sizes_E.astype(jnp.int32),
    preferred_element_type=x_MD.dtype,
    tiling=TILING,
    interpret=interpret,
  )
  return out[:m]
