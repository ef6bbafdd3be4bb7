"""ReMix's objective: a clipped surrogate against each sample's own behaviour
policy and the KL-Convex constraint, with policy reincarnation.

ReMix (Liang et al., 2025, arXiv 2507.06892) trains on the current policy's
rollouts together with replayed rollouts of the last few policies
(`rljax.rollouts.MixPolicyReplay` marks them ``extra["stream_PG"] == 6``
and gives them the old policy's sampler log-probs ``rollout_logp_PGT``).
"""

from collections.abc import Callable
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import LossTerms
from rljax._src.base import Mean
from rljax._src.base import Transform
from rljax._src.base import mean_metric
from rljax.losses import _kl
from rljax.losses import _policy

#: Batch.extra["stream_PG"] of a replayed sample (`rollouts.REPLAYED`)
REPLAYED = 6

Estimator = Callable[[jax.Array, jax.Array], jax.Array]


def remix_behaviour_logp(
  old_logp_PGT: ArrayLike, rollout_logp_PGT: ArrayLike, replayed_PG: ArrayLike
) -> jax.Array:
  """Each token's behaviour log-prob log mu, [P, G, T]: the sampler's
  (``rollout_logp_PGT``, the past policy that drew it) on replayed samples,
  ``old_logp_PGT`` (the policy at the start of the step) on fresh ones."""
  checks.rank("old_logp_PGT", old_logp_PGT, 3, "[P, G, T]")
  checks.same_shape(
    ["old_logp_PGT", "rollout_logp_PGT"], old_logp_PGT, rollout_logp_PGT
  )
  if jnp.shape(replayed_PG) != jnp.shape(old_logp_PGT)[:2]:
    raise ValueError(
      f"replayed_PG has shape {jnp.shape(replayed_PG)}; it must be [P, G] ="
      f" {jnp.shape(old_logp_PGT)[:2]}, one flag per sample."
    )
  replayed = jnp.asarray(replayed_PG, bool)[..., None]
  return jnp.where(
    replayed, stats.f32(rollout_logp_PGT), stats.f32(old_logp_PGT)
  )


def kl_convex(
  logp_PGT: ArrayLike,
  ref_logp_PGT: ArrayLike,
  prev_logp_PGT: ArrayLike,
  *,
  lam: ArrayLike = 0.5,
  estimator: Estimator = _kl.kl_k3,
) -> jax.Array:
  """ReMix's KL-Convex constraint per token:

    lam * k(logp, ref_logp) + (1 - lam) * k(logp, prev_logp)

  k an estimator of KL(pi_theta || other) per token (default `losses.kl_k3`,
  as the trainer's KL loss); ref the base model, prev the precedent policy
  (the weights at the start of the step). ``lam`` in [0, 1] may be traced.
  """
  lam = jnp.asarray(lam, jnp.float32)
  base = stats.f32(estimator(logp_PGT, ref_logp_PGT))
  prev = stats.f32(estimator(logp_PGT, prev_logp_PGT))
  return lam * base + (1.0 - lam) * prev


def remix_loss(
  logp_PGT: ArrayLike,
  old_logp_PGT: ArrayLike,
  rollout_logp_PGT: ArrayLike,
  ref_logp_PGT: ArrayLike,
  adv_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  replayed_PG: ArrayLike,
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  kl_coef: float = 1e-3,
  lam: ArrayLike = 0.5,
  estimator: Estimator = _kl.kl_k3,
) -> tuple[_policy.TokenLoss, jax.Array]:
  """ReMix's per-token loss (arXiv 2507.06892): (policy term, penalty).

    mu  = rollout_logp on replayed samples, old_logp on fresh ones
    r   = exp(logp - log mu)
    L_pi = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
    L_kl = kl_coef (lam KL(pi || pi_base) + (1 - lam) KL(pi || pi_prev))

  pi_base is the reference (``ref_logp_PGT``), pi_prev the precedent
  policy (``old_logp_PGT``). The loss per token is L_pi + L_kl; the penalty
  is never scaled by the policy term's masks (as `objectives.kl_penalty`).
  Returns the `losses.ppo_clip` `TokenLoss` and the [P, G, T] penalty.
  """
  if isinstance(lam, (int, float)):
    checks.in_range("lam", lam, 0.0, 1.0)
  checks.non_negative(kl_coef=kl_coef)
  mu = remix_behaviour_logp(old_logp_PGT, rollout_logp_PGT, replayed_PG)
  out = _policy.ppo_clip(
    logp_PGT, mu, adv_PGT, mask_PGT, eps_low=eps_low, eps_high=eps_high
  )
  kl = kl_convex(
    logp_PGT, ref_logp_PGT, old_logp_PGT, lam=lam, estimator=estimator
  )
  return out, kl_coef * kl * stats.f32(mask_PGT)


class RemixState(NamedTuple):
  """How many rollout batches the stage has seen."""

  step: jax.Array  # int32 scalar


def _scalar(x) -> Mean:
  return Mean(jnp.asarray(x, jnp.float32), jnp.ones((), jnp.float32))


def remix(
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  kl_coef: float = 1e-3,
  lam: float = 0.5,
  reincarnate_at: Optional[int] = None,
  replayed_streams: tuple[int, ...] = (REPLAYED,),
  estimator: Estimator = _kl.kl_k3,
) -> Transform:
  """ReMix's loss stage: `remix_loss` on the batch, reincarnation by step.

  Replayed samples are those whose ``extra["stream_PG"]`` is in
  `replayed_streams` (`rljax.rollouts.MixPolicyReplay` writes 6); their
  ratio is against the sampler's log-probs (``rollout_logp_PGT``), fresh
  samples' against ``old_logp_PGT`` (the trainer computes it when this
  stage is in the chain). Several optimizer steps per batch (the paper's
  update-to-data ratio > 1) are ``train.epochs`` / ``train.minibatches``.

  Policy reincarnation: the state counts rollout batches; from batch
  `reincarnate_at` on (t >= reincarnate_at, t counted from 0) the KL is to
  the base alone (lam = 1), as on-policy training restarts (give the
  strategy the same step). The paper's base is then the reincarnated model:
  give the trainer ``train.reference_resets=(reincarnate_at,)``, which
  makes the reference a copy of the policy as that step begins (without
  it the base stays the initial model).

  Checked against the abstract and project page of arXiv 2507.06892 (the
  three components: mix-policy PPG, KL-Convex on base and precedent
  model, reincarnation); the equations follow the catalog's reading
  (r = pi_theta / mu in PPO's clip, lam KL(pi || pi_base) + (1 - lam)
  KL(pi || pi_prev)), not verified against the paper's body, which could
  not be read here; the official repository (AnitaLeungxx/
  ReMix-Off-Policy-RFT) holds evaluation code only. lam 0.5, kl_coef
  1e-3 and eps 0.2 are our defaults.
  """
  checks.positive(eps_low=eps_low, eps_high=eps_high)
  checks.non_negative(kl_coef=kl_coef)
  if not 0.0 <= lam <= 1.0:
    raise ValueError(f"lam={lam}; it must be in [0, 1] (the KL-Convex mix).")
  if reincarnate_at is not None and reincarnate_at < 0:
    raise ValueError(
      f"reincarnate_at={reincarnate_at}; give a step >= 0 or None (never)."
    )
  if not replayed_streams:
    raise ValueError("replayed_streams is empty; give e.g. (6,).")
  by = "transforms.remix"
  streams = jnp.asarray(tuple(replayed_streams))

  def prepare(batch: Batch, state: RemixState):
    return batch, RemixState(state.step + 1)

  def apply(terms: LossTerms, batch: Batch, state: RemixState) -> LossTerms:
    batch.require("advantages_PGT", "old_logp_PGT", "rollout_logp_PGT", by=by)
    if kl_coef > 0:
      batch.require("ref_logp_PGT", by=by)
    ref = batch.ref_logp_PGT if kl_coef > 0 else batch.old_logp_PGT
    replayed = jnp.isin(jnp.asarray(batch.get("stream_PG", by=by)), streams)
    t = state.step - 1  # this batch's index: prepare has counted it
    lam_t = lam
    if reincarnate_at is not None:
      lam_t = jnp.where(t >= reincarnate_at, 1.0, lam)
    mask = batch.loss_mask()
    out, penalty = remix_loss(
      terms.logp_PGT,
      batch.old_logp_PGT,
      batch.rollout_logp_PGT,
      ref,
      batch.advantages_PGT,
      mask,
      replayed & (batch.samples() > 0),
      eps_low=eps_low,
      eps_high=eps_high,
      kl_coef=kl_coef,
      lam=lam_t,
      estimator=estimator,
    )
    metrics = dict(terms.metrics)
    metrics["clip_frac_low"] = mean_metric(out.clip_low, mask)
    metrics["clip_frac_high"] = mean_metric(out.clip_high, mask)
    metrics["remix_kl"] = mean_metric(jax.lax.stop_gradient(penalty), mask)
    metrics["remix_lam"] = _scalar(lam_t)
    metrics["replayed_frac"] = Mean(
      jnp.sum(stats.f32(replayed) * batch.samples()),
      jnp.sum(batch.samples()),
    )
    return terms._replace(
      policy_loss_PGT=terms.policy_loss_PGT + out.loss,
      penalty_PGT=terms.penalty_PGT + penalty,
      metrics=metrics,
    )

  return Transform(
    init=lambda: RemixState(jnp.zeros((), jnp.int32)),
    prepare=prepare,
    apply=apply,
  )
