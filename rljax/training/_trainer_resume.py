"""A run's checkpoints: a fresh start, resuming, and what a save refuses.

A resumed run restores the newest intact checkpoint and refuses one saved
with another config (unless the changed fields are allowed); a fresh start
moves a previous run aside so that two runs never mix; a train state with
a NaN or an infinity is never checkpointed.
"""

import dataclasses
import fnmatch
import json
import logging
import pathlib
from typing import Any

import jax
import numpy as np

from rljax import checkpointing
from rljax._src.errors import NonFiniteError
from rljax._src.errors import UserError
from rljax.training import _hosts
from rljax.training import _run_dir
from rljax.training._config import RunConfig
from rljax.training._step import all_finite

# Config fields a resumed run may change without changing what it trains:
# logging, evaluation, checkpoint cadence, the run's length, the mesh
# (checkpoints restore onto any mesh), and the warm start (not re-run).
RESUMABLE_CHANGES = (
  "train.steps",
  "train.eval_*",
  "train.mesh",
  "train.warm_start_*",
  "train.nonfinite",
  "train.max_skipped_updates",
  "output.*",
)


def config_json(config: RunConfig) -> dict:
  """The config as JSON values (tuples become lists), as checkpoints hold it."""
  return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
  """Nested dicts as {"section.field": value}."""
  if not isinstance(tree, dict):
    return {prefix: tree}
  if not tree and prefix:
    return {prefix: tree}
  out = {}
  for k, v in tree.items():
    out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
  return out


def check_same_config(saved, current, allowed, *, step, directory) -> None:
  """Refuse to resume a checkpoint of a run with another config.

  Fields matching a pattern of `allowed` (fnmatch) may differ. A field the
  saved config lacks (a checkpoint of an earlier rljax) is unchanged when
  it holds its default now: a new field's default keeps what runs did
  before it existed.
  """
  old, new = _flat(saved), _flat(current)
  defaults = _flat(config_json(RunConfig()))
  changed = sorted(
    k
    for k in set(old) | set(new)
    if old.get(k, "<unset>") != new.get(k, "<unset>")
    and not (k not in old and k in defaults and new.get(k) == defaults[k])
    and not any(fnmatch.fnmatchcase(k, pattern) for pattern in allowed)
  )
  if not changed:
    return
  listed = ", ".join(
    f"{k} {old.get(k, '<unset>')!r} -> {new.get(k, '<unset>')!r}"
    for k in changed
  )
  raise UserError(
    f"the checkpoint at step {step} in {directory} was saved by a run with"
    f" another config ({listed}); resuming would mix two runs. Start over"
    " with --fresh (the old run is moved aside), give this run another"
    " output.directory, or accept the change with --allow_change"
    f" {','.join(changed)}."
  )


def clear_previous_run(directory, checkpoints, *, writer: bool) -> None:
  """``resume=False`` (``--fresh``): move a previous run aside so that the
  two never mix (its checkpoints would block this run's saves, and a later
  resume would restore them)."""
  remote = "://" in str(checkpoints)
  if remote:
    with checkpointing.Checkpointer(checkpoints) as previous:
      steps = previous.all_steps()
    if steps:
      raise UserError(
        f"output.checkpoint_directory={str(checkpoints)!r} holds the"
        f" checkpoints of a previous run (steps {steps}); a fresh start"
        " cannot move them aside on remote storage. Delete them, or give"
        " this run another output.checkpoint_directory."
      )
  if writer:
    _run_dir.move_aside(
      directory, None if remote else pathlib.Path(checkpoints)
    )
  _hosts.process_sum(np.int32(0))  # every process waits for the move


def restore(checkpointer, state, config: RunConfig, allowed):
  """The newest intact checkpoint shaped like `state`, if its config
  matches `config` (up to the `allowed` fields); damaged ones skipped are
  logged."""
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
    state,
  )
  current = config_json(config)

  def same_config(step, metadata):
    if "config" in metadata:
      check_same_config(
        metadata["config"],
        current,
        allowed,
        step=step,
        directory=checkpointer.directory,
      )

  restored = checkpointer.restore(
    abstract, restore_data=False, check_metadata=same_config
  )
  if restored.skipped:
    logging.getLogger("rljax").warning(
      "Resumed from step %d; skipped damaged checkpoints: %s.",
      restored.step,
      "; ".join(f"step {s}: {why}" for s, why in restored.skipped),
    )
  return restored


def restored_prompt_state(metadata, prompt_state, prompts_per_step: int):
  """The prompt sampler's state a checkpoint holds (one saved before
  prompt samplers holds grain's batch position instead)."""
  if "prompt_state" in metadata:
    return metadata["prompt_state"]
  prompt_state["position"] = (
    metadata["data_state"]["next_index"] * prompts_per_step
  )
  return prompt_state


def check_savable(state, step: int) -> None:
  """Refuse to checkpoint a train state with a NaN or an infinity."""
  if not bool(jax.jit(all_finite)(state)):
    raise NonFiniteError(
      f"step {step}: the train state holds a NaN or an infinity (in "
      f"{_nonfinite_leaf(state)}); it was not checkpointed. The last"
      " checkpoint is intact: resume from it with a lower"
      " optim.learning_rate or check the algorithm's hyperparameters."
    )


def _nonfinite_leaf(tree: Any) -> str:
  """The key path of the first floating leaf of `tree` with a NaN or inf."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if not bool(jax.jit(all_finite)(leaf)):
      return jax.tree_util.keystr(path)
  return "an unknown leaf"
