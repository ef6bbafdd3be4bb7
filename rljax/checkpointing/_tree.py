"""The train-state pytree as orbax stores it, and its match with a target."""

from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from rljax._src.errors import CheckpointError
from rljax.checkpointing import _keys

PyTree = Any


def _storable(tree: PyTree) -> PyTree:
  """What orbax can store: typed keys as key data, numpy scalars as arrays."""
  return jax.tree.map(
    lambda x: np.asarray(x) if isinstance(x, np.generic) else x,
    _keys.keys_to_data(tree),
  )


def _unstorable(tree: PyTree, like: PyTree) -> PyTree:
  """Invert `_storable` where `like` has typed keys or numpy scalars."""
  return jax.tree.map(
    lambda x, ref: (
      np.asarray(x, ref.dtype)[()] if isinstance(ref, np.generic) else x
    ),
    _keys.data_to_keys(tree, like),
    like,
  )


def _abstract(x: Any) -> Any:
  """A restore target for one leaf: arrays become ShapeDtypeStructs."""
  if isinstance(x, jax.Array):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
  return x


def _check_structure(saved: PyTree, target: PyTree, where: str) -> None:
  """Raise at the first key path where the trees differ.

  Raises:
    CheckpointError: a leaf is in one tree only or has another shape (the
      model or algorithm changed since the checkpoint of `where`).
    ValueError: a ShapeDtypeStruct of `target` has no sharding.
  """
  saved_leaves = _paths(saved)
  target_leaves = _paths(ocp.tree.serialize_tree(target, keep_empty_nodes=True))
  for path in sorted(set(saved_leaves) | set(target_leaves), key=_order):
    if path not in target_leaves:
      _mismatch(path, "is in the checkpoint but not in abstract_state", where)
    if path not in saved_leaves:
      _mismatch(path, "is in abstract_state but not in the checkpoint", where)
    _check_leaf(path, saved_leaves[path], target_leaves[path], where)


def _check_leaf(path: tuple, saved: Any, target: Any, where: str) -> None:
  """Raise when a leaf's saved shape differs or its sharding is missing."""
  saved_shape = getattr(saved, "shape", None)
  shape = getattr(target, "shape", None)
  if None not in (saved_shape, shape) and tuple(saved_shape) != tuple(shape):
    _mismatch(
      path,
      f"has shape {tuple(saved_shape)} in the checkpoint but {tuple(shape)} "
      "in abstract_state",
      where,
    )
  if isinstance(target, jax.ShapeDtypeStruct) and target.sharding is None:
    raise ValueError(
      f"abstract_state key path {_path_name(path)} is a ShapeDtypeStruct "
      "without a sharding; give it sharding=... (or pass a concrete array)."
    )


def _paths(tree: PyTree) -> dict[tuple, Any]:
  """Leaves by key path (a tuple of str/int keys)."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {tuple(_key_name(k) for k in path): leaf for path, leaf in leaves}


def _key_name(key: Any) -> Any:
  """The dict key, sequence index or attribute name of a key-path entry."""
  for attr in ("key", "idx", "name"):
    if hasattr(key, attr):
      return getattr(key, attr)
  return str(key)


def _order(path: tuple) -> tuple:
  """Sort key: jax's flattening order (ints and strs apart)."""
  return tuple((isinstance(k, str), k) for k in path)


def _path_name(path: tuple) -> str:
  return "".join(f"[{k!r}]" for k in path)


def _mismatch(path: tuple, what: str, where: str) -> None:
  """Raise the structure-mismatch error for `path`."""
  raise CheckpointError(
    f"abstract_state does not match the checkpoint of {where}: key path "
    f"{_path_name(path)} {what}. The run's model or algorithm changed since "
    "this checkpoint: resume with the config it was saved with, or start "
    "over with --fresh."
  )
