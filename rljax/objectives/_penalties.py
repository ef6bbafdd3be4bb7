"""Penalty stages: KL to the reference and the entropy bonus, in the loss.

Penalties are added per token after the policy term's masks and weights, so
importance weights and token masks never scale them (TRL's placement), and they
share the algorithm's aggregation (verl's).
"""

from collections.abc import Callable
import functools
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from rljax._src import checks
from rljax._src import controllers
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import LossTerms
from rljax._src.base import Mean
from rljax._src.base import Transform
from rljax._src.base import _keep_batch
from rljax._src.base import mean_metric
from rljax._src.base import old_logp

Estimator = Callable[[jax.Array, jax.Array], jax.Array]


def _scalar_metric(x) -> Mean:
  return Mean(jnp.asarray(x, jnp.float32), jnp.ones((), jnp.float32))


_AGAINST = ("reference", "old")


def _kl_weight(batch: Batch, weight: str) -> jax.Array:
  """[P, G, T] per-token weight from ``extra[weight]`` (_PG or _PGT)."""
  w = stats.f32(batch.get(weight, by="kl_penalty(weight=...)"))
  return w[..., None] if weight.endswith("_PG") else w


def _add_kl(
  terms, batch, estimator, coef, against="reference", weight=None
) -> LossTerms:
  if against == "reference":
    batch.require("ref_logp_PGT", by="kl_penalty")
    other, name = batch.ref_logp_PGT, "kl_ref"
  else:
    other, name = old_logp(terms.logp_PGT, batch), "kl_old_penalty"
  kl = estimator(terms.logp_PGT, other)
  if weight is not None:
    kl = kl * _kl_weight(batch, weight)
  metrics = dict(terms.metrics)
  metrics[name] = mean_metric(jax.lax.stop_gradient(kl), batch.loss_mask())
  metrics[f"{name}_coef" if against == "old" else "kl_coef"] = _scalar_metric(
    coef
  )
  return terms._replace(
    penalty_PGT=terms.penalty_PGT + coef * kl, metrics=metrics
  )


def kl_penalty(
  estimator: Estimator,
  *,
  coef: float = 1e-3,
  against: str = "reference",
  weight: Optional[str] = None,
) -> Transform:
  """Add coef * estimator(logp, other_logp) per token (verl `use_kl_loss`).

  ``against="reference"`` penalises the distance to the frozen reference
  (`Batch.ref_logp_PGT`); ``against="old"`` to the behaviour policy of the
  batch (`Batch.old_logp_PGT`; on-policy, the detached current log-probs, so
  the penalty and its gradient are zero on the first step and grow as the
  update moves away: MDPO, Kimi's OPMD, REP). The tokens were sampled by the
  old policy, so against it `rljax.losses.kl_reverse_old` (r log r - r + 1)
  is the unbiased estimate of KL(pi || pi_old); k3 there estimates
  KL(pi_old || pi). Use k3 (`rljax.losses.kl_k3`)
  or k2 in the loss: k1's expected gradient is zero on-policy, so as a loss
  it does nothing on average.

  ``weight`` names a ``Batch.extra`` entry (``_PG`` per sample or ``_PGT``
  per token) that multiplies the per-token KL: a per-sample coefficient
  written by an earlier stage (RAPO's reward-tilted reference,
  `transforms.rapo_weights`; ARES's per-difficulty coefficient). The
  ``kl_ref`` metric is then the weighted KL.
  """
  checks.non_negative(coef=coef)
  checks.one_of("against", against, _AGAINST)
  if weight is not None and not weight.endswith(("_PG", "_PGT")):
    raise ValueError(
      f"kl_penalty: weight must name an extra entry ending in _PG or _PGT;"
      f" got {weight!r}."
    )
  return Transform(
    init=lambda: (),
    prepare=lambda batch, state: (batch, state),
    apply=lambda terms, batch, state: _add_kl(
      terms, batch, estimator, coef, against, weight
    ),
  )


def adaptive_kl_penalty(
  estimator: Estimator,
  *,
  init_coef: float = 1e-3,
  target: float = 0.1,
  horizon: float = 10_000,
) -> Transform:
  """`kl_penalty` whose coefficient follows the adaptive KL controller.

  Each batch first updates the coefficient from its measured KL(old || ref)
  (needs `old_logp_PGT`), then trains with the updated coefficient.
  """
  checks.positive(target=target, horizon=horizon)

  def prepare(batch: Batch, state):
    batch.require("old_logp_PGT", "ref_logp_PGT", by="adaptive_kl_penalty")
    kl = estimator(batch.old_logp_PGT, batch.ref_logp_PGT)
    current = stats.masked_mean(kl, batch.loss_mask())
    n_steps = batch.shape[0] * batch.shape[1]
    return batch, controllers.adaptive_kl(
      state, current, target=target, horizon=horizon, n_steps=n_steps
    )

  return Transform(
    init=lambda: controllers.init_coef(init_coef),
    prepare=prepare,
    apply=lambda terms, batch, state: _add_kl(
      terms, batch, estimator, state.coef
    ),
  )


def _add_entropy(terms: LossTerms, batch: Batch, coef) -> LossTerms:
  if terms.entropy_PGT is None:
    raise ValueError(
      "entropy_bonus needs the policy entropies: pass entropy_PGT= to"
      " Algorithm.loss."
    )
  entropy = stats.f32(terms.entropy_PGT)
  metrics = dict(terms.metrics)
  metrics["entropy_coef"] = _scalar_metric(coef)
  return terms._replace(
    penalty_PGT=terms.penalty_PGT - coef * entropy, metrics=metrics
  )


def entropy_bonus(*, coef: float = 1e-3) -> Transform:
  """Subtract coef * H per token (verl `entropy_coeff`, TRL `entropy_coef`)."""
  checks.non_negative(coef=coef)
  return Transform(
    init=lambda: (),
    prepare=lambda batch, state: (batch, state),
    apply=lambda terms, batch, state: _add_entropy(terms, batch, coef),
  )


def adaptive_entropy_bonus(
  *,
  init_coef: float = 0.0,
  target: float = 0.2,
  delta: float = 0.005,
  min_coef: float = 0.0,
  max_coef: float = 1.0,
) -> Transform:
  """Skywork-OR1 adaptive entropy bonus (TRL `use_adaptive_entropy`).

  Each batch measures the behaviour policy's token-mean entropy
  (`old_entropy_PGT`), updates the coefficient, and applies the bonus only
  while that entropy is at or below `target`.
  """
  checks.non_negative(delta=delta, min_coef=min_coef)
  checks.in_range("init_coef", init_coef, min_coef, max_coef)

  def prepare(batch: Batch, state):
    batch.require("old_entropy_PGT", by="adaptive_entropy_bonus")
    entropy = stats.masked_mean(batch.old_entropy_PGT, batch.loss_mask())
    return batch, controllers.adaptive_entropy(
      state,
      entropy,
      target=target,
      delta=delta,
      min_coef=min_coef,
      max_coef=max_coef,
    )

  return Transform(
    init=lambda: controllers.init_coef(init_coef),
    prepare=prepare,
    apply=lambda terms, batch, state: _add_entropy(
      terms, batch, state.coef * state.active
    ),
  )


class AresKlState(NamedTuple):
  """ARES's per-difficulty KL controller (easy, medium, hard)."""

  beta_3: jax.Array  # the KL coefficient's factor per bucket
  kl_3: jax.Array  # EMA of the bucket's mean sequence KL (NaN before any)
  error_3: jax.Array  # EMA of the relative error, used at update steps
  count: jax.Array  # optimizer steps observed


def _bucket_kl(terms: LossTerms, batch: Batch, estimator, difficulty):
  """Per-bucket sums of the valid samples' sequence-mean KL, and counts."""
  batch.require("ref_logp_PGT", by="ares_kl_penalty")
  d = jnp.asarray(batch.get(difficulty, by="ares_kl_penalty"), jnp.int32)
  mask = batch.loss_mask()
  kl = jax.lax.stop_gradient(estimator(terms.logp_PGT, batch.ref_logp_PGT))
  seq = stats.masked_mean(kl, mask, axis=-1)  # [P, G]
  present = (jnp.sum(mask, -1) > 0).astype(jnp.float32)
  onehot = jax.nn.one_hot(d, 3, dtype=jnp.float32)  # [P, 3]
  total_3 = jnp.einsum("pg,pk->k", seq * present, onehot)
  count_3 = jnp.einsum("pg,pk->k", present, onehot)
  return total_3, count_3


def ares_kl_penalty(
  estimator: Estimator,
  *,
  coef: float = 1e-2,
  target: float | tuple[float, float, float] = 0.01,
  beta_init: float = 1.0,
  lr: float = 0.05,
  clip: float = 0.2,
  interval: int = 100,
  deadzone: float = 0.02,
  ema: float = 0.97,
  beta_min: float = 1e-4,
  beta_max: float = 1e2,
  difficulty: str = "difficulty_P",
) -> Transform:
  """ARES (arXiv 2510.08457): a KL penalty whose coefficient adapts per
  difficulty bucket (``extra[difficulty]``: 0 easy, 1 medium, 2 hard, as
  written by `rljax.transforms.ares_entropy_shaping`).

  Per token the penalty is coef * beta_d * KL (``estimator(logp, ref)``).
  Each optimizer step, `measure` sums each bucket's sequence-mean KL over
  the minibatch and `observe` runs the official code's controller
  (``dp_actor._update_beta_per_bucket``) on every bucket present:

    kl_d <- (1 - ema) KL_d + ema kl_d          (seeded by the first KL_d)
    e = kl_d / target_d - 1; skipped if |e| < deadzone or the step count
    is not a multiple of `interval`; else
    e~_d <- (1 - ema) e + ema e~_d,
    log beta_d <- clip(log beta_d + lr clip(e~_d, -clip, clip),
                       log beta_min, log beta_max).

  Defaults are the code's (``kl_target_default`` 0.01, ``kl_beta_init`` 1,
  ``kl_beta_lr`` 0.05, ``kl_beta_clip`` 0.2, ``kl_update_interval`` 100,
  ``kl_deadzone`` 0.02, ``kl_ema_decay`` 0.97, beta in [1e-4, 1e2]; the
  actor's ``kl_coef`` 1e-2). Difference: the code updates once per
  micro-batch with that micro-batch's KL (so `interval` counts
  micro-batches); here once per optimizer step with the whole minibatch's
  (exact under micro-batching and sharding). The code's "second-chance"
  relaxation reads a reasoning soft cost its reward never produces, and is
  left out.
  """
  targets = _check_ares(
    target,
    interval,
    difficulty,
    coef=coef,
    beta_init=beta_init,
    lr=lr,
    clip=clip,
    deadzone=deadzone,
    ema=ema,
    beta_min=beta_min,
    beta_max=beta_max,
  )
  log_lo, log_hi = math.log(beta_min), math.log(beta_max)
  return Transform(
    init=functools.partial(_ares_init, beta_init),
    prepare=_keep_batch,
    apply=functools.partial(
      _ares_apply, estimator=estimator, coef=coef, difficulty=difficulty
    ),
    measure=functools.partial(
      _ares_measure, estimator=estimator, difficulty=difficulty
    ),
    observe=functools.partial(
      _ares_observe,
      target_3=jnp.asarray(targets, jnp.float32),
      lr=lr,
      clip=clip,
      interval=interval,
      deadzone=deadzone,
      ema=ema,
      beta_range=(beta_min, beta_max),
      log_range=(log_lo, log_hi),
    ),
  )


def _check_ares(target, interval, difficulty, **hyper) -> tuple:
  """`ares_kl_penalty`'s hyperparameters checked; the 3 bucket targets."""
  targets = (target,) * 3 if isinstance(target, (int, float)) else target
  if len(targets) != 3:
    raise ValueError(
      f"ares_kl_penalty: target is one value or 3 (easy, medium, hard); got"
      f" {target!r}."
    )
  checks.positive(
    beta_init=hyper["beta_init"],
    beta_min=hyper["beta_min"],
    beta_max=hyper["beta_max"],
    target=targets,
  )
  checks.non_negative(
    coef=hyper["coef"],
    lr=hyper["lr"],
    clip=hyper["clip"],
    deadzone=hyper["deadzone"],
  )
  checks.in_range("ema", hyper["ema"], 0.0, 1.0)
  if not isinstance(interval, int) or interval < 1:
    raise ValueError(
      f"ares_kl_penalty: interval must be an int >= 1; got {interval!r}."
    )
  if not difficulty.endswith("_P"):
    raise ValueError(
      f"ares_kl_penalty: difficulty must name an extra _P entry; got"
      f" {difficulty!r}."
    )
  return targets


def _ares_init(beta_init: float) -> AresKlState:
  """Every bucket at beta_init, no KL seen yet."""
  return AresKlState(
    beta_3=jnp.full((3,), beta_init, jnp.float32),
    kl_3=jnp.full((3,), jnp.nan, jnp.float32),
    error_3=jnp.zeros((3,), jnp.float32),
    count=jnp.zeros((), jnp.int32),
  )


def _ares_measure(terms, batch, state, *, estimator, difficulty):
  """Each bucket's summed sequence KL and sample count in the micro-batch."""
  del state
  total_3, count_3 = _bucket_kl(terms, batch, estimator, difficulty)
  return {
    "kl_3": Mean(total_3, count_3),
    "samples_3": Mean(count_3, jnp.zeros((3,), jnp.float32)),
  }


def _ares_observe(
  state: AresKlState,
  values,
  *,
  target_3,
  lr,
  clip,
  interval,
  deadzone,
  ema,
  beta_range,
  log_range,
) -> AresKlState:
  """One optimizer step of the per-bucket controller (`ares_kl_penalty`)."""
  count = state.count + 1
  present = values["samples_3"] > 0
  cur = values["kl_3"]
  last = jnp.where(jnp.isnan(state.kl_3), cur, state.kl_3)
  kl_3 = jnp.where(present, (1.0 - ema) * cur + ema * last, state.kl_3)
  error = kl_3 / target_3 - 1.0
  due = present & (jnp.abs(error) >= deadzone) & (count % interval == 0)
  error_3 = jnp.where(
    due, (1.0 - ema) * error + ema * state.error_3, state.error_3
  )
  step = lr * jnp.clip(error_3, -clip, clip)
  log_beta = jnp.log(jnp.clip(state.beta_3, *beta_range)) + step
  beta_3 = jnp.where(due, jnp.exp(jnp.clip(log_beta, *log_range)), state.beta_3)
  return AresKlState(beta_3, kl_3, error_3, count)


def _ares_apply(
  terms: LossTerms,
  batch: Batch,
  state: AresKlState,
  *,
  estimator,
  coef,
  difficulty,
) -> LossTerms:
  """Add coef * beta_d * KL per token, d the sample's difficulty bucket."""
  batch.require("ref_logp_PGT", by="ares_kl_penalty")
  d = jnp.asarray(batch.get(difficulty, by="ares_kl_penalty"), jnp.int32)
  beta = state.beta_3[d][:, None, None]
  kl = estimator(terms.logp_PGT, batch.ref_logp_PGT)
  metrics = dict(terms.metrics)
  metrics["kl_ref"] = mean_metric(jax.lax.stop_gradient(kl), batch.loss_mask())
  for i, name in enumerate(("easy", "medium", "hard")):
    metrics[f"ares_kl_beta_{name}"] = _scalar_metric(state.beta_3[i])
  return terms._replace(
    penalty_PGT=terms.penalty_PGT + coef * beta * kl, metrics=metrics
  )
