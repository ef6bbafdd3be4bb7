"""Pieces several presets share."""

from typing import Optional

from rljax import transforms
from rljax._src.base import Transform


def dapo_shaping(
  name: str,
  *,
  max_length: Optional[int],
  overlong_buffer: Optional[int],
  overlong_factor: float,
  dynamic_sampling: bool,
) -> list[Transform]:
  """DAPO's batch stages before the advantage: dynamic sampling (the filter
  reads the task reward before shaping: the paper drops prompts whose
  accuracy is 0 or 1, verl's filter metric ``acc``) and the soft overlong
  penalty when both `max_length` and `overlong_buffer` are given."""
  if (max_length is None) != (overlong_buffer is None):
    raise ValueError(
      f"{name}: set both max_length and overlong_buffer to enable the"
      " overlong penalty, or neither."
    )
  stages = [transforms.dynamic_sampling()] if dynamic_sampling else []
  if max_length is not None:
    stages.append(
      transforms.overlong_penalty(
        max_length=max_length, buffer=overlong_buffer, factor=overlong_factor
      )
    )
  return stages
