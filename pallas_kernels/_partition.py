"""Pallas kernels on a device mesh: one kernel call per shard of the rows.

A Mosaic (TPU) or Triton (GPU) kernel cannot be partitioned by XLA: under a
`jax.jit` whose inputs are split over a mesh, it must run inside
`jax.shard_map`. When the abstract mesh of the trace (`jax.set_mesh`) has
more than one device, `forward` and `backward` run a schedule's kernels per
shard: the token rows [N], zero-padded to a multiple of the device count,
split over every mesh axis; the unembedding whole on each device; its
gradient summed over the shards (in float32, then rounded to its dtype).
Padded rows have zero hidden states and zero cotangents, so they add
nothing to either gradient, and are cut from the outputs. With no mesh, or
one device, the kernels run as they are.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from pallas_kernels._contract import Stats


def _mesh_axes():
  """(abstract mesh, its axes of more than one device); () when the trace
  has no mesh or one device."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return mesh, ()
  return mesh, tuple(n for n in mesh.axis_names if mesh.shape[n] > 1)


def _pad(x, rows: int):
  """`x` with zero rows appended to `rows` rows."""
  extra = rows - x.shape[0]
  if not extra:
    return x
  return jnp.pad(x, [(0, extra)] + [(0, 0)] * (x.ndim - 1))


def _split(axes, mesh, n: int) -> int:
  """N rounded up to a multiple of the devices along `axes`."""
  devices = math.prod(mesh.shape[a] for a in axes)
  return -(-n // devices) * devices


def forward(kernel):
  """`kernel` (a contract forward) run per row shard of the trace's mesh."""

  @functools.wraps(kernel)
  def run(hidden, unembed, targets, inv_temp):
    mesh, axes = _mesh_axes()
    if not axes:
      return kernel(hidden, unembed, targets, inv_temp)
    n = hidden.shape[0]
    rows = _split(axes, mesh, n)
    spec = P(axes)
    out = jax.shard_map(
      kernel,
      mesh=mesh,
      in_specs=(P(axes, None), P(), spec, P()),
      out_specs=Stats(spec, spec, spec),
      check_vma=False,
    )(_pad(hidden, rows), unembed, _pad(targets, rows), inv_temp)
    return Stats(*(x[:n] for x in out))

  return run


def backward(kernel):
  """`kernel` (a contract backward) run per row shard of the trace's mesh,
  the unembedding's gradient summed over the shards."""

  @functools.wraps(kernel)
  def run(hidden, unembed, targets, inv_temp, lse, ez, a, b):
    mesh, axes = _mesh_axes()
    if not axes:
      return kernel(hidden, unembed, targets, inv_temp, lse, ez, a, b)
    n = hidden.shape[0]
    rows = _split(axes, mesh, n)
    spec = P(axes)

    def local(*args):
      d_hidden, d_unembed = kernel(*args)
      total = jax.lax.psum(d_unembed.astype(jnp.float32), axes)
      return d_hidden, total.astype(d_unembed.dtype)

    padded = [_pad(x, rows) for x in (hidden, targets, lse, ez, a, b)]
    h, t, *stats = padded
    d_hidden, d_unembed = jax.shard_map(
      local,
      mesh=mesh,
      in_specs=(P(axes, None), P(), spec, P(), spec, spec, spec, spec),
      out_specs=(P(axes, None), P()),
      check_vma=False,
    )(h, unembed, t, inv_temp, *stats)
    return d_hidden[:n], d_unembed

  return run
