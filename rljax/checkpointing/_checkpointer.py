"""Atomic, keep-N, asynchronous training checkpoints over orbax.

One checkpoint is one step directory ``<directory>/<step>/`` with up to three
items:

* ``state``: the train-state pytree (params, optax state, algorithm state,
  step, PRNG keys), written by orbax's `StandardCheckpointHandler` (OCDBT
  array store, sharding-aware: every process writes its own shards).
* ``data``: the data-iterator state, one JSON file per process,
  ``process_<i>-of-<n>.json`` (grain's own naming), because each process reads
  its own shard of the data.
* ``metadata``: a JSON dict (the run config, ...), written by process 0.

Atomicity is orbax's: a save writes ``<step>.orbax-checkpoint-tmp``
and renames it to ``<step>`` only when every item and every process has
finished. A save killed part-way leaves the tmp directory, which
`latest_step`, `all_steps` and `restore` never see and which the next
`Checkpointer` on the directory deletes.

Multi-process runs (one process per host): create the `Checkpointer` and call
`save`, `restore`, `wait` and `close` on every process. orbax refuses to save
host-local arrays (for example a scalar step placed on one local device): keep
every array in `state` a global `jax.Array` (built on the global mesh, e.g. with
`jax.make_array_from_process_local_data`) or a numpy/Python value.
"""

from collections.abc import Mapping
import os
from typing import Any, NamedTuple, Optional

from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp

from rljax._src import checks
from rljax.checkpointing import _json
from rljax.checkpointing import _keys

PyTree = Any
_policies = ocp.checkpoint_managers


class Restored(NamedTuple):
  """What `Checkpointer.restore` returns.

  Attributes:
    step: the restored step.
    state: the train state, with the structure and shardings of the abstract
      state given to `restore` (typed PRNG keys included).
    data_state: this process's data-iterator state as given to `save`
      (``iterator.set_state(data_state)`` resumes it), or None if none was
      saved or it was not asked for.
    metadata: the metadata dict given to `save`, or None.
  """

  step: int
  state: PyTree
  data_state: Optional[Any]
  metadata: Optional[dict]


class Checkpointer:
  """Saves and restores train states, data-iterator states and metadata.

  Example::

    ckpt = Checkpointer(run_dir / "checkpoints", keep=3, save_every=100)
    ckpt.save(step, state, data_state=iterator.get_state(), metadata=config)
    ...
    restored = ckpt.restore(abstract_state)  # the latest step
    iterator.set_state(restored.data_state)

  `save` returns at once when ``async_save`` (device arrays are copied to host
  first, so the next train step may donate them); the files are written in a
  background thread and the step becomes visible when they are complete.
  `wait` blocks until pending saves finish; `close` waits and releases
  orbax's threads (or use the `Checkpointer` as a context manager).

  Args:
    directory: the checkpoint root (created if missing).
    keep: how many of the most recent checkpoints to keep; None keeps all.
    save_every: `save` writes only at steps that are multiples of it (and at a
      preemption signal on TPU), unless ``force=True``.
    async_save: write in the background.
  """

  def __init__(
    self,
    directory: os.PathLike | str,
    *,
    keep: Optional[int] = 3,
    save_every: int = 1,
    async_save: bool = True,
  ):
    checks.positive(save_every=save_every)
    if keep is not None:
      checks.positive(keep=keep)
    # URLs (gs://bucket/run: the shared storage of a multi-host run) go to
    # orbax as they are; local paths are made absolute.
    directory = str(directory)
    if "://" not in directory:
      directory = os.path.abspath(directory)
    self.directory = epath.Path(directory)
    self._data_file = f"process_{jax.process_index()}-of-{jax.process_count()}"
    options = ocp.CheckpointManagerOptions(
      save_decision_policy=_policies.AnySavePolicy(
        [
          _policies.FixedIntervalPolicy(save_every),
          _policies.PreemptionCheckpointingPolicy(),
        ]
      ),
      preservation_policy=_policies.LatestN(keep),
      enable_async_checkpointing=async_save,
      cleanup_tmp_directories=True,
    )
    self._manager = ocp.CheckpointManager(
      self.directory, options=options, handler_registry=self._registry()
    )

  def _registry(self) -> ocp.handlers.DefaultCheckpointHandlerRegistry:
    """Handlers: standard for the state, JSON for data (per process), meta."""
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    # primary_host=None: every process writes its own iterator-state file.
    data = ocp.JsonCheckpointHandler(
      f"{self._data_file}.json",
      multiprocessing_options=ocp.options.MultiprocessingOptions(
        primary_host=None
      ),
    )
    for item, save, restore, handler in [
      ("state", ocp.args.StandardSave, ocp.args.StandardRestore, None),
      ("data", ocp.args.JsonSave, ocp.args.JsonRestore, data),
      ("metadata", ocp.args.JsonSave, ocp.args.JsonRestore, None),
    ]:
      registry.add(item, save, handler)
      registry.add(item, restore, handler)
    return registry

  def save(
    self,
    step: int,
    state: PyTree,
    *,
    data_state: Optional[Any] = None,
    metadata: Optional[Mapping[str, Any]] = None,
    force: bool = False,
  ) -> bool:
    """Save a checkpoint for `step` if `save_every` (or `force`) says so.

    Args:
      step: the training step (>= 0); later saves need larger steps.
      state: a pytree of jax arrays (sharded ones included), numpy arrays and
        Python scalars; typed PRNG keys are stored as their key data.
      data_state: this process's data-iterator state, e.g. grain's
        ``iterator.get_state()``: JSON values plus bytes and numpy values.
      metadata: a JSON dict stored with the step (the run config, ...).
      force: save even when `step` is not a multiple of `save_every`.

    Returns:
      Whether a checkpoint was started: False when `save_every` skips the
      step, and always for a step not after the latest saved one.
    """
    checks.non_negative(step=step)
    latest = self.latest_step()
    if latest is not None and step <= latest:
      return False
    if not force and not self._manager.should_save(step):
      return False
    items = {"state": ocp.args.StandardSave(_storable(state))}
    if data_state is not None:
      items["data"] = ocp.args.JsonSave(_json.encode(data_state, "data_state"))
    if metadata is not None:
      items["metadata"] = ocp.args.JsonSave(_json.encode(metadata, "metadata"))
    return self._manager.save(
      step, args=ocp.args.Composite(**items), force=True
    )

  def latest_step(self) -> Optional[int]:
    """The largest step of a finished checkpoint, or None if there is none."""
    return max(self._manager.all_steps(), default=None)

  def all_steps(self) -> list[int]:
    """The steps of all finished checkpoints kept, ascending."""
    return sorted(self._manager.all_steps())

  def restore(
    self,
    abstract_state: PyTree,
    step: Optional[int] = None,
    *,
    restore_data: bool = True,
  ) -> Restored:
    """Restore a checkpoint onto the shardings of `abstract_state`.

    Each array is read straight into the sharding its abstract leaf names, so
    a state saved on one mesh restores onto any other (8 devices -> 1, or a
    different mesh shape).

    Args:
      abstract_state: the target pytree: `jax.ShapeDtypeStruct` leaves with a
        ``sharding`` (e.g. ``jax.eval_shape`` of the init function with
        shardings attached), or concrete arrays whose shapes, dtypes and
        shardings to use; numpy and Python leaves restore as such.
      step: the step to restore; the latest by default.
      restore_data: also restore this process's data-iterator state. Set it
        False to resume on a different number of processes (the data pipeline
        then starts afresh).

    Returns:
      `Restored(step, state, data_state, metadata)`.

    Raises:
      FileNotFoundError: there is no checkpoint (for `step`) in the directory.
      ValueError: `abstract_state` does not match the saved state (the
        message names the first differing key path), or the data state was
        saved by a different number of processes.
    """
    self.wait()
    step = self._check_step(step)
    target = jax.tree.map(_abstract, _storable(abstract_state))
    saved = self._manager.item_metadata(step)
    _check_structure(getattr(saved["state"], "tree", saved["state"]), target)
    items = {"state": ocp.args.StandardRestore(target)}
    if "metadata" in saved.keys():
      items["metadata"] = ocp.args.JsonRestore()
    if restore_data and "data" in saved.keys():
      self._check_data_file(step)
      items["data"] = ocp.args.JsonRestore()
    out = self._manager.restore(step, args=ocp.args.Composite(**items))
    return Restored(
      step=step,
      state=_unstorable(out["state"], abstract_state),
      data_state=_json.decode(out["data"]) if "data" in items else None,
      metadata=_json.decode(out["metadata"]) if "metadata" in items else None,
    )

  def _check_step(self, step: Optional[int]) -> int:
    """The step to restore, or a FileNotFoundError saying what exists."""
    steps = self.all_steps()
    if not steps:
      raise FileNotFoundError(
        f"No checkpoint exists in {self.directory}: it holds no finished "
        "step directory (unfinished saves, '<step>.orbax-checkpoint-tmp*', "
        "do not count)."
      )
    if step is None:
      return steps[-1]
    if step not in steps:
      raise FileNotFoundError(
        f"No checkpoint for step {step} in {self.directory}; the saved steps "
        f"are {steps}."
      )
    return step

  def _check_data_file(self, step: int) -> None:
    """Raise unless this process's data-iterator state was saved."""
    folder = self.directory / str(step) / "data"
    if (folder / f"{self._data_file}.json").exists():
      return
    found = sorted(p.name for p in folder.glob("process_*.json"))
    raise ValueError(
      f"The checkpoint at {folder} holds data-iterator states {found} but "
      f"none for this process ({self._data_file}): it was saved by a "
      "different number of processes. Pass restore_data=False to restore the "
      "rest and restart the data pipeline."
    )

  def wait(self) -> None:
    """Block until every pending save has finished."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Wait for pending saves and release orbax's resources."""
    self.wait()
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


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


def _check_structure(saved: PyTree, target: PyTree) -> None:
  """Raise a ValueError at the first key path where the trees differ."""
  saved_leaves = _paths(saved)
  target_leaves = _paths(ocp.tree.serialize_tree(target, keep_empty_nodes=True))
  for path in sorted(set(saved_leaves) | set(target_leaves), key=_order):
    if path not in target_leaves:
      _mismatch(path, "is in the checkpoint but not in abstract_state")
    if path not in saved_leaves:
      _mismatch(path, "is in abstract_state but not in the checkpoint")
    _check_leaf(path, saved_leaves[path], target_leaves[path])


def _check_leaf(path: tuple, saved: Any, target: Any) -> None:
  """Raise when a leaf's saved shape differs or its sharding is missing."""
  saved_shape = getattr(saved, "shape", None)
  shape = getattr(target, "shape", None)
  if None not in (saved_shape, shape) and tuple(saved_shape) != tuple(shape):
    _mismatch(
      path,
      f"has shape {tuple(saved_shape)} in the checkpoint but {tuple(shape)} "
      "in abstract_state",
    )
  if isinstance(target, jax.ShapeDtypeStruct) and target.sharding is None:
    _mismatch(
      path,
      "is a ShapeDtypeStruct without a sharding; give it sharding=... (or "
      "pass a concrete array)",
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


def _mismatch(path: tuple, what: str) -> None:
  """Raise the structure-mismatch error for `path`."""
  name = "".join(f"[{k!r}]" for k in path)
  raise ValueError(
    f"abstract_state does not match the checkpoint: key path {name} {what}."
  )
