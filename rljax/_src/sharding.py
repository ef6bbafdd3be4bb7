"""Sharding helpers for library code (which never builds a mesh itself)."""

import jax


def replicated(x: jax.Array) -> jax.Array:
  """`x` gathered onto every device of its mesh, if it is split.

  Needed before sorting along a sharded axis: under explicit-axis meshes
  (jax >= 0.7 `jax.make_mesh` default) XLA cannot sort a split dimension and
  raises `ShardingTypeError`. A no-op outside a mesh or on replicated arrays.
  """
  sharding = jax.typeof(x).sharding
  if sharding.mesh.empty or all(s is None for s in sharding.spec):
    return x
  whole = jax.sharding.NamedSharding(
    sharding.mesh, jax.sharding.PartitionSpec()
  )
  return jax.sharding.reshard(x, whole)
