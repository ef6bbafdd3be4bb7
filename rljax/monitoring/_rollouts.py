"""Sampled rollouts (prompt, completion, reward) as JSON lines every K steps."""

from collections.abc import Mapping, Sequence
import json
import math
import os
import pathlib
from typing import Any, Optional

import jax
import numpy as np

from rljax._src import checks

_FIELDS = ("step", "prompt", "completion", "reward")


class RolloutWriter:
  """Append one JSON line per sample, ``{step, prompt, completion, reward,
  **extra}``, at every `every`-th step, from process 0 only (strict JSON: a
  NaN or infinite value is written as null).

  Args:
    path: the JSONL file (appended to; its directory is created).
    every: write at steps that are multiples of it.
  """

  def __init__(self, path: os.PathLike | str, *, every: int):
    checks.positive(every=every)
    self.path = pathlib.Path(path)
    self.every = every
    self.active = jax.process_index() == 0

  def maybe_write(
    self,
    step: int,
    prompts: Sequence[str],
    completions: Sequence[str],
    rewards: Any,
    extra: Optional[Mapping[str, Sequence[Any]]] = None,
  ) -> bool:
    """Write the step's samples if ``step % every == 0``.

    Args:
      step: the training step.
      prompts: one prompt per sample, or one per group of G samples (the
        [P, G] layout flattened row-major: prompt i for samples iG..iG+G-1).
      completions: the decoded completions, one per sample.
      rewards: one reward per sample (any shape, e.g. [P, G]; jax or numpy).
      extra: more per-sample fields (e.g. ``{"accuracy": acc_B}``).

    Returns:
      Whether the samples were written.
    """
    if step % self.every or not self.active:
      return False
    rows = _rows(step, prompts, completions, rewards, extra or {})
    self.path.parent.mkdir(parents=True, exist_ok=True)
    with open(self.path, "a") as f:
      f.writelines(
        json.dumps(_strict(row), allow_nan=False) + "\n" for row in rows
      )
    return True


def _rows(step, prompts, completions, rewards, extra) -> list[dict]:
  """The JSON records, after checking that every field has one per sample."""
  rewards, extra = jax.device_get((rewards, dict(extra)))
  num = len(completions)
  if not prompts or num % len(prompts):
    raise ValueError(
      f"prompts has {len(prompts)} entries; give one per completion "
      f"({num}) or one per group (a divisor of {num})."
    )
  group = num // len(prompts)
  columns = {"reward": _column("rewards", rewards, num)}
  for name, values in extra.items():
    if name in _FIELDS:
      raise ValueError(f"extra field {name!r} clashes with {_FIELDS}.")
    columns[name] = _column(f"extra[{name!r}]", values, num)
  return [
    {
      "step": int(step),
      "prompt": prompts[i // group],
      "completion": completions[i],
      **{name: values[i] for name, values in columns.items()},
    }
    for i in range(num)
  ]


def _strict(row: dict) -> dict:
  """`row` with NaN and infinite floats as None (JSON null)."""
  return {
    k: None if isinstance(v, float) and not math.isfinite(v) else v
    for k, v in row.items()
  }


def _column(name: str, values: Any, num: int) -> list:
  """Per-sample values as a JSON-able list of length `num`."""
  if isinstance(values, list | tuple):
    values = [v.item() if isinstance(v, np.generic) else v for v in values]
  else:
    values = np.asarray(values).reshape(-1).tolist()
  if len(values) != num:
    raise ValueError(
      f"{name} has {len(values)} values for {num} completions; give one per "
      "completion."
    )
  return values
