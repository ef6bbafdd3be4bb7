"""On-policy distillation (OPD): the teacher's log-probs of the student's
own samples as a dense per-token advantage.

The student samples, a frozen teacher scores the same tokens
(`Batch.teacher_logp_PGT`: ``Trainer(config, teacher=model)``), and the
per-token reverse KL(pi_theta || pi_T), estimated at the sampled token by
log pi_old(y_t) - log pi_T(y_t), becomes a negative reward. Minimising the
reverse KL by policy gradient then uses the advantage

  A_t = coef sum_{k >= t} gamma^(k - t) (log pi_T(y_k) - log pi_old(y_k))

(gamma = 0: each token's own term, the Thinking Machines / Tinker recipe;
gamma = 1: the full reward-to-go, the policy gradient of the
sequence-level reverse KL that MiniLLM starts from, without MiniLLM's
further corrections). It is 0 wherever the teacher agrees with the
sampling policy, so at teacher == student the loss and its gradient are
exactly zero.
"""

import jax
from jax import lax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax import advantages
from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import LossTerms
from rljax._src.base import Transform
from rljax._src.base import mean_metric


def opd_token_advantages(
  teacher_logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  coef: float = 1.0,
  gamma: float = 0.0,
) -> jax.Array:
  """OPD's per-token advantage, [..., T] float32 (detached).

    r_t = log pi_T(y_t) - log pi_old(y_t)      (minus the reverse-KL k1)
    A_t = coef sum_{k >= t, m_k > 0} gamma^(k - t) r_k

  with k - t counted in valid tokens (`rljax.advantages.discounted_returns`).
  Masked tokens get 0, and their inputs are replaced by 0 first.

  Args:
    teacher_logp_BT: [..., T] teacher log-probs of the sampled tokens.
    old_logp_BT: [..., T] log-probs of the policy that sampled them.
    mask_BT: [..., T] > 0 on completion tokens.
    coef: weight of the distillation term, >= 0 (Tinker's
      ``kl_penalty_coef``, default 1).
    gamma: discount in [0, 1] of the future terms (Tinker's
      ``kl_discount_factor``, default 0).

  Returns:
    [..., T] float32 advantages.
  """
  checks.same_shape(
    ["teacher_logp_BT", "old_logp_BT", "mask_BT"],
    teacher_logp_BT,
    old_logp_BT,
    mask_BT,
  )
  checks.non_negative(coef=coef)
  checks.in_range("gamma", gamma, 0.0, 1.0)
  valid = stats.f32(mask_BT) > 0

  def inert(x):  # padding may hold anything; it must not reach r
    return jnp.where(valid, stats.f32(x), 0.0)

  r = inert(teacher_logp_BT) - inert(old_logp_BT)
  if gamma > 0:
    r = advantages.discounted_returns(r, stats.f32(valid), gamma=gamma)
  return lax.stop_gradient(coef * r)


def opd_advantages(coef: float = 1.0, *, gamma: float = 0.0) -> Transform:
  """Add on-policy distillation's advantage to `Batch.advantages_PGT`.

    A_t <- A_t + coef sum_{k >= t} gamma^(k - t) r_k,
    r_k = log pi_T(y_k) - log pi_old(y_k)

  (`opd_token_advantages`), starting from 0 when no earlier stage wrote
  advantages: chain it after `group_advantages(grpo)` for "RL reward +
  OPD" (the teacher term is added after the group normalisation, so it is
  not rescaled by the reward's std), or alone for pure OPD (presets
  ``opd`` and ``opd_grpo``). Follow it with an importance-weighted policy
  loss: `rljax.losses.ratio_pg` (Tinker's ``importance_sampling``) or
  `rljax.losses.ppo_clip`. Needs `Batch.teacher_logp_PGT` (the Trainer
  fills it when ``Trainer(config, teacher=model)``; the teacher must share
  the student's tokenizer) and `Batch.old_logp_PGT`.

  Metric ``opd_reverse_kl``: the token mean of log pi_old - log pi_T, the
  k1 estimate of the per-token reverse KL(pi_old || pi_T) on the batch.

  References: Agarwal et al. (GKD, on-policy with reverse KL), arXiv
  2306.13649; Gu et al. (MiniLLM), arXiv 2306.08543; Lu and Thinking
  Machines Lab, "On-Policy Distillation" (2025).

  Checked: against thinking-machines-lab/tinker-cookbook
  (``distillation/train_on_policy.incorporate_kl_penalty``: advantage +=
  -kl_penalty_coef * mask * (sampled_logprobs - teacher_logprobs),
  discounted future sum when kl_discount_factor > 0, defaults 1 and 0,
  added to the reward advantages, then the ``importance_sampling`` loss).
  One difference: Tinker uses the sampler's log-probs where this stage
  uses `Batch.old_logp_PGT` (the trainer's recomputation of the same
  policy; equal up to inference-engine numerics). MiniLLM's further
  pieces (single-step exact KL term, teacher-mixed sampling, length
  normalisation) are not included; MiniLLM was read through its abstract
  and summaries only (its code, microsoft/LMOps, not checked).
  """
  checks.non_negative(coef=coef)
  checks.in_range("gamma", gamma, 0.0, 1.0)
  name = "transforms.opd_advantages"

  def prepare(batch: Batch, state):
    if batch.teacher_logp_PGT is None:
      raise ValueError(
        f"{name} needs Batch.teacher_logp_PGT, the teacher's log-probs of"
        " the sampled tokens: pass the teacher as Trainer(config,"
        " teacher=model) (same tokenizer as the student), or fill the field"
        " when building the Batch."
      )
    batch.require("old_logp_PGT", by=name)
    adv = opd_token_advantages(
      batch.teacher_logp_PGT,
      batch.old_logp_PGT,
      batch.loss_mask(),
      coef=coef,
      gamma=gamma,
    )
    if batch.advantages_PGT is not None:
      adv = stats.f32(batch.advantages_PGT) + adv
    return batch._replace(advantages_PGT=adv), state

  def apply(terms: LossTerms, batch: Batch, state) -> LossTerms:
    del state
    mask = batch.loss_mask()
    gap = stats.f32(batch.old_logp_PGT) - stats.f32(batch.teacher_logp_PGT)
    metrics = dict(terms.metrics)
    metrics["opd_reverse_kl"] = mean_metric(jnp.where(mask > 0, gap, 0.0), mask)
    return terms._replace(metrics=metrics)

  return Transform(init=lambda: (), prepare=prepare, apply=apply)
