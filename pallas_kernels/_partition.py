"""Pallas kernels on a device mesh: one kernel call per shard of the rows.

A Mosaic (TPU) or Triton (GPU) kernel cannot be partitioned by XLA: under a
`jax.jit` whose inputs are split over a mesh, it must run inside
`jax.shard_map`. When the abstract mesh of the trace (`jax.set_mesh`) has
more than one device, `by_rows` runs a schedule's forward and backward per
shard: the token rows [N] split over every mesh axis (in mesh order) whose
size still divides N, the unembedding whole on each device, and the
unembedding's gradient summed over the row shards (in float32, then rounded
to its dtype). With no mesh, or one device, the kernels run as they are.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from pallas_kernels._contract import Stats


def _row_axes(n: int):
  """(abstract mesh, axes the N rows split over); () when there is none."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return mesh, ()
  axes, size = [], 1
  for name in mesh.axis_names:
    if mesh.shape[name] > 1 and n % (size * mesh.shape[name]) == 0:
      axes.append(name)
      size *= mesh.shape[name]
  return mesh, tuple(axes)


def forward(kernel):
  """`kernel` (a contract forward) run per row shard of the trace's mesh."""

  @functools.wraps(kernel)
  def run(hidden, unembed, targets, inv_temp):
    mesh, axes = _row_axes(hidden.shape[0])
    if not axes:
      return kernel(hidden, unembed, targets, inv_temp)
    rows = P(axes)
    return jax.shard_map(
      kernel,
      mesh=mesh,
      in_specs=(P(axes, None), P(), rows, P()),
      out_specs=Stats(rows, rows, rows),
      check_vma=False,
    )(hidden, unembed, targets, inv_temp)

  return run


def backward(kernel):
  """`kernel` (a contract backward) run per row shard of the trace's mesh,
  the unembedding's gradient summed over the shards."""

  @functools.wraps(kernel)
  def run(hidden, unembed, targets, inv_temp, lse, ez, a, b):
    mesh, axes = _row_axes(hidden.shape[0])
    if not axes:
      return kernel(hidden, unembed, targets, inv_temp, lse, ez, a, b)
    rows = P(axes)

    def local(*args):
      d_hidden, d_unembed = kernel(*args)
      total = jax.lax.psum(d_unembed.astype(jnp.float32), axes)
      return d_hidden, total.astype(d_unembed.dtype)

    return jax.shard_map(
      local,
      mesh=mesh,
      in_specs=(P(axes, None), P(), rows, P(), rows, rows, rows, rows),
      out_specs=(P(axes, None), P()),
      check_vma=False,
    )(hidden, unembed, targets, inv_temp, lse, ez, a, b)

  return run
