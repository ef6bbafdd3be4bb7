"""Typed PRNG keys <-> their uint32 key data, leaf by leaf in a pytree.

Checkpoints hold a typed key (``jax.random.key``) as its raw ``uint32`` key
data (``jax.random.key_data``, trailing axes of the implementation's key shape,
e.g. ``(2,)`` for threefry2x32): plain arrays that any reader and any orbax
version restore. The key's implementation is not stored: it comes back from the
typed-key leaf of the abstract state given to restore, through
``jax.random.wrap_key_data(data, dtype=<that leaf's key dtype>)``.
"""

from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
from jax.sharding import SingleDeviceSharding

PyTree = Any


def is_key(x: Any) -> bool:
  """Whether `x` (an array or ShapeDtypeStruct) holds typed PRNG keys."""
  dtype = getattr(x, "dtype", None)
  return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def keys_to_data(tree: PyTree) -> PyTree:
  """Replace every typed-key leaf with its uint32 key data.

  Concrete key arrays become ``jax.random.key_data(x)`` (same sharding on the
  leading axes, the trailing key axes unsharded); `jax.ShapeDtypeStruct` key
  leaves become the matching uint32 ShapeDtypeStruct. Other leaves are kept.

  Args:
    tree: a pytree whose leaves may include typed PRNG key arrays.

  Returns:
    The same pytree with typed keys replaced by uint32 key data.
  """
  return jax.tree.map(_key_leaf_to_data, tree)


def data_to_keys(tree: PyTree, like: PyTree) -> PyTree:
  """Wrap uint32 key data back into typed keys wherever `like` has a key.

  Args:
    tree: a pytree with the structure of `like`, key data where `like` has
      typed keys.
    like: the pytree whose typed-key leaves (arrays or ShapeDtypeStructs) give
      each key's implementation through its dtype.

  Returns:
    `tree` with those leaves as typed keys.
  """
  return jax.tree.map(
    lambda x, ref: (
      jax.random.wrap_key_data(x, dtype=ref.dtype) if is_key(ref) else x
    ),
    tree,
    like,
  )


def _key_leaf_to_data(x: Any) -> Any:
  """Key data for one typed-key leaf; any other leaf unchanged."""
  if not is_key(x):
    return x
  if isinstance(x, jax.ShapeDtypeStruct):
    data = jax.eval_shape(
      jax.random.key_data, jax.ShapeDtypeStruct(x.shape, x.dtype)
    )
    extra = data.ndim - len(x.shape)
    sharding = _with_trailing_axes(x.sharding, len(x.shape), extra)
    return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
  return jax.random.key_data(x)


def _with_trailing_axes(sharding: Any, ndim: int, extra: int) -> Any:
  """The sharding of key data: the key's sharding, trailing axes unsharded."""
  if sharding is None or isinstance(sharding, SingleDeviceSharding):
    return sharding
  if isinstance(sharding, NamedSharding):
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec) + extra)
    return NamedSharding(sharding.mesh, PartitionSpec(*spec))
  raise ValueError(
    f"a typed PRNG key ShapeDtypeStruct has sharding {sharding!r}; give it a "
    "NamedSharding or SingleDeviceSharding (or pass the concrete key array)."
  )
