"""Advantage and reward reweighting from the samples' own probabilities and
from the group's balance: ProGRPO's ARM, RED-Drop, GRPO-S and RAPO's
reward-tilted reference weights.

Shapes follow `rljax.advantages`: [P, G] per sample (the group is the last
axis), [P, G, T] per token with a token mask; outputs are float32 and 0 at
invalid samples.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats
from rljax.advantages._group import _group_stats
from rljax.advantages._group import _prepare
from rljax.advantages._group import _scorable


def check_low_fraction(low_fraction: Optional[float]) -> None:
  if low_fraction is not None and not 0.0 < low_fraction <= 1.0:
    raise ValueError(
      f"low_fraction must be in (0, 1] or None; got {low_fraction}."
    )


def answer_confidence(
  logp_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  *,
  low_fraction: Optional[float] = 0.2,
) -> jax.Array:
  """ProGRPO's answer confidence c(o|q) = exp(mean of selected token logp).

  With ``low_fraction`` f, the mean runs over the k_i = max(1, ceil(f n_i))
  lowest-probability valid tokens of each completion (n_i valid tokens),
  the paper's "low-probability token length normalisation"; ``None`` takes
  every valid token (the geometric-mean token probability). [P, G] float32,
  0 for completions without valid tokens.
  """
  check_low_fraction(low_fraction)
  checks.same_shape(["logp_PGT", "mask_PGT"], logp_PGT, mask_PGT)
  logp = stats.f32(logp_PGT)
  valid = stats.f32(mask_PGT) > 0
  n = jnp.sum(valid, axis=-1)
  if low_fraction is None:
    chosen = valid
  else:
    k = jnp.maximum(jnp.ceil(low_fraction * n), 1.0)
    # Rank of each token among its sequence's valid tokens, lowest first.
    order = jnp.argsort(jnp.where(valid, logp, jnp.inf), axis=-1)
    rank = jnp.argsort(order, axis=-1)
    chosen = valid & (rank < k[..., None])
  mean = stats.masked_mean(logp, chosen, axis=-1)
  return jnp.where(n > 0, jnp.exp(mean), 0.0)


def arm(
  advantages_PG: ArrayLike,
  rewards_PG: ArrayLike,
  confidence_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  alpha: float = 0.1,
  prompt_confidence_P: Optional[ArrayLike] = None,
) -> jax.Array:
  """ProGRPO's Advantage Re-weighting Mechanism (arXiv 2602.05281).

  A~_i = A_i                          if sum_k r_k = 0 over the group,
  A~_i = A_i + alpha (c(q) - c(o_i|q))  otherwise,

  with c(o_i|q) the answer confidence (`answer_confidence`) and c(q) the
  prompt's confidence, exp(mean prompt token log-prob), i.e. the inverse
  of its perplexity (`transforms.arm_advantages` gets it from the
  Trainer). When ``prompt_confidence_P`` is None, c(q) is the group's mean
  answer confidence, so the term is zero-mean in the group and only moves
  credit from over-confident to under-explored samples.

  Checked: the case split and the additive form against the paper's
  summary (the ARM equation quoted in a review of the paper); the paper's
  own text beyond its abstract, its default alpha and its exact c(q) (from
  the prompt's perplexity) were not available. Default alpha 0.1 is our
  choice.
  """
  checks.non_negative(alpha=alpha)
  checks.same_shape(
    ["advantages_PG", "rewards_PG", "confidence_PG"],
    advantages_PG,
    rewards_PG,
    confidence_PG,
  )
  r, valid = _prepare(rewards_PG, sample_mask_PG)
  adv = jnp.where(valid > 0, stats.f32(advantages_PG), 0.0)
  conf = jnp.where(valid > 0, stats.f32(confidence_PG), 0.0)
  if prompt_confidence_P is None:
    c_q = stats.masked_mean(conf, valid, axis=-1, keepdims=True)
  else:
    checks.leading_shape(
      "prompt_confidence_P", prompt_confidence_P, r.shape[:-1], "rewards_PG"
    )
    c_q = stats.f32(prompt_confidence_P)[..., None]
  solved = jnp.sum(r * valid, axis=-1, keepdims=True) != 0
  shaped = jnp.where(solved, adv + alpha * (c_q - conf), adv)
  return jnp.where(valid > 0, shaped, 0.0)


def red_drop(
  rewards_PG: ArrayLike,
  key: jax.Array,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  std_normalize: bool = False,
  eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array]:
  """RED-Drop (arXiv 2509.24203): drop extra negatives, then re-baseline.

  In each group, a sample is positive when R_i >= mean_g R. When the
  negatives outnumber the positives, (#neg - #pos) negatives chosen
  uniformly at random are dropped; the advantages are R_i - mean_kept R
  (divided by the kept samples' population std + eps with
  ``std_normalize``). Returns (advantages [P, G], kept [P, G] float 0/1);
  dropped samples get advantage 0.

  Checked against Trinity-RFT's group advantage function with
  ``drop="balance"`` (the paper's official code): the sign rule (>= mean),
  the random choice among negatives and the population std of the kept
  samples. There, a group whose kept samples number <= 1 uses mean 0 and
  std 1; here such groups get advantage 0 (rljax's convention; it cannot
  happen after a drop, which always keeps 2 #pos >= 2 samples).
  """
  checks.non_negative(eps=eps)
  r, valid = _prepare(rewards_PG, sample_mask_PG)
  _, mean, _ = _group_stats(r, valid)
  positive = (r >= mean) & (valid > 0)
  negative = (r < mean) & (valid > 0)
  extra = jnp.sum(negative, -1, keepdims=True) - jnp.sum(
    positive, -1, keepdims=True
  )
  u = jax.random.uniform(key, r.shape)
  order = jnp.argsort(jnp.where(negative, u, jnp.inf), axis=-1)
  rank = jnp.argsort(order, axis=-1)
  dropped = negative & (rank < extra)
  kept = valid * (1.0 - dropped)
  n, mean_k, _ = _group_stats(r, kept)
  adv = r - mean_k
  if std_normalize:
    var = stats.masked_var(r - mean_k, kept, axis=-1, keepdims=True, ddof=0)
    adv = stats.safe_div(adv, stats.safe_sqrt(var) + eps)
  return jnp.where(_scorable(kept, n), adv, 0.0), kept


def grpo_s_scale(
  rewards_PG: ArrayLike,
  hardness_P: ArrayLike,
  reference_rewards_P: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  alpha: float = 1.0,
  beta: float = 1.0,
  temperature: float = 1.0,
) -> jax.Array:
  """GRPO-S's difficulty-scaled rewards (DR-IRL, arXiv 2503.18991).

  r'_i = r_i * w_q with w_q = 1 + alpha h_q + beta d_q: h_q in [0, 1] is
  the data-level hardness of the prompt (the paper measures it by a text
  encoder's cosine similarity; pass it as an input), and d_q =
  sigmoid((r_ref,q - mean_g r) / temperature) the model-level difficulty
  from the reward gap between a reference response and the group.

  Only the abstract was available: it names the two factors (hardness by
  similarity, responsiveness by reward gaps) and that the reward is scaled
  by task difficulty, not the form of w. The affine combination, the
  sigmoid of the gap and every default are our choices.
  """
  checks.non_negative(alpha=alpha, beta=beta)
  checks.positive(temperature=temperature)
  r, valid = _prepare(rewards_PG, sample_mask_PG)
  lead = r.shape[:-1]
  checks.leading_shape("hardness_P", hardness_P, lead, "rewards_PG")
  checks.leading_shape(
    "reference_rewards_P", reference_rewards_P, lead, "rewards_PG"
  )
  mean = stats.masked_mean(r, valid, axis=-1)
  gap = stats.f32(reference_rewards_P) - mean
  w = (
    1.0
    + alpha * stats.f32(hardness_P)
    + beta * jax.nn.sigmoid(gap / temperature)
  )
  return jnp.where(valid > 0, r * w[..., None], 0.0)


def rapo_weights(
  rewards_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  temperature: float = 1.0,
) -> jax.Array:
  """RAPO's reward-tilted reference as per-sample weights (arXiv 2510.03865).

  The reference pi~_ref(y) ∝ pi_ref(y) w(R(y)) with w(R) = exp(R / T):
  against samples of the policy, its forward KL weighs each sample's
  per-token forward-KL estimate by w_i / mean_g w (self-normalised over
  the valid samples of the group). Pair with
  ``objectives.kl_penalty(losses.kl_k3, weight=<name>)``: k3's expected
  gradient is the forward KL's.

  The paper's abstract states the forward KL and the reward-aware
  reweighting of the reference; the reweighting's form was not available,
  so the exponential tilt and T = 1 are our choices.
  """
  checks.positive(temperature=temperature)
  r, valid = _prepare(rewards_PG, sample_mask_PG, minimum=1)
  # Shift by the group max so exp never overflows; the ratio is unchanged.
  top = jnp.max(jnp.where(valid > 0, r, -jnp.inf), axis=-1, keepdims=True)
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  u = jnp.where(valid > 0, jnp.exp((r - top) / temperature), 0.0)
  return stats.safe_div(u, stats.masked_mean(u, valid, -1, keepdims=True))
