"""Advantage and reward variants over [..., G] groups from the seed papers:
ASPO, HDPO, ADORA, DaGRPO, TempSamp-R1's soft advantage and PF-PPO here; the
answer-cluster variants (COPO, Polychromic, SEED-GRPO) in
`_variants_answers.py` and the length rewards (Kimi k1.5, L-GRPO,
GRPO-lambda) in `_variants_length.py`, which share this module's helpers.

Same conventions as `rljax.advantages` (see `_group.py`): the group is the
LAST axis, ``sample_mask_PG`` marks valid samples (invalid ones are left out
of every statistic and get exactly 0), all arithmetic is float32, and values
and gradients stay finite at empty or constant groups.

Side inputs:

* correctness ``correct_PG``: bool/0-1 per sample. The transforms read it
  from ``Batch.extra["correct_PG"]`` when present, else from reward column 0
  (``rewards_PGK[..., 0] > 0``), else ``rewards_PG > 0``.
* answer cluster ids ``answer_ids_PG``: int per sample, equal ids are
  equivalent answers, a negative id ("no answer extracted") is its own
  singleton cluster (the `rljax.transforms.empo_rewards` convention). A run
  provides them in ``Batch.extra["answer_ids_PG"]`` through
  ``Trainer(annotate=rljax.rewards.cluster_annotate(...))``.
* lengths ``lengths_PG``: completion lengths, ``sum_t mask_PGT``.
"""

from collections.abc import Sequence
from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax._src import stats
from rljax.advantages import _group

# ---------------------------------------------------------------------------
# Shared helpers.
# ---------------------------------------------------------------------------


def _valid(name: str, x: ArrayLike, sample_mask: Optional[ArrayLike]):
  return _group._validity(name, x, sample_mask)


def _same(name: str, *arrays: ArrayLike) -> None:
  names = [name] + [f"argument {i + 2}" for i in range(len(arrays) - 1)]
  checks.same_shape(names, *arrays)


def _masked_max(x, valid, axis=-1):
  best = jnp.max(jnp.where(valid > 0, x, -jnp.inf), axis=axis, keepdims=True)
  return jnp.where(jnp.isfinite(best), best, 0.0)


def _masked_min(x, valid, axis=-1):
  return -_masked_max(-x, valid, axis)


# ---------------------------------------------------------------------------
# 1.4 ASPO.
# ---------------------------------------------------------------------------


def aspo(
  adv_PG: ArrayLike,
  feature_PG: ArrayLike,
  lengths_PG: ArrayLike,
  eligible_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  delta: float = -2.0,
  k: float = 0.7,
) -> jax.Array:
  """ASPO: a clipped additive bias on the advantage of eligible samples.

    E = eligible valid samples of the group (correct and tool-using),
    b_i = delta (p_i - mean_E p) / mean_E L,
    A'_i = A_i + clip(b_i, -k |A_i|, k |A_i|)   for i in E,  A_i otherwise.

  p_i is the steered feature (the token index of the first tool call) and L
  the completion length; with delta < 0 earlier calls are preferred. The
  clip bounds the bias by the base advantage, so it can never flip the sign
  of A_i (for k < 1) and vanishes where A_i = 0.

  Args:
    adv_PG: [..., G] base sequence advantages A_i.
    feature_PG: [..., G] the feature p_i (only read for eligible samples).
    lengths_PG: [..., G] completion lengths L_i.
    eligible_PG: [..., G] eligibility (bool or 0/1).
    sample_mask_PG: [..., G] validity (default: all valid).
    delta: bias scale. Default -2.0 (the reimplementation below).
    k: clip of the bias relative to |A_i| (>= 0). Default 0.7 (same).

  Returns:
    [..., G] float32 shaped advantages (0 for invalid samples).

  References:
    Lin & Xu 2025, Understanding Tool-Integrated Reasoning, arXiv 2508.19201
    (Sec. "Advantage Shaping Policy Optimization").
    Checked: the paper text was not reachable here; the formula and
    defaults follow a third-party verl reimplementation
    (`apply_aspo_shaping`: per group mean over eligible samples of p and L,
    clip by k |mean_t A|, bias added to every token), consistent with the
    paper's abstract and blog. Groups with no eligible sample, or mean
    length 0, are unchanged.
  """
  checks.non_negative(k=k)
  _same("adv_PG", adv_PG, feature_PG, lengths_PG, eligible_PG)
  checks.group_size("adv_PG", adv_PG, 1)
  valid = _valid("adv_PG", adv_PG, sample_mask_PG)
  adv = jnp.where(valid > 0, stats.f32(adv_PG), 0.0)
  elig = valid * stats.f32(jnp.asarray(eligible_PG) != 0)
  p = jnp.where(elig > 0, stats.f32(feature_PG), 0.0)
  length = jnp.where(elig > 0, stats.f32(lengths_PG), 0.0)
  mean_p = stats.masked_mean(p, elig, axis=-1, keepdims=True)
  mean_l = stats.masked_mean(length, elig, axis=-1, keepdims=True)
  bias = delta * stats.safe_div(p - mean_p, mean_l)
  bound = k * jnp.abs(adv)
  bias = jnp.clip(bias, -bound, bound)
  return adv + jnp.where(elig > 0, bias, 0.0)


# ---------------------------------------------------------------------------
# 1.6 HDPO.
# ---------------------------------------------------------------------------


def hdpo_channels(
  accuracy_PG: ArrayLike,
  efficiency_PG: ArrayLike,
  correct_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array]:
  """HDPO's two decoupled advantage channels (A_acc, A_eff).

    A_acc_i = grpo(R^acc)_i over all valid samples of the group,
    A_eff_i = grpo(R^eff)_i over the CORRECT valid samples only
      (the conditional advantage), 0 for wrong samples.

  A channel whose group has fewer than 2 members gets 0 (the `grpo`
  convention), so A_eff is 0 until at least two samples are correct: the
  paper's implicit curriculum.

  Args:
    accuracy_PG: [..., G] accuracy reward.
    efficiency_PG: [..., G] efficiency reward, higher is better (the paper:
      1 / (T + 1) with T the number of tool calls; or -cost).
    correct_PG: [..., G] correctness (bool or 0/1).
    sample_mask_PG: [..., G] validity (default: all valid).
    eps: added to each std (grpo; verl 1e-6).

  Returns:
    (A_acc, A_eff), each [..., G] float32.

  References:
    Act Wisely: Cultivating Meta-Cognitive Tool Use in Agentic Multimodal
    Models (Metis / HDPO), Yan et al. 2026, arXiv 2604.08545.
    Checked: abstract and two secondary summaries (efficiency channel
    normalised only over correct rollouts, wrong rollouts get 0, R_tool =
    1 / (T + 1)); the paper's equations were not reachable.
  """
  _same("accuracy_PG", accuracy_PG, efficiency_PG, correct_PG)
  valid = _valid("accuracy_PG", accuracy_PG, sample_mask_PG)
  correct = valid * stats.f32(jnp.asarray(correct_PG) != 0)
  a_acc = _group.grpo(accuracy_PG, valid, eps=eps)
  a_eff = _group.grpo(efficiency_PG, correct, eps=eps)
  return a_acc, a_eff


def hdpo(
  accuracy_PG: ArrayLike,
  efficiency_PG: ArrayLike,
  correct_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  weight: float = 1.0,
  eps: float = 1e-6,
) -> jax.Array:
  """HDPO: A = A_acc + weight * A_eff (see `hdpo_channels`).

  The paper combines the channels "at the loss level"; with a loss linear
  in A (REINFORCE, or PPO inside the clip range) that equals this sum. For
  per-channel clipping use ``rljax.transforms.hdpo_advantages(combine=
  "loss")`` with ``rljax.objectives.mixed_policy``. ``weight`` (>= 0) is not
  given in the sources read: default 1.0 (a choice).
  """
  checks.non_negative(weight=weight)
  a_acc, a_eff = hdpo_channels(
    accuracy_PG, efficiency_PG, correct_PG, sample_mask_PG, eps=eps
  )
  return a_acc + weight * a_eff


# ---------------------------------------------------------------------------
# 1.81 ADORA.
# ---------------------------------------------------------------------------


def adora_length_classes(
  correct_PG: ArrayLike,
  lengths_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  truncated_PG: Optional[ArrayLike] = None,
) -> jax.Array:
  """ADORA's "length advantage" criterion: 1 = advantageous group, 0 not.

  A group is temporarily advantageous when its longest correct completion is
  longer than the mean length of its incorrect, non-truncated completions
  (max_{correct} L > mean_{wrong, not truncated} L): its correct answers
  come with longer reasoning. Groups without a correct or without such an
  incorrect completion count as advantageous (their GRPO advantages are 0
  with binary rewards anyway).

  Returns:
    [..., G] int32 class of each sample (constant within a group).

  References:
    ADORA, arXiv 2602.10019; ShadeCloak/ADORA
    `compute_grpo_outcome_advantage_ADORA` (verl) and `weight_func`
    (OpenRLHF). Checked against both code versions; the code drops
    incorrect samples whose length reaches a threshold (4054 / 4094 of a
    4096 limit), read here as ``truncated_PG``.
  """
  _same("correct_PG", correct_PG, lengths_PG)
  valid = _valid("correct_PG", correct_PG, sample_mask_PG)
  correct = jnp.asarray(correct_PG) != 0
  lengths = stats.f32(lengths_PG)
  pos = valid * stats.f32(correct)
  neg = valid * stats.f32(~correct)
  if truncated_PG is not None:
    _same("correct_PG", correct_PG, truncated_PG)
    neg = neg * stats.f32(jnp.asarray(truncated_PG) == 0)
  max_pos = _masked_max(lengths, pos)
  mean_neg = stats.masked_mean(lengths, neg, axis=-1, keepdims=True)
  has_pos = jnp.sum(pos, -1, keepdims=True) > 0
  has_neg = jnp.sum(neg, -1, keepdims=True) > 0
  good = (max_pos > mean_neg) | ~has_pos | ~has_neg
  return jnp.broadcast_to(good, lengths.shape).astype(jnp.int32)


def adora(
  adv_PG: ArrayLike,
  classes_PG: ArrayLike,
  kappa: Sequence[float] = (0.1, 1.0),
) -> jax.Array:
  """ADORA: A'_i = kappa[c(i)] * A_i, c(i) the class of sample i.

  Args:
    adv_PG: [..., G] advantages (any shape: the product is elementwise).
    classes_PG: int class per sample, in [0, len(kappa)).
    kappa: factor per class. Default (0.1, 1.0): class 0 (temporarily
      disadvantageous) is damped by the code's lambda = 0.1, class 1 kept.
      The paper also amplifies the advantageous class for strong LLMs
      (kappa[1] > 1).

  Returns:
    float32 advantages, the shape of `adv_PG`.

  References:
    ADORA (arXiv 2602.10019), ShadeCloak/ADORA (lamda = 0.1).
  """
  checks.rank("kappa", kappa, 1, "[number of classes]")
  checks.non_negative(kappa=np.asarray(kappa))
  kappa = stats.f32(kappa)
  classes = jnp.asarray(classes_PG)
  if not jnp.issubdtype(classes.dtype, jnp.integer):
    raise ValueError(
      f"classes_PG must be integer class ids; got dtype {classes.dtype}."
    )
  _same("adv_PG", adv_PG, classes)
  factor = jnp.take(kappa, jnp.clip(classes, 0, kappa.shape[0] - 1))
  return stats.f32(adv_PG) * factor


# ---------------------------------------------------------------------------
# 2.5 DaGRPO (the sample mask).
# ---------------------------------------------------------------------------


def distinctiveness_mask(
  scores_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  delta: float = 0.1,
) -> jax.Array:
  """DaGRPO: w_i = 1[max_j |s_i - s_j| >= delta] over the valid j of i's
  group.

  A sample whose fine-grained score is within delta of every other sample
  of its group carries no distinctive signal (its pairwise gradients
  conflict) and is masked. Invalid samples and groups with one valid sample
  get 0. ``delta`` (> 0) is not given in the sources read: 0.1 (a choice,
  for scores in [0, 1]).

  Returns:
    [..., G] float32 0/1 weights.

  References:
    DaGRPO (distinctiveness-aware GRPO), seed #5; arXiv id not verified.
    Checked: not verified (catalog formula [REC]); the off-policy anchors
    are rollout structure and are not implemented.
  """
  checks.positive(delta=delta)
  r, valid = _group._prepare(scores_PG, sample_mask_PG)
  gap = jnp.abs(r[..., :, None] - r[..., None, :]) * valid[..., None, :]
  best = jnp.max(gap, axis=-1)
  return stats.f32((best >= delta) & (valid > 0))


# ---------------------------------------------------------------------------
# 2.23 TempSamp-R1 (the soft advantage).
# ---------------------------------------------------------------------------


def soft_advantage(
  adv_PG: ArrayLike, *, tau_pos: float = 1.0, tau_neg: float = 1.0
) -> jax.Array:
  """An asymmetric non-linear reshaping phi of the advantage.

    phi(a) = tau_pos * tanh(a / tau_pos)            for a >= 0 (concave),
    phi(a) = tau_neg * (exp(a / tau_neg) - 1)       for a <  0 (convex),

  phi(0) = 0, phi'(0) = 1 on both sides; large positive advantages (e.g.
  an injected ground-truth sample) saturate at tau_pos, negative ones at
  -tau_neg, which keeps one outlier from dominating the group.

  References:
    Li et al. 2025, TempSamp-R1, arXiv 2509.18056 ("non-linear soft
    advantage ... asymmetric transformation").
    Checked: not verified -- the paper's phi was not reachable; this
    concave-above / convex-below form follows the catalog's description
    [REC]. The ground-truth injection is rollout structure (not here).
  """
  checks.positive(tau_pos=tau_pos, tau_neg=tau_neg)
  a = stats.f32(adv_PG)
  pos = tau_pos * jnp.tanh(jnp.where(a >= 0, a, 0.0) / tau_pos)
  neg = tau_neg * jnp.expm1(jnp.where(a < 0, a, 0.0) / tau_neg)
  return jnp.where(a >= 0, pos, neg)


# ---------------------------------------------------------------------------
# 2.70 PF-PPO weights.
# ---------------------------------------------------------------------------


def pf_ppo_weights(
  rewards_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  mode: str = "pow",
  k: float = 2.0,
  axis: str = "group",
) -> jax.Array:
  """PF-PPO's resampling weight of each sample (unnormalised).

  * "pow": w = |R|^k;
  * "max_min" (best-worst): w = 1 if R is the max or min, else 0;
  * "max_random" (best-random): w = 0.4 if R is the max, else 0.1;

  the max / min over the valid samples of the group (``axis="group"``) or
  of the whole array (``axis="batch"``, verl). Invalid samples get 0.

  References:
    Zhang et al. 2024, Policy Filtration in RLHF (PF-PPO), arXiv
    2409.06957; verl `compute_pf_ppo_reweight_data` (modes pow / max_min /
    max_random, weight_pow 2). Checked: against the catalog's reading of
    verl's code [SRC]; the paper's choice of filter by R^2 is left to the
    user.
  """
  checks.one_of("mode", mode, ("pow", "max_min", "max_random"))
  checks.one_of("axis", axis, ("group", "batch"))
  checks.non_negative(k=k)
  r, valid = _group._prepare(rewards_PG, sample_mask_PG, minimum=1)
  ax = -1 if axis == "group" else None
  if mode == "pow":
    w = jnp.abs(r) ** k
  else:
    hi = _masked_max(r, valid, ax)
    if mode == "max_min":
      w = stats.f32((r == hi) | (r == _masked_min(r, valid, ax)))
    else:
      w = jnp.where(r == hi, 0.4, 0.1)
  return jnp.where(valid > 0, w, 0.0)


def pf_ppo_indices(
  key: jax.Array, weights: ArrayLike, num: Optional[int] = None
) -> jax.Array:
  """``num`` indices into the LAST axis of `weights`, drawn with replacement
  with probability proportional to the weights, independently per leading
  row (uniform over the row when its weights sum to 0), [..., num] int32.
  """
  w = stats.f32(weights)
  num = w.shape[-1] if num is None else int(num)
  total = jnp.sum(w, -1, keepdims=True)
  w = jnp.where(total > 0, w, 1.0)
  logits = jnp.log(jnp.where(w > 0, w, 1e-30))
  logits = jnp.where(w > 0, logits, -jnp.inf)
  return jax.random.categorical(
    key, logits[..., None, :], axis=-1, shape=(*w.shape[:-1], num)
  ).astype(jnp.int32)
