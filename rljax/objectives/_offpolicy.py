"""Loss stages with state or group context: DisCO (global KL hinge) and MDPO
(annealed KL-to-old proximity term).

The plain per-token losses of `rljax.losses._offpolicy` (rec, kimi_opmd,
reg_grpo, p3o) plug into `rljax.objectives.policy`; these two need more than
a `TokenLoss`: DisCO reads the rewards and a minibatch-wide KL, MDPO a step
counter.
"""

from collections.abc import Callable
from typing import NamedTuple

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
from rljax.losses import _offpolicy as L
from rljax.objectives._policy import _add_policy

_LOG_RATIO_CLAMP = 20.0


def _scalar(x) -> Mean:
  return Mean(jnp.asarray(x, jnp.float32), jnp.ones((), jnp.float32))


def _add_penalty(terms: LossTerms, penalty, **metrics) -> LossTerms:
  merged = dict(terms.metrics)
  merged.update({k: _scalar(v) for k, v in metrics.items()})
  return terms._replace(penalty_PGT=terms.penalty_PGT + penalty, metrics=merged)


# --------------------------------------------------------------------------
# DisCO


class DiscoState(NamedTuple):
  """The minibatch's KL(pi_old || pi) and mean valid tokens per sequence,
  as observed before this optimizer step (0 and 1 until `observe` runs)."""

  kl: jax.Array
  tokens_per_sequence: jax.Array


def disco_kl_k3(logp_PGT, old_logp_PGT) -> jax.Array:
  """Per-token k3 estimate of KL(pi_old || pi) from pi_old's samples:
  r - 1 - log r, r = pi / pi_old (DisCO's ``low_var_kl``; log-ratio clamped
  to [-20, 20], no clamp on the result as in the official code)."""
  d = stats.f32(logp_PGT) - lax.stop_gradient(stats.f32(old_logp_PGT))
  d = jnp.clip(d, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
  return jnp.exp(d) - 1.0 - d


def _disco_measure(terms: LossTerms, batch: Batch, state) -> dict[str, Mean]:
  del state
  mask = batch.loss_mask()
  kl = disco_kl_k3(terms.logp_PGT, old_logp(terms.logp_PGT, batch))
  lengths = stats.sequence_lengths(mask)
  return {
    "kl": Mean(stats.masked_sum(kl, mask), jnp.sum(mask)),
    "tokens_per_sequence": Mean(
      jnp.sum(lengths), jnp.sum(lengths > 0, dtype=jnp.float32)
    ),
  }


def _disco_observe(state: DiscoState, values: dict) -> DiscoState:
  del state
  return DiscoState(
    jnp.asarray(values["kl"], jnp.float32),
    jnp.asarray(values["tokens_per_sequence"], jnp.float32),
  )


def disco(
  *,
  score: str = "log_likelihood",
  tau: float = 10.0,
  beta: float = 1e3,
  delta: float = 1e-4,
  variant: str = "dro",
  threshold: float = 0.5,
  hinge_gradient: str = "paper",
) -> Transform:
  """DisCO: discriminative objective plus a squared-hinge KL constraint.

    loss = -(1/Q) sum_q J_q  +  beta [max(0, KL(pi_old || pi) - delta)]^2

  J_q is `rljax.losses.disco` (read from `Batch.rewards_PG`, the group on
  axis G). KL is the token mean of the k3 estimate (`disco_kl_k3`) over the
  WHOLE minibatch: `measure` sums it (and the valid tokens per sequence)
  over micro-batches, `observe` stores K in the state, and `apply` adds
  sg(c) * kl_t per token with c = 2 beta max(0, K - delta), the gradient of
  the hinge (``hinge_gradient="code"``: c = beta max(0, K - delta), the
  official code's `max(beta (KL - delta), 0).detach() * KL`, i.e. the
  paper's beta halved). The penalty is scaled by n_i / (N_tok / E) so that,
  aggregated with `seq_mean_token_mean` (use that aggregation, as the preset
  does), it contributes c * K with the exact gradient c dK whatever the
  micro-batching; the official code takes K per micro-batch (gathered over
  data-parallel ranks). Before any `observe` (or with ``old_logp_PGT``
  absent, on-policy) K = 0 and the penalty is 0.

  Defaults: tau 10 (``log_likelihood``; use 1 with ``likelihood_ratio``),
  beta 1e3, delta 1e-4 (paper / verl ``docs/algo/disco.md``).

  Checked: against the official code (Optimization-AI/DisCO,
  ``core_algos.py``; see `rljax.losses.disco`). The squared hinge and the
  defaults are from the catalog (SEED_PAPERS 4.6, citing verl
  ``docs/algo/disco.md``), not read in the paper itself; the factor 2 is the
  derivative of the squared hinge.
  """
  checks.positive(tau=tau, beta=beta)
  checks.non_negative(delta=delta)
  checks.one_of("score", score, L.DISCO_SCORES)
  checks.one_of("variant", variant, L.DISCO_VARIANTS)
  checks.one_of("hinge_gradient", hinge_gradient, ("paper", "code"))
  scale = 2.0 * beta if hinge_gradient == "paper" else beta

  def apply(terms: LossTerms, batch: Batch, state: DiscoState) -> LossTerms:
    batch.require("rewards_PG", by="objectives.disco")
    mask = batch.loss_mask()
    old = old_logp(terms.logp_PGT, batch)
    out = L.disco(
      terms.logp_PGT,
      old,
      batch.rewards_PG,
      mask,
      score=score,
      tau=tau,
      variant=variant,
      threshold=threshold,
    )
    terms = _add_policy(terms, out, mask)
    coef = lax.stop_gradient(scale * jnp.maximum(state.kl - delta, 0.0))
    share = stats.sequence_lengths(mask)[..., None] / jnp.maximum(
      state.tokens_per_sequence, 1e-6
    )
    kl = disco_kl_k3(terms.logp_PGT, old)
    return _add_penalty(
      terms,
      coef * share * kl,
      disco_kl=state.kl,
      disco_hinge_coef=coef,
    )

  return Transform(
    init=lambda: DiscoState(
      jnp.zeros((), jnp.float32), jnp.ones((), jnp.float32)
    ),
    prepare=lambda batch, state: (batch, state),
    apply=apply,
    measure=_disco_measure,
    observe=_disco_observe,
  )


# --------------------------------------------------------------------------
# MDPO


class MdpoState(NamedTuple):
  """Rollout batches prepared so far, and optimizer steps observed on the
  current batch."""

  iteration: jax.Array
  step: jax.Array


_ANNEAL = ("iterations", "optimizer_steps")


def mdpo(
  *,
  iterations: int = 1000,
  anneal: str = "iterations",
  estimator: Callable[[jax.Array, jax.Array], jax.Array] = L.kl_reverse_old,
  log_ratio_clamp: float | None = _LOG_RATIO_CLAMP,
) -> Transform:
  """MDPO (on-policy): unclipped IS surrogate plus an annealed KL to pi_old.

    L = -A r + (1 / t_k) KL(pi_theta || pi_old),   t_k = 1 - k / K

  The policy term is `rljax.losses.ratio_pg`; the proximity term is
  ``estimator(logp, old_logp)`` per token (default `losses.kl_reverse_old`,
  r log r - r + 1, unbiased for KL(pi || pi_old) on pi_old's samples; the
  paper's continuous-control code uses the closed-form Gaussian KL),
  added as a penalty (never scaled by policy masks or weights).

  ``anneal="iterations"`` (the paper and its code): k counts rollout batches
  (mirror-descent iterations; `prepare` increments it), K = ``iterations``
  is the total number of iterations of the run, so 1/t_k grows from 1 to K.
  ``anneal="optimizer_steps"``: k counts the optimizer steps on the current
  batch (`observe` increments it, `prepare` resets it), K =
  ``iterations`` is the number of optimizer steps per batch. k is clipped to
  [0, K - 1] (`losses.mdpo_step_size`). On-policy (no ``old_logp_PGT``) the
  penalty and its gradient are 0 on the first step.

  Defaults: iterations 1000 (set it to the run's number of batches),
  ``iterations`` annealing, the log-ratio clamp 20 (verl's).

  Checked: the annealing against the official code
  (manantomar/Mirror-Descent-Policy-Optimization, ``mdpo_on/mdpo.py``:
  ``surrgain = mean(ratio * atarg) - meankl / lr_now`` with
  ``lr_now = 1 - (iters_so_far - 1) / n_updates``, KL(pi_theta || pi_old));
  the paper's equation (Tomar et al., arXiv 2005.09814, on-policy MDPO
  update) from its abstract page and the authors' blog post.
  """
  checks.positive(iterations=iterations)
  checks.one_of("anneal", anneal, _ANNEAL)

  def prepare(batch: Batch, state: MdpoState):
    return batch, MdpoState(state.iteration + 1, jnp.zeros_like(state.step))

  def observe(state: MdpoState, values: dict) -> MdpoState:
    del values
    return state._replace(step=state.step + 1)

  def apply(terms: LossTerms, batch: Batch, state: MdpoState) -> LossTerms:
    batch.require("advantages_PGT", by="objectives.mdpo")
    mask = batch.loss_mask()
    old = old_logp(terms.logp_PGT, batch)
    out = L.ratio_pg(
      terms.logp_PGT,
      old,
      batch.advantages_PGT,
      mask,
      log_ratio_clamp=log_ratio_clamp,
    )
    terms = _add_policy(terms, out, mask)
    k = state.iteration if anneal == "iterations" else state.step
    inv_step = 1.0 / L.mdpo_step_size(k - 1, iterations)
    kl = stats.f32(estimator(terms.logp_PGT, old))
    metrics = dict(terms.metrics)
    metrics["mdpo_kl"] = mean_metric(lax.stop_gradient(kl), mask)
    terms = terms._replace(metrics=metrics)
    return _add_penalty(terms, inv_step * kl, mdpo_kl_coef=inv_step)

  zero = lambda: jnp.zeros((), jnp.int32)  # noqa: E731
  return Transform(
    init=lambda: MdpoState(zero(), zero()),
    prepare=prepare,
    apply=apply,
    observe=observe if anneal == "optimizer_steps" else None,
  )
