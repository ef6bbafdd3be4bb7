"""The advantage side of the rollout-allocation papers: XRPO's
novelty-aware advantage sharpening (its rollout allocator is
`rljax.selection.XRPO`)."""

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare
from rljax.transforms._variants import correctness


def xrpo_novelty_bonus(
  advantages_PG: ArrayLike,
  logp_mean_PG: ArrayLike,
  correct_PG: ArrayLike,
  sample_mask_PG: ArrayLike,
  *,
  lam: float = 1.0,
  kappa: float = 1.0,
) -> jax.Array:
  """XRPO's novelty bonus (arXiv 2510.06672), added to each sample's
  advantage:

    s_i = (1/|y_i|) sum_t log pi(y_i,t)     (length-normalised likelihood)
    eta_i = exp(s_i - mean_j s_j)            (over the group's valid samples)
    bonus_i = min(max(lam (1 - eta_i), 0), kappa A_i)   for correct, A_i > 0

  and 0 for the others: a correct answer the policy finds less likely than
  its group's average (eta < 1) gets up to kappa times its advantage more,
  A' = A (1 + min(lam (1 - eta) / A, kappa)). Invalid samples get 0.

  Args:
    advantages_PG: [..., G] each sample's advantage A_i.
    logp_mean_PG: [..., G] s_i, the mean token log-prob of each sample.
    correct_PG: [..., G] correctness (bool or 0/1).
    sample_mask_PG: [..., G] valid samples.
    lam: the novelty scale lambda (>= 0).
    kappa: the cap on the relative boost (>= 0).

  Returns:
    float32 [..., G] bonuses.
  """
  checks.non_negative(lam=lam, kappa=kappa)
  checks.same_shape(
    ("advantages_PG", "logp_mean_PG", "correct_PG", "sample_mask_PG"),
    advantages_PG,
    logp_mean_PG,
    correct_PG,
    sample_mask_PG,
  )
  valid = stats.f32(sample_mask_PG)
  s = stats.f32(logp_mean_PG)
  s_bar = stats.masked_mean(s, valid, axis=-1, keepdims=True)
  # exp of a non-positive gap where the bonus can be non-zero; clip the
  # other side so that an outlier cannot overflow.
  eta = jnp.exp(jnp.minimum(s - s_bar, 30.0))
  adv = stats.f32(advantages_PG)
  bonus = jnp.minimum(jnp.maximum(lam * (1 - eta), 0.0), kappa * adv)
  gate = valid * stats.f32(jnp.asarray(correct_PG) != 0) * (adv > 0)
  return bonus * gate


def xrpo_novelty_advantages(
  *, lam: float = 1.0, kappa: float = 1.0
) -> Transform:
  """XRPO (arXiv 2510.06672): novelty-sharpened advantages, after an
  advantage stage (the paper's is GRPO's).

  Adds `xrpo_novelty_bonus` to every valid token of each correct sample
  with a positive advantage. s_i is the masked mean over T of the
  behaviour log-probs (``old_logp_PGT``, else ``rollout_logp_PGT``);
  correctness follows `rljax.transforms._variants.correctness`
  (``extra["correct_PG"]``, else ``rewards_PGK[..., 0] > 0``, else
  ``rewards_PG > 0``). Writes ``extra["novelty_bonus_PG"]``.

  Checked: the paper's abstract (amplify low-probability correct
  responses, group-relative, from sequence likelihoods); the formula
  above, and the defaults lam = kappa = 1, come from a secondary
  description of the paper and are not verified against its text or
  official code (UIUC-MLSys/XRPO was not available here).
  """
  checks.non_negative(lam=lam, kappa=kappa)

  def fn(batch: Batch) -> Batch:
    by = "xrpo_novelty_advantages"
    batch.require("advantages_PGT", by=by)
    if batch.old_logp_PGT is not None:
      logp = batch.old_logp_PGT
    elif batch.rollout_logp_PGT is not None:
      logp = batch.rollout_logp_PGT
    else:
      raise ValueError(
        f"{by} needs the behaviour log-probs: Batch.old_logp_PGT (the"
        " Trainer computes it when a stage reads it) or"
        " Batch.rollout_logp_PGT."
      )
    mask = batch.loss_mask()
    a_seq = stats.masked_mean(batch.advantages_PGT, mask, axis=-1)
    bonus = xrpo_novelty_bonus(
      a_seq,
      stats.masked_mean(logp, mask, axis=-1),
      correctness(batch),
      batch.samples(),
      lam=lam,
      kappa=kappa,
    )
    adv = stats.f32(batch.advantages_PGT) + bonus[..., None] * mask
    return batch._replace(advantages_PGT=adv).with_extra(novelty_bonus_PG=bonus)

  return stateless_prepare(fn)
