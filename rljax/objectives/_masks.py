"""Token-selection stages that need the current policy (inside the loss).

They multiply the policy term's weight only; the loss normaliser is unchanged
(TRL's convention for the top-entropy and off-policy masks).
"""

import jax

from rljax import masks
from rljax._src.base import Batch
from rljax._src.base import LossTerms
from rljax._src.base import Transform
from rljax._src.base import mean_metric
from rljax._src.base import old_logp
from rljax._src.base import stateless_apply


def _weighted(
  terms: LossTerms, weight: jax.Array, name: str, mask
) -> LossTerms:
  metrics = dict(terms.metrics)
  metrics[name] = mean_metric(weight, mask)
  return terms._replace(
    policy_weight_PGT=terms.policy_weight_PGT * weight, metrics=metrics
  )


def top_entropy_mask(*, keep_fraction: float = 0.2) -> Transform:
  """Train only the highest-entropy tokens ("80/20", arXiv 2506.01939)."""

  def fn(terms: LossTerms, batch: Batch) -> LossTerms:
    if terms.entropy_PGT is None:
      raise ValueError(
        "top_entropy_mask needs the policy entropies: pass entropy_PGT= to"
        " Algorithm.loss."
      )
    mask = batch.loss_mask()
    keep = masks.top_entropy_mask(
      jax.lax.stop_gradient(terms.entropy_PGT),
      mask,
      keep_fraction=keep_fraction,
    )
    return _weighted(terms, keep, "top_entropy_kept", mask)

  return stateless_apply(fn)


def off_policy_mask(*, delta: float = 0.5) -> Transform:
  """DeepSeek-V3.2: drop negative-advantage sequences that drifted too far.

  The sampler log-probs are `rollout_logp_PGT` when present, else the
  recomputed `old_logp_PGT`.
  """

  def fn(terms: LossTerms, batch: Batch) -> LossTerms:
    batch.require("advantages_PGT", by="off_policy_mask")
    sampler = batch.rollout_logp_PGT
    if sampler is None:
      sampler = old_logp(terms.logp_PGT, batch)
    mask = batch.loss_mask()
    keep = masks.off_policy_sequence_mask(
      terms.logp_PGT, sampler, batch.advantages_PGT, mask, delta=delta
    )
    return _weighted(terms, keep, "off_policy_kept", mask)

  return stateless_apply(fn)
