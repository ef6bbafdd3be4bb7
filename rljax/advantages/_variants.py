"""Advantage and reward variants over [..., G] groups from the seed papers.

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

from collections.abc import Callable, Sequence
import itertools
import math
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


def _check_ids(name: str, ids: ArrayLike) -> jax.Array:
  ids = jnp.asarray(ids)
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise ValueError(
      f"{name} must hold integer answer cluster ids; got dtype {ids.dtype}."
      " Build them with rljax.rewards.cluster_answers (a negative id means"
      " 'no answer')."
    )
  return ids


def _same_cluster(ids: jax.Array, valid: jax.Array) -> jax.Array:
  """[..., G, G] 1.0 where j is a valid sample in the cluster of i."""
  g = ids.shape[-1]
  same = (ids[..., :, None] == ids[..., None, :]) & (ids[..., :, None] >= 0)
  same = same | jnp.broadcast_to(jnp.eye(g, dtype=bool), same.shape)
  return stats.f32(same) * valid[..., None, :]


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
# Answer-distribution entropies (COPO 1.105, SEED-GRPO 2.31).
# ---------------------------------------------------------------------------


def answer_entropy(
  answer_ids_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  weights_PG: Optional[ArrayLike] = None,
  base: float = math.e,
  estimator: str = "plugin",
) -> jax.Array:
  """Entropy of the answer-cluster distribution of each group, [...].

  p(C) = sum_{i in C} w_i / sum_i w_i over the valid samples (w = 1 by
  default: empirical frequencies). ``estimator``:

  * "plugin": H = -sum_C p(C) log p(C)  (COPO; <= log n);
  * "mean_log": SE = -(1/K) sum_C log p(C), K = number of clusters
    (SEED-GRPO's Monte-Carlo estimate of semantic entropy).

  Groups without a valid sample get 0.
  """
  checks.one_of("estimator", estimator, ("plugin", "mean_log"))
  checks.positive(base=base)
  ids = _check_ids("answer_ids_PG", answer_ids_PG)
  checks.group_size("answer_ids_PG", ids, 1)
  valid = _valid("answer_ids_PG", ids, sample_mask_PG)
  w = valid
  if weights_PG is not None:
    _same("answer_ids_PG", ids, weights_PG)
    w = valid * jnp.where(valid > 0, stats.f32(weights_PG), 0.0)
  same = _same_cluster(ids, valid)
  mass = jnp.sum(same * w[..., None, :], -1)  # cluster mass of i's cluster
  p = stats.safe_div(mass, jnp.sum(w, -1, keepdims=True))
  log_p = jnp.log(jnp.where(p > 0, p, 1.0))
  # Each cluster once: weight 1/count_i spreads one unit over its members.
  count = jnp.sum(same, -1)
  per_cluster = valid * stats.safe_div(1.0, count)
  if estimator == "plugin":
    h = -jnp.sum(per_cluster * p * log_p, -1)
  else:
    k = jnp.sum(per_cluster, -1)
    h = -stats.safe_div(jnp.sum(per_cluster * log_p, -1), k)
  return h / math.log(base)


# ---------------------------------------------------------------------------
# 1.105 COPO.
# ---------------------------------------------------------------------------


def copo_global_advantages(
  rewards_PG: ArrayLike,
  answer_ids_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array]:
  """COPO's consistency-aware global advantage, and the answer entropy.

    H_q = entropy (base 2) of the answer distribution of group q,
    lambda_q = (1 - 1/n_q) / log2 n_q,  n_q valid samples,
    R^glob_q = mean_q(R) * (1 - lambda_q H_q),
    A^glob_i = (R^glob_q(i) - mean R^glob) / (std R^glob + eps),

  the batch mean and unbiased std taken over every valid sample of groups
  with n_q >= 2 (each response counts once, as in the verl code, so a
  group weighs by its size). A group where every answer agrees keeps its
  whole mean reward (H = 0); fully scattered answers keep 1/n of it.

  Args:
    rewards_PG: [..., G] rewards (the global reward is meant for 0/1).
    answer_ids_PG: [..., G] int answer cluster ids.
    sample_mask_PG: [..., G] validity (default: all valid).
    eps: added to the batch std (>= 0).

  Returns:
    (A^glob [..., G] float32, 0 for invalid samples and groups with n < 2;
    H [...] float32 in bits).

  References:
    Han et al. 2025, COPO: Consistency-Aware Policy Optimization, arXiv
    2508.04138; code hijih/copo-code `compute_score_global`.
    Checked: the catalog's reading of the official code (not re-read here:
    no snapshot was reachable) and the paper's abstract; batch statistics
    over responses is our reading of "batch z-score".
  """
  checks.non_negative(eps=eps)
  _same("rewards_PG", rewards_PG, answer_ids_PG)
  r, valid = _group._prepare(rewards_PG, sample_mask_PG)
  h = answer_entropy(answer_ids_PG, valid, base=2.0)
  n = jnp.sum(valid, -1)
  log2n = jnp.log2(jnp.maximum(n, 2.0))
  lam = (1.0 - stats.safe_div(1.0, n)) / log2n
  mean_r = stats.masked_mean(r, valid, axis=-1)
  r_glob = mean_r * (1.0 - lam * h)
  scored = stats.f32(_group._scorable(valid, n[..., None]))
  r_glob_pg = jnp.broadcast_to(r_glob[..., None], r.shape)
  mu = stats.masked_mean(r_glob_pg, scored)
  sd = stats.masked_std(r_glob_pg, scored)
  adv = stats.safe_div(r_glob_pg - mu, sd + eps)
  return jnp.where(scored > 0, adv, 0.0), h


def copo_weights(
  entropy_P: ArrayLike, *, k: float = 1.0, b: float = 0.5
) -> jax.Array:
  """COPO's blend weight of the LOCAL loss, w_q = sigmoid(k (H_q - b)).

  Diverse answers (high entropy) favour the local GRPO advantage; a
  consistent group (H near 0) leans on the global one. Defaults k = 1,
  b = 0.5 (hijih/copo-code, per the catalog).
  """
  checks.positive(k=k)
  return jax.nn.sigmoid(k * (stats.f32(entropy_P) - b))


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
# 2.26 Polychromic set-level advantage.
# ---------------------------------------------------------------------------

_MAX_SETS = 200_000


def _subsets(g: int, n: int) -> np.ndarray:
  count = math.comb(g, n)
  if count > _MAX_SETS:
    raise ValueError(
      f"set_size={n} with G={g} gives {count} subsets (more than"
      f" {_MAX_SETS}); use a smaller set_size."
    )
  return np.asarray(list(itertools.combinations(range(g), n)), np.int32)


def distinct_fraction(ids_PSN: jax.Array) -> jax.Array:
  """Number of distinct answers in each set / set size, [..., S].

  A negative id (no answer) is distinct from everything, itself included.
  """
  n = ids_PSN.shape[-1]
  same = ids_PSN[..., :, None] == ids_PSN[..., None, :]
  same = same & (ids_PSN[..., :, None] >= 0)
  earlier = jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool), k=-1), same.shape)
  repeated = jnp.any(same & earlier, axis=-1)
  return jnp.sum(~repeated, axis=-1) / n


def polychromic(
  rewards_PG: ArrayLike,
  answer_ids_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  set_size: int = 4,
  diversity: Callable[[jax.Array], jax.Array] = distinct_fraction,
) -> jax.Array:
  """Polychromic set-level advantage over all size-n subsets of the group.

    f(S) = mean_{i in S} R_i * d(S),   d(S) = diversity of the answers in S,
    A(tau) = mean_{S contains tau} f(S) - mean_S f(S),

  the means over every subset of ``set_size`` valid samples of the group
  (exact enumeration; subsets with an invalid sample are left out). A failed
  but novel answer can get A > 0 when it makes sets more diverse.

  Args:
    rewards_PG: [..., G] rewards.
    answer_ids_PG: [..., G] int answer cluster ids.
    sample_mask_PG: [..., G] validity (default: all valid).
    set_size: n, 2 <= n <= G. Default 4 (the paper's n = 4 sets, per the
      catalog; not verified).
    diversity: maps ids [..., S, n] to d(S) [..., S]; default the fraction
      of distinct answers.

  Returns:
    [..., G] float32; 0 for invalid samples and groups with fewer than n
    valid samples.

  References:
    Hamid et al. 2025, Polychromic Objectives for Reinforcement Learning,
    arXiv 2509.25424. Checked: abstract and author's visualisation page
    (marginal set advantage = expected score of sets containing y minus the
    mean score of all sets); f = mean reward x diversity per the catalog
    [REC]. Vine sampling is rollout structure (not here).
  """
  ids = _check_ids("answer_ids_PG", answer_ids_PG)
  _same("rewards_PG", rewards_PG, ids)
  g = np.shape(rewards_PG)[-1] if np.ndim(rewards_PG) else 0
  if not 2 <= set_size <= g:
    raise ValueError(
      f"set_size must be in [2, G] with G = {g} samples per group; got"
      f" {set_size!r}."
    )
  r, valid = _group._prepare(rewards_PG, sample_mask_PG)
  idx = _subsets(g, set_size)  # [S, n]
  member = np.zeros((idx.shape[0], g), np.float32)
  np.put_along_axis(member, idx, 1.0, axis=1)
  set_ok = jnp.prod(valid[..., idx], axis=-1)  # [..., S]
  f = jnp.mean(r[..., idx], axis=-1) * diversity(ids[..., idx])
  f = f * set_ok
  member = jnp.asarray(member)
  mean_all = stats.safe_div(jnp.sum(f, -1), jnp.sum(set_ok, -1))[..., None]
  with_i = jnp.einsum("...s,sg->...g", f, member)
  count_i = jnp.einsum("...s,sg->...g", set_ok, member)
  adv = stats.safe_div(with_i, count_i) - mean_all
  return jnp.where((count_i > 0) & (valid > 0), adv, 0.0)


# ---------------------------------------------------------------------------
# 2.31 SEED-GRPO.
# ---------------------------------------------------------------------------

_SEED_F = {
  "linear": lambda x, gamma: jnp.maximum(1.0 - x, 0.0),
  "exponential": lambda x, gamma: jnp.exp(-x),
  "focal": lambda x, gamma: jnp.maximum(1.0 - x, 0.0) ** gamma,
}


def seed_grpo(
  adv_PG: ArrayLike,
  answer_ids_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  logp_PG: Optional[ArrayLike] = None,
  alpha: float = 1.0,
  f: str = "linear",
  gamma: float = 2.0,
) -> jax.Array:
  """SEED-GRPO: advantages scaled down by the prompt's semantic entropy.

    p(C) = sum_{i in C} pi_old(o_i) / sum_i pi_old(o_i)   (softmax of logp
      over the valid samples; uniform when ``logp_PG`` is None),
    SE(q) = -(1/K) sum_C log p(C),   SE_max = log n  (n valid samples),
    A'_i = A_i * f(alpha SE(q) / SE_max),
    f: linear 1 - x, exponential e^-x, focal (1 - x)^gamma, floored at 0.

  Args:
    adv_PG: [..., G] advantages (the paper: A_i = r_i - mean r).
    answer_ids_PG: [..., G] int answer cluster ids.
    sample_mask_PG: [..., G] validity (default: all valid).
    logp_PG: [..., G] log pi_old of each completion (sequence log-prob);
      None weighs every sample equally (discrete semantic entropy).
    alpha: sensitivity (>= 0). Default 1.0 (a choice).
    f: "linear" (default), "exponential" or "focal".
    gamma: focal exponent (> 0).

  Returns:
    [..., G] float32; 0 for invalid samples.

  References:
    Chen et al. 2025, SEED-GRPO, arXiv 2505.12346, Sec. 3 (SE estimate and
    the modulated advantage). Checked: the SE estimator, p(C) as the
    pi_old mass of a cluster and A' = A f(alpha SE/SE_max) against a
    review of the paper; the exact f family, alpha default and SE_max
    (taken as log n, the entropy of n singleton clusters) were not
    verified. With uneven pi_old mass SE can exceed log n; x is not
    clipped, f is floored at 0.
  """
  checks.non_negative(alpha=alpha)
  checks.positive(gamma=gamma)
  checks.one_of("f", f, tuple(_SEED_F))
  _same("adv_PG", adv_PG, answer_ids_PG)
  valid = _valid("adv_PG", adv_PG, sample_mask_PG)
  weights = None
  if logp_PG is not None:
    _same("adv_PG", adv_PG, logp_PG)
    logp = jnp.where(valid > 0, stats.f32(logp_PG), -jnp.inf)
    top = jax.lax.stop_gradient(_masked_max(logp, valid))
    weights = jnp.where(valid > 0, jnp.exp(logp - top), 0.0)
  se = answer_entropy(
    answer_ids_PG, valid, weights_PG=weights, estimator="mean_log"
  )
  n = jnp.sum(valid, -1)
  se_max = jnp.log(jnp.maximum(n, 1.0))
  x = alpha * stats.safe_div(se, se_max)
  scale = _SEED_F[f](x, gamma)[..., None]
  return jnp.where(valid > 0, stats.f32(adv_PG) * scale, 0.0)


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


# ---------------------------------------------------------------------------
# Length rewards: Kimi k1.5, L-GRPO (2.90), GRPO-lambda (2.88).
# ---------------------------------------------------------------------------


def kimi_length_reward(
  lengths_PG: ArrayLike,
  correct_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
) -> jax.Array:
  """Kimi k1.5's length reward over the k samples of a prompt.

    lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len),
    reward_i = lambda_i if correct, min(0, lambda_i) if wrong,

  min / max over the valid samples of the group; a group whose lengths are
  all equal gets 0 (the ratio is undefined there: a choice). It lies in
  [-0.5, 0.5]: the shortest correct answer gets +0.5, the longest -0.5.

  References:
    Kimi Team 2025, Kimi k1.5, arXiv 2501.12599, Sec. 2.3.3 "Length
    Penalty". Checked: the formula against the catalog and a secondary
    summary ("normalised between min/max lengths"); the paper's warm-up
    schedule of the reward's weight is left to the caller.
  """
  _same("lengths_PG", lengths_PG, correct_PG)
  length, valid = _group._prepare(lengths_PG, sample_mask_PG, minimum=1)
  lo = _masked_min(length, valid)
  hi = _masked_max(length, valid)
  lam = 0.5 - stats.safe_div(length - lo, hi - lo)
  lam = jnp.where(hi > lo, lam, 0.0)
  correct = jnp.asarray(correct_PG) != 0
  out = jnp.where(correct, lam, jnp.minimum(lam, 0.0))
  return jnp.where(valid > 0, out, 0.0)


def l_grpo_bonus(
  lengths_PG: ArrayLike,
  correct_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  max_length: float,
  alpha: float = 1.0,
) -> jax.Array:
  """ConciseR's L-GRPO length bonus, paid only when the whole group is
  correct: 1[all valid samples correct] * alpha * (1 - L_i / L_max).

  The reward is then r_i = 1[correct_i] + this bonus (add it to a 0/1
  reward). Invalid samples get 0.

  Args:
    lengths_PG, correct_PG: [..., G] lengths and correctness.
    sample_mask_PG: [..., G] validity (default: all valid).
    max_length: L_max (> 0), the generation limit.
    alpha: bonus scale (>= 0). Default 1.0 (a choice).

  References:
    Song & Zheng 2025, Walk Before You Run! Concise LLM Reasoning via RL
    (ConciseR), arXiv 2505.21178. Checked: not verified (catalog [REC]).
  """
  checks.positive(max_length=max_length)
  checks.non_negative(alpha=alpha)
  _same("lengths_PG", lengths_PG, correct_PG)
  length, valid = _group._prepare(lengths_PG, sample_mask_PG, minimum=1)
  correct = valid * stats.f32(jnp.asarray(correct_PG) != 0)
  n = jnp.sum(valid, -1, keepdims=True)
  all_ok = (jnp.sum(correct, -1, keepdims=True) == n) & (n > 0)
  bonus = alpha * (1.0 - length / max_length)
  return jnp.where(all_ok & (valid > 0), bonus, 0.0)


def top_groups(
  score_P: ArrayLike, fraction: float, valid_P: Optional[ArrayLike] = None
) -> jax.Array:
  """Bool [P]: the ceil(fraction * #valid) valid rows of highest score
  (ties broken by position, earlier first)."""
  checks.in_range("fraction", fraction, 0.0, 1.0)
  score = stats.f32(score_P)
  checks.rank("score_P", score, 1, "[prompts]")
  valid = jnp.ones_like(score) if valid_P is None else stats.f32(valid_P)
  k = jnp.ceil(fraction * jnp.sum(valid)).astype(jnp.int32)
  key = jnp.where(valid > 0, -score, jnp.inf)
  rank = jnp.argsort(jnp.argsort(key, stable=True), stable=True)
  return (rank < k) & (valid > 0)


def grpo_lambda_mask(
  correct_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  fraction: float = 0.2,
) -> jax.Array:
  """GRPO-lambda's switch: bool [P], True for the groups in the top
  ``fraction`` of the batch by correctness ratio c_g = #correct / n_g;
  those get the length-penalised reward, the others the 0/1 reward.

  Args:
    correct_PG: [P, G] correctness.
    sample_mask_PG: [P, G] validity (default: all valid).
    fraction: lambda in [0, 1]. Default 0.2 (a choice: the paper's value
      was not read).

  References:
    Dai, Liu & Si 2025, Stable Reinforcement Learning for Efficient
    Reasoning (GRPO-lambda), arXiv 2505.18086. Checked: abstract and
    summaries (batch-wise top-lambda selection by group correctness ratio,
    Kimi-style length penalty for the selected groups, 0/1 otherwise).
  """
  checks.rank("correct_PG", correct_PG, 2, "[prompts, samples]")
  valid = _valid("correct_PG", correct_PG, sample_mask_PG)
  correct = valid * stats.f32(jnp.asarray(correct_PG) != 0)
  n = jnp.sum(valid, -1)
  ratio = stats.safe_div(jnp.sum(correct, -1), n)
  return top_groups(ratio, fraction, n > 0)
