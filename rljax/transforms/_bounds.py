"""Batch stages for the adaptive-bound objectives: DCPO's smoothed
per-prompt advantages (a `PromptTable`), ETR's per-sample clip ranges and
HAPO's entropy scores and token-level group advantages.

Each runs once per rollout batch on the whole batch, so micro-batching does
not change it; bounds and scores reach the loss through ``Batch.extra``.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import _keep_terms
from rljax._src.base import stateless_prepare
from rljax._src.tables import PromptTable
from rljax.losses import _bounds as L
from rljax.transforms._advantages import sequence_rewards


def _per_token(batch: Batch, adv_PG: jax.Array) -> Batch:
  return batch._replace(advantages_PGT=adv_PG[..., None] * batch.loss_mask())


# ---------------------------------------------------------------------------
# DCPO SAS (arXiv 2509.02333).


def _first_occurrence(ids: jax.Array) -> jax.Array:
  """[P] True where no earlier row has the same id."""
  ids = jnp.asarray(ids)
  earlier = jnp.arange(ids.shape[0])[:, None] > jnp.arange(ids.shape[0])[None]
  return ~jnp.any(earlier & (ids[:, None] == ids[None, :]), axis=-1)


class SasState(NamedTuple):
  """Per prompt: (mean, std) of its rewards so far; ``seen`` counts steps."""

  table: PromptTable


def dcpo_sas_advantages(num_prompts: int) -> Transform:
  """DCPO's Smooth Advantage Standardization (`rljax.losses.dcpo_sas`).

  The state is a `PromptTable` of (mean, std) per prompt id
  (``Batch.prompt_ids_P``) whose ``seen`` counts the steps the prompt was
  trained on; each batch reads them, computes the smoothed advantages from
  R_i = `sequence_rewards` and stores the updated statistics. Size the table
  with the training set (``num_prompts = len(task.train)``). A prompt twice
  in one batch: both rows read the same history and only the first row's
  group updates it (one step).
  Groups with fewer than 2 valid samples get A = 0 and no update.

  Checked: against lime-RL/DCPO ``compute_dcpo_outcome_advantage`` and
  ``get_mean_std`` (``verl/trainer/ppo/core_algos.py``) and the README's
  SAS equations; ``user_old_mean_ratio`` (1.0 there) is not exposed.
  """
  checks.positive(num_prompts=num_prompts)

  def init() -> SasState:
    return SasState(PromptTable.create(num_prompts, shape=(2,), fill=0.0))

  def prepare(batch: Batch, state: SasState):
    batch.require("prompt_ids_P", by="transforms.dcpo_sas_advantages")
    ids = batch.prompt_ids_P
    values, seen = state.table.lookup(ids)
    valid = batch.samples()
    adv, count, mean, std = L.dcpo_sas(
      sequence_rewards(batch), valid, seen, values[:, 0], values[:, 1]
    )
    updated = (count > stats.f32(seen)) & _first_occurrence(ids)
    table = state.table.store(ids, jnp.stack([mean, std], -1), updated)
    return _per_token(batch, adv), SasState(table)

  return Transform(init=init, prepare=prepare, apply=_keep_terms)


# ---------------------------------------------------------------------------
# ETR (arXiv 2601.03723).

# The ``Batch.extra`` keys `etr_bounds` writes and `rljax.objectives.etr`
# reads (objectives import them from here: transforms never import objectives).
ETR_EPS_LOW = "etr_eps_low_PG"
ETR_EPS_HIGH = "etr_eps_high_PG"


def etr_bounds(
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  g: Callable[[jax.Array], jax.Array] = L.etr_micro,
  h: Callable[[jax.Array], jax.Array] = L.etr_macro,
) -> Transform:
  """ETR's elastic clip ranges, per sample, into ``Batch.extra``.

    eps_low_i  = eps_low  g(|A_i|) h(s^2_group)
    eps_high_i = eps_high g(|A_i|) h(s^2_group)

  (`rljax.losses.etr_eps`; A_i the sample's mean advantage over its
  tokens, so put it after the advantage stage; s^2 the population variance
  of the group's rewards R = `sequence_rewards`). Writes
  ``etr_eps_low_PG`` and ``etr_eps_high_PG``; `rljax.objectives.etr` reads
  them.

  Not verified: the paper (arXiv 2601.03723) says only that the micro level
  widens the bounds with |A| and the macro level with the group variance
  (abstract); g and h are callables whose defaults, g = 1 + 0.5 |A| and
  h = 1 + 4 s^2 (`rljax.losses.etr_micro`, `etr_macro`), are our choice.
  """
  checks.positive(eps_low=eps_low, eps_high=eps_high)

  def fn(batch: Batch) -> Batch:
    batch.require("advantages_PGT", by="transforms.etr_bounds")
    mask = batch.loss_mask()
    adv = stats.masked_mean(batch.advantages_PGT, mask, axis=-1)
    scale = L.etr_eps(
      adv, sequence_rewards(batch), batch.samples(), eps0=1.0, g=g, h=h
    )
    return batch.with_extra(
      **{ETR_EPS_LOW: eps_low * scale, ETR_EPS_HIGH: eps_high * scale}
    )

  return stateless_prepare(fn)


# ---------------------------------------------------------------------------
# HAPO-het (arXiv 2509.16591).

# The ``Batch.extra`` key `hapo_entropy_scores` writes and
# `rljax.objectives.hapo_het` reads.
HAPO_SCORES = "hapo_entropy_scores_PGT"


def hapo_entropy_scores(
  *, pivot: float = 0.8, sign: str = "paper"
) -> Transform:
  """HAPO's normalised entropies h^ (`rljax.losses.hapo_entropy_scores`)
  of the behaviour policy (``Batch.old_entropy_PGT``) over the whole
  rollout batch, into ``Batch.extra['hapo_entropy_scores_PGT']`` for
  `rljax.objectives.hapo_het`.

  The official code computes h^ in the loss from the current entropies of
  each micro-batch; here the statistic (a quantile, which does not add over
  micro-batches) is the rollout batch's, so it does not depend on the
  micro-batching. On the first update of a batch the entropies agree.
  """
  checks.in_range("pivot", pivot, 0.0, 1.0)
  checks.one_of("sign", sign, L._HAPO_SIGNS)

  def fn(batch: Batch) -> Batch:
    batch.require("old_entropy_PGT", by="transforms.hapo_entropy_scores")
    h = L.hapo_entropy_scores(
      batch.old_entropy_PGT, batch.loss_mask(), pivot=pivot, sign=sign
    )
    return batch.with_extra(**{HAPO_SCORES: h})

  return stateless_prepare(fn)


def hapo_token_advantages(
  *, eps: float = 1e-6, fallback_at: float = 5.0
) -> Transform:
  """HAPO's Token Level Group Average (`rljax.losses.hapo_token_advantages`):
  group mean and std over all valid tokens (length-weighted), GRPO
  advantages for a group with an |A| >= ``fallback_at``."""
  checks.positive(fallback_at=fallback_at)

  def fn(batch: Batch) -> Batch:
    mask = batch.loss_mask()
    adv = L.hapo_token_advantages(
      sequence_rewards(batch),
      stats.sequence_lengths(mask),
      batch.samples(),
      eps=eps,
      fallback_at=fallback_at,
    )
    return _per_token(batch, adv)

  return stateless_prepare(fn)
