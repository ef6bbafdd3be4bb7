"""Loss stages fed by a teacher or by statistics of the minibatch.

* KEPO (arXiv 2602.00400): on-policy distillation toward
  `Batch.teacher_logp_PGT`, gated per trajectory by its quality.
* CAPO (arXiv 2510.00819): reject samples whose second-order (Fisher)
  estimate of the policy change exceeds a threshold.
* VCPO (arXiv 2602.17616): the effective sample size of the minibatch's
  sequence importance weights (`measure` / `observe`) and the learning-rate
  scale it implies, with an optax piece that applies it.
"""

from collections.abc import Callable
from typing import NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np
import optax

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import LossTerms
from rljax._src.base import Mean
from rljax._src.base import Transform
from rljax._src.base import mean_metric
from rljax._src.base import old_logp
from rljax.losses import _kl
from rljax.transforms import _teacher as T

Estimator = Callable[[jax.Array, jax.Array], jax.Array]


def _scalar(x) -> Mean:
  return Mean(jnp.asarray(x, jnp.float32), jnp.ones((), jnp.float32))


def _valid(mask) -> jax.Array:
  return stats.f32(mask) > 0


# --------------------------------------------------------------------------
# KEPO


def kepo_gate(quality_B: ArrayLike, *, threshold: float) -> jax.Array:
  """1[q(tau) >= threshold] per trajectory, float32."""
  return stats.f32(stats.f32(quality_B) >= threshold)


def kepo_distill_loss(
  logp_BT: ArrayLike,
  teacher_logp_BT: ArrayLike,
  gate_B: ArrayLike,
  mask_BT: ArrayLike,
  *,
  estimator: Estimator = _kl.kl_k2,
) -> jax.Array:
  """Per-token gate_i * KL_t(pi_theta || pi_teacher), [..., T] float32.

  The KL at each sampled token is `estimator(logp, teacher_logp)`; the
  default k2 = (log pi - log pi_teacher)^2 / 2 is the estimator whose
  gradient, on the policy's own samples, is exactly the gradient of the
  reverse KL(pi_theta || pi_teacher) (k3 as a loss gives the forward KL's
  gradient, k1's is zero on average; see `rljax.losses`). Padded tokens
  are 0 (their inputs are replaced by 0 first).
  """
  checks.same_shape(
    ["logp_BT", "teacher_logp_BT", "mask_BT"], logp_BT, teacher_logp_BT, mask_BT
  )
  checks.leading_shape(
    "gate_B", gate_B, np.shape(mask_BT)[:-1], "mask_BT[..., 0]"
  )
  valid = _valid(mask_BT)
  logp = jnp.where(valid, stats.f32(logp_BT), 0.0)
  teacher = lax.stop_gradient(jnp.where(valid, stats.f32(teacher_logp_BT), 0.0))
  kl = estimator(logp, teacher)
  return jnp.where(valid, stats.f32(gate_B)[..., None] * kl, 0.0)


def kepo_distill(
  *,
  coef: float = 1.0,
  threshold: float = 0.5,
  estimator: Estimator = _kl.kl_k2,
  quality: Optional[str] = None,
) -> Transform:
  """KEPO's quality-gated on-policy distillation penalty.

    L = L_policy + coef 1[q(tau) >= threshold] sum_t KL(pi_theta || pi_T)

  added per token to the penalty (after the policy weights, so importance
  weights and masks never scale it), with the chain's aggregation. q(tau)
  is the outcome reward `rewards_PG` (``quality=None``) or
  ``Batch.extra[quality]`` (a ``_PG`` score written by an earlier stage or
  `Trainer(annotate=...)`); pi_T is the frozen teacher
  (`Batch.teacher_logp_PGT`: ``Trainer(config, teacher=model)``).

  Defaults (choices, not from the paper): threshold 0.5 (with 0/1 verifier
  rewards the gate keeps the correct trajectories), coef 1, estimator k2
  (see `kepo_distill_loss`).

  Not in this stage: KEPO's knowledge-enhanced exploration (teacher hints,
  rejection sampling of reward-positive rollouts) is a rollout feature.

  References: Ezzati et al., "KEPO: Knowledge-Enhanced Preference
  Optimization for Reinforcement Learning with Reasoning", arXiv 2602.00400.

  Checked: the abstract (distillation applied only to high-quality
  trajectories) and the catalog's formula (SEED_PAPERS 4.40, REC). Not
  verified: the paper's q(tau), theta, lambda and KL estimator (its text
  beyond the abstract was not reachable); all are exposed.
  """
  checks.non_negative(coef=coef)
  name = "objectives.kepo_distill"

  def apply(terms: LossTerms, batch: Batch, state) -> LossTerms:
    del state
    batch.require("teacher_logp_PGT", by=name)
    if quality is None:
      batch.require("rewards_PG", by=name)
      q = batch.rewards_PG
    else:
      q = batch.get(quality, by=name)
    mask = batch.loss_mask()
    gate = kepo_gate(q, threshold=threshold) * batch.samples()
    kl = kepo_distill_loss(
      terms.logp_PGT, batch.teacher_logp_PGT, gate, mask, estimator=estimator
    )
    metrics = dict(terms.metrics)
    metrics["kepo_gate_frac"] = Mean(jnp.sum(gate), jnp.sum(batch.samples()))
    metrics["kepo_kl"] = mean_metric(
      lax.stop_gradient(kl), mask * gate[..., None]
    )
    return terms._replace(
      penalty_PGT=terms.penalty_PGT + coef * kl, metrics=metrics
    )

  return Transform(
    init=lambda: (),
    prepare=lambda batch, state: (batch, state),
    apply=apply,
  )


# --------------------------------------------------------------------------
# CAPO


def capo_scores(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  reduce: str = "mean",
) -> jax.Array:
  """Per-sample second-order estimate of the policy change, [...].

    s_i = (1/2) sum_t m_t (log pi_theta - log pi_old)^2   (``"sum"``)
    s_i = that sum / |o_i|                                 (``"mean"``)

  (1/2)(log r)^2 is the k2 estimate: to second order its expectation under
  pi_old is KL(pi_old || pi_theta) = (1/2) d^T F d, the Fisher quadratic
  form of the step d = theta - theta_old. Detached.
  """
  checks.one_of("reduce", reduce, ("mean", "sum"))
  checks.same_shape(
    ["logp_BT", "old_logp_BT", "mask_BT"], logp_BT, old_logp_BT, mask_BT
  )
  valid = _valid(mask_BT)
  d = jnp.where(valid, stats.f32(logp_BT) - stats.f32(old_logp_BT), 0.0)
  d = lax.stop_gradient(d)
  total = 0.5 * jnp.sum(d * d, axis=-1)
  if reduce == "sum":
    return total
  return stats.safe_div(total, stats.sequence_lengths(valid))


def capo_mask(
  *,
  threshold: float,
  reduce: str = "mean",
  score: Optional[str] = None,
) -> Transform:
  """CAPO-style sample rejection: zero the policy term of every sample
  whose predicted change exceeds `threshold`.

  The score is `capo_scores` of the current step (the realised k2 / Fisher
  estimate of KL(pi_old || pi_theta) per sample; needs `old_logp_PGT`,
  on-policy it is 0) or ``Batch.extra[score]`` (a ``_PG`` score computed
  elsewhere, e.g. from a model's last-layer curvature). Only the policy
  term is masked (weight 0, loss normaliser unchanged); penalties stay.
  Metric ``capo_rejected`` is the fraction of valid tokens rejected (the
  paper reports < 8%).

  Partial: CAPO predicts each sample's effect BEFORE the step from a
  last-layer curvature model (per-sample gradients and a Fisher /
  Gauss-Newton model); the log-probs and ratios the loss sees can only give
  the realised change during an update's later minibatches, which is what
  the built-in score measures. `threshold` has no default: the paper's
  value was not found.

  References: Melo, Abate, Gal, "Stabilizing Policy Gradients for
  Sample-Efficient Reinforcement Learning in LLM Reasoning" (CAPO), arXiv
  2510.00819.

  Checked: the abstract and summaries (curvature model of the last layer,
  data selection that masks samples, < 8% of tokens rejected); the paper's
  equations and criterion were not read (not verified).
  """
  checks.positive(threshold=threshold)
  checks.one_of("reduce", reduce, ("mean", "sum"))
  name = "objectives.capo_mask"

  def apply(terms: LossTerms, batch: Batch, state) -> LossTerms:
    del state
    mask = batch.loss_mask()
    if score is None:
      s = capo_scores(
        terms.logp_PGT, old_logp(terms.logp_PGT, batch), mask, reduce=reduce
      )
    else:
      s = stats.f32(batch.get(score, by=name))
    keep = stats.f32(s <= threshold)[..., None]
    metrics = dict(terms.metrics)
    metrics["capo_rejected"] = mean_metric(1.0 - keep, mask)
    return terms._replace(
      policy_weight_PGT=terms.policy_weight_PGT * keep, metrics=metrics
    )

  return Transform(
    init=lambda: (),
    prepare=lambda batch, state: (batch, state),
    apply=apply,
  )


# --------------------------------------------------------------------------
# VCPO: ESS of the minibatch and the learning-rate scale


class VcpoState(NamedTuple):
  """The last optimizer step's ESS ratio and learning-rate scale (1 and 1
  before any `observe`)."""

  ess_ratio: jax.Array
  lr_scale: jax.Array


def vcpo_ess(
  *,
  base_ess_ratio: float = 1.0,
  rule: str = "sqrt",
  clip: Optional[float] = None,
) -> Transform:
  """VCPO's effective sample size of each optimizer step's minibatch.

    w_i = pi_old(tau_i) / pi_rollout(tau_i)      (`vcpo_sequence_weights`)
    rho_ess = (sum w)^2 / (B sum w^2),  scale = min(1, rho_ess/rho_base)^1/2

  `measure` sums sum w, sum w^2 and B over the micro-batches (exact for the
  whole minibatch), `observe` stores rho_ess and the scale in `VcpoState`,
  and `apply` reports them as metrics ``vcpo_ess_ratio`` and
  ``vcpo_lr_scale``; it does not change the loss. The stage's
  ``step_scale`` is the scale, so the Trainer multiplies each optimizer
  step's update by it (the same as scaling AdamW's learning rate); a
  custom loop multiplies by `rljax.Algorithm.step_scale` or chains
  `vcpo_scale_by_ess` (an optax transformation).

  ``clip``: weights clipped at this value first (the code's
  ``use_clipped``, off by default).

  Defaults: rho_base 1.0, the sqrt rule (``shell/vcpo/math/vcpo_k=10.sh``).

  Checked: against mit-han-lab/vcpo (``compute_ess_info``: ESS of the
  minibatch's sequence IS weights rollout_seq_is = exp(sum(old -
  rollout)), ``megatron_actor._optimizer_step_with_buffer``: lr = base_lr
  min(1, ess_ratio / base) ** 0.5).
  """
  checks.positive(base_ess_ratio=base_ess_ratio)
  checks.one_of("rule", rule, ("sqrt", "linear"))
  if clip is not None:
    checks.positive(clip=clip)
  name = "objectives.vcpo_ess"

  def measure(terms: LossTerms, batch: Batch, state) -> dict[str, Mean]:
    del terms, state
    batch.require("old_logp_PGT", "rollout_logp_PGT", by=name)
    w = T.vcpo_sequence_weights(
      batch.old_logp_PGT, batch.rollout_logp_PGT, batch.loss_mask()
    )
    if clip is not None:
      w = jnp.minimum(w, clip)
    m = batch.samples()
    count = jnp.sum(m)
    return {
      "w": Mean(jnp.sum(w * m), count),
      "w2": Mean(jnp.sum(w * w * m), count),
    }

  def observe(state: VcpoState, values: dict) -> VcpoState:
    del state
    if not values:
      raise ValueError(
        f"{name} observes the statistics of its own measure; pass the"
        " measured tree to Algorithm.observe."
      )
    mean_w, mean_w2 = values["w"], values["w2"]
    ess = stats.safe_div(mean_w * mean_w, mean_w2)
    return VcpoState(
      ess, T.vcpo_lr_scale(ess, base_ess_ratio=base_ess_ratio, rule=rule)
    )

  def apply(terms: LossTerms, batch: Batch, state: VcpoState) -> LossTerms:
    del batch
    metrics = dict(terms.metrics)
    metrics["vcpo_ess_ratio"] = _scalar(state.ess_ratio)
    metrics["vcpo_lr_scale"] = _scalar(state.lr_scale)
    return terms._replace(metrics=metrics)

  return Transform(
    init=lambda: VcpoState(
      jnp.ones((), jnp.float32), jnp.ones((), jnp.float32)
    ),
    prepare=lambda batch, state: (batch, state),
    apply=apply,
    measure=measure,
    observe=observe,
    step_scale=lambda state: state.lr_scale,
  )


def vcpo_scale_by_ess(
  *, base_ess_ratio: float = 1.0, rule: str = "sqrt"
) -> optax.GradientTransformationExtraArgs:
  """An optax transformation: multiply the updates by `vcpo_lr_scale`.

  Chain it LAST (after the optimizer that applies the learning rate) and
  pass the minibatch's ESS ratio at each update; scaling the final update
  of AdamW (weight decay included) by s is the same as scaling its
  learning rate by s:

    opt = optax.chain(optax.adamw(lr), vcpo_scale_by_ess())
    updates, opt_state = opt.update(grads, opt_state, params,
                                    ess_ratio=state.ess_ratio)

  where ``state`` is the `vcpo_ess` stage's `VcpoState` after `observe`
  (or pass ``lr_scale=`` directly to skip the rule).
  """
  checks.positive(base_ess_ratio=base_ess_ratio)
  checks.one_of("rule", rule, ("sqrt", "linear"))

  def init(params):
    del params
    return optax.EmptyState()

  def update(
    updates, state, params=None, *, ess_ratio=None, lr_scale=None, **extra_args
  ):
    del params, extra_args
    if (ess_ratio is None) == (lr_scale is None):
      raise ValueError(
        "vcpo_scale_by_ess: pass exactly one of ess_ratio= (the minibatch's"
        " ESS ratio, VcpoState.ess_ratio) or lr_scale= to optimizer.update."
      )
    if lr_scale is None:
      lr_scale = T.vcpo_lr_scale(
        ess_ratio, base_ess_ratio=base_ess_ratio, rule=rule
      )
    scale = stats.f32(lr_scale)
    return jax.tree.map(lambda u: (u * scale).astype(u.dtype), updates), state

  return optax.GradientTransformationExtraArgs(init, update)
