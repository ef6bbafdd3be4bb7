"""Batch stages fed by extra scoring passes: a teacher, another temperature,
the rollout engine's log-probs, a second sampling stream.

* RTO (arXiv 2404.18922): dense token rewards from a DPO policy scored as
  the teacher (`Batch.teacher_logp_PGT`), for PPO/GAE.
* DCPO-dist (arXiv 2601.12730): advantages mixed with a temperature ratio of
  the old policy (``Batch.extra['old_logp_tstar_PGT']``).
* VCPO (arXiv 2602.17616): sequence importance weights, their effective
  sample size and the minimum-variance off-policy baseline.
* AEPO (arbitrary entropy, arXiv 2510.08141): the temperature controller
  and the REINFORCE advantages of a second stream of samples
  (``Batch.extra['from_stream_PG']``).

All arithmetic is float32; padded tokens never leak into the results.
"""

from collections.abc import Callable
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax import advantages
from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Rescore
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare
from rljax.transforms._advantages import sequence_rewards

# verl / OpenRLHF clamp log-ratios to [-20, 20] before exp.
_LOG_CLAMP = 20.0


def _check_optional_positive(**values) -> None:
  checks.positive(**{k: v for k, v in values.items() if v is not None})


def _valid(mask) -> jax.Array:
  return stats.f32(mask) > 0


# --------------------------------------------------------------------------
# RTO


def rto_token_rewards(
  teacher_logp_BT: ArrayLike,
  ref_logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  rewards_B: ArrayLike,
  mask_BT: ArrayLike,
  *,
  beta1: float = 0.05,
  beta2: float = 0.01,
  beta3: float = 1.0,
  dpo_clip: Optional[float] = 0.05,
  reward_clip: Optional[float] = 10.0,
) -> jax.Array:
  """RTO's token-wise reward for PPO (Reinforced Token Optimization).

    r_t = clip(beta1 log(pi_DPO / pi_ref), +-dpo_clip)
          - beta2 log(pi_old / pi_ref) + beta3 1[t = T] clip(r, +-reward_clip)

  pi_DPO is the DPO-trained policy (`teacher_logp_BT`), pi_old the policy
  that sampled the tokens, T the last valid token and r the sentence-level
  reward. Rank-polymorphic over leading axes: [..., T] log-probs and mask,
  [...] rewards. Returns [..., T] float32, 0 on padded tokens.

  Defaults: the official script ``train_rto_llama_8b.sh`` (beta1 =
  ``--dpo_reward_scale 0.05``, dpo_clip = ``--dpo_reward_clip 0.05``, beta2 =
  ``--init_kl_coef 0.01``, beta3 = 1 with the reward model's output clamped
  to [-10, 10] as OpenRLHF's ``compute_reward`` does). ``None`` disables a
  clip (the paper's formula has none).

  References: Zhong et al., "DPO Meets PPO: Reinforced Token Optimization
  for RLHF", arXiv 2404.18922 (the reward of its practical algorithm, which
  combines the DPO token reward, the KL term and the sentence reward;
  section and equation number not verified).

  Checked: against the official code zkshan2002/RTO
  (``experience_maker._compute_dpo_rewards``: (log pi_dpo - log pi_ref) *
  scale, then clamp; ``models/utils.compute_reward``: reward on the last
  action token plus -kl_coef * (log pi - log pi_ref), k1). The paper's
  equation number was not read (only the abstract and the code were
  reachable); its pi_ref of the DPO term is the PPO reference here, as the
  code's default (``--dpo_ref`` unset reuses the reference model).
  """
  checks.non_negative(beta1=beta1, beta2=beta2, beta3=beta3)
  _check_optional_positive(dpo_clip=dpo_clip, reward_clip=reward_clip)
  if np.ndim(mask_BT) < 1:
    raise ValueError(
      f"mask_BT must have rank >= 1 ([..., T]); got {np.shape(mask_BT)}."
    )
  checks.same_shape(
    ["teacher_logp_BT", "ref_logp_BT", "old_logp_BT", "mask_BT"],
    teacher_logp_BT,
    ref_logp_BT,
    old_logp_BT,
    mask_BT,
  )
  dense = _rto_dense(
    teacher_logp_BT, ref_logp_BT, old_logp_BT, mask_BT, beta1, beta2, dpo_clip
  )
  outcome = _rto_outcome(rewards_B, beta3, reward_clip)
  return dense + advantages.outcome_to_token_rewards(outcome, mask_BT)


def _rto_dense(teacher, ref, old, mask, beta1, beta2, dpo_clip) -> jax.Array:
  valid = _valid(mask)
  ref = stats.f32(ref)
  dpo = beta1 * (stats.f32(teacher) - ref)
  if dpo_clip is not None:
    dpo = jnp.clip(dpo, -dpo_clip, dpo_clip)
  kl = beta2 * (stats.f32(old) - ref)
  return jnp.where(valid, dpo - kl, 0.0)


def _rto_outcome(rewards, beta3, reward_clip) -> jax.Array:
  r = stats.f32(rewards)
  if reward_clip is not None:
    r = jnp.clip(r, -reward_clip, reward_clip)
  return beta3 * r


def rto_rewards(
  *,
  beta1: float = 0.05,
  beta2: float = 0.01,
  beta3: float = 1.0,
  dpo_clip: Optional[float] = 0.05,
  reward_clip: Optional[float] = 10.0,
) -> Transform:
  """RTO rewards (see `rto_token_rewards`) for `gae_advantages`.

  Adds clip(beta1 log(pi_DPO/pi_ref)) - beta2 log(pi_old/pi_ref) to
  `Batch.token_rewards_PGT` and replaces `Batch.rewards_PG` by beta3
  clip(R), which the token-level estimators place on the last token, so
  that ``transforms.token_rewards(batch)`` is exactly RTO's r_t. Reads
  `teacher_logp_PGT` (the DPO policy: ``Trainer(config, teacher=dpo_model)``),
  `ref_logp_PGT`, `old_logp_PGT` and `rewards_PG`. Put it before
  `gae_advantages` (the `rto` preset does).
  """
  checks.non_negative(beta1=beta1, beta2=beta2, beta3=beta3)
  _check_optional_positive(dpo_clip=dpo_clip, reward_clip=reward_clip)
  name = "transforms.rto_rewards"

  def fn(batch: Batch) -> Batch:
    batch.require(
      "teacher_logp_PGT",
      "ref_logp_PGT",
      "old_logp_PGT",
      "rewards_PG",
      by=name,
    )
    dense = _rto_dense(
      batch.teacher_logp_PGT,
      batch.ref_logp_PGT,
      batch.old_logp_PGT,
      batch.mask_PGT,
      beta1,
      beta2,
      dpo_clip,
    )
    if batch.token_rewards_PGT is not None:
      dense = dense + stats.f32(batch.token_rewards_PGT)
    return batch._replace(
      token_rewards_PGT=dense,
      rewards_PG=_rto_outcome(batch.rewards_PG, beta3, reward_clip),
    )

  return stateless_prepare(fn)


# --------------------------------------------------------------------------
# DCPO (distribution-centric)

_ENTROPY_SOURCES = ("sampled", "exact")


def dcpo_dist_entropy(batch: Batch, *, source: str = "sampled") -> jax.Array:
  """The entropy H that steers DCPO-dist and AEPO: a token mean over the
  valid tokens of -old_logp (``"sampled"``, the official code's
  ``entropy_loss``) or of `old_entropy_PGT` (``"exact"``)."""
  checks.one_of("source", source, _ENTROPY_SOURCES)
  mask = batch.loss_mask()
  if source == "sampled":
    batch.require("old_logp_PGT", by="the entropy estimate (source='sampled')")
    return stats.masked_mean(-stats.f32(batch.old_logp_PGT), mask)
  batch.require("old_entropy_PGT", by="the entropy estimate (source='exact')")
  return stats.masked_mean(batch.old_entropy_PGT, mask)


def dcpo_dist_temperature(
  entropy: ArrayLike,
  *,
  h_base: float = 0.5,
  t_high: float = 1.2,
  t_low: float = 0.8,
) -> jax.Array:
  """T* = t_high if H <= h_base else t_low (DCPO-dist's target temperature;
  the same rule picks AEPO's sampling temperature)."""
  checks.positive(t_high=t_high, t_low=t_low)
  return jnp.where(stats.f32(entropy) <= h_base, t_high, t_low)


def dcpo_dist_alpha(
  entropy: ArrayLike,
  correct_frac: ArrayLike,
  *,
  h_base: float = 0.5,
  max_gap: float = 0.1,
) -> jax.Array:
  """alpha = a / (1 + a), a = min(|h_base - H|, max_gap) / p.

  p is the fraction of correct samples. With p = 0 the formula's limit is
  alpha = 1 (the official code divides by zero); here alpha = 0 then: the
  mixed-in term b_i rho is 0 for every sample, and alpha = 1 would erase
  the GRPO advantages of the whole batch.
  """
  checks.non_negative(max_gap=max_gap)
  gap = jnp.minimum(jnp.abs(h_base - stats.f32(entropy)), max_gap)
  p = stats.f32(correct_frac)
  # a / (1 + a) with a = gap / p is gap / (p + gap).
  return jnp.where(p > 0, stats.safe_div(gap, p + gap), 0.0)


def dcpo_dist_mix(
  adv_BT: ArrayLike,
  correct_B: ArrayLike,
  old_logp_BT: ArrayLike,
  old_logp_tstar_BT: ArrayLike,
  mask_BT: ArrayLike,
  alpha: ArrayLike,
) -> jax.Array:
  """A'_t = (1 - alpha) A_t + alpha b rho_t, rho_t = pi_old^{T*} / pi_old.

  b = `correct_B` (1 for a correct sample), broadcast over T; the log of
  rho is clamped to [-20, 20]. [..., T] float32, 0 on padded tokens.
  """
  checks.same_shape(
    ["adv_BT", "old_logp_BT", "old_logp_tstar_BT", "mask_BT"],
    adv_BT,
    old_logp_BT,
    old_logp_tstar_BT,
    mask_BT,
  )
  checks.leading_shape(
    "correct_B", correct_B, np.shape(mask_BT)[:-1], "mask_BT[..., 0]"
  )
  valid = _valid(mask_BT)
  log_rho = stats.f32(old_logp_tstar_BT) - stats.f32(old_logp_BT)
  log_rho = jnp.clip(jnp.where(valid, log_rho, 0.0), -_LOG_CLAMP, _LOG_CLAMP)
  b = stats.f32(correct_B)[..., None]
  alpha = stats.f32(alpha)
  mixed = (1.0 - alpha) * stats.f32(adv_BT) + alpha * b * jnp.exp(log_rho)
  return jnp.where(valid, mixed, 0.0)


def dcpo_dist_advantages(
  *,
  h_base: float = 0.5,
  t_high: float = 1.2,
  t_low: float = 0.8,
  max_gap: float = 0.1,
  correct_threshold: float = 0.05,
  entropy: str = "sampled",
) -> Transform:
  """DCPO (Distribution-Centric Policy Optimization): mix the advantages
  with a REINFORCE term under a temperature-scaled target distribution.

    H = token mean of -log pi_old (see `dcpo_dist_entropy`)
    T* = 1.2 if H <= h_base else 0.8             (`dcpo_dist_temperature`)
    b_i = 1[R_i > 0.05], p = mean_i b_i over the valid samples
    alpha = min(|h_base - H|, 0.1)/p,  alpha <- alpha / (1 + alpha)
    A'_{i,t} = (1 - alpha) A_{i,t} + alpha b_i pi_old^{T*}(o_t) / pi_old(o_t)

  Put it after an advantage stage (the `dcpo_dist` preset: GRPO). pi_old^T*
  is the old policy's log-probs of the sampled tokens with its logits
  divided by T* (the official code's ``compute_log_probs`` with
  ``meta_info['temperature'] = T*``). T* is one of two values, so the stage
  asks the Trainer for both passes (`rljax.Rescore`:
  ``Batch.extra['old_logp_t_high_PGT']`` and ``['old_logp_t_low_PGT']``)
  and uses the one T* picks; outside the Trainer, fill those entries.

  Defaults: h_base 0.5 (``trainer.entropy_base``), T* in {1.2, 0.8},
  cap 0.1 and threshold 0.05, all from the official code. Choice: H is
  measured on this batch's old log-probs (the policy after the previous
  update), where the code reuses the previous update's loss-time metric
  (``actor/entropy_loss``, the same -log pi estimate on the previous
  batch); ``entropy="exact"`` uses `old_entropy_PGT` instead.

  References: Li et al., "Distribution-Centric Policy Optimization
  Dominates Exploration-Exploitation Trade-off", arXiv 2601.12730.

  Checked: against the official code 597358816/DCPO
  (``verl/trainer/ray_trainer.py``, branch ``alg == "DCPO"``;
  ``_compute_bool_reward_by_score``; config ``entropy_base``). The paper's
  equations were not read (only its abstract was reachable).
  """
  checks.positive(t_high=t_high, t_low=t_low)
  checks.non_negative(max_gap=max_gap)
  checks.one_of("entropy", entropy, _ENTROPY_SOURCES)
  name = "transforms.dcpo_dist_advantages"

  def fn(batch: Batch) -> Batch:
    batch.require("advantages_PGT", "old_logp_PGT", "rewards_PG", by=name)
    high = batch.get("old_logp_t_high_PGT", by=name)
    low = batch.get("old_logp_t_low_PGT", by=name)
    h = dcpo_dist_entropy(batch, source=entropy)
    t_star = dcpo_dist_temperature(h, h_base=h_base, t_high=t_high, t_low=t_low)
    tstar_logp = jnp.where(t_star == t_high, stats.f32(high), stats.f32(low))
    samples = batch.samples()
    correct = (stats.f32(batch.rewards_PG) > correct_threshold) * samples
    p = stats.safe_div(jnp.sum(correct), jnp.sum(samples))
    alpha = dcpo_dist_alpha(h, p, h_base=h_base, max_gap=max_gap)
    mask = batch.loss_mask()
    adv = dcpo_dist_mix(
      batch.advantages_PGT, correct, batch.old_logp_PGT, tstar_logp, mask, alpha
    )
    return batch._replace(advantages_PGT=adv)

  return stateless_prepare(fn)._replace(
    rescores=(
      Rescore("old_logp_t_high_PGT", temperature=t_high),
      Rescore("old_logp_t_low_PGT", temperature=t_low),
    )
  )


# --------------------------------------------------------------------------
# VCPO


def vcpo_sequence_weights(
  old_logp_BT: ArrayLike,
  rollout_logp_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  log_clamp: Optional[float] = _LOG_CLAMP,
) -> jax.Array:
  """w = pi_old(tau) / pi_rollout(tau) = exp(sum_t m_t (old_t - rollout_t)).

  VCPO's sequence importance weight (the code's ``rollout_seq_is``), [...].
  The summed log-ratio is clamped to [-log_clamp, log_clamp] (the code has
  no clamp; with it, w**2 stays finite in float32); ``None`` disables it.
  """
  _check_optional_positive(log_clamp=log_clamp)
  checks.same_shape(
    ["old_logp_BT", "rollout_logp_BT", "mask_BT"],
    old_logp_BT,
    rollout_logp_BT,
    mask_BT,
  )
  d = stats.f32(old_logp_BT) - stats.f32(rollout_logp_BT)
  log_w = jnp.sum(jnp.where(_valid(mask_BT), d, 0.0), axis=-1)
  if log_clamp is not None:
    log_w = jnp.clip(log_w, -log_clamp, log_clamp)
  return jnp.exp(log_w)


def vcpo_ess_ratio(
  w_B: ArrayLike, sample_mask_B: Optional[ArrayLike] = None
) -> jax.Array:
  """rho_ess = (sum w)^2 / (B sum w^2) over the valid samples (all axes).

  In (0, 1]; 1 when all weights are equal (on-policy). 0 for an empty
  selection.
  """
  w = stats.f32(w_B)
  m = jnp.ones_like(w) if sample_mask_B is None else stats.f32(sample_mask_B)
  checks.same_shape(["w_B", "sample_mask_B"], w, m)
  total = jnp.sum(w * m)
  return stats.safe_div(total * total, jnp.sum(m) * jnp.sum(w * w * m))


_LR_RULES = ("sqrt", "linear")


def vcpo_lr_scale(
  ess_ratio: ArrayLike, *, base_ess_ratio: float = 1.0, rule: str = "sqrt"
) -> jax.Array:
  """The learning-rate factor min(1, rho_ess / rho_base) ** (1/2 or 1).

  ``rule="sqrt"`` is VCPO's rule (eta_eff = eta sqrt(rho_ess / rho_base));
  ``"linear"`` the code's alternative. The min(1, .) cap is the code's
  (``megatron_actor._optimizer_step_with_buffer``).
  """
  checks.positive(base_ess_ratio=base_ess_ratio)
  checks.one_of("rule", rule, _LR_RULES)
  scale = jnp.minimum(1.0, stats.f32(ess_ratio) / base_ess_ratio)
  return stats.safe_sqrt(scale) if rule == "sqrt" else scale


def vcpo_optimal_baseline(
  rewards_PG: ArrayLike,
  w_PG: ArrayLike,
  grad_sq_norm_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
) -> jax.Array:
  """b* = sum_i w_i^2 |g_i|^2 R_i / sum_i w_i^2 |g_i|^2 within each group.

  The minimum-variance off-policy baseline (OPOB), over the last axis (the
  group). |g_i|^2 is the squared norm of the gradient of the trajectory's
  summed log-probability, grad log pi(tau_i) (the code's
  ``grad_norm_unscaled``: one backward per trajectory with advantage 1).
  Returns [...] (one baseline per group); 0 for a group without weight.
  """
  checks.same_shape(
    ["rewards_PG", "w_PG", "grad_sq_norm_PG", "sample_mask_PG"],
    rewards_PG,
    w_PG,
    grad_sq_norm_PG,
    sample_mask_PG,
  )
  w = stats.f32(w_PG)
  m = 1.0 if sample_mask_PG is None else stats.f32(sample_mask_PG)
  weight = w * w * stats.f32(grad_sq_norm_PG) * m
  num = jnp.sum(weight * stats.f32(rewards_PG), axis=-1)
  return stats.safe_div(num, jnp.sum(weight, axis=-1))


def vcpo_baseline_advantages(
  rewards_PG: ArrayLike,
  w_PG: ArrayLike,
  grad_sq_norm_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  norm_by_std: bool = True,
) -> jax.Array:
  """A_i = (R_i - b*) / sigma_group, sigma the population std of the
  group's valid rewards (no division where sigma <= 1e-8), the code's
  ``grad_baselining_norm_by_std=True``; ``norm_by_std=False``: R_i - b*.
  [..., G] float32, 0 on invalid samples."""
  m = (
    jnp.ones(np.shape(rewards_PG), jnp.float32)
    if sample_mask_PG is None
    else stats.f32(sample_mask_PG)
  )
  b = vcpo_optimal_baseline(rewards_PG, w_PG, grad_sq_norm_PG, m)
  adv = stats.f32(rewards_PG) - b[..., None]
  if norm_by_std:
    sigma = stats.masked_std(rewards_PG, m, axis=-1, keepdims=True, ddof=0)
    adv = jnp.where(
      sigma > 1e-8, adv / jnp.where(sigma > 1e-8, sigma, 1.0), adv
    )
  return adv * m


_GRAD_NORMS = ("extra", "uniform")


def vcpo_advantages(
  *,
  grad_norms: str = "extra",
  use_is_weights: bool = True,
  norm_by_std: bool = True,
  log_clamp: Optional[float] = _LOG_CLAMP,
) -> Transform:
  """VCPO's optimal off-policy baseline as an advantage stage.

  A_i = (R_i - b*_group) / sigma_group with b* from `vcpo_optimal_baseline`
  and w_i = pi_old(tau_i) / pi_rollout(tau_i) (`vcpo_sequence_weights`;
  needs `old_logp_PGT` and `rollout_logp_PGT`; ``use_is_weights=False``
  sets w = 1). |g_i|^2 comes from ``Batch.extra['grad_sq_norm_PG']``
  (``grad_norms="extra"``): per-trajectory squared gradient norms of
  sum_t log pi(y_t), which the stage asks the Trainer for
  (`rljax.Rescore` with ``span="gradient"``: one backward pass per
  trajectory, as the code's ``_compute_grad_norms``, at temperature 1);
  ``grad_norms="uniform"`` sets them to 1 (b* is then the w^2-weighted group
  mean of the rewards: a choice of this library, not in the paper).

  Defaults: the official scripts (``shell/vcpo/math/vcpo_k=10.sh``): scope
  group, IS weights on and unclipped, no length normalisation, norm by std.

  References: "Stable Asynchrony: Variance-Controlled Off-Policy RL for
  LLMs" (VCPO), arXiv 2602.17616.

  Checked: against the official code mit-han-lab/vcpo
  (``recipe/fully_async_policy/staleness_utils.py``: ``compute_is_info``,
  ``compute_opob_baseline``; ``verl/workers/actor/megatron_actor.py``:
  ``_update_grad_buffers``, ``_compute_grad_norms``). The code accumulates
  sum_i (R_i/sigma) g_i - (b*/sigma) sum_i g_i, the gradient of these
  advantages.
  """
  checks.one_of("grad_norms", grad_norms, _GRAD_NORMS)
  _check_optional_positive(log_clamp=log_clamp)
  name = "transforms.vcpo_advantages"

  def fn(batch: Batch) -> Batch:
    batch.require("rewards_PG", by=name)
    mask = batch.loss_mask()
    if use_is_weights:
      batch.require("old_logp_PGT", "rollout_logp_PGT", by=name)
      w = vcpo_sequence_weights(
        batch.old_logp_PGT, batch.rollout_logp_PGT, mask, log_clamp=log_clamp
      )
    else:
      w = jnp.ones(batch.shape[:2], jnp.float32)
    if grad_norms == "extra":
      g2 = stats.f32(batch.get("grad_sq_norm_PG", by=name))
    else:
      g2 = jnp.ones(batch.shape[:2], jnp.float32)
    adv = vcpo_baseline_advantages(
      sequence_rewards(batch), w, g2, batch.samples(), norm_by_std=norm_by_std
    )
    return batch._replace(advantages_PGT=adv[..., None] * mask)

  rescores = ()
  if grad_norms == "extra":
    rescores = (Rescore("grad_sq_norm_PG", span="gradient"),)
  return stateless_prepare(fn)._replace(rescores=rescores)


# --------------------------------------------------------------------------
# AEPO (arbitrary entropy)


class AepoState(NamedTuple):
  """The temperature for the next stream of samples, and the entropy
  that chose it."""

  temperature: jax.Array
  entropy: jax.Array


_AEPO_TARGETS = ("paper", "code")


def aepo_stream_targets(
  rewards_PG: ArrayLike,
  sample_mask_PG: ArrayLike,
  *,
  target: str = "paper",
  estimator: Callable[..., jax.Array] = advantages.grpo,
  threshold: float = 0.05,
) -> jax.Array:
  """The REINFORCE target of each stream sample, [..., G].

  ``"paper"``: R_i (grad l R of the README's formula). ``"code"``: 1 where
  the stream sample's own group advantage (`estimator` over the stream
  samples of its group) exceeds `threshold`, else 0 (the official code's
  ``_select_by_advantage(threshold=0.05)`` then advantages set to 1).
  """
  checks.one_of("target", target, _AEPO_TARGETS)
  m = stats.f32(sample_mask_PG)
  if target == "paper":
    return stats.f32(rewards_PG) * m
  adv = estimator(rewards_PG, m)
  return stats.f32(adv > threshold) * m


def aepo_stream_advantages(
  estimator: Callable[..., jax.Array] = advantages.grpo,
  *,
  h_target: float = 0.5,
  alpha: float = 1.0,
  alpha_above: Optional[float] = None,
  t_high: float = 1.2,
  t_low: float = 0.8,
  target: str = "paper",
  threshold: float = 0.05,
  entropy: str = "sampled",
  **estimator_kwargs,
) -> Transform:
  """AEPO (Arbitrary Entropy Policy Optimization): GRPO plus a REINFORCE
  term on samples drawn at a switched temperature.

    grad J = grad J_GRPO + alpha E_{o ~ pi^T}[grad log pi(o) R(o)]
    T = t_high if H <= h_target else t_low

  Samples with ``Batch.extra['from_stream_PG'] = 1`` come from the second
  stream (sampled at temperature T, scored at the policy's own temperature
  like the others). The main samples get ``estimator``'s advantages over
  the main samples of their group only; a stream sample gets alpha times
  its REINFORCE target (`aepo_stream_targets`). The chain's policy
  objective then gives the README's gradient (at ratio 1). The state
  (`AepoState`) holds the temperature for the NEXT batch's stream, from
  this batch's entropy (`dcpo_dist_entropy` over the main samples); it
  starts at t_high (the code starts with H = 0). The temperature also picks
  the weight of this batch's stream: alpha after a t_high stream,
  ``alpha_above`` (default alpha / 2: the code keeps half as many stream
  samples when H > h_target) after a t_low one.

  Partial: the second rollout stream (sampling at ``state.temperature``,
  marking ``from_stream_PG``) is a rollout-engine feature the `Trainer`
  lacks. The code also caps the stream samples per step
  (``reinforce_sample_num = 60``) and puts them in place of main samples;
  here every marked sample counts and alpha sets their weight.

  Defaults: h_target 0.5, t_high 1.2, t_low 0.8 (the code's
  ``entropy_base``, ``temperature_high``, ``temperature_low``); alpha 1 (a
  stream sample weighs as a main sample, as in the code). The switch uses
  H <= h_target (the code; the README writes <).

  References: Wang et al., "Arbitrary Entropy Policy Optimization Breaks
  The Exploration Bottleneck of Reinforcement Learning", arXiv 2510.08141.

  Checked: the README formula (catalog) and the official code
  597358816/DCPO (``ray_trainer.py`` branch ``alg == "AEPO"``,
  ``config.py``), which the AEPO README points to; the paper's equations
  were not read.
  """
  checks.positive(t_high=t_high, t_low=t_low)
  checks.non_negative(alpha=alpha)
  if alpha_above is not None:
    checks.non_negative(alpha_above=alpha_above)
  checks.one_of("target", target, _AEPO_TARGETS)
  checks.one_of("entropy", entropy, _ENTROPY_SOURCES)
  above = alpha / 2 if alpha_above is None else alpha_above
  name = "transforms.aepo_stream_advantages"

  def prepare(batch: Batch, state: AepoState):
    stream = stats.f32(batch.get("from_stream_PG", by=name) > 0)
    samples = batch.samples()
    main_mask, stream_mask = samples * (1.0 - stream), samples * stream
    rewards = sequence_rewards(batch)
    adv_main = estimator(rewards, main_mask, **estimator_kwargs) * main_mask
    weight = jnp.where(state.temperature == t_high, alpha, above)
    targets = aepo_stream_targets(
      rewards,
      stream_mask,
      target=target,
      estimator=estimator,
      threshold=threshold,
    )
    adv = adv_main + weight * targets
    h = dcpo_dist_entropy(
      batch._replace(sample_mask_PG=main_mask), source=entropy
    )
    state = AepoState(
      dcpo_dist_temperature(h, h_base=h_target, t_high=t_high, t_low=t_low),
      h,
    )
    return batch._replace(advantages_PGT=adv[..., None] * batch.loss_mask()), (
      state
    )

  return Transform(
    init=lambda: AepoState(
      jnp.asarray(t_high, jnp.float32), jnp.zeros((), jnp.float32)
    ),
    prepare=prepare,
    apply=lambda terms, batch, state: terms,
  )
