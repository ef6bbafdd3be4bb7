"""Batch stages for the advantage and reward variants of `rljax.advantages`
(`_variants.py`, `_variants_answers.py`, `_variants_length.py`): ASPO,
HDPO, ADORA, COPO, DaGRPO, TempSamp-R1's soft advantage, Polychromic,
SEED-GRPO, PF-PPO resampling and the length rewards of Kimi k1.5, L-GRPO
and GRPO-lambda.

Where the stages read side data:

* correctness: ``Batch.extra["correct_PG"]`` when present, else reward
  column 0 (``rewards_PGK[..., 0] > 0``), else ``rewards_PG > 0``;
* answer cluster ids: ``Batch.extra["answer_ids_PG"]`` (int, negative = no
  answer), written on the host by
  ``Trainer(annotate=rljax.rewards.cluster_annotate(...))``;
* per-sample features (ASPO's first tool-call position, HDPO's tool-call
  count): an ``extra`` name ending in ``_PG``, or an int column of
  ``rewards_PGK`` (the Trainer copies every reward function's output there,
  so a weight-0 reward function can carry a feature);
* lengths: ``sum_t mask_PGT``.

Reward stages rewrite ``rewards_PG`` and go before the advantage stage;
advantage modifiers rewrite ``advantages_PGT`` and go after it.
"""

from collections.abc import Callable, Sequence
from typing import Optional

import jax
import jax.numpy as jnp

from rljax import advantages
from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare
from rljax.transforms._advantages import sequence_rewards

Source = str | int

# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------


def correctness(batch: Batch) -> jax.Array:
  """[P, G] bool correctness by the convention of this module's docstring."""
  if batch.extra and "correct_PG" in batch.extra:
    return jnp.asarray(batch.extra["correct_PG"]) != 0
  if batch.rewards_PGK is not None:
    return stats.f32(batch.rewards_PGK[..., 0]) > 0
  batch.require("rewards_PG", by="correctness (rewards_PGK or correct_PG)")
  return stats.f32(batch.rewards_PG) > 0


def read_feature(batch: Batch, source: Source, *, by: str) -> jax.Array:
  """[P, G] float32 feature: ``extra[source]`` or ``rewards_PGK[..., source]``."""
  if isinstance(source, str):
    if not source.endswith("_PG"):
      raise ValueError(
        f"{by}: the feature name {source!r} must end with _PG (one value per"
        " sample)."
      )
    return stats.f32(batch.get(source, by=by))
  if isinstance(source, int) and not isinstance(source, bool):
    batch.require("rewards_PGK", by=by)
    k = batch.rewards_PGK.shape[-1]
    if not -k <= source < k:
      raise ValueError(
        f"{by}: reward column {source} is out of range for rewards_PGK with"
        f" {k} columns."
      )
    return stats.f32(batch.rewards_PGK[..., source])
  raise ValueError(
    f"{by}: a feature source must be an extra name ending in _PG or an int"
    f" column of rewards_PGK; got {source!r}."
  )


def _lengths(batch: Batch) -> jax.Array:
  return stats.sequence_lengths(batch.mask_PGT)


def _sequence_advantages(batch: Batch, by: str) -> jax.Array:
  """[P, G] masked mean over T of ``advantages_PGT``."""
  batch.require("advantages_PGT", by=by)
  return stats.masked_mean(batch.advantages_PGT, batch.loss_mask(), axis=-1)


def _per_token(batch: Batch, adv_PG: jax.Array) -> jax.Array:
  return adv_PG[..., None] * batch.loss_mask()


def _answer_ids(batch: Batch, ids: str, by: str) -> jax.Array:
  return jnp.asarray(batch.get(ids, by=by))


# ---------------------------------------------------------------------------
# Advantage modifiers (after an advantage stage).
# ---------------------------------------------------------------------------


def aspo_shaping(
  feature: Source = "tool_position_PG",
  *,
  delta: float = -2.0,
  k: float = 0.7,
  used: Optional[str] = None,
) -> Transform:
  """ASPO (arXiv 2508.19201): add `rljax.advantages.aspo`'s clipped bias to
  the advantages of eligible samples (correct and tool-using).

  The bias is computed from the sequence advantage (the masked mean over T
  of ``advantages_PGT``) and added to every valid token, as in the
  reimplementation the formula was checked against.

  Args:
    feature: where p_i (the token index of the first tool call) comes from:
      an extra ``_PG`` name or a ``rewards_PGK`` column. A negative value
      means "no tool call" (not eligible), unless ``used`` is given.
    delta, k: see `rljax.advantages.aspo` (defaults -2.0, 0.7).
    used: optional extra ``_PG`` name of a 0/1 "tool used" flag.
  """
  checks.non_negative(k=k)

  def fn(batch: Batch) -> Batch:
    by = "aspo_shaping"
    a_seq = _sequence_advantages(batch, by)
    p = read_feature(batch, feature, by=by)
    tool = p >= 0 if used is None else read_feature(batch, used, by=by) != 0
    eligible = correctness(batch) & tool
    shaped = advantages.aspo(
      a_seq, p, _lengths(batch), eligible, batch.samples(), delta=delta, k=k
    )
    bias = shaped - jnp.where(batch.samples() > 0, a_seq, 0.0)
    adv = stats.f32(batch.advantages_PGT) + _per_token(batch, bias)
    return batch._replace(advantages_PGT=adv)

  return stateless_prepare(fn)


def adora_length_criterion(batch: Batch) -> jax.Array:
  """ADORA's default class of each sample (1 advantageous, 0 not): the
  length criterion `rljax.advantages.adora_length_classes` on the batch's
  correctness, lengths and ``truncated_PG`` (when present)."""
  return advantages.adora_length_classes(
    correctness(batch), _lengths(batch), batch.samples(), batch.truncated_PG
  )


def adora_advantages(
  *,
  kappa: Sequence[float] = (0.1, 1.0),
  classify: Optional[Callable[[Batch], jax.Array]] = None,
) -> Transform:
  """ADORA (arXiv 2602.10019): multiply each sample's advantages by
  ``kappa[classify(batch)]``.

  Args:
    kappa: factor per class (default (0.1, 1.0): the code's lambda = 0.1 on
      temporarily disadvantageous groups). Amplify with kappa[1] > 1.
    classify: ``f(batch) -> int [P, G]`` classes; default
      `adora_length_criterion` (the code's "length advantage").
  """
  classify = adora_length_criterion if classify is None else classify
  kappa = tuple(float(x) for x in kappa)
  checks.non_negative(kappa=kappa)

  def fn(batch: Batch) -> Batch:
    batch.require("advantages_PGT", by="adora_advantages")
    classes = jnp.asarray(classify(batch))
    if classes.shape != batch.shape[:2]:
      raise ValueError(
        f"adora_advantages: classify(batch) has shape {classes.shape};"
        f" expected [P, G] = {batch.shape[:2]}."
      )
    factor = advantages.adora(jnp.ones(batch.shape[:2]), classes, kappa)
    adv = stats.f32(batch.advantages_PGT) * factor[..., None]
    return batch._replace(advantages_PGT=adv)

  return stateless_prepare(fn)


def soft_advantages(*, tau_pos: float = 1.0, tau_neg: float = 1.0) -> Transform:
  """TempSamp-R1's asymmetric soft advantage (`rljax.advantages.
  soft_advantage`) applied to ``advantages_PGT``. Partial: the ground-truth
  injection into the group is rollout structure; phi is not verified."""
  checks.positive(tau_pos=tau_pos, tau_neg=tau_neg)

  def fn(batch: Batch) -> Batch:
    batch.require("advantages_PGT", by="soft_advantages")
    adv = advantages.soft_advantage(
      batch.advantages_PGT, tau_pos=tau_pos, tau_neg=tau_neg
    )
    return batch._replace(advantages_PGT=adv * batch.loss_mask())

  return stateless_prepare(fn)


def seed_grpo_advantages(
  *,
  ids: str = "answer_ids_PG",
  alpha: float = 1.0,
  f: str = "linear",
  gamma: float = 2.0,
  weighting: str = "sequence",
) -> Transform:
  """SEED-GRPO (arXiv 2505.12346): scale ``advantages_PGT`` by
  f(alpha SE(q) / SE_max) (`rljax.advantages.seed_grpo`).

  Args:
    ids: extra name of the answer cluster ids.
    alpha, f, gamma: see `rljax.advantages.seed_grpo`.
    weighting: the pi_old weight of each completion in p(C): "sequence"
      (the paper: exp of sum_t old_logp_PGT; needs ``old_logp_PGT``),
      "token_mean" (exp of the mean token log-prob: length-normalised, as
      is common for semantic entropy) or "count" (uniform).
  """
  checks.one_of("weighting", weighting, ("sequence", "token_mean", "count"))
  checks.one_of("f", f, ("linear", "exponential", "focal"))
  checks.non_negative(alpha=alpha)
  checks.positive(gamma=gamma)

  def fn(batch: Batch) -> Batch:
    by = "seed_grpo_advantages"
    a_seq = _sequence_advantages(batch, by)
    answer_ids = _answer_ids(batch, ids, by)
    logp = None
    if weighting != "count":
      batch.require("old_logp_PGT", by=f"{by}(weighting={weighting!r})")
      reduce = (
        stats.masked_sum if weighting == "sequence" else stats.masked_mean
      )
      logp = reduce(batch.old_logp_PGT, batch.mask_PGT, axis=-1)
    scaled = advantages.seed_grpo(
      jnp.ones_like(a_seq),
      answer_ids,
      batch.samples(),
      logp_PG=logp,
      alpha=alpha,
      f=f,
      gamma=gamma,
    )
    adv = stats.f32(batch.advantages_PGT) * scaled[..., None]
    return batch._replace(advantages_PGT=adv)

  return stateless_prepare(fn)


def dagrpo_mask(
  *, delta: float = 0.1, scores: Optional[Source] = None
) -> Transform:
  """DaGRPO: multiply ``policy_weights_PGT`` by the distinctiveness mask
  1[max_j |s_i - s_j| >= delta] (`rljax.advantages.distinctiveness_mask`),
  so that indistinct samples leave the policy term (penalties stay).

  Args:
    delta: distinctiveness threshold (> 0; default 0.1, a choice).
    scores: the fine-grained score s: an extra ``_PG`` name or a
      ``rewards_PGK`` column; default the sequence reward.

  Partial: DaGRPO's off-policy anchors for all-fail prompts are rollout
  structure.
  """
  checks.positive(delta=delta)

  def fn(batch: Batch) -> Batch:
    by = "dagrpo_mask"
    s = (
      sequence_rewards(batch)
      if scores is None
      else read_feature(batch, scores, by=by)
    )
    w = advantages.distinctiveness_mask(s, batch.samples(), delta=delta)
    old = (
      jnp.ones(batch.shape, jnp.float32)
      if batch.policy_weights_PGT is None
      else stats.f32(batch.policy_weights_PGT)
    )
    return batch._replace(policy_weights_PGT=old * w[..., None])

  return stateless_prepare(fn)


# ---------------------------------------------------------------------------
# Advantage stages (from rewards).
# ---------------------------------------------------------------------------


def hdpo_advantages(
  cost: Source = "tool_calls_PG",
  *,
  weight: float = 1.0,
  efficiency: Optional[Callable[[jax.Array], jax.Array]] = None,
  combine: str = "advantage",
  eps: float = 1e-6,
) -> Transform:
  """HDPO: accuracy advantage over the group + efficiency advantage among
  the correct samples (`rljax.advantages.hdpo_channels`).

  Args:
    cost: per-sample cost (tool calls): extra ``_PG`` name or
      ``rewards_PGK`` column; a [P, G, N] array (the agent layout's
      per-turn ``tool_calls_PG``, `rljax.envs`) is summed over turns.
    weight: w of the efficiency channel (>= 0; default 1.0, a choice).
    efficiency: cost -> efficiency reward, higher is better; default
      1 / (cost + 1) (the paper's R_tool, per a secondary summary).
    combine: "advantage" writes ``advantages_PGT = A_acc + w A_eff``;
      "loss" writes ``advantages_PGT = A_acc`` and
      ``extra["advantages_efficiency_PGT"] = A_eff`` for
      ``objectives.mixed_policy(loss, mix=(("advantages_PGT", 1.0),
      ("advantages_efficiency_PGT", w)))`` (per-channel clipping).
  """
  checks.non_negative(weight=weight)
  checks.one_of("combine", combine, ("advantage", "loss"))
  efficiency = (lambda c: 1.0 / (c + 1.0)) if efficiency is None else efficiency

  def fn(batch: Batch) -> Batch:
    c = read_feature(batch, cost, by="hdpo_advantages")
    eff = efficiency(c.sum(-1) if c.ndim == 3 else c)
    a_acc, a_eff = advantages.hdpo_channels(
      sequence_rewards(batch),
      eff,
      correctness(batch),
      batch.samples(),
      eps=eps,
    )
    if combine == "advantage":
      return batch._replace(
        advantages_PGT=_per_token(batch, a_acc + weight * a_eff)
      )
    return batch._replace(advantages_PGT=_per_token(batch, a_acc)).with_extra(
      advantages_efficiency_PGT=_per_token(batch, a_eff)
    )

  return stateless_prepare(fn)


def copo_advantages(
  *,
  ids: str = "answer_ids_PG",
  k: float = 1.0,
  b: float = 0.5,
  eps: float = 1e-6,
  forced: bool = False,
  local: Callable[..., jax.Array] = advantages.grpo,
) -> Transform:
  """COPO (arXiv 2508.04138): the local and the global advantage, and the
  entropy blend weight, for `rljax.objectives.mixed_policy`.

  Writes ``advantages_PGT`` = the local (group) advantage,
  ``extra["advantages_global_PGT"]`` = `rljax.advantages.
  copo_global_advantages`, ``extra["copo_local_weight_PG"]`` = w_q =
  sigmoid(k (H_q - b)) and ``extra["copo_global_weight_PG"]`` = 1 - w_q.
  The loss is then L = (1 - w_q) L(A^glob) + w_q L(A^loc); use the preset
  `rljax.algorithms.copo` or ``objectives.mixed_policy(..., mix=COPO_MIX)``.

  Args:
    ids: extra name of the answer cluster ids.
    k, b: the sigmoid's slope (> 0) and centre in bits (1 and 0.5).
    eps: std epsilon of both advantages.
    forced: COPO's "soft with forced" variant: w_q = 0 (global only) for
      groups whose local advantage is all zero.
    local: the local estimator ``f(rewards_PG, sample_mask_PG)``; grpo.
  """
  checks.positive(k=k)

  def fn(batch: Batch) -> Batch:
    by = "copo_advantages"
    rewards, valid = sequence_rewards(batch), batch.samples()
    a_loc = local(rewards, valid)
    a_glob, h = advantages.copo_global_advantages(
      rewards, _answer_ids(batch, ids, by), valid, eps=eps
    )
    w = advantages.copo_weights(h, k=k, b=b)[..., None] * jnp.ones_like(a_loc)
    if forced:
      flat = jnp.all(a_loc == 0, axis=-1, keepdims=True)
      w = jnp.where(flat, 0.0, w)
    return batch._replace(advantages_PGT=_per_token(batch, a_loc)).with_extra(
      advantages_global_PGT=_per_token(batch, a_glob),
      copo_local_weight_PG=w,
      copo_global_weight_PG=1.0 - w,
    )

  return stateless_prepare(fn)


#: The ``mix`` of `rljax.objectives.mixed_policy` for `copo_advantages`.
COPO_MIX = (
  ("advantages_PGT", "copo_local_weight_PG"),
  ("advantages_global_PGT", "copo_global_weight_PG"),
)


def polychromic_advantages(
  *,
  ids: str = "answer_ids_PG",
  set_size: int = 4,
  diversity: Callable[[jax.Array], jax.Array] = advantages.distinct_fraction,
) -> Transform:
  """Polychromic (arXiv 2509.25424): ``advantages_PGT`` = the set-level
  advantage `rljax.advantages.polychromic` of the sequence rewards and the
  answer clusters. Partial: the paper's vine sampling is rollout structure;
  here the sets are the subsets of each prompt's G samples."""

  def fn(batch: Batch) -> Batch:
    adv = advantages.polychromic(
      sequence_rewards(batch),
      _answer_ids(batch, ids, "polychromic_advantages"),
      batch.samples(),
      set_size=set_size,
      diversity=diversity,
    )
    return batch._replace(advantages_PGT=_per_token(batch, adv))

  return stateless_prepare(fn)


# ---------------------------------------------------------------------------
# PF-PPO resampling (after the advantage stage).
# ---------------------------------------------------------------------------


def draw_counts(idx: jax.Array, axis: str) -> jax.Array:
  """[P, G] how many times each sample was drawn: ``idx`` [P, G] indexes
  samples of the same prompt (group) or the flattened P * G (batch)."""
  p, g = idx.shape
  if axis == "group":
    return jax.vmap(lambda i: jnp.zeros((g,)).at[i].add(1.0))(idx)
  flat = jnp.zeros((p * g,)).at[idx.reshape(-1)].add(1.0)
  return flat.reshape(p, g)


def pf_ppo_resample(
  *, mode: str = "pow", k: float = 2.0, axis: str = "group"
) -> Transform:
  """PF-PPO (arXiv 2409.06957): resample the batch's samples with
  replacement, with probability proportional to
  `rljax.advantages.pf_ppo_weights` of the sequence rewards.

  The draw is kept as multiplicities: each sample's ``sample_mask_PG`` is
  multiplied by the number of times it was drawn (0 when never drawn), so
  the rows stay where the update's sequences are. With a token-level
  aggregation (`aggregate.token_mean`, `token_sum`, verl's default) the loss
  and gradient equal those of the resampled batch with its duplicates; the
  sequence-mean aggregations count a drawn sequence once in their
  denominator. Put it after the advantage stage (verl reweights the data
  after computing advantages). Randomised: uses the PRNG key of
  ``Algorithm.prepare(..., key=...)``.

  Args:
    mode: "pow" (|R|^k), "max_min" (best-worst) or "max_random"
      (best-random); verl's names.
    k: the power of "pow" (verl weight_pow 2).
    axis: "group" draws G samples per prompt among its own samples (a
      choice: every prompt keeps G draws); "batch" draws P * G samples from
      the whole batch (verl).
  """
  checks.one_of("mode", mode, ("pow", "max_min", "max_random"))
  checks.one_of("axis", axis, ("group", "batch"))
  checks.non_negative(k=k)

  def prepare(batch: Batch, state):
    key = batch.require_key(by="pf_ppo_resample")
    w = advantages.pf_ppo_weights(
      sequence_rewards(batch), batch.samples(), mode=mode, k=k, axis=axis
    )
    if axis == "group":
      idx = advantages.pf_ppo_indices(key, w)
    else:
      idx = advantages.pf_ppo_indices(key, w.reshape(-1)).reshape(w.shape)
    counts = draw_counts(idx, axis)
    return batch._replace(sample_mask_PG=batch.samples() * counts), state

  return Transform(
    init=lambda: (), prepare=prepare, apply=lambda terms, batch, state: terms
  )


# ---------------------------------------------------------------------------
# Length rewards (before the advantage stage).
# ---------------------------------------------------------------------------


def _add_reward(batch: Batch, extra_PG: jax.Array, by: str) -> Batch:
  batch.require("rewards_PG", by=by)
  return batch._replace(rewards_PG=stats.f32(batch.rewards_PG) + extra_PG)


def kimi_length_rewards(*, coef: float = 1.0) -> Transform:
  """Kimi k1.5 (arXiv 2501.12599): ``rewards_PG += coef *``
  `rljax.advantages.kimi_length_reward` (correctness by this module's
  convention, lengths from ``mask_PGT``). Ramp ``coef`` up for the
  paper's warm-up."""
  checks.non_negative(coef=coef)

  def fn(batch: Batch) -> Batch:
    r = advantages.kimi_length_reward(
      _lengths(batch), correctness(batch), batch.samples()
    )
    return _add_reward(batch, coef * r, "kimi_length_rewards")

  return stateless_prepare(fn)


def l_grpo_rewards(
  *, max_length: Optional[int] = None, alpha: float = 1.0
) -> Transform:
  """ConciseR L-GRPO (arXiv 2505.21178): ``rewards_PG +=``
  `rljax.advantages.l_grpo_bonus` (paid only in all-correct groups). With a
  0/1 reward this is r = 1[correct] + 1[all correct] alpha (1 - L/L_max).

  Args:
    max_length: L_max; default the batch's token axis T.
    alpha: bonus scale (default 1.0, a choice).
  """
  checks.non_negative(alpha=alpha)
  if max_length is not None:
    checks.positive(max_length=max_length)

  def fn(batch: Batch) -> Batch:
    l_max = batch.shape[-1] if max_length is None else max_length
    bonus = advantages.l_grpo_bonus(
      _lengths(batch),
      correctness(batch),
      batch.samples(),
      max_length=l_max,
      alpha=alpha,
    )
    return _add_reward(batch, bonus, "l_grpo_rewards")

  return stateless_prepare(fn)


def grpo_lambda_rewards(
  *, fraction: float = 0.2, coef: float = 1.0
) -> Transform:
  """GRPO-lambda (arXiv 2505.18086): the groups in the top ``fraction`` of
  the batch by correctness ratio get the Kimi length reward added
  (``coef *`` `rljax.advantages.kimi_length_reward`); the others keep the
  0/1 reward.

  Args:
    fraction: lambda in [0, 1] (default 0.2, a choice).
    coef: weight of the length reward (>= 0).
  """
  checks.in_range("fraction", fraction, 0.0, 1.0)
  checks.non_negative(coef=coef)

  def fn(batch: Batch) -> Batch:
    correct, valid = correctness(batch), batch.samples()
    top = advantages.grpo_lambda_mask(correct, valid, fraction=fraction)
    r = advantages.kimi_length_reward(_lengths(batch), correct, valid)
    return _add_reward(
      batch, jnp.where(top[:, None], coef * r, 0.0), "grpo_lambda_rewards"
    )

  return stateless_prepare(fn)
