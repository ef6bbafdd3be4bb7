"""Loss stages with adaptive or per-token clip bounds, and their penalties.

BAPO searches its ratio bounds over the whole minibatch (`measure` returns
the positive / negative contributions of every candidate pair, `observe`
picks the pair and stores it, `apply` clips with it); AEPO and R^2VPO take
their batch statistics the same way (entropy z-scores, the ratio's mean and
variance and a dual variable). DCPO, DISPO, ETR and HAPO-het clip with
per-token bounds computed from the batch (ETR's and HAPO's come from a batch
stage in `rljax.transforms`, through `Batch.extra`). LLDS adds a penalty.
"""

import functools
from typing import NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import LossTerms
from rljax._src.base import Mean
from rljax._src.base import Transform
from rljax._src.base import mean_metric
from rljax._src.base import old_logp
from rljax.losses import _bounds as L
from rljax.losses._offpolicy import ratio_pg
from rljax.losses._policy import _LOG_RATIO_CLAMP
from rljax.objectives._policy import _add_policy
from rljax.objectives._policy import policy
from rljax.transforms._bounds import ETR_EPS_HIGH
from rljax.transforms._bounds import ETR_EPS_LOW
from rljax.transforms._bounds import HAPO_SCORES


def _scalar(x) -> Mean:
  return Mean(jnp.asarray(x, jnp.float32), jnp.ones((), jnp.float32))


def _with_metrics(terms: LossTerms, **metrics) -> LossTerms:
  merged = dict(terms.metrics)
  merged.update(
    {k: v if isinstance(v, Mean) else _scalar(v) for k, v in metrics.items()}
  )
  return terms._replace(metrics=merged)


def _inputs(terms: LossTerms, batch: Batch, by: str):
  batch.require("advantages_PGT", by=by)
  mask = batch.loss_mask()
  return terms.logp_PGT, old_logp(terms.logp_PGT, batch), mask


# --------------------------------------------------------------------------
# BAPO


class BapoState(NamedTuple):
  """The ratio bounds chosen at the last `observe`, and their P / N."""

  clip_low: jax.Array
  clip_high: jax.Array
  ratio: jax.Array


def bapo(
  *,
  rho0: float = 0.5,
  low_start: float = 0.6,
  low_max: float = 0.9,
  low_step: float = 0.05,
  high_start: float = 1.2,
  high_max: float = 3.0,
  high_step: float = 0.1,
  dual_clip: Optional[float] = 3.0,
  contribution: str = "clamped",
  eps: float = 1e-8,
  log_ratio_clamp: Optional[float] = _LOG_RATIO_CLAMP,
) -> Transform:
  """BAPO: PPO clip whose ratio bounds are searched for balance each step.

  For each candidate (c_lo, c_hi) of `rljax.losses.bapo_candidates` (raise
  c_lo from ``low_start`` to ``low_max`` by ``low_step``, then c_hi from
  ``high_start`` to ``high_max`` by ``high_step``), `measure` sums the
  positive and negative contributions P and N
  (`rljax.losses.bapo_contributions`) over the micro-batch; the sums over
  the minibatch reach `observe`, which picks the first pair with
  P / (N + eps) >= rho0 (the last pair when none does) and stores it; `apply`
  then adds PPO clip with clip(r, c_lo, c_hi) and dual clip c
  (`rljax.losses.ppo_clip_bounds`). The search is exact whatever the
  micro-batching: it sees the whole minibatch's P and N, as the official
  code does after its all-reduce. Until the first `observe` the start
  bounds apply.

  Defaults: rho0 = 0.5 and the bound ranges [0.6, 0.9], [1.2, 3.0] (the
  paper's settings quoted in the official README), steps 0.05 / 0.1 and
  c = 3 (the official example script, ``clip_ratio_c``); the log-ratio
  clamp 20 (the code). The official script narrows the ranges to
  [0.8, 0.95] / [1.2, 2.0].

  ``contribution="clamped"`` is the official code's P / N (the effective
  ratio of a clipped token is its bound), in which raising c_lo only adds
  to N, so the c_lo stage never helps and ends at ``low_max`` whenever rho0
  is out of reach at the start; ``"unclipped"`` counts only tokens that keep
  their gradient, the reading of the paper's "filtering low-probability
  negative tokens" (raising c_lo removes them from N).

  Checked: the search order, the N <= 0 rule and the loss against
  WooooDyy/BAPO ``recipe/bapo/policy_loss.py`` and ``config.py``; the
  paper (arXiv 2510.18927) was read only through its abstract and README,
  not its equations.
  """
  lows, highs = L.bapo_candidates(
    low_start=low_start,
    low_max=low_max,
    low_step=low_step,
    high_start=high_start,
    high_max=high_max,
    high_step=high_step,
  )
  checks.non_negative(rho0=rho0, eps=eps)
  checks.one_of("contribution", contribution, L._CONTRIBUTIONS)
  L._check_dual_clip(dual_clip)
  return Transform(
    init=lambda: BapoState(
      jnp.asarray(lows[0]), jnp.asarray(highs[0]), jnp.zeros((), jnp.float32)
    ),
    prepare=lambda batch, state: (batch, state),
    apply=functools.partial(
      _bapo_apply, dual_clip=dual_clip, log_ratio_clamp=log_ratio_clamp
    ),
    measure=functools.partial(
      _bapo_measure,
      lows=lows,
      highs=highs,
      contribution=contribution,
      log_ratio_clamp=log_ratio_clamp,
    ),
    observe=functools.partial(
      _bapo_observe, lows=lows, highs=highs, rho0=rho0, eps=eps
    ),
  )


_BAPO = "objectives.bapo"


def _bapo_measure(
  terms: LossTerms,
  batch: Batch,
  state,
  *,
  lows,
  highs,
  contribution,
  log_ratio_clamp,
) -> dict[str, Mean]:
  """P and N of every candidate pair, summed over the micro-batch."""
  del state
  logp, old, mask = _inputs(terms, batch, _BAPO)
  p, n = L.bapo_contributions(
    logp,
    old,
    batch.advantages_PGT,
    mask,
    lows,
    highs,
    contribution=contribution,
    log_ratio_clamp=log_ratio_clamp,
  )
  # Denominator 0: the values are the sums themselves.
  zeros = jnp.zeros_like(p)
  return {"positive": Mean(p, zeros), "negative": Mean(n, zeros)}


def _bapo_observe(
  state: BapoState, values: dict, *, lows, highs, rho0, eps
) -> BapoState:
  """The first pair with P / (N + eps) >= rho0 (else the last); its P / N."""
  del state
  p, n = values["positive"], values["negative"]
  k = L.bapo_select(p, n, rho0=rho0, eps=eps)
  ratio = jnp.where(n[k] <= 0, jnp.inf, p[k] / (n[k] + eps))
  return BapoState(jnp.asarray(lows)[k], jnp.asarray(highs)[k], ratio)


def _bapo_apply(
  terms: LossTerms,
  batch: Batch,
  state: BapoState,
  *,
  dual_clip,
  log_ratio_clamp,
) -> LossTerms:
  """PPO clip with the stored bounds, and the bounds as metrics."""
  logp, old, mask = _inputs(terms, batch, _BAPO)
  out = L.ppo_clip_bounds(
    logp,
    old,
    batch.advantages_PGT,
    mask,
    ratio_low=state.clip_low,
    ratio_high=state.clip_high,
    dual_clip=dual_clip,
    log_ratio_clamp=log_ratio_clamp,
  )
  terms = _add_policy(terms, out, mask)
  return _with_metrics(
    terms,
    bapo_clip_low=state.clip_low,
    bapo_clip_high=state.clip_high,
    bapo_pos_neg_ratio=jnp.minimum(state.ratio, 1e6),
  )


# --------------------------------------------------------------------------
# DCPO, DISPO


def dcpo_clip(
  *,
  eps_low: float = 0.16,
  eps_high: float = 0.2,
  max_high: Optional[float] = 10.0,
  dual_clip: Optional[float] = 3.0,
  log_ratio_clamp: Optional[float] = None,
) -> Transform:
  """DCPO's dynamic clip (`rljax.losses.dcpo_clip`) as a loss stage: the
  bounds come from each token's old probability (arXiv 2509.02333,
  section "Dynamic Adaptive Clipping")."""
  return policy(
    L.dcpo_clip,
    eps_low=eps_low,
    eps_high=eps_high,
    max_high=max_high,
    dual_clip=dual_clip,
    log_ratio_clamp=log_ratio_clamp,
  )


_CORRECT_BY = ("advantage", "reward")


def dispo(
  *,
  eps_low_pos: float = 0.2,
  eps_high_pos: float = 0.2,
  eps_low_neg: float = 0.2,
  eps_high_neg: float = 0.2,
  mode: str = "clip",
  correct_by: str = "advantage",
  threshold: float = 0.0,
  log_ratio_clamp: Optional[float] = _LOG_RATIO_CLAMP,
) -> Transform:
  """DISPO (arXiv 2602.00983): `rljax.losses.dispo` as a loss stage.

  ``correct_by="advantage"``: a response is correct where A > 0;
  ``"reward"``: where ``Batch.rewards_PG`` > ``threshold`` (the paper
  speaks of correct and incorrect responses; with 0/1 rewards and group
  baselines both agree except in all-correct groups, where A = 0).
  """
  checks.one_of("correct_by", correct_by, _CORRECT_BY)
  hyper = dict(
    eps_low_pos=eps_low_pos,
    eps_high_pos=eps_high_pos,
    eps_low_neg=eps_low_neg,
    eps_high_neg=eps_high_neg,
    mode=mode,
    log_ratio_clamp=log_ratio_clamp,
  )
  x = jax.ShapeDtypeStruct((1, 2, 3), jnp.float32)
  jax.eval_shape(lambda *a: L.dispo(*a, **hyper), x, x, x, x)
  name = "objectives.dispo"

  def apply(terms: LossTerms, batch: Batch, state) -> LossTerms:
    del state
    logp, old, mask = _inputs(terms, batch, name)
    correct = None
    if correct_by == "reward":
      batch.require("rewards_PG", by=f"{name}(correct_by='reward')")
      correct = stats.f32(batch.rewards_PG > threshold)[..., None]
    out = L.dispo(
      logp, old, batch.advantages_PGT, mask, correct_BT=correct, **hyper
    )
    return _add_policy(terms, out, mask)

  return Transform(
    init=lambda: (),
    prepare=lambda batch, state: (batch, state),
    apply=apply,
  )


# --------------------------------------------------------------------------
# ETR, HAPO-het: bounds from a batch stage, through Batch.extra (its keys,
# `ETR_EPS_LOW`, `ETR_EPS_HIGH`, `HAPO_SCORES`, are the batch stage's).


def etr(
  *,
  dual_clip: Optional[float] = None,
  log_ratio_clamp: Optional[float] = _LOG_RATIO_CLAMP,
) -> Transform:
  """ETR (arXiv 2601.03723): PPO clip with the per-sample ranges that
  `rljax.transforms.etr_bounds` wrote into ``Batch.extra``
  (``etr_eps_low_PG``, ``etr_eps_high_PG``):
  clip(r, 1 - eps_low_i, 1 + eps_high_i)."""
  L._check_dual_clip(dual_clip)
  name = "objectives.etr"

  def apply(terms: LossTerms, batch: Batch, state) -> LossTerms:
    del state
    logp, old, mask = _inputs(terms, batch, name)
    low = batch.get(ETR_EPS_LOW, by=name)[..., None]
    high = batch.get(ETR_EPS_HIGH, by=name)[..., None]
    out = L.ppo_clip_bounds(
      logp,
      old,
      batch.advantages_PGT,
      mask,
      ratio_low=1.0 - low,
      ratio_high=1.0 + high,
      dual_clip=dual_clip,
      log_ratio_clamp=log_ratio_clamp,
    )
    terms = _add_policy(terms, out, mask)
    return _with_metrics(
      terms,
      etr_eps_low=mean_metric(jnp.broadcast_to(low, mask.shape), mask),
      etr_eps_high=mean_metric(jnp.broadcast_to(high, mask.shape), mask),
    )

  return Transform(
    init=lambda: (),
    prepare=lambda batch, state: (batch, state),
    apply=apply,
  )


def hapo_het(
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.28,
  alpha: float = 1.0,
  beta: float = 1.0,
  adaptive_clip: bool = True,
  adaptive_advantage: bool = True,
  dual_clip: Optional[float] = 3.0,
) -> Transform:
  """HAPO-het (arXiv 2509.16591) loss: `rljax.losses.hapo_het` with the
  entropy scores h^ that `rljax.transforms.hapo_entropy_scores` wrote into
  ``Batch.extra['hapo_entropy_scores_PGT']``."""
  hyper = dict(
    eps_low=eps_low,
    eps_high=eps_high,
    alpha=alpha,
    beta=beta,
    adaptive_clip=adaptive_clip,
    adaptive_advantage=adaptive_advantage,
    dual_clip=dual_clip,
  )
  x = jax.ShapeDtypeStruct((1, 2, 3), jnp.float32)
  jax.eval_shape(
    lambda *a: L.hapo_het(*a, entropy_scores_BT=a[0], **hyper), x, x, x, x
  )
  name = "objectives.hapo_het"

  def apply(terms: LossTerms, batch: Batch, state) -> LossTerms:
    del state
    logp, old, mask = _inputs(terms, batch, name)
    scores = batch.get(HAPO_SCORES, by=name)
    out = L.hapo_het(
      logp, old, batch.advantages_PGT, mask, entropy_scores_BT=scores, **hyper
    )
    return _add_policy(terms, out, mask)

  return Transform(
    init=lambda: (),
    prepare=lambda batch, state: (batch, state),
    apply=apply,
  )


# --------------------------------------------------------------------------
# AEPO: entropy z-scores over the minibatch.


class EntropyStats(NamedTuple):
  """Mean and standard deviation of the token entropy (last `observe`)."""

  mean: jax.Array
  std: jax.Array


def _entropy(terms: LossTerms, by: str) -> jax.Array:
  if terms.entropy_PGT is None:
    raise ValueError(
      f"{by} needs the policy entropies: pass entropy_PGT= to"
      " Algorithm.measure and Algorithm.loss."
    )
  return lax.stop_gradient(stats.f32(terms.entropy_PGT))


def aepo(
  *,
  alpha: float = 0.2,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  dual_clip: Optional[float] = 3.0,
  preserve: str = "high",
) -> Transform:
  """AEPO (agentic, arXiv 2510.14545) loss: `rljax.losses.aepo` with
  z = (H - mean H) / std H over the valid tokens of the WHOLE minibatch.

  `measure` sums H and H^2 (current-policy entropies, ``entropy_PGT``);
  `observe` stores the mean and the unbiased std (1 where it is 0, as the
  port); `apply` standardises each token's entropy with them. The port
  standardises per micro-batch; here the statistic is exact whatever the
  micro-batching. Before the first `observe`: mean 0, std 1.
  """
  x = jax.ShapeDtypeStruct((1, 2, 3), jnp.float32)
  hyper = dict(
    alpha=alpha,
    eps_low=eps_low,
    eps_high=eps_high,
    dual_clip=dual_clip,
    preserve=preserve,
  )
  jax.eval_shape(lambda *a: L.aepo(*a, entropy_z_BT=a[0], **hyper), x, x, x, x)
  name = "objectives.aepo"

  def measure(terms: LossTerms, batch: Batch, state) -> dict[str, Mean]:
    del state
    h = _entropy(terms, name)
    mask = batch.loss_mask()
    n = jnp.sum(mask)
    zero = jnp.zeros((), jnp.float32)
    return {
      "sum": Mean(stats.masked_sum(h, mask), zero),
      "sum_sq": Mean(stats.masked_sum(h * h, mask), zero),
      "count": Mean(n, zero),
    }

  def observe(state: EntropyStats, values: dict) -> EntropyStats:
    del state
    n = values["count"]
    mean = stats.safe_div(values["sum"], n)
    var = stats.safe_div(values["sum_sq"] - n * mean * mean, n - 1.0)
    std = stats.safe_sqrt(jnp.maximum(var, 0.0))
    return EntropyStats(mean, jnp.where(std > 0, std, 1.0))

  def apply(terms: LossTerms, batch: Batch, state: EntropyStats) -> LossTerms:
    logp, old, mask = _inputs(terms, batch, name)
    z = (_entropy(terms, name) - state.mean) / state.std
    out = L.aepo(logp, old, batch.advantages_PGT, mask, entropy_z_BT=z, **hyper)
    terms = _add_policy(terms, out, mask)
    return _with_metrics(
      terms, aepo_entropy_mean=state.mean, aepo_entropy_std=state.std
    )

  return Transform(
    init=lambda: EntropyStats(
      jnp.zeros((), jnp.float32), jnp.ones((), jnp.float32)
    ),
    prepare=lambda batch, state: (batch, state),
    apply=apply,
    measure=measure,
    observe=observe,
  )


# --------------------------------------------------------------------------
# R^2VPO: primal-dual ratio-variance constraint.


class R2vpoState(NamedTuple):
  """Dual variable lambda, and the minibatch's mean ratio and Var[r]."""

  lam: jax.Array
  mean_ratio: jax.Array
  variance: jax.Array


def r2vpo(
  *,
  delta: float = 0.01,
  eta: float = 1.0,
  init_lambda: float = 0.0,
  log_ratio_clamp: Optional[float] = _LOG_RATIO_CLAMP,
) -> Transform:
  """R^2VPO: unclipped surrogate plus a dual-weighted ratio-variance term.

    L = -r A + lambda (Var_B[r] - delta)
    lambda <- max(0, lambda + eta (Var_B[r] - delta))   once per step

  Var_B[r] is the population variance of r over the valid tokens of the
  WHOLE minibatch: `measure` sums r and r^2, `observe` takes one dual-ascent
  step with this Var and stores lambda and mu = mean r; `apply` adds
  ``policy = -r A`` (`rljax.losses.ratio_pg`) and the per-token penalty
  lambda ((r - sg mu)^2 - delta) (`rljax.losses.r2vpo_penalty`). Assumption:
  aggregate with `rljax.aggregate.token_mean`; then the penalty's
  aggregated value is lambda (Var_B[r] - delta) and its gradient exactly
  lambda grad Var_B[r] under any micro-batching (other aggregations weigh
  tokens differently and give a weighted variance). lambda is updated
  BEFORE the step's loss, with the Var measured at the step's start (on
  the first step on-policy Var = 0).

  Defaults: delta 0.01 (Var of r when |r - 1| ~ 0.1), eta 1, lambda_0 = 0:
  a choice; the paper's values were not found.

  Not verified: from the abstract of arXiv 2601.03320 (and its v2,
  2605.26784) and the catalog's formula; the paper's reweighting of stale
  samples is not implemented.
  """
  checks.non_negative(delta=delta, eta=eta, init_lambda=init_lambda)
  name = "objectives.r2vpo"

  def measure(terms: LossTerms, batch: Batch, state) -> dict[str, Mean]:
    del state
    mask = batch.loss_mask()
    d = stats.f32(terms.logp_PGT) - old_logp(terms.logp_PGT, batch)
    if log_ratio_clamp is not None:
      d = jnp.clip(d, -log_ratio_clamp, log_ratio_clamp)
    r = jnp.where(mask > 0, jnp.exp(jnp.where(mask > 0, d, 0.0)), 0.0)
    n = jnp.sum(mask)
    return {
      "ratio": Mean(stats.masked_sum(r, mask), n),
      "ratio_sq": Mean(stats.masked_sum(r * r, mask), n),
    }

  def observe(state: R2vpoState, values: dict) -> R2vpoState:
    mu = values["ratio"]
    var = jnp.maximum(values["ratio_sq"] - mu * mu, 0.0)
    lam = jnp.maximum(0.0, state.lam + eta * (var - delta))
    return R2vpoState(lam, mu, var)

  def apply(terms: LossTerms, batch: Batch, state: R2vpoState) -> LossTerms:
    logp, old, mask = _inputs(terms, batch, name)
    out = ratio_pg(
      logp, old, batch.advantages_PGT, mask, log_ratio_clamp=log_ratio_clamp
    )
    terms = _add_policy(terms, out, mask)
    sq = L.r2vpo_penalty(
      logp,
      old,
      mask,
      mean_ratio=state.mean_ratio,
      log_ratio_clamp=log_ratio_clamp,
    )
    lam = lax.stop_gradient(state.lam)
    terms = terms._replace(penalty_PGT=terms.penalty_PGT + lam * (sq - delta))
    return _with_metrics(
      terms,
      r2vpo_lambda=state.lam,
      r2vpo_ratio_var=state.variance,
      r2vpo_ratio_sq_dev=mean_metric(lax.stop_gradient(sq), mask),
    )

  return Transform(
    init=lambda: R2vpoState(
      jnp.asarray(init_lambda, jnp.float32),
      jnp.ones((), jnp.float32),
      jnp.zeros((), jnp.float32),
    ),
    prepare=lambda batch, state: (batch, state),
    apply=apply,
    measure=measure,
    observe=observe,
  )


# --------------------------------------------------------------------------
# LLDS


def llds(*, coef: float = 0.2, preserve: str = "nonnegative") -> Transform:
  """LLDS (arXiv 2512.04220): add coef * `rljax.losses.llds` per token.

  The penalty max(0, l_old - l) acts only on preserved tokens (A >= 0 by
  default) of responses whose preserved log-likelihood fell, and is
  aggregated with the algorithm's aggregation (the official code takes a
  token mean over the micro-batch: use `aggregate.token_mean` for the
  same normalisation). The gate is per response, so micro-batching (which
  splits prompts) does not change it.

  Defaults: coef 0.2 (``NO_REDUCE_LAMBDA`` in the official
  ``train_grpo_nqhot.sh``). Checked: against the official
  ``verl/workers/actor/dp_actor.py`` (response-level gate); its answer-span
  coefficient map and the action-level (per tool call) gate are not
  implemented.
  """
  checks.non_negative(coef=coef)
  checks.one_of("preserve", preserve, L._LLDS_PRESERVE)
  name = "objectives.llds"

  def apply(terms: LossTerms, batch: Batch, state) -> LossTerms:
    del state
    logp, old, mask = _inputs(terms, batch, name)
    pen = L.llds(logp, old, batch.advantages_PGT, mask, preserve=preserve)
    terms = terms._replace(penalty_PGT=terms.penalty_PGT + coef * pen)
    return _with_metrics(
      terms, llds_penalty=mean_metric(lax.stop_gradient(pen), mask)
    )

  return Transform(
    init=lambda: (),
    prepare=lambda batch, state: (batch, state),
    apply=apply,
  )
