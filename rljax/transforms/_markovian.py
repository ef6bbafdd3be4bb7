"""Delethink's trace-level advantage and trace-length normaliser.

Delethink (Aghajohari et al., 2025, "The Markovian Thinker", arXiv
2510.06557; official code McGill-NLP/the-markovian-thinker) samples each
answer as a trace of chunks; every chunk is its own (prompt, completion)
row of the batch (`rljax.rollouts.MarkovianChunks`), and the sampler hands
the layout over as ``Batch.extra["trace_PG"]`` (int32 [P, G]: the trace of
each row within its group, -1 for unused rows) and ``Batch.extra
["chunk_PG"]`` (int32 [P, G]: the chunk's index in its trace, 0 first, -1
for unused rows). A trace's reward is the reward of its last chunk (the
chunk that holds the answer).
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax import advantages
from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare
from rljax.transforms._advantages import _need_group
from rljax.transforms._advantages import _per_token
from rljax.transforms._advantages import sequence_rewards

_SCALES = ("std", "none")


def _check_ids(name: str, ids: ArrayLike, rewards_PG: ArrayLike) -> None:
  checks.rank(name, ids, 2, "[P, G]")
  checks.same_shape(["rewards_PG", name], rewards_PG, ids)
  if not jnp.issubdtype(jnp.result_type(ids), jnp.integer):
    raise ValueError(
      f"{name} must hold integer ids (-1 for unused rows), got dtype"
      f" {jnp.result_type(ids)}; pass the sampler's int32 array."
    )


def _same_trace(trace_PG: jax.Array, valid: jax.Array) -> jax.Array:
  """[P, G, G] float32: rows i and j are valid rows of one trace."""
  inside = (trace_PG >= 0) & (valid > 0)
  same = trace_PG[:, :, None] == trace_PG[:, None, :]
  return stats.f32(same & inside[:, :, None] & inside[:, None, :])


def final_chunks(
  trace_PG: ArrayLike,
  chunk_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
) -> jax.Array:
  """[P, G] float32: 1 on the last valid chunk row of each trace.

  The last chunk of a trace is its row with the highest ``chunk_PG``;
  unused rows (trace -1 or invalid) are 0.
  """
  trace, chunk = jnp.asarray(trace_PG), jnp.asarray(chunk_PG)
  valid = (
    jnp.ones(trace.shape, jnp.float32)
    if sample_mask_PG is None
    else stats.f32(jnp.asarray(sample_mask_PG) != 0)
  )
  same = _same_trace(trace, valid)
  last = jnp.max(jnp.where(same > 0, chunk[:, None, :], -1), axis=-1)
  return stats.f32((trace >= 0) & (valid > 0) & (chunk == last))


def trace_lengths_of(mask_PGT: ArrayLike, trace_PG: ArrayLike) -> jax.Array:
  """[P, G] float32: the completion tokens of each row's whole trace.

  ell(tau) = sum over the trace's chunk rows of their token counts (the
  mask summed, so weights count as they are); 0 for rows of no trace.
  """
  checks.rank("mask_PGT", mask_PGT, 3, "[P, G, T]")
  checks.leading_shape("trace_PG", trace_PG, np.shape(mask_PGT)[:2], "mask")
  trace = jnp.asarray(trace_PG)
  n = stats.sequence_lengths(mask_PGT)  # [P, G]
  same = _same_trace(trace, stats.f32(trace >= 0))
  return jnp.sum(same * n[:, None, :], axis=-1)


def delethink_advantages_of(
  rewards_PG: ArrayLike,
  trace_PG: ArrayLike,
  chunk_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  scale: str = "std",
  eps: float = 1e-6,
) -> jax.Array:
  """Delethink's trace-level GRPO advantage, copied to every chunk row.

  With R(tau) the reward of trace tau's last chunk row and tau_1..tau_n the
  traces of a group:

    A(tau_i) = (R(tau_i) - mean_j R(tau_j)) / (std_j R(tau_j) + eps)

  (``scale="std"``, unbiased std as verl's `compute_grpo_outcome_advantage`,
  eps 1e-6; ``"none"``: no division, Dr.GRPO). Every chunk row of tau_i
  gets A(tau_i): the chunks share their trace's advantage.

  What was checked: the official trainer (verl/trainer/delethink_ppo/
  ray_trainer.py, `_compute_advantages` before `_flatten_intermediate_turns`,
  with ``adv_estimator: grpo`` in verl/trainer/config/
  r1d-1.5b_deepscaler_delethink_24k.yaml) computes GRPO on the unflattened
  batch, one entry per trace grouped by prompt, scored on its last turn,
  then copies each trace's advantage to all its chunk rows. The paper's
  equation itself could not be read (only its abstract and third-party
  summaries, which agree: a per-trace advantage shared by the chunks).

  Args:
    rewards_PG: [P, G] row rewards; only each trace's last row is read.
    trace_PG: [P, G] int trace id within the group, -1 for unused rows.
    chunk_PG: [P, G] int chunk index within the trace.
    sample_mask_PG: [P, G] row validity (default: all valid).
    scale: "std" (GRPO) or "none" (mean-centred only).
    eps: added to the std.

  Returns:
    [P, G] float32; 0 for unused rows and for groups with fewer than 2
    traces.
  """
  checks.one_of("scale", scale, _SCALES)
  checks.non_negative(eps=eps)
  checks.rank("rewards_PG", rewards_PG, 2, "[P, G]")
  _check_ids("trace_PG", trace_PG, rewards_PG)
  _check_ids("chunk_PG", chunk_PG, rewards_PG)
  if sample_mask_PG is not None:
    checks.same_shape(
      ["rewards_PG", "sample_mask_PG"], rewards_PG, sample_mask_PG
    )
  trace = jnp.asarray(trace_PG)
  final = final_chunks(trace, chunk_PG, sample_mask_PG)
  r = jnp.where(final > 0, stats.f32(rewards_PG), 0.0)
  if scale == "std":
    adv_final = advantages.grpo(r, final, eps=eps)
  else:
    adv_final = advantages.dr_grpo(r, final)
  # Each row takes the advantage of its trace's final row.
  same = _same_trace(trace, stats.f32(trace >= 0))
  valid = (
    jnp.ones(trace.shape, jnp.float32)
    if sample_mask_PG is None
    else stats.f32(jnp.asarray(sample_mask_PG) != 0)
  )
  adv = jnp.sum(same * (final * adv_final)[:, None, :], axis=-1)
  return jnp.where((trace >= 0) & (valid > 0), adv, 0.0)


def delethink_advantages(
  *,
  trace: str = "trace_PG",
  chunk: str = "chunk_PG",
  scale: str = "std",
  eps: float = 1e-6,
) -> Transform:
  """Delethink (arXiv 2510.06557): `delethink_advantages_of` on the batch.

  Reads the sequence rewards and the sampler's ``Batch.extra[trace]`` and
  ``Batch.extra[chunk]`` (`rljax.rollouts.MarkovianChunks`), writes
  ``advantages_PGT`` (the trace's advantage on every completion token of
  each of its chunks).
  """
  checks.one_of("scale", scale, _SCALES)
  checks.non_negative(eps=eps)

  def fn(batch: Batch) -> Batch:
    _need_group(batch, "delethink_advantages")
    adv = delethink_advantages_of(
      sequence_rewards(batch),
      batch.get(trace, by="delethink_advantages"),
      batch.get(chunk, by="delethink_advantages"),
      batch.samples(),
      scale=scale,
      eps=eps,
    )
    return _per_token(batch, adv)

  return stateless_prepare(fn)


def trace_length_norm(*, trace: str = "trace_PG") -> Transform:
  """Delethink's loss normaliser: every token weighs 1 / ell(its trace).

  Replaces ``mask_PGT`` by ``loss_mask / ell(tau)`` (ell from
  `trace_lengths_of` on the loss mask). Aggregated with
  `rljax.aggregate.token_mean` (sum_t m_t L_t / sum_t m_t) this is

    J = (1 / |traces|) sum_tau (1 / ell(tau)) sum_{chunks c of tau}
        sum_{t in c} L_t,

  each trace's token mean over all its chunks, averaged over the traces:
  the denominator sum_t m_t counts each trace once, so the `Mean` stays
  exact when micro-batches or shards are summed. Put it after the
  stages that read the mask as 0/1 (advantages; importance weights such as
  `token_tis`, which multiply the mask into their weights) and before the
  objective.

  What was checked: the official code's ``loss_agg_mode:
  seq-mean-token-norm-trace-length`` (`agg_loss_with_trace_lengths` in
  verl/trainer/ppo/core_algos.py: per chunk row sum_t L_t / trace_length,
  then the mean over rows; with ``use_flat_batch_correction_ratio`` the
  trace length is multiplied by rows / traces of the batch,
  ray_trainer.py): over the whole batch that equals J above. The code
  takes the mean over the rows of each mini-batch with the batch-wide
  correction, so a mini-batch whose chunks-per-trace ratio differs from
  the batch's is weighted slightly differently; here each mini-batch of
  whole groups gets exactly J over its traces. ell(tau) counts the loss
  mask, the code the trace's response tokens (the same unless a filter
  masks tokens).
  """

  def fn(batch: Batch) -> Batch:
    ids = batch.get(trace, by="trace_length_norm")
    mask = batch.loss_mask()
    lengths = trace_lengths_of(mask, ids)
    weight = stats.safe_div(1.0, lengths)
    return batch._replace(mask_PGT=mask * weight[..., None])

  return stateless_prepare(fn)
