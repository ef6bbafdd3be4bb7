"""Atomic, keep-N, asynchronous, verified training checkpoints over orbax.

One checkpoint is one step directory ``<directory>/<step>/`` with up to three
items and a checksum manifest:

* ``state``: the train-state pytree (params, optax state, algorithm state,
  step, PRNG keys), written by orbax's `StandardCheckpointHandler` (OCDBT
  array store, sharding-aware: every process writes its own shards).
* ``data``: the data-iterator state, one JSON file per process,
  ``process_<i>-of-<n>.json`` (grain's own naming), because each process reads
  its own shard of the data.
* ``metadata``: a JSON dict (the run config, ...), written by process 0.
* ``rljax_checksums.json``: the size and SHA-256 of every file of the items.
  orbax and tensorstore verify nothing in the array data (a flipped bit loads
  silently), so process 0 hashes the files once they are all written, in
  orbax's background thread, just before orbax commits the step.

Guarantees:

* Atomicity is orbax's: a save writes ``<step>.orbax-checkpoint-tmp`` and
  renames it to ``<step>`` (with its ``commit_success.txt`` and checksums)
  only when every item and every process has finished. A save killed
  part-way, or one that failed (a full disk), leaves the tmp directory, which
  `latest_step`, `all_steps` and `restore` never see and which the next
  `Checkpointer` on the directory deletes; keep-N deletes nothing for it.
* Only committed step directories count: a stray ``<directory>/7`` (made by
  hand, or by an interrupted copy) is not a step, does not become the latest
  and does not stop `save` from writing step 7 (an empty one is replaced; one
  holding files is never overwritten: `save` raises `CheckpointError`).
* `restore` verifies a step before loading it (sizes and checksums, every
  item present, orbax's own read errors) and, without an explicit step, falls
  back to the newest intact one: each step skipped is logged as one warning
  line on the "rljax" logger and listed in `Restored.skipped`. The first save
  after such a fallback deletes the damaged steps it supersedes. With nothing
  intact, or a damaged explicit step, it raises one-line `CheckpointError`.
  A checkpoint without checksums (saved before they existed) restores with a
  warning. A state whose structure differs from the checkpoint's (a changed
  model or algorithm) is not damage: `CheckpointError` at once.
* An unwritable or full local directory fails in `Checkpointer(...)`, and a
  save that fails for lack of space (or permission) raises one-line
  `CheckpointError` naming the step, directory and cause, at `wait`, the next
  `save` or `close`.

Multi-process runs (one process per host): create the `Checkpointer` and call
`save`, `restore`, `wait` and `close` on every process. Every process verifies
the same files on restore (so each reads the whole checkpoint once more, about
1 GB/s per process); they reach the same verdict unless a read fails on one
host only. orbax refuses to save host-local arrays (for example a scalar step
placed on one local device): keep every array in `state` a global `jax.Array`
(built on the global mesh, e.g. with `jax.make_array_from_process_local_data`)
or a numpy/Python value.
"""

from collections.abc import Callable, Mapping
import errno
import logging
import os
import shutil
import time
from typing import Any, NamedTuple, Optional

from etils import epath
import jax
import orbax.checkpoint as ocp

from rljax._src import checks
from rljax._src.errors import CheckpointError
from rljax.checkpointing import _json
from rljax.checkpointing._checksums import _CHECKSUMS
from rljax.checkpointing._checksums import _verify
from rljax.checkpointing._checksums import _write_manifest
from rljax.checkpointing._errors import _NO_SPACE
from rljax.checkpointing._errors import _chain
from rljax.checkpointing._errors import _Damaged
from rljax.checkpointing._errors import _one_line
from rljax.checkpointing._errors import _probe
from rljax.checkpointing._errors import _storage_cause
from rljax.checkpointing._errors import _unless_damaged
from rljax.checkpointing._steps import _COMMITTED
from rljax.checkpointing._steps import _STEP_NAME
from rljax.checkpointing._steps import _TMP_SUFFIX
from rljax.checkpointing._steps import _TREE_METADATA
from rljax.checkpointing._steps import _committed
from rljax.checkpointing._steps import _CommittedSteps
from rljax.checkpointing._tree import _abstract
from rljax.checkpointing._tree import _check_structure
from rljax.checkpointing._tree import _storable
from rljax.checkpointing._tree import _unstorable

PyTree = Any
_policies = ocp.checkpoint_managers
_log = logging.getLogger("rljax")

# How long opening a directory waits for a failed save's writers to finish.
_TMP_CLEANUP_S = 30.0


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
    skipped: the newer steps `restore` passed over, newest first, as
      ``(step, reason)`` with a one-line reason (a damaged file, a missing
      item, a directory that is no finished checkpoint); each was also logged
      as a warning. Empty when the latest step was restored.
  """

  step: int
  state: PyTree
  data_state: Optional[Any]
  metadata: Optional[dict]
  skipped: tuple[tuple[int, str], ...] = ()


class Checkpointer:
  """Saves and restores train states, data-iterator states and metadata.

  Example::

    ckpt = Checkpointer(run_dir / "checkpoints", keep=3, save_every=100)
    ckpt.save(step, state, data_state=iterator.get_state(), metadata=config)
    ...
    restored = ckpt.restore(abstract_state)  # the newest intact step
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

  Raises:
    CheckpointError: a local `directory` cannot be created or written (a
      read-only file system, no permission, no space left).
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
    # orbax as they are; local paths are made absolute and probed.
    directory = str(directory)
    self._local = "://" not in directory
    if self._local:
      directory = os.path.abspath(directory)
      _probe(directory)
    self.directory = epath.Path(directory)
    self._async = async_save
    self._data_file = f"process_{jax.process_index()}-of-{jax.process_count()}"
    self._names = _CommittedSteps()
    self._saving: Optional[int] = None  # the step of the save in flight
    self._superseded: dict[int, str] = {}  # damaged steps a save replaces
    self._failure: Optional[BaseException] = None  # a failed save, reported
    options = ocp.CheckpointManagerOptions(
      save_decision_policy=_policies.AnySavePolicy(
        [
          _policies.FixedIntervalPolicy(save_every),
          _policies.PreemptionCheckpointingPolicy(),
        ]
      ),
      preservation_policy=_policies.LatestN(keep),
      # Always async (a synchronous save is a save and a wait): the checksums
      # are written by orbax's post-finalization callback, which only async
      # checkpointers run.
      enable_async_checkpointing=True,
      async_options=ocp.AsyncOptions(
        post_finalization_callback=self._write_checksums
      ),
      step_name_format=self._names,
      cleanup_tmp_directories=True,
    )
    self._manager = ocp.CheckpointManager(
      self.directory, options=options, handler_registry=self._registry()
    )
    self._await_tmp_cleanup()

  def _await_tmp_cleanup(self) -> None:
    """Wait until the tmp directories of unfinished saves are gone.

    orbax deletes them in a background thread that only its next save waits
    for; wait here, so that a directory just opened holds finished steps
    only. A save of this process that failed (no space) may still have
    writers finishing in its tmp directory, so that orbax's single `rmtree`
    finds it refilled ("Directory not empty"): the removal is then retried
    until those writers are done.
    """
    try:
      getattr(self._manager, "_maybe_await_cleanup_tmp_directory", lambda: 0)()
      return
    except OSError as e:
      if not self._local:
        raise
      first = e
    deadline = time.monotonic() + _TMP_CLEANUP_S
    while True:
      left = [
        p for p in self.directory.iterdir() if p.name.endswith(_TMP_SUFFIX)
      ]
      try:
        for path in left:
          shutil.rmtree(path)
        return
      except FileNotFoundError:
        continue  # removed meanwhile: look again
      except OSError as e:
        if e.errno != errno.ENOTEMPTY or time.monotonic() > deadline:
          raise CheckpointError(
            f"{self.directory} holds the tmp directory of an unfinished save "
            f"that cannot be deleted ({_one_line(str(e))}): delete "
            f"{', '.join(str(p) for p in left)} and open it again."
          ) from first
        time.sleep(0.05)

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

  def _step_dir(self, step: int) -> epath.Path:
    return self.directory / self._names.build_name(step)

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

    The first call after a `restore` that skipped damaged steps deletes them:
    the run goes on from the restored step and its new saves replace them.

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
      step, and always for a step not after the latest finished one.

    Raises:
      CheckpointError: the previous save (or this one, without
        ``async_save``) failed for lack of space or permission; or a
        directory that is not a finished checkpoint holds files where this
        step's checkpoint would go.
    """
    checks.non_negative(step=step)
    self._delete_superseded()
    latest = self.latest_step()
    if latest is not None and step <= latest:
      return False
    if not force and not self._manager.should_save(step):
      return False
    self.wait()
    self._clear_stray(step)
    items = {"state": ocp.args.StandardSave(_storable(state))}
    if data_state is not None:
      items["data"] = ocp.args.JsonSave(_json.encode(data_state, "data_state"))
    if metadata is not None:
      items["metadata"] = ocp.args.JsonSave(_json.encode(metadata, "metadata"))
    self._saving = step
    try:
      started = self._manager.save(
        step, args=ocp.args.Composite(**items), force=True
      )
    except Exception as e:
      self._saving = None
      error = self._save_error(step, e)
      if error is None:
        raise
      raise error from e
    if not started:
      self._saving = None
    elif not self._async:
      self.wait()
    return started

  def _delete_superseded(self) -> None:
    """Delete the damaged steps a fallback `restore` passed over."""
    superseded, self._superseded = self._superseded, {}
    for step, reason in sorted(superseded.items()):
      if step in self._manager.all_steps():
        _log.warning(
          "Deleting the damaged checkpoint of step %d in %s (%s): the run "
          "resumed from an earlier step and saves it anew.",
          step,
          self.directory,
          reason,
        )
        self._manager.delete(step)

  def _clear_stray(self, step: int) -> None:
    """Remove an empty stray directory where `step` goes; refuse a full one."""
    path = self._step_dir(step)
    if not self._local or not path.exists():
      return
    try:
      os.rmdir(path)  # only if empty
    except FileNotFoundError:  # another process removed it
      pass
    except OSError as e:
      raise CheckpointError(
        f"{path} is not a finished checkpoint (it has no {_COMMITTED}) but "
        f"holds files ({e.strerror}), so the checkpoint of step {step} cannot "
        f"take its place: move it out of {self.directory} or delete it, then "
        "resume."
      ) from e

  def _write_checksums(self) -> None:
    """Write the step's checksum manifest (orbax's background thread).

    orbax calls it on process 0 when every process has written every item,
    just before it commits the step, so the manifest is part of the atomic
    step directory.
    """
    final = self._step_dir(self._saving)
    tmp = final.parent / (final.name + _TMP_SUFFIX)
    root = tmp if tmp.exists() else final  # GCS: orbax writes in place
    _write_manifest(root)

  def latest_step(self) -> Optional[int]:
    """The largest step of a committed checkpoint, or None if there is none.

    Committed is not intact: `restore` verifies, and may fall back.
    """
    return max(self._manager.all_steps(), default=None)

  def all_steps(self) -> list[int]:
    """The steps of all committed checkpoints kept, ascending."""
    return sorted(self._manager.all_steps())

  def restore(
    self,
    abstract_state: PyTree,
    step: Optional[int] = None,
    *,
    restore_data: bool = True,
    check_metadata: Optional[Callable[[int, dict], None]] = None,
  ) -> Restored:
    """Restore a checkpoint onto the shardings of `abstract_state`.

    Each array is read straight into the sharding its abstract leaf names, so
    a state saved on one mesh restores onto any other (8 devices -> 1, or a
    different mesh shape). The step's files are verified first (sizes and
    SHA-256 checksums); by default the newest intact step is restored and each
    newer one skipped is logged (a warning on the "rljax" logger) and listed
    in `Restored.skipped`.

    Args:
      abstract_state: the target pytree: `jax.ShapeDtypeStruct` leaves with a
        ``sharding`` (e.g. ``jax.eval_shape`` of the init function with
        shardings attached), or concrete arrays whose shapes, dtypes and
        shardings to use; numpy and Python leaves restore as such.
      step: the step to restore, with no fallback; the newest intact one by
        default.
      restore_data: also restore this process's data-iterator state. Set it
        False to resume on a different number of processes (the data pipeline
        then starts afresh).
      check_metadata: called as ``check_metadata(step, metadata)`` with the
        step's metadata dict before its state is read (e.g. to refuse a
        checkpoint saved with another config, whose state may not even have
        the same structure); what it raises propagates, with no fallback.

    Returns:
      `Restored(step, state, data_state, metadata, skipped)`.

    Raises:
      FileNotFoundError: there is no checkpoint (for `step`) in the directory.
      CheckpointError: every checkpoint is damaged (the message lists each
        step and why), or the explicit `step` is; `abstract_state` does not
        match the saved state (a changed model or algorithm: the message names
        the first differing key path); the data state was saved by a
        different number of processes; a pending save failed.
      ValueError: a `jax.ShapeDtypeStruct` in `abstract_state` has no
        sharding.
    """
    self.wait()
    steps = self._check_step(step)
    target = jax.tree.map(_abstract, _storable(abstract_state))

    def attempt(s: int) -> Restored:
      return self._restore(
        s, target, abstract_state, restore_data, check_metadata
      )

    if step is not None:
      self._superseded = {}
      try:
        return attempt(step)
      except _Damaged as e:
        path = self._step_dir(step)
        raise CheckpointError(
          f"The checkpoint of step {step} at {path} is damaged: {e.reason}. "
          f"Restore another step (saved: {steps}; by default the newest "
          f"intact one) or delete {path}."
        ) from e
    stray = [(s, self._stray_reason(s)) for s in self._stray_steps()]
    damaged = []
    for s in reversed(steps):
      try:
        restored = attempt(s)
      except _Damaged as e:
        damaged.append((s, e.reason))
        continue
      skipped = sorted(
        [(d, r) for d, r in damaged + stray if d > s], reverse=True
      )
      for d, reason in skipped:
        _log.warning(
          "Skipped the checkpoint of step %d in %s: %s; restored step %d.",
          d,
          self.directory,
          reason,
          s,
        )
      self._superseded = dict(damaged)
      return restored._replace(skipped=tuple(skipped))
    listed = sorted(damaged + stray, reverse=True)
    raise CheckpointError(
      f"No intact checkpoint in {self.directory}: "
      + "; ".join(f"step {s}: {reason}" for s, reason in listed)
      + ". Delete the damaged step directories ("
      + ", ".join(str(self._step_dir(s)) for s, _ in listed)
      + ") to start this run over, or start over with --fresh (which moves "
      "them aside)."
    )

  def _check_step(self, step: Optional[int]) -> list[int]:
    """The committed steps, or a FileNotFoundError saying what exists."""
    steps = self.all_steps()
    if not steps:
      raise FileNotFoundError(
        f"No checkpoint exists in {self.directory}: it holds no finished "
        "step directory (unfinished saves, '<step>.orbax-checkpoint-tmp*', "
        "do not count)."
      )
    if step is not None and step not in steps:
      raise FileNotFoundError(
        f"No checkpoint for step {step} in {self.directory}; the saved steps "
        f"are {steps}."
      )
    return steps

  def _stray_steps(self) -> list[int]:
    """Local step-named directories without orbax's commit marker."""
    if not self._local or not self.directory.exists():
      return []
    return [
      int(p.name)
      for p in self.directory.iterdir()
      if _STEP_NAME.fullmatch(p.name) and p.is_dir() and not _committed(p)
    ]

  def _stray_reason(self, step: int) -> str:
    return (
      f"{self._step_dir(step)} is not a finished checkpoint (no {_COMMITTED}:"
      " made by hand or by an interrupted copy)"
    )

  def _restore(
    self,
    step: int,
    target: PyTree,
    abstract_state: PyTree,
    restore_data: bool,
    check_metadata: Optional[Callable[[int, dict], None]] = None,
  ) -> Restored:
    """Verify and restore one step; `_Damaged` if it cannot be read."""
    path = self._step_dir(step)
    if restore_data:
      self._check_data_file(step)
    # Only what is read: with restore_data=False, the data item is not.
    unread = () if restore_data else ("data",)
    if not _verify(path, unread):
      _log.warning(
        "The checkpoint of step %d in %s has no %s (saved before rljax wrote "
        "checksums, or copied without it): restoring it without verifying "
        "its files.",
        step,
        self.directory,
        _CHECKSUMS,
      )
    meta = _unless_damaged(lambda: self._manager.metadata(step))
    handlers = meta.item_handlers
    for item in sorted(handlers if isinstance(handlers, Mapping) else ()):
      if item not in unread and not (path / item).exists():
        raise _Damaged(f"its {item!r} item is missing ({path / item})")
    saved = meta.item_metadata
    if saved is None or "state" not in saved.keys() or saved["state"] is None:
      raise _Damaged(f"it has no readable 'state' item ({path / 'state'})")
    if not (path / "state" / _TREE_METADATA).exists():
      raise _Damaged(f"state/{_TREE_METADATA} is missing")
    if check_metadata is not None and "metadata" in saved.keys():
      only = ocp.args.Composite(metadata=ocp.args.JsonRestore())
      out = _unless_damaged(lambda: self._manager.restore(step, args=only))
      check_metadata(step, _json.decode(out["metadata"]))
    _check_structure(
      getattr(saved["state"], "tree", saved["state"]),
      target,
      f"step {step} in {self.directory}",
    )
    items = {"state": ocp.args.StandardRestore(target)}
    if "metadata" in saved.keys():
      items["metadata"] = ocp.args.JsonRestore()
    if restore_data and "data" in saved.keys():
      items["data"] = ocp.args.JsonRestore()
    out = _unless_damaged(
      lambda: self._manager.restore(step, args=ocp.args.Composite(**items))
    )
    return Restored(
      step=step,
      state=_unstorable(out["state"], abstract_state),
      data_state=_json.decode(out["data"]) if "data" in items else None,
      metadata=_json.decode(out["metadata"]) if "metadata" in items else None,
    )

  def _check_data_file(self, step: int) -> None:
    """Raise if the data-iterator states are of another process count.

    A state missing among those of this process count is damage, left to
    `_verify` and orbax.
    """
    folder = self._step_dir(step) / "data"
    if (folder / f"{self._data_file}.json").exists() or not folder.exists():
      return
    found = sorted(p.name for p in folder.glob("process_*.json"))
    if not found or any(
      name.endswith(f"-of-{jax.process_count()}.json") for name in found
    ):
      return
    raise CheckpointError(
      f"The checkpoint at {folder} holds data-iterator states {found} but "
      f"none for this process ({self._data_file}): it was saved by a "
      "different number of processes. Pass restore_data=False to restore the "
      "rest and restart the data pipeline."
    )

  def wait(self) -> None:
    """Block until every pending save has finished.

    Raises:
      CheckpointError: the pending save failed for lack of space or
        permission (the checkpoints before it are intact).
    """
    step = self._saving
    if step is None:  # nothing in flight (a failure is reported once)
      return
    try:
      self._manager.wait_until_finished()
    except Exception as e:
      error = self._save_error(step, e)
      if error is None:
        raise
      self._failure = e
      raise error from e
    finally:
      self._saving = None

  def _save_error(
    self, step: Optional[int], error: BaseException
  ) -> Optional[CheckpointError]:
    """The one-line error for a save the storage refused, else None."""
    cause = _storage_cause(error)
    if cause is None:
      return None
    # orbax dropped the failed step but also the steps keep-N was to delete
    # after it (they are still there): list the committed steps again.
    self._manager.reload()
    code, text = cause
    fix = (
      "free space on it or set output.checkpoint_directory to a disk with room"
      if code in _NO_SPACE
      else "make it writable or set output.checkpoint_directory elsewhere"
    )
    what = "a checkpoint" if step is None else f"the checkpoint of step {step}"
    return CheckpointError(
      f"Saving {what} to {self.directory} failed: {text}. The checkpoints "
      f"before it are intact (steps {self.all_steps()}); {fix}, then resume."
    )

  def close(self) -> None:
    """Wait for pending saves and release orbax's resources.

    Raises:
      CheckpointError: the pending save failed (see `wait`).
    """
    try:
      self.wait()
    finally:
      try:
        self._manager.close()
      except Exception as e:
        # orbax raises a failed save again in each thread that waits on it.
        if not any(x is self._failure for x in _chain(e)):
          raise

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
