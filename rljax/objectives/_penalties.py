"""Penalty stages: KL to the reference and the entropy bonus, in the loss.

Penalties are added per token after the policy term's masks and weights, so
importance weights and token masks never scale them (TRL's placement), and they
share the algorithm's aggregation (verl's).
"""

from collections.abc import Callable
from typing import Optional

import jax
import jax.numpy as jnp

from rljax._src import checks
from rljax._src import controllers
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import LossTerms
from rljax._src.base import Mean
from rljax._src.base import Transform
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
