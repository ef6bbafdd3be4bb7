"""Batch stages that read the completion token ids ``Batch.tokens_PGT``:
GTPO's conflict-token weights and entropy filter, HICRA's planning-token
amplification and AdaCoT's Selective Loss Masking of the decision token.

The math is in `rljax.advantages` (`_tokens.py`). Each stage runs once per
rollout batch, per group, so micro-batching and splitting the P axis do not
change it. ``tokens_PGT`` is set by the Trainer (the sampler's completion
ids); built by hand, pass ``Batch(tokens_PGT=...)`` (int32 [P, G, T]).
Advantage modifiers (`gtpo_advantages`, `hicra`) go after the advantage
stage; `decision_token_mask` can go anywhere before the loss.
"""

from collections.abc import Sequence
import functools
from typing import Optional

import jax
import jax.numpy as jnp

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare
from rljax.advantages import _tokens as K


def _tokens(batch: Batch, by: str) -> jax.Array:
  if batch.tokens_PGT is None:
    raise ValueError(
      f"{by} needs Batch.tokens_PGT (int32 completion token ids [P, G, T]);"
      " the Trainer sets it from the sampler, or pass"
      " Batch(tokens_PGT=...) when building the Batch by hand."
    )
  return jnp.asarray(batch.tokens_PGT)


def _advantages(batch: Batch, by: str) -> jax.Array:
  if batch.advantages_PGT is None:
    raise ValueError(
      f"{by} needs Batch.advantages_PGT; put an advantage stage (e.g."
      " rljax.transforms.group_advantages(rljax.advantages.grpo)) before it"
      " in the chain."
    )
  return stats.f32(batch.advantages_PGT)


def _policy_weights(batch: Batch) -> jax.Array:
  if batch.policy_weights_PGT is None:
    return jnp.ones(batch.shape, jnp.float32)
  return stats.f32(batch.policy_weights_PGT)


# ---------------------------------------------------------------------------
# GTPO.
# ---------------------------------------------------------------------------


def gtpo_advantages(
  *,
  weight: float = 2.0,
  positions: str = "all",
  entropy_threshold: Optional[float] = 0.7,
  entropy_scale: float = 0.1,
  divide_by_conflicts: bool = False,
) -> Transform:
  """GTPO (Simoni et al., arXiv 2508.03772, "GTPO: Stabilizing Group
  Relative Policy Optimization via Gradient and Entropy Control"): protect
  conflict tokens and filter high-entropy completions.

  Rewrites ``advantages_PGT`` as

    A'_{i,t} = keep_i (A_{i,t} - c H_i) delta_{i,t} m_{i,t},
    keep_i = 1[H_i <= threshold],

  with delta from `rljax.advantages.gtpo_token_weights` (conflict tokens:
  W in positive completions, 0 in negative ones, 1 elsewhere), H_i the
  masked mean of ``old_entropy_PGT`` over the completion and c the
  shaping scale (`rljax.advantages.gtpo_entropy_filter`). Any policy loss
  downstream then sees the GTPO advantages. The sign of completion i is that
  of its sequence advantage (masked mean over T of ``advantages_PGT``);
  for outcome advantages, constant over T, A_{i,t} = A_i, which is the
  official code's per-completion scalar. The code's loss is REINFORCE
  (ratio 1 carrying the gradient), a token mean per completion, averaged
  over completions: ``objectives.policy(losses.reinforce)`` with
  ``aggregate.seq_mean_token_mean``; any other policy loss also works.

  Writes ``extra["gtpo_conflict_PGT"]`` (0/1 conflict tokens) and
  ``extra["gtpo_conflict_count_PG"]`` (conflict tokens per completion).

  Args:
    weight: W, the weight of a positive completion's conflict tokens (the
      code's ``W_RAW = 2.0``).
    positions: ``"all"`` (default, the paper abstract's definition: any
      position) or ``"runs"`` (the official code: only the run of conflicts
      from the start and the run up to the end; see
      `rljax.advantages.gtpo_token_weights`).
    entropy_threshold: completions whose mean entropy exceeds it get A' = 0
      (the code's ``ENT_THRESHOLD = 0.7``); None keeps all.
    entropy_scale: c (the code's ``ENT_SCALE = 0.1``). With
      ``entropy_threshold=None`` and ``entropy_scale=0`` the stage needs no
      entropies.
    divide_by_conflicts: a detail of the official code's loss, which divides
      each completion's token mean by its number of conflict tokens
      (clamped to >= 1); when True, ``policy_weights_PGT`` is multiplied by
      1 / max(n_i, 1), n_i = ``gtpo_conflict_count_PG``. Off by default
      (not in the paper text we could see). For ``positions="runs"`` the
      code counts the union of the forward run and the backward run taken
      in its reversed (right-aligned) coordinates, which looks like an
      indexing slip; n_i here counts the union at the true positions, so
      it can differ from the code's count (the weights delta do not).

  Verified: the conflict definition, W, the entropy filter and shaping and
  the constants against the official code (winstonsmith1897/GTPO,
  ``gtpo/gtpo_training.py``: ``build_conflict_mask``,
  ``UnslothEfficientGTPO``, ``gtpo_compute_loss``) and the abstract of
  v1/v2/v5; ``positions="runs"`` weights equal the code's
  ``build_conflict_mask`` output on 400 random groups (run separately).
  Not verified: the paper's objective equation and the derivation of its
  "provable" entropy threshold (the full text was not reachable here).
  Choices: the code computes the entropies from the current policy's
  logits at loss time; here they are the behaviour policy's
  (``old_entropy_PGT``), identical on-policy. The code drops
  padding by ``ids != PAD_ID``; here by the loss mask.
  """
  checks.non_negative(weight=weight, entropy_scale=entropy_scale)
  checks.one_of("positions", positions, ("all", "runs"))
  fn = functools.partial(
    _gtpo_update,
    weight=weight,
    positions=positions,
    entropy_threshold=entropy_threshold,
    entropy_scale=entropy_scale,
    divide_by_conflicts=divide_by_conflicts,
  )
  return stateless_prepare(fn)


def _gtpo_update(
  batch: Batch,
  *,
  weight: float,
  positions: str,
  entropy_threshold: Optional[float],
  entropy_scale: float,
  divide_by_conflicts: bool,
) -> Batch:
  """`gtpo_advantages`' stage: A' = keep (A - c H) delta m, the conflicts."""
  by = "gtpo_advantages"
  tokens = _tokens(batch, by)
  adv = _advantages(batch, by)
  mask = batch.loss_mask()
  a_seq = stats.masked_mean(adv, mask, axis=-1)
  delta, conflict = K.gtpo_token_weights(
    tokens, mask, a_seq, positions=positions, weight=weight
  )
  if entropy_threshold is not None or entropy_scale != 0:
    adv = _gtpo_entropy_filter(
      batch, adv, mask, entropy_threshold, entropy_scale
    )
  conflict = stats.f32(conflict) * mask
  count = jnp.sum(conflict, axis=-1)
  batch = batch._replace(advantages_PGT=adv * delta * mask).with_extra(
    gtpo_conflict_PGT=conflict, gtpo_conflict_count_PG=count
  )
  if divide_by_conflicts:
    scale = 1.0 / jnp.maximum(count, 1.0)
    batch = batch._replace(
      policy_weights_PGT=_policy_weights(batch) * scale[..., None]
    )
  return batch


def _gtpo_entropy_filter(
  batch: Batch, adv, mask, threshold: Optional[float], scale: float
) -> jax.Array:
  """A filtered by the completions' mean entropy H (keep, A - c H)."""
  if batch.old_entropy_PGT is None:
    raise ValueError(
      "gtpo_advantages needs Batch.old_entropy_PGT for its entropy filter"
      " (the Trainer computes it when an algorithm reads it); pass"
      " entropy_threshold=None, entropy_scale=0 to turn the filter off."
    )
  h = stats.masked_mean(batch.old_entropy_PGT, mask, axis=-1)
  return K.gtpo_entropy_filter(
    adv, h[..., None], threshold=threshold, scale=scale
  )


# ---------------------------------------------------------------------------
# HICRA.
# ---------------------------------------------------------------------------


def hicra(
  grams: Optional[Sequence[Sequence[int]]] = None,
  *,
  alpha: float = 0.2,
  mask_name: Optional[str] = None,
) -> Transform:
  """HICRA (Wang et al., arXiv 2509.03646, "Emergent Hierarchical
  Reasoning in LLMs through Reinforcement Learning"): amplify the advantage
  of planning tokens,

    A'_{i,t} = A_{i,t} + alpha |A_{i,t}| 1[t is a planning token],

  (`rljax.advantages.hicra_amplify`): on planning tokens positive
  advantages are scaled by (1 + alpha), negative ones by (1 - alpha).

  Planning tokens are the tokens inside an occurrence of a Strategic Gram
  (`rljax.advantages.strategic_gram_mask` on ``tokens_PGT``), or any 0/1
  ``extra[mask_name]`` written earlier (e.g. by a host-side tagger through
  ``Trainer(annotate=...)``). Writes ``extra["hicra_planning_PGT"]``.

  Args:
    grams: the tokenized Strategic Grams (token-id tuples, any lengths).
      The paper mines 3-5 word n-grams from successful solutions; tokenize
      each phrase (mind leading-space variants of BPE vocabularies).
    alpha: the amplification (default 0.2).
    mask_name: an extra ``*_PGT`` planning mask instead of `grams`.

  Verified: the paper's abstract (HICRA "concentrates optimization efforts
  on high-impact planning tokens"); the formula and alpha = 0.2 only
  against secondary sources (a third-party MLX port, textpolicy
  ``algorithms/hicra.py``, and article summaries); the paper's equation
  and the official code were not reachable. Choices: a gram matches on
  exact token ids (the port matches decoded text); occurrences crossing
  padding or a masked token do not count.
  """
  if (grams is None) == (mask_name is None):
    raise ValueError(
      "hicra needs exactly one of grams (token-id tuples) or mask_name (an"
      " extra '*_PGT' planning mask)."
    )
  if mask_name is not None and not mask_name.endswith("_PGT"):
    raise ValueError(
      f"hicra: mask_name {mask_name!r} must end with _PGT (one value per"
      " token)."
    )
  if grams is not None:
    grams = K._gram_tuples(grams)
  checks.non_negative(alpha=alpha)

  def fn(batch: Batch) -> Batch:
    by = "hicra"
    adv = _advantages(batch, by)
    mask = batch.loss_mask()
    if grams is not None:
      planning = K.strategic_gram_mask(_tokens(batch, by), mask, grams)
    else:
      planning = batch.get(mask_name, by=by)
    planning = stats.f32(planning) * mask
    adv = K.hicra_amplify(adv, planning, alpha=alpha)
    return batch._replace(advantages_PGT=adv).with_extra(
      hicra_planning_PGT=planning
    )

  return stateless_prepare(fn)


# ---------------------------------------------------------------------------
# AdaCoT Selective Loss Masking.
# ---------------------------------------------------------------------------


def decision_token_mask(
  trigger_ids: Sequence[int],
  *,
  count: int = 1,
  first_only: bool = True,
  at_start: bool = False,
) -> Transform:
  """AdaCoT's Selective Loss Masking (Lou et al., arXiv 2505.11896, "AdaCoT:
  Pareto-Optimal Adaptive Chain-of-Thought Triggering via Reinforcement
  Learning"): keep the think / no-think decision out of the policy loss.

  Multiplies ``policy_weights_PGT`` (ones when absent) by 0 on the `count`
  token(s) right after the first occurrence of any id in `trigger_ids`
  (the ``<think>`` token) in each completion
  (`rljax.advantages.tokens_after_trigger`), so the decision token gets no
  policy gradient while penalties (KL, entropy) still apply. With
  ``at_start=True`` a completion without the trigger masks its first
  token(s) instead: use it when the prompt template ends in ``<think>``.
  Writes ``extra["decision_tokens_PGT"]`` (0/1 masked positions).

  Args:
    trigger_ids: the token id(s) of ``<think>``.
    count: tokens masked after the trigger (default 1: the decision token).
    first_only: only after the first trigger (default); False masks after
      every occurrence.
    at_start: see above.

  Verified: from the abstract only, that SLM is AdaCoT's mechanism against
  "decision boundary collapse during multi-stage RL training". The exact
  masked position (the first token after ``<think>``) follows the project's
  reading of the paper (catalog entry A16, reconstructed); the paper's
  section on SLM was not reachable here.
  """
  trigger_ids = K._id_tuple("trigger_ids", trigger_ids)
  if not isinstance(count, int) or isinstance(count, bool) or count < 1:
    raise ValueError(f"count must be an int >= 1; got {count!r}.")

  def fn(batch: Batch) -> Batch:
    by = "decision_token_mask"
    selected = K.tokens_after_trigger(
      _tokens(batch, by),
      batch.loss_mask(),
      trigger_ids,
      count=count,
      first_only=first_only,
      at_start=at_start,
    )
    selected = stats.f32(selected)
    weights = _policy_weights(batch) * (1.0 - selected)
    return batch._replace(policy_weights_PGT=weights).with_extra(
      decision_tokens_PGT=selected
    )

  return stateless_prepare(fn)
