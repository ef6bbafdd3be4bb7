"""Argument checks that run at trace time and raise errors that say what to fix.

Shapes are static under `jax.jit`, so every check here costs nothing at run
time. Each error names the argument, what it got, and what it needs.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np


def _shape(x: Any) -> tuple[int, ...]:
  return tuple(np.shape(x))


def rank(name: str, x: Any, expected: int, layout: str) -> None:
  """Raise unless `x` has `expected` dimensions (`layout` names them)."""
  if np.ndim(x) != expected:
    raise ValueError(
      f"{name} must have rank {expected} ({layout}); got shape {_shape(x)}."
    )


def same_shape(names: Sequence[str], *arrays: Any) -> None:
  """Raise unless all non-None arrays have the same shape."""
  present = [(n, _shape(a)) for n, a in zip(names, arrays) if a is not None]
  if len({s for _, s in present}) > 1:
    listed = ", ".join(f"{n} {s}" for n, s in present)
    raise ValueError(f"shapes must match: {listed}.")


def leading_shape(name: str, x: Any, shape: tuple[int, ...], of: str) -> None:
  """Raise unless the leading dimensions of `x` equal `shape`."""
  got = _shape(x)
  if got[: len(shape)] != tuple(shape):
    raise ValueError(
      f"{name} has shape {got}; its leading dimensions must be {shape},"
      f" the shape of {of}."
    )


def group_size(name: str, x: Any, minimum: int = 2) -> None:
  """Raise when the group axis (the last one) is smaller than `minimum`."""
  if np.ndim(x) < 1 or _shape(x)[-1] < minimum:
    raise ValueError(
      f"{name} has shape {_shape(x)}: its last axis is the group (samples per"
      f" prompt) and this estimator needs at least {minimum} samples per"
      " group. Sample more completions per prompt, or use an estimator"
      " without a group baseline (e.g. advantages.remax or"
      " advantages.reinforce_pp)."
    )


def positive(**values: float) -> None:
  """Raise for any hyperparameter that is not > 0."""
  for name, value in values.items():
    if value is None or not np.all(np.asarray(value) > 0):
      raise ValueError(f"{name} must be > 0; got {value!r}.")


def non_negative(**values: float) -> None:
  """Raise for any hyperparameter that is < 0."""
  for name, value in values.items():
    if value is None or not np.all(np.asarray(value) >= 0):
      raise ValueError(f"{name} must be >= 0; got {value!r}.")


def in_range(name: str, value: float, low: float, high: float) -> None:
  """Raise unless low <= value <= high."""
  if not low <= value <= high:
    raise ValueError(f"{name} must be in [{low}, {high}]; got {value!r}.")


def one_of(name: str, value: Any, choices: Sequence[Any]) -> None:
  if value not in choices:
    raise ValueError(f"{name} must be one of {list(choices)}; got {value!r}.")
