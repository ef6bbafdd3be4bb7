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


_BODIES = ("seq_mean_token_mean", "token_mean")


def decoupled(*, alpha: float = 1e-3, body: str = "seq_mean_token_mean"):
  """Thinkless's DeGRPO (arXiv 2505.13379): the control token apart.

  The first valid token of each completion (the mode-selecting control
  token, ``<short>`` / ``<think>``) and the rest (the response) are
  normalised separately, so a long response cannot drown the mode decision:

    J = (1/E) sum_i ( alpha L_i,0 + (1/(n_i - 1)) sum_{t>=1} L_i,t )

  (``body="seq_mean_token_mean"``, the paper's equation; exact under
  micro-batching). The official code (VainF/Thinkless,
  ``core_algos.compute_policy_loss``) computes alpha * mean_i L_i,0 plus the
  token mean of the response tokens over the micro-batch:
  ``body="token_mean"``, which, like the code, is per micro-batch (the
  micro-batch values are averaged). Default alpha 1e-3 as in the official
  training script. The penalties (KL) of the per-token loss are split the
  same way, as in the code, where the KL is a separate term only when used
  as a loss.

  Returns an aggregation for `rljax.Algorithm`.
  """
  checks.non_negative(alpha=alpha)
  checks.one_of("body", body, _BODIES)

  def aggregate(loss_BT: ArrayLike, mask_BT: ArrayLike) -> Mean:
    checks.same_shape(["loss_BT", "mask_BT"], loss_BT, mask_BT)
    valid = stats.f32(mask_BT) > 0
    first = valid & (jnp.cumsum(valid, axis=-1) == 1)
    control = stats.masked_sum(loss_BT, first, axis=-1)
    rest = valid & ~first
    body_sum = stats.masked_sum(loss_BT, rest, axis=-1)
    body_len = jnp.sum(rest, axis=-1, dtype=jnp.float32)
    present = jnp.any(valid, axis=-1)
    n_seq = jnp.sum(present, dtype=jnp.float32)
    if body == "seq_mean_token_mean":
      per_seq = alpha * control + stats.safe_div(body_sum, body_len)
      return Mean(jnp.sum(per_seq), n_seq)
    value = alpha * stats.safe_div(jnp.sum(control), n_seq) + stats.safe_div(
      jnp.sum(body_sum), jnp.sum(body_len)
    )
    return Mean(value, jnp.ones((), jnp.float32))

  aggregate.__name__ = f"decoupled_{body}"
  return aggregate
