"""Learning-curve PNGs from metrics.jsonl records, one run or several.

Figures are drawn on `matplotlib.figure.Figure` with the Agg canvas and never
through pyplot, so no display, backend choice or global figure state is
involved: the same calls work on a headless server, in CI and in notebooks
(show the PNG with ``IPython.display.Image(path)``).
"""

from collections.abc import Iterable, Mapping, Sequence
import json
import math
import os
import pathlib
from typing import Any, Optional

Records = os.PathLike | str | Iterable[Mapping[str, Any]]

DEFAULT_PLOT_KEYS = (
  "reward",
  "accuracy",
  "kl_ref",
  "entropy",
  "clip_frac",
  "response_length",
  "loss",
)


def read_metrics(source: Records) -> list[dict[str, Any]]:
  """Metric records sorted by step, the records of a repeated step merged.

  Records of one step are merged, later values winning: a resumed run appends
  the steps after its checkpoint again (their newest values count), and an
  evaluation logged at a train step adds its keys to that step.

  Args:
    source: a ``metrics.jsonl`` path, or records (dicts with a ``step``).

  Returns:
    The records, one per step, ascending.
  """
  if isinstance(source, str | os.PathLike):
    with open(source) as f:
      source = [json.loads(line) for line in f if line.strip()]
  by_step = {}
  for record in source:
    if "step" not in record:
      raise ValueError(f"a metrics record has no 'step': {record!r}.")
    by_step.setdefault(record["step"], {}).update(record)
  return [by_step[step] for step in sorted(by_step)]


def plot_learning_curves(
  source: Records,
  out_png: os.PathLike | str,
  keys: Sequence[str] = DEFAULT_PLOT_KEYS,
  title: Optional[str] = None,
) -> pathlib.Path:
  """One subplot per metric in `keys` that the run logged, against step.

  Args:
    source: a ``metrics.jsonl`` path or its records.
    out_png: the PNG to write (its directory is created).
    keys: the metrics to draw, in order; those never logged are skipped.
    title: the figure title.

  Returns:
    The PNG's path.
  """
  records = read_metrics(source)
  present = [k for k in keys if any(k in r for r in records)]
  if not present:
    logged = sorted({k for r in records for k in r} - {"step"})
    raise ValueError(f"none of keys={list(keys)} was logged; found {logged}.")
  cols = min(3, len(present))
  rows = math.ceil(len(present) / cols)
  fig = _figure(figsize=(4.2 * cols, 3.0 * rows))
  for i, key in enumerate(present):
    ax = fig.add_subplot(rows, cols, i + 1)
    ax.plot(*_series(records, key))
    ax.set(title=key, xlabel="step")
    ax.grid(alpha=0.3)
  return _save(fig, out_png, title)


def plot_runs(
  runs: Mapping[str, Records],
  out_png: os.PathLike | str,
  key: str = "reward",
  title: Optional[str] = None,
) -> pathlib.Path:
  """Overlay one metric of several runs (e.g. GRPO vs SAPO) on one axis.

  Args:
    runs: run label -> a ``metrics.jsonl`` path or its records.
    out_png: the PNG to write (its directory is created).
    key: the metric to compare.
    title: the figure title (default: `key`).

  Returns:
    The PNG's path.
  """
  fig = _figure(figsize=(6.0, 4.0))
  ax = fig.add_subplot()
  for label, source in runs.items():
    steps, values = _series(read_metrics(source), key)
    if not steps:
      raise ValueError(f"run {label!r} never logged {key!r}.")
    ax.plot(steps, values, label=label)
  ax.set(xlabel="step", ylabel=key)
  ax.grid(alpha=0.3)
  ax.legend()
  return _save(fig, out_png, title or key)


def _series(records: list[dict], key: str) -> tuple[list, list]:
  """(steps, values) of the records that logged `key` (null as NaN)."""
  points = [
    (r["step"], math.nan if r[key] is None else r[key])
    for r in records
    if key in r
  ]
  return [s for s, _ in points], [v for _, v in points]


def _figure(figsize: tuple[float, float]) -> Any:
  """A constrained-layout `matplotlib.figure.Figure`; matplotlib is imported
  here, at the first plot, so that importing rljax does not pay for it."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  return Figure(figsize=figsize, layout="constrained")


def _save(fig: Any, out_png: os.PathLike | str, title: Optional[str]):
  """Write `fig` as a PNG through the Agg canvas and return its path."""
  if title:
    fig.suptitle(title)
  path = pathlib.Path(out_png)
  path.parent.mkdir(parents=True, exist_ok=True)
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top

  FigureCanvasAgg(fig).print_png(str(path))
  return path
