"""Selection stages: filters and masks that decide which samples train.

Filters never drop rows (that would change shapes under jit): they zero the
sample mask of the groups they reject, which also removes them from the loss
normaliser. The training loop reads `kept_groups` to refill the batch.
"""

import jax
import jax.numpy as jnp

from rljax import filters
from rljax import masks
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare


def kept_groups(batch: Batch) -> jax.Array:
  """[P] 1.0 for prompt groups that still have a valid sample."""
  return (batch.samples().sum(-1) > 0).astype(jnp.float32)


def _keep(batch: Batch, keep_P: jax.Array) -> Batch:
  return batch._replace(sample_mask_PG=batch.samples() * keep_P[..., None])


def dynamic_sampling() -> Transform:
  """DAPO: drop groups whose rewards have zero spread (no learning signal)."""

  def fn(batch: Batch) -> Batch:
    batch.require("rewards_PG", by="dynamic_sampling")
    return _keep(
      batch, filters.dynamic_sampling(batch.rewards_PG, batch.samples())
    )

  return stateless_prepare(fn)


def reward_range_filter(*, low: float = 0.0, high: float = 1.0) -> Transform:
  """OpenRLHF: keep groups whose mean reward lies strictly in (low, high)."""

  def fn(batch: Batch) -> Batch:
    batch.require("rewards_PG", by="reward_range_filter")
    keep = filters.reward_range_filter(
      batch.rewards_PG, batch.samples(), low=low, high=high
    )
    return _keep(batch, keep)

  return stateless_prepare(fn)


def informative_groups(*, num_keep: int) -> Transform:
  """Down-sample to the `num_keep` groups of largest reward variance."""

  def fn(batch: Batch) -> Batch:
    batch.require("rewards_PG", by="informative_groups")
    keep = filters.informative_groups(
      batch.rewards_PG, batch.samples(), num_keep=num_keep
    )
    return _keep(batch, keep)

  return stateless_prepare(fn)


def mask_truncated() -> Transform:
  """Exclude truncated completions from the loss (TRL)."""

  def fn(batch: Batch) -> Batch:
    batch.require("truncated_PG", by="mask_truncated")
    return batch._replace(
      mask_PGT=masks.truncated_mask(batch.truncated_PG, batch.mask_PGT)
    )

  return stateless_prepare(fn)
