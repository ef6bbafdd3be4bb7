"""Batch filters returning float32 0/1 keep masks over prompt groups.

They never drop rows: multiply keep_P into the sample mask and let the
training loop refill the batch from the kept count.
"""

from rljax.filters._filters import dynamic_sampling
from rljax.filters._filters import informative_groups
from rljax.filters._filters import reward_range_filter

__all__ = [
  "dynamic_sampling",
  "informative_groups",
  "reward_range_filter",
]
