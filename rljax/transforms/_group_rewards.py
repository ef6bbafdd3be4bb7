"""Group-level rewards from judges: EMPO, P-GRPO, SPO, CGPO and TP-GRPO.

A `RewardFn` scores each completion on the host; these mechanisms need the
whole group (the G answers of one prompt) or a judge's side output, so they
run as batch stages on [P, G] arrays. The host writes what the judges said
into ``Batch.extra`` (with ``Trainer(annotate=...)`` and the helpers of
`rljax.rewards`: `cluster_annotate`, `preference_annotate`,
`flag_annotate`) or into reward columns (``rewards_PGK``); the stage turns
them into ``rewards_PG`` (or masks advantages) before the advantage stage.

Each mechanism is an array function (rank-polymorphic over leading axes,
the group last) and a `Transform` factory.
"""

from collections.abc import Callable
from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare


def _valid(values: ArrayLike, sample_mask: Optional[ArrayLike]) -> jax.Array:
  if sample_mask is None:
    return jnp.ones(jnp.shape(values), jnp.float32)
  checks.same_shape(["values", "sample_mask_PG"], values, sample_mask)
  return stats.f32(jnp.asarray(sample_mask) != 0)


# ---------------------------------------------------------------------------
# EMPO (arXiv 2504.05812): semantic-cluster frequency rewards.
# ---------------------------------------------------------------------------


def cluster_frequency_rewards(
  answer_ids: ArrayLike,
  sample_mask: Optional[ArrayLike] = None,
  *,
  max_entropy: Optional[float] = None,
  min_entropy: Optional[float] = None,
) -> jax.Array:
  """EMPO's label-free reward: the empirical probability of the answer's
  semantic cluster in its group.

  With ``n`` valid samples in a group, ``c(i)`` the cluster of sample i and
  ``p_c = |c| / n``: ``H = -sum_c p_c log p_c`` and

      R_i = p_{c(i)}  if H < max_entropy (and H >= min_entropy) and sample
                      i has an answer,
      R_i = 0         otherwise.

  Args:
    answer_ids: int [..., G] cluster ids (equal ids = equivalent answers);
      a negative id means "no answer extracted": such a sample is its own
      singleton cluster (it counts in n and in H) and gets 0, as in the
      official code, where empty predictions never verify as equal.
    sample_mask: [..., G] valid samples (others are left out of n, H and
      get 0).
    max_entropy: the entropy threshold. None (default) is ``log n`` of each
      group, the official code's condition ``H < log G``, which means "not
      every answer is distinct"; it is tested exactly as "some cluster has
      2 or more members", so float rounding cannot flip it.
    min_entropy: optional lower threshold (the paper also filters prompts
      whose entropy is too low, i.e. trivial ones); None keeps them, as the
      official code does. (With GRPO such groups get zero advantage
      anyway when all answers agree.)

  Returns:
    float32 [..., G] rewards in [0, 1].

  References:
    Zhang et al., "Right Question is Already Half the Answer: Fully
    Unsupervised LLM Reasoning Incentivization" (EMPO), arXiv 2504.05812,
    Sec. 3 (semantic entropy reward).
    Checked: against QingyangZhang/EMPO `trl/src/open_r1/rewards.py::
    get_empo_math_reward` (clusters by greedy first-match, reward =
    probability of the cluster if H < log G and the prediction is non-empty,
    else 0); the paper's two-sided entropy filter is the optional
    ``min_entropy``; its exact thresholds were not read.
  """
  ids = jnp.asarray(answer_ids)
  checks.group_size("answer_ids", ids, 1)
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise ValueError(
      f"answer_ids must hold integer cluster ids; got dtype {ids.dtype}. Build"
      " them with rljax.rewards.cluster_answers."
    )
  valid = _valid(ids, sample_mask)
  answered = ids >= 0
  g = ids.shape[-1]
  same = ids[..., :, None] == ids[..., None, :]
  self_ = jnp.broadcast_to(jnp.eye(g, dtype=bool), same.shape)
  same = (same & answered[..., :, None]) | self_
  counts = jnp.sum(same * valid[..., None, :], axis=-1)  # includes itself
  n = jnp.sum(valid, axis=-1, keepdims=True)
  p = stats.safe_div(counts, n)
  log_p = jnp.log(jnp.where(valid > 0, p, 1.0))
  entropy = -stats.safe_div(jnp.sum(valid * log_p, -1, keepdims=True), n)
  if max_entropy is None:
    shared = jnp.max(jnp.where(valid > 0, counts, 0.0), -1, keepdims=True)
    keep = shared >= 2
  else:
    keep = entropy < max_entropy
  if min_entropy is not None:
    keep = keep & (entropy >= min_entropy)
  return jnp.where(keep & answered & (valid > 0), p, 0.0)


def empo_rewards(
  *,
  ids: str = "answer_ids_PG",
  max_entropy: Optional[float] = None,
  min_entropy: Optional[float] = None,
) -> Transform:
  """EMPO: ``rewards_PG`` = `cluster_frequency_rewards` of the cluster ids
  in ``Batch.extra[ids]`` (written on the host by
  ``Trainer(annotate=rljax.rewards.cluster_annotate(...))``).

  The rewards replace ``rewards_PG`` (EMPO needs no verifier; give the task
  no reward or weight 0). Chain a group advantage stage after it.
  """

  def fn(batch: Batch) -> Batch:
    answer_ids = batch.get(ids, by="empo_rewards")
    rewards = cluster_frequency_rewards(
      answer_ids,
      batch.samples(),
      max_entropy=max_entropy,
      min_entropy=min_entropy,
    )
    return batch._replace(rewards_PG=rewards)

  return stateless_prepare(fn)


# ---------------------------------------------------------------------------
# P-GRPO (Posterior-GRPO): process reward only on successful outcomes.
# ---------------------------------------------------------------------------


def success_gated_rewards(
  outcome: ArrayLike, process: ArrayLike, *, success: float = 1.0
) -> jax.Array:
  """P-GRPO: ``r = r_out + 1[r_out >= success] * r_proc``.

  The process (reasoning-quality) reward counts only on rollouts whose
  outcome succeeded, so the policy cannot farm it on wrong answers.

  Args:
    outcome: [...] outcome rewards (1 = correct by default).
    process: [...] process rewards (a PRM score), same shape.
    success: the outcome value that counts as success (the paper's
      ``r_out = 1``; ``>=`` so that a bonus above 1 still counts).

  References:
    Posterior-GRPO (P-GRPO), "Posterior-GRPO: Rewarding Reasoning Processes
    in Code Generation", arXiv 2508.05170, the gated reward of Sec. 3.
    Checked: the catalog's formula (from the abstract); the paper's full
    text was not read ("not verified" beyond the abstract).
  """
  checks.same_shape(["outcome", "process"], outcome, process)
  r_out = stats.f32(outcome)
  return r_out + jnp.where(r_out >= success, stats.f32(process), 0.0)


def _column(batch: Batch, column: int, by: str) -> jax.Array:
  batch.require("rewards_PGK", by=by)
  k = batch.rewards_PGK.shape[-1]
  if not -k <= column < k:
    raise ValueError(
      f"{by}: reward column {column} is out of range; Batch.rewards_PGK has"
      f" {k} columns (one per reward of the task, in rewards.score order)."
    )
  return stats.f32(batch.rewards_PGK[..., column])


def p_grpo_rewards(
  *, outcome_column: int = 0, process_column: int = 1, success: float = 1.0
) -> Transform:
  """P-GRPO: ``rewards_PG`` = `success_gated_rewards` of two reward columns
  (``rewards_PGK[..., outcome_column]`` and ``[..., process_column]``,
  e.g. a verifier and ``rljax.rewards.judge_reward(prm)``). Score the
  process column with weight 0 in the task so that it enters only here.
  """

  def fn(batch: Batch) -> Batch:
    r_out = _column(batch, outcome_column, "p_grpo_rewards")
    r_proc = _column(batch, process_column, "p_grpo_rewards")
    return batch._replace(
      rewards_PG=success_gated_rewards(r_out, r_proc, success=success)
    )

  return stateless_prepare(fn)


# ---------------------------------------------------------------------------
# SPO, self-play preference optimisation (arXiv 2401.04056): win rates.
# ---------------------------------------------------------------------------


def win_rate_rewards(
  preferences: ArrayLike, sample_mask: Optional[ArrayLike] = None
) -> jax.Array:
  """SPO (self-play): ``R_i = 1/(n-1) sum_{j != i, valid} P(xi_i > xi_j)``.

  Args:
    preferences: [..., G, G], entry [i, j] the probability that sample i is
      preferred to sample j (the diagonal is ignored).
    sample_mask: [..., G] valid samples.

  Returns:
    float32 [..., G] win rates in [0, 1] (0 for groups of fewer than 2
    valid samples).

  References:
    Swamy et al., "A Minimaximalist Approach to Reinforcement Learning from
    Human Feedback" (SPO), arXiv 2401.04056, Algorithm 1 (the reward of a
    trajectory is its win rate against the other samples of the batch).
    Checked: the catalog's formula (high-confidence reading of the
    abstract); the paper's algorithm box was not read here.
  """
  pref = stats.f32(preferences)
  if pref.ndim < 2 or pref.shape[-1] != pref.shape[-2]:
    raise ValueError(
      f"preferences must be [..., G, G] (P(i preferred to j)); got shape"
      f" {pref.shape}."
    )
  valid = _valid(pref[..., 0], sample_mask)
  g = pref.shape[-1]
  off_diagonal = jnp.broadcast_to(1.0 - jnp.eye(g), pref.shape)
  others = valid[..., None, :] * off_diagonal
  # where(): a NaN preference at an invalid or diagonal entry stays out.
  wins = jnp.sum(jnp.where(others > 0, pref, 0.0), axis=-1)
  n = jnp.sum(valid, axis=-1, keepdims=True)
  return stats.safe_div(wins, n - 1.0) * valid


def spo_win_rates(*, preferences: str = "preferences_PG") -> Transform:
  """SPO: ``rewards_PG`` = `win_rate_rewards` of the [P, G, G] preference
  probabilities in ``Batch.extra[preferences]`` (from
  ``Trainer(annotate=rljax.rewards.preference_annotate(prefer))``)."""

  def fn(batch: Batch) -> Batch:
    pref = batch.get(preferences, by="spo_win_rates")
    return batch._replace(rewards_PG=win_rate_rewards(pref, batch.samples()))

  return stateless_prepare(fn)


# ---------------------------------------------------------------------------
# CGPO (arXiv 2409.20370): calibrated rewards and judge-gated positives.
# ---------------------------------------------------------------------------


def calibrated_rewards(rewards: ArrayLike, reference: ArrayLike) -> jax.Array:
  """CGPO's calibrated reward ``R_cal = sigmoid(R(q, o) - R(q, o_bar))``.

  `reference` is the reward model's score of a reference ("golden")
  answer o_bar to the same prompt, broadcast against `rewards` (e.g. [P, 1]
  against [P, G]). The result lies in (0, 1): the probability, under a
  Bradley-Terry model, that o beats the reference, so that scores of
  different prompts become comparable.

  References:
    Xu et al., "The Perfect Blend: Redefining RLHF with Mixture of Judges"
    (CGPO), arXiv 2409.20370, Sec. 4.1 (calibrated reward).
    Checked: the catalog's formula [REC]; the paper's text was not read
    ("not verified").
  """
  return jax.nn.sigmoid(stats.f32(rewards) - stats.f32(reference))


def mask_flagged_positives(
  advantages: ArrayLike, flagged: ArrayLike
) -> jax.Array:
  """CGPO's constraint: samples flagged by a judge take no positive update.

  ``A' = 0 where A > 0 and flagged, else A``; `flagged` broadcasts against
  `advantages` ([P, G, 1] against [P, G, T]). Negative advantages of
  flagged samples stay (they are pushed down like any failure).

  References:
    CGPO, arXiv 2409.20370, Sec. 4 (constrained RLHF: violating samples are
    kept out of the positive set in CRPG / CRRAFT / CODPO). Checked: the
    catalog's description [REC]; not verified against the paper's text.
  """
  adv = stats.f32(advantages)
  return jnp.where((adv > 0) & (jnp.asarray(flagged) != 0), 0.0, adv)


def cgpo_calibrated_rewards(
  *, reference: str = "reference_rewards_P"
) -> Transform:
  """CGPO: ``rewards_PG`` = sigmoid(rewards_PG - extra[reference][:, None]).

  ``rewards_PG`` must be the reward model's score R(q, o), and
  ``Batch.extra[reference]`` its score of each prompt's reference answer
  R(q, o_bar) (an annotation). On the host, `rljax.rewards.calibrated_reward`
  does the same in one RewardFn.
  """

  def fn(batch: Batch) -> Batch:
    batch.require("rewards_PG", by="cgpo_calibrated_rewards")
    ref = batch.get(reference, by="cgpo_calibrated_rewards")
    rewards = calibrated_rewards(batch.rewards_PG, stats.f32(ref)[:, None])
    return batch._replace(rewards_PG=rewards)

  return stateless_prepare(fn)


def cgpo_constraint_mask(*, flags: str = "flagged_PG") -> Transform:
  """CGPO: zero the positive advantages of samples a judge flagged.

  Put it after the advantage stage; ``Batch.extra[flags]`` is 1 where any
  judge found a violation (``Trainer(annotate=rljax.rewards.flag_annotate(
  judges))``).
  """

  def fn(batch: Batch) -> Batch:
    batch.require("advantages_PGT", by="cgpo_constraint_mask")
    flagged = batch.get(flags, by="cgpo_constraint_mask")
    adv = mask_flagged_positives(batch.advantages_PGT, flagged[..., None])
    return batch._replace(advantages_PGT=adv)

  return stateless_prepare(fn)


# ---------------------------------------------------------------------------
# TP-GRPO (arXiv 2507.23317): thought-level process rewards, adaptive weight.
# ---------------------------------------------------------------------------


def inverse_accuracy(accuracy: jax.Array) -> jax.Array:
  """``w(acc) = 1 - acc``: process rewards matter more where the policy
  still fails (the default of `adaptive_process_rewards`; our choice)."""
  return 1.0 - accuracy


def adaptive_process_rewards(
  outcome: ArrayLike,
  process: ArrayLike,
  sample_mask: Optional[ArrayLike] = None,
  *,
  weight: Callable[[jax.Array], jax.Array] = inverse_accuracy,
  success: float = 1.0,
) -> jax.Array:
  """TP-GRPO: ``r_i = r_out_i + w(acc) * sum_k r_{i,k}``.

  Args:
    outcome: [..., G] outcome rewards.
    process: [..., G] the summed thought-level rewards of each sample
      (`rljax.rewards.thought_rewards` merges a PRM's step verdicts into
      thoughts and sums +-c per thought).
    sample_mask: [..., G] valid samples.
    weight: w(acc) of the group's accuracy (the fraction of valid samples
      with ``outcome >= success``), [..., 1] -> [..., 1].
    success: the outcome value that counts as correct.

  References:
    He et al., "Good Learners Think Their Thinking: Generative PRM Makes
    Large Reasoning Model More Efficient Math Learner" (TP-GRPO), arXiv
    2507.23317, the capability-adaptive reward.
    Checked: the paper's abstract (thought units, capability-adaptive
    mixing); the exact w(acc) was not found ("not verified"): the default
    ``1 - acc`` is our choice, pass the paper's as `weight`.
  """
  checks.same_shape(["outcome", "process"], outcome, process)
  r_out = stats.f32(outcome)
  valid = _valid(r_out, sample_mask)
  acc = stats.masked_mean(r_out >= success, valid, axis=-1, keepdims=True)
  return r_out + weight(acc) * stats.f32(process)


def tp_grpo_rewards(
  *,
  outcome_column: int = 0,
  process_column: int = 1,
  weight: Callable[[jax.Array], jax.Array] = inverse_accuracy,
  success: float = 1.0,
) -> Transform:
  """TP-GRPO: ``rewards_PG`` = `adaptive_process_rewards` of two reward
  columns (a verifier and ``rljax.rewards.thought_reward(prm)``, scored
  with weight 0 so that it enters only here)."""

  def fn(batch: Batch) -> Batch:
    r_out = _column(batch, outcome_column, "tp_grpo_rewards")
    r_proc = _column(batch, process_column, "tp_grpo_rewards")
    rewards = adaptive_process_rewards(
      r_out, r_proc, batch.samples(), weight=weight, success=success
    )
    return batch._replace(rewards_PG=rewards)

  return stateless_prepare(fn)
