"""The critic's objective for PPO (the value model is a separate state)."""

from typing import Optional

from jax.typing import ArrayLike

from rljax import aggregate as aggregate_lib
from rljax import losses
from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Aggregation
from rljax._src.base import Batch
from rljax._src.base import Mean
from rljax._src.base import check_batch
from rljax._src.base import mean_metric


def value_loss(
  values_PGT: ArrayLike,
  batch: Batch,
  *,
  eps: Optional[float] = 0.2,
  aggregate: Aggregation = aggregate_lib.token_mean,
) -> tuple[Mean, dict[str, Mean]]:
  """Clipped value loss against `returns_PGT` (from `gae_advantages`).

  ``eps=None`` gives the unclipped squared error. verl aggregates the value
  loss with the actor's mode (token-mean by default); OpenRLHF uses eps 0.5.
  """
  check_batch(batch)
  checks.same_shape(
    ["values_PGT", "Batch.mask_PGT"], values_PGT, batch.mask_PGT
  )
  batch.require("returns_PGT", by="value_loss")
  if eps is None:
    out = losses.value_mse(values_PGT, batch.returns_PGT)
  else:
    batch.require("old_values_PGT", by="value_loss with eps (clipping)")
    out = losses.value_clip(
      values_PGT, batch.old_values_PGT, batch.returns_PGT, eps=eps
    )
  mask = batch.loss_mask()
  if batch.extra and "value_mask_PGT" in batch.extra:  # e.g. T-PPO's
    mask = mask * stats.f32(batch.extra["value_mask_PGT"])
  loss = aggregate(out.loss, mask)
  metrics = {
    "value_loss": loss,
    "value_clip_frac": mean_metric(out.clipped, mask),
    "value_mean": mean_metric(values_PGT, mask),
  }
  return loss, metrics
