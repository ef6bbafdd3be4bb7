"""Running a jitted function inside its mesh (`jax.set_mesh`)."""

import contextlib

import jax


class InMesh:
  """A jitted function traced, lowered and called inside ``jax.set_mesh``:
  the Pallas kernels in it then run per shard of the mesh
  (`pallas_kernels` wraps them in `jax.shard_map`; XLA cannot partition a
  Mosaic or Triton kernel itself).

  Example::

    update = InMesh(mesh, jax.jit(step, in_shardings=...))
    state, metrics = update(state, batch)
    update.lower(abstract_state, abstract_batch).compile()
  """

  def __init__(self, mesh: jax.sharding.Mesh, jitted):
    self.mesh = mesh
    self.jitted = jitted

  def _inside(self):
    """The mesh's context; none when it is already set (inside a trace, say
    `jax.eval_shape` under ``jax.set_mesh(mesh)``, it cannot be set)."""
    if jax.sharding.get_abstract_mesh() == self.mesh.abstract_mesh:
      return contextlib.nullcontext()
    return jax.set_mesh(self.mesh)

  def __call__(self, *args):
    with self._inside():
      return self.jitted(*args)

  def lower(self, *args):
    """`jax.stages.Lowered` for (abstract) `args`."""
    with self._inside():
      return self.jitted.lower(*args)
