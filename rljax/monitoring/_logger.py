"""Scalar metrics to a JSONL file, TensorBoard and (when asked) W&B."""

from collections.abc import Mapping
import json
import math
import os
import pathlib
from typing import Any, Optional

import jax

from rljax.monitoring._values import to_floats


class MetricsLogger:
  """Fan scalar metrics out to every writer, from process 0 only.

  Writers, all under ``run_dir``:

  * ``metrics.jsonl``, always: one ``{"step": s, "<name>": value, ...}`` line
    per `log` call, flushed at once (a crash loses nothing logged), strict
    JSON (a NaN or infinite value is written as null). The file is appended
    to, so a resumed run continues it; `read_metrics` merges the records of a
    repeated step, the newest values winning.
  * TensorBoard event files (tensorboardX), unless ``tensorboard=False``:
    ``tensorboard --logdir <parent of run_dir>`` compares runs.
  * Weights & Biases when ``wandb`` is True (project "rljax") or a project
    name; wandb is an optional extra (``pip install rljax[wandb]``).

  On every process but ``jax.process_index() == 0`` nothing is created and
  `log` does nothing, so the loop can call it unconditionally.

  Args:
    run_dir: the run directory (created if missing).
    tensorboard: write TensorBoard event files.
    wandb: False, True or a W&B project name.
    config: the run configuration, given to W&B.
    purge_step: a resumed run's first new step: TensorBoard hides the events
      at this step and after that the interrupted run wrote (tensorboardX's
      ``purge_step``). The caller truncates ``metrics.jsonl`` itself.
  """

  def __init__(
    self,
    run_dir: os.PathLike | str,
    *,
    tensorboard: bool = True,
    wandb: bool | str = False,
    config: Optional[Mapping[str, Any]] = None,
    purge_step: Optional[int] = None,
  ):
    self.run_dir = pathlib.Path(run_dir)
    self.active = jax.process_index() == 0
    self._jsonl = self._tensorboard = self._wandb = None
    self._closed = False
    if not self.active:
      return
    self.run_dir.mkdir(parents=True, exist_ok=True)
    if wandb:
      project = wandb if isinstance(wandb, str) else "rljax"
      self._wandb = _import_wandb().init(
        project=project,
        name=self.run_dir.name,
        dir=str(self.run_dir),
        config=dict(config or {}),
      )
    self._jsonl = open(self.run_dir / "metrics.jsonl", "a")
    if tensorboard:
      # Imported here: tensorboardX imports torch where it is installed
      # (seconds), which a run without TensorBoard should not pay.
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top

      self._tensorboard = SummaryWriter(
        logdir=str(self.run_dir), flush_secs=10, purge_step=purge_step
      )

  def log(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Write `metrics` (name -> scalar, jax or numpy or Python) for `step`."""
    if self._closed:
      raise ValueError(f"MetricsLogger for {self.run_dir} is closed.")
    if not self.active:
      return
    values = to_floats(metrics)
    record = {"step": int(step), **strict(values)}
    self._jsonl.write(json.dumps(record, allow_nan=False) + "\n")
    self._jsonl.flush()
    if self._tensorboard is not None:
      for name, value in values.items():
        self._tensorboard.add_scalar(name, value, global_step=int(step))
    if self._wandb is not None:
      self._wandb.log(values, step=int(step))

  def close(self) -> None:
    """Flush and close every writer."""
    if self._jsonl is not None:
      self._jsonl.close()
    if self._tensorboard is not None:
      self._tensorboard.close()
    if self._wandb is not None:
      self._wandb.finish()
    self._jsonl = self._tensorboard = self._wandb = None
    self._closed = True

  def __enter__(self) -> "MetricsLogger":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def strict(values: Mapping[str, float]) -> dict[str, Optional[float]]:
  """`values` with NaN and infinities as None (JSON null): JSON has no NaN."""
  return {k: v if math.isfinite(v) else None for k, v in values.items()}


def _import_wandb() -> Any:
  """The wandb module, or an ImportError that says how to install it."""
  try:
    import wandb
  except ImportError as e:
    raise ImportError(
      "W&B logging needs the wandb package: pip install rljax[wandb] "
      "(or log without wandb=...)."
    ) from e
  return wandb
