"""A lossless JSON form for data-iterator states and run metadata.

grain's `DatasetIterator.get_state()` is a dict of Python ints (0.2.x), but
the `DataLoader` iterator's state is ``bytes`` and grain recommends numpy
scalars in custom iterator states. JSON has neither, so they are tagged:
``bytes`` -> ``{"__bytes__": base64}``, numpy arrays -> ``{"__ndarray__":
list, "dtype": str}``; numpy scalars become Python scalars. Tuples come back as
lists, as in any JSON round trip.
"""

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np

_BYTES = "__bytes__"
_NDARRAY = "__ndarray__"


def encode(x: Any, name: str) -> Any:
  """`x` as JSON-able values; a TypeError names the path of a bad value."""
  if isinstance(x, bytes):
    return {_BYTES: base64.b64encode(x).decode("ascii")}
  if isinstance(x, np.ndarray):
    return {_NDARRAY: x.tolist(), "dtype": x.dtype.str}
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, Mapping):
    return {_key(k, name): encode(v, f"{name}[{k!r}]") for k, v in x.items()}
  if isinstance(x, list | tuple):
    return [encode(v, f"{name}[{i}]") for i, v in enumerate(x)]
  if x is None or isinstance(x, bool | int | float | str):
    return x
  raise TypeError(
    f"{name} is a {type(x).__name__}, which cannot be stored as JSON; use "
    "dicts, lists, str, int, float, bool, None, bytes or numpy values."
  )


def decode(x: Any) -> Any:
  """Invert `encode`."""
  if isinstance(x, Mapping):
    if set(x) == {_BYTES}:
      return base64.b64decode(x[_BYTES])
    if set(x) == {_NDARRAY, "dtype"}:
      return np.asarray(x[_NDARRAY], dtype=np.dtype(x["dtype"]))
    return {k: decode(v) for k, v in x.items()}
  if isinstance(x, list):
    return [decode(v) for v in x]
  return x


def _key(k: Any, name: str) -> str:
  """A dict key, which JSON requires to be a string."""
  if not isinstance(k, str):
    raise TypeError(f"{name} has key {k!r}; JSON object keys must be str.")
  return k
