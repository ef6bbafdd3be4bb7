"""Loss aggregation: per-token losses [..., T] and a mask to one `Mean`.

Notation: S_i = sum_t m_it L_it (token sum of sequence i), n_i = sum_t m_it,
E = number of sequences with n_i > 0. Every mode returns (numerator,
denominator) with an additive denominator, so summing the `Mean`s of
micro-batches or data-parallel shards gives the exact mean of the whole batch
(see docs/normalisation.md for how each mode maps onto verl, TRL, OpenRLHF).
"""

from typing import Optional

import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Mean


def _sums(loss_BT: ArrayLike, mask_BT: ArrayLike):
  checks.same_shape(["loss_BT", "mask_BT"], loss_BT, mask_BT)
  seq_sum = stats.masked_sum(loss_BT, mask_BT, axis=-1)
  seq_len = stats.sequence_lengths(mask_BT)
  return seq_sum, seq_len


def token_mean(loss_BT: ArrayLike, mask_BT: ArrayLike) -> Mean:
  """sum_i S_i / sum_i n_i: every token of the batch weighs the same.

  DAPO's token-level loss; verl `token-mean`, TRL `dapo`/`bnpo`, OpenRLHF's
  default.
  """
  seq_sum, seq_len = _sums(loss_BT, mask_BT)
  return Mean(jnp.sum(seq_sum), jnp.sum(seq_len))


def token_sum(
  loss_BT: ArrayLike, mask_BT: ArrayLike, *, normalizer: float = 1.0
) -> Mean:
  """sum_i S_i / normalizer, a constant (denominator 0 = no normaliser).

  No division by the number of sequences: with ``normalizer`` = the padded
  response width this is what older verl snapshots' `seq-mean-token-sum-norm`
  computed on one micro-batch. verl 0.9.1's `seq-mean-token-sum-norm` divides
  by the number of sequences too, like Dr.GRPO: that is
  `seq_mean_token_sum_norm`.
  """
  checks.positive(normalizer=normalizer)
  seq_sum, _ = _sums(loss_BT, mask_BT)
  return Mean(jnp.sum(seq_sum) / normalizer, jnp.zeros((), jnp.float32))


def seq_mean_token_sum(loss_BT: ArrayLike, mask_BT: ArrayLike) -> Mean:
  """sum_i S_i / E: each sequence contributes its token sum."""
  seq_sum, seq_len = _sums(loss_BT, mask_BT)
  return Mean(jnp.sum(seq_sum), jnp.sum(seq_len > 0, dtype=jnp.float32))


def seq_mean_token_mean(loss_BT: ArrayLike, mask_BT: ArrayLike) -> Mean:
  """sum_i (S_i / n_i) / E: each sequence weighs the same (original GRPO)."""
  seq_sum, seq_len = _sums(loss_BT, mask_BT)
  per_seq = stats.safe_div(seq_sum, seq_len)
  return Mean(jnp.sum(per_seq), jnp.sum(seq_len > 0, dtype=jnp.float32))


def seq_mean_token_sum_norm(
  loss_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  max_length: Optional[float] = None,
) -> Mean:
  """sum_i S_i / (E * L_max): Dr.GRPO's constant length normaliser.

  ``max_length`` defaults to the padded width T; set it to the generation
  limit so that the normaliser does not change from batch to batch.
  """
  length = jnp.shape(loss_BT)[-1] if max_length is None else max_length
  checks.positive(max_length=length)
  seq_sum, seq_len = _sums(loss_BT, mask_BT)
  return Mean(
    jnp.sum(seq_sum) / length, jnp.sum(seq_len > 0, dtype=jnp.float32)
  )
