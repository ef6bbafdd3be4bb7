"""Metric values to Python floats, with one host transfer per call."""

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np


def to_floats(metrics: Mapping[str, Any]) -> dict[str, float]:
  """`metrics` as floats: jax arrays, numpy and Python scalars of one element.

  The whole dict goes through a single ``jax.device_get``, so logging N
  device scalars costs one host round trip, not N.
  """
  values = jax.device_get(dict(metrics))
  out = {}
  for name, value in values.items():
    out[str(name)] = _float(name, value)
  return out


def _float(name: str, value: Any) -> float:
  """One metric as a float, or a ValueError naming it."""
  array = np.asarray(value)
  try:
    if array.size == 1 and array.dtype.kind not in "USO":
      return float(array.reshape(()))
  except (TypeError, ValueError):
    pass
  raise ValueError(
    f"metric {name!r} must be a number or a one-element array; got "
    f"{type(value).__name__} with shape {array.shape} and dtype {array.dtype}."
    " Reduce it (e.g. take its mean) before logging."
  )
