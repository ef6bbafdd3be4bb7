"""Rollout-mismatch correction: importance weights on the policy term.

The sampler (rollout engine) and the trainer compute slightly different
log-probs for the same tokens. These stages weight the policy surrogate by
functions of lr = old_logp - rollout_logp; the weights multiply into
`policy_weights_PGT`, so they never touch the KL or entropy terms and never
change the loss normaliser.
"""

from collections.abc import Callable

from rljax import masks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare


def _weighting(name: str, weight_fn: Callable, **kwargs) -> Transform:
  def fn(batch: Batch) -> Batch:
    batch.require("old_logp_PGT", "rollout_logp_PGT", by=name)
    mask = batch.loss_mask()
    w = weight_fn(batch.old_logp_PGT, batch.rollout_logp_PGT, mask, **kwargs)
    if batch.policy_weights_PGT is not None:
      w = w * stats.f32(batch.policy_weights_PGT)
    return batch._replace(policy_weights_PGT=w)

  return stateless_prepare(fn)


def token_tis(*, threshold: float = 2.0) -> Transform:
  """Truncated importance sampling per token (verl `rollout_is=token`)."""
  return _weighting("token_tis", masks.token_tis, threshold=threshold)


def sequence_tis(*, threshold: float = 2.0) -> Transform:
  """Truncated importance sampling per sequence (verl `rollout_is=sequence`)."""
  return _weighting("sequence_tis", masks.sequence_tis, threshold=threshold)


def icepop(*, low: float = 0.5, high: float = 5.0) -> Transform:
  """IcePop / masked IS: drop tokens whose ratio leaves [low, high]."""
  return _weighting("icepop", masks.icepop, low=low, high=high)


def sequence_masked_tis(*, low: float = 0.5, high: float = 5.0) -> Transform:
  """OpenRLHF seq-mask-tis: token IS gated by the sequence geometric ratio."""
  return _weighting(
    "sequence_masked_tis", masks.sequence_masked_tis, low=low, high=high
  )
