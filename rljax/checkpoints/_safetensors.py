"""Reading safetensors files: the header checked, the tensors memory-mapped.

A damaged, truncated or foreign file raises one `CheckpointError` that names
the file (and the tensor) and says what to do.
"""

import json
import math
import pathlib
import struct
from typing import Any

import ml_dtypes
import numpy as np

from rljax._src.errors import CheckpointError
from rljax.checkpoints._hf_errors import _REDOWNLOAD

_DTYPES = {
  "BF16": ml_dtypes.bfloat16,
  "F16": np.float16,
  "F32": np.float32,
  "F64": np.float64,
}


def _safetensors_header(path: pathlib.Path) -> tuple[dict[str, Any], int, int]:
  """The JSON header of a safetensors file, its length and the file's size."""
  damaged = f"the file is damaged or truncated. {_REDOWNLOAD}"
  try:
    size = path.stat().st_size
    with open(path, "rb") as f:
      head = f.read(8)
      if head[:4] == b"GGUF":
        raise CheckpointError(
          f"{path} is a GGUF file, not safetensors; load it with"
          " rljax.checkpoints.load_gguf, or move it out of the directory."
        )
      if size < 8:
        raise CheckpointError(
          f"{path} is {'empty' if size == 0 else f'only {size} bytes long'};"
          f" a safetensors file starts with an 8-byte header length, so {damaged}"
        )
      (n,) = struct.unpack("<Q", head)
      if n > size - 8:
        raise CheckpointError(
          f"{path} declares a {n}-byte header but holds only {size - 8} bytes"
          f" after the length: it is not a safetensors file, or {damaged}"
        )
      raw = f.read(n)
  except OSError as e:
    raise CheckpointError(f"{path} cannot be read: {e}") from e
  try:
    header = json.loads(raw)
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    raise CheckpointError(
      f"{path} has a header that is not valid JSON ({e}): it is not a"
      f" safetensors file, or {damaged}"
    ) from e
  if not isinstance(header, dict):
    raise CheckpointError(
      f"{path} has a JSON {type(header).__name__} as its header, not an"
      f" object: it is not a safetensors file, or {damaged}"
    )
  return header, n, size


def _entry(path: pathlib.Path, name: str, info: Any) -> tuple[Any, ...]:
  """(numpy dtype, shape, begin, end) of one header entry, checked."""
  if not (
    isinstance(info, dict)
    and isinstance(info.get("dtype"), str)
    and isinstance(shape := info.get("shape"), list)
    and all(type(d) is int and d >= 0 for d in shape)
    and isinstance(offsets := info.get("data_offsets"), list)
    and len(offsets) == 2
    and all(type(o) is int for o in offsets)
    and 0 <= offsets[0] <= offsets[1]
  ):
    raise CheckpointError(
      f"{path}: tensor {name!r} has a malformed header entry"
      f" {str(info)[:100]}; the file is damaged. {_REDOWNLOAD}"
    )
  if info["dtype"] not in _DTYPES:
    raise CheckpointError(
      f"{path}: tensor {name!r} has dtype {info['dtype']}; supported:"
      f" {sorted(_DTYPES)}. Export the checkpoint again in float32, bfloat16"
      " or float16."
    )
  dtype = np.dtype(_DTYPES[info["dtype"]])
  begin, end = offsets
  if end - begin != math.prod(shape) * dtype.itemsize:
    raise CheckpointError(
      f"{path}: tensor {name!r} is {end - begin} bytes long, but shape"
      f" {tuple(shape)} of {info['dtype']} needs"
      f" {math.prod(shape) * dtype.itemsize}; the file is damaged."
      f" {_REDOWNLOAD}"
    )
  return dtype, tuple(shape), begin, end


def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
  """Memory-mapped tensors of one file, bfloat16 included, header checked.

  `safetensors.numpy` cannot represent bfloat16, the dtype of most
  published checkpoints, so the (simple) format is read directly: an 8-byte
  little-endian header length, a JSON header, then the tensor data.

  Raises:
    CheckpointError: the file is unreadable, truncated, not safetensors, or
      its header is malformed or has a dtype other than a float.
  """
  header, n, size = _safetensors_header(path)
  entries = {
    name: _entry(path, name, info)
    for name, info in header.items()
    if name != "__metadata__"
  }
  data_size = size - 8 - n
  cut = [(e[2], name) for name, e in entries.items() if e[3] > data_size]
  if cut:
    expected = 8 + n + max(e[3] for e in entries.values())
    others = f" and {len(cut) - 1} more lie" if len(cut) > 1 else " lies"
    raise CheckpointError(
      f"{path} is truncated: it has {size} bytes, its header describes"
      f" {expected}; tensor {min(cut)[1]!r}{others} past its end."
      f" {_REDOWNLOAD}"
    )
  if data_size == 0:  # np.memmap cannot map nothing
    data = np.zeros(0, np.uint8)
  else:
    data = np.memmap(path, np.uint8, "r", offset=8 + n, shape=(data_size,))
  return {
    name: data[begin:end].view(dtype).reshape(shape)
    for name, (dtype, shape, begin, end) in entries.items()
  }
