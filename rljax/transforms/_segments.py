"""SPO-chain's segment advantages from Monte Carlo values at cutpoints.

Segment Policy Optimization (Guo et al., 2025, arXiv 2505.23564; official
code AIFrameResearch/SPO) cuts each response into segments at its
low-probability tokens and estimates the value of the state before each
segment by Monte Carlo (`rljax.rollouts.SegmentRollouts` samples the
continuations). The sampler hands three [P, G, T] arrays to the batch:

* ``extra["spo_cuts_PGT"]``: 1 where a segment starts, i.e. token t is a
  cutpoint and the state s = (prompt, y_<t) was valued;
* ``extra["spo_values_PGT"]``: V(s) there (the mean reward of the
  continuations sampled from s), 0 elsewhere;
* ``extra["spo_low_prob_PGT"]``: 1 where pi(y_t) < rho (the probability
  mask).
"""

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare
from rljax.transforms._advantages import sequence_rewards

_NORMALIZE = ("batch", "none")


def spo_chain_advantages_of(
  rewards_PG: ArrayLike,
  cuts_PGT: ArrayLike,
  values_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  low_prob_PGT: ArrayLike | None = None,
  *,
  normalize: str = "batch",
  eps: float = 1e-8,
) -> jax.Array:
  """SPO-chain's token advantages (arXiv 2505.23564, chain-based estimate).

  Let b_1 < ... < b_K be the cutpoints of a response y (tokens where
  ``cuts_PGT`` is 1, inside ``mask_PGT``), V_k the Monte Carlo value of the
  state before token b_k and V_{K+1} = R its reward (the value of the
  finished response). Segment k is the tokens b_k .. b_{k+1} - 1 and

    A_k = V_{k+1} - V_k                        (chain-based advantage)
    A_t = A_k * M_t  for t in segment k,  M_t = 1[pi(y_t) < rho]

  (the probability mask: ``low_prob_PGT`` M_t; None: every token of the
  segment, the paper's ablation without it). Tokens before b_1 get 0: they
  are all above rho (b_1 is the first low-probability token), so the mask
  removes them anyway; a response whose first token is below rho has
  b_1 = 0 and V_1 = V(prompt), the paper's V(s_0). ``normalize="batch"``
  then whitens the advantages over the masked tokens of the whole batch
  (mean and unbiased variance, ``(A - mu) / sqrt(var + eps)``; over every
  token when no token is masked in), as the official PPO trainer does
  (`whiten_advantages` with the probability mask); ``"none"`` keeps A.

  Checked against the official code (src/treetune/episode_generators/
  math_episode_generator_with_mc_advantages.py `_compute_token_advantages`
  and `_create_value_estimation_requests`, src/treetune/trainers/
  ppo_trainer.py, configs/polIter_rho1bSft2_spo_chain_*.jsonnet): cutpoints
  are the states before tokens with p < 0.9, every `cutpoint_interval`-th
  of them (5 in the released runs), a cut's value is the mean reward of its
  9 continuations (truncated ones score the unfinished penalty 0), the
  segment ending at a cut gets the value difference and the last segment
  R - V_K, tokens with p > 0.9 get advantage 0 and leave the loss. Only
  the abstract, third-party summaries and the Fig. 1 caption of the paper
  could be read here ("assigns the corresponding segment advantages
  specifically to the cutpoints instead of all tokens within a segment"),
  which agree with the code; the paper's own equations were not read.

  Args:
    rewards_PG: [P, G] sequence rewards R.
    cuts_PGT: [P, G, T] 1 where a segment starts.
    values_PGT: [P, G, T] V(s) at the cutpoints (read only there).
    mask_PGT: [P, G, T] completion tokens (0 for padding and invalid
      samples).
    low_prob_PGT: [P, G, T] the probability mask M_t, or None.
    normalize: "batch" or "none".
    eps: added to the variance of the whitening.

  Returns:
    [P, G, T] float32 advantages, 0 outside ``mask_PGT * low_prob_PGT``.
  """
  checks.one_of("normalize", normalize, _NORMALIZE)
  checks.non_negative(eps=eps)
  checks.rank("rewards_PG", rewards_PG, 2, "[P, G]")
  checks.rank("mask_PGT", mask_PGT, 3, "[P, G, T]")
  checks.leading_shape("mask_PGT", mask_PGT, np.shape(rewards_PG), "rewards_PG")
  names = ["mask_PGT", "cuts_PGT", "values_PGT"]
  arrays = [mask_PGT, cuts_PGT, values_PGT]
  if low_prob_PGT is not None:
    names.append("low_prob_PGT")
    arrays.append(low_prob_PGT)
  checks.same_shape(names, *arrays)
  mask = stats.f32(mask_PGT) > 0
  adv = _segment_differences(
    stats.f32(rewards_PG), (jnp.asarray(cuts_PGT) > 0) & mask, values_PGT
  )
  keep = mask
  if low_prob_PGT is not None:
    keep = keep & (jnp.asarray(low_prob_PGT) > 0)
  adv = jnp.where(keep, adv, 0.0)
  if normalize == "batch":
    # Statistics over the kept tokens; the code falls back to every token.
    weight = jnp.where(jnp.any(keep), keep, mask)
    mean = stats.masked_mean(adv, weight)
    var = stats.masked_var(adv, weight)
    adv = jnp.where(keep, (adv - mean) * jax.lax.rsqrt(var + eps), 0.0)
  return adv


def _segment_differences(r_PG, cuts_PGT, values_PGT) -> jax.Array:
  """[P, G, T] V(next cut, or R at the end) - V(this segment's cut); 0
  before the first cut."""
  t = cuts_PGT.shape[-1]
  pos = jnp.arange(t, dtype=jnp.int32)
  values = stats.f32(values_PGT)
  # The latest cut at or before t (-1: none yet).
  start = jax.lax.cummax(jnp.where(cuts_PGT, pos, -1), axis=2)
  # The earliest cut strictly after t (t: none, the response's end).
  after = jax.lax.cummin(jnp.where(cuts_PGT, pos, t), axis=2, reverse=True)
  after = jnp.concatenate(
    [after[..., 1:], jnp.full_like(after[..., :1], t)], -1
  )
  v_start = jnp.take_along_axis(values, jnp.maximum(start, 0), axis=2)
  v_next = jnp.take_along_axis(values, jnp.minimum(after, t - 1), axis=2)
  v_next = jnp.where(after < t, v_next, r_PG[..., None])
  return jnp.where(start >= 0, v_next - v_start, 0.0)


def spo_chain_advantages(
  *,
  cuts: str = "spo_cuts_PGT",
  values: str = "spo_values_PGT",
  low_prob: str = "spo_low_prob_PGT",
  probability_mask: bool = True,
  normalize: str = "batch",
  eps: float = 1e-8,
) -> Transform:
  """SPO-chain (arXiv 2505.23564): `spo_chain_advantages_of` on the batch.

  Reads the sequence rewards and the sampler's ``Batch.extra`` arrays
  (`rljax.rollouts.SegmentRollouts`), writes ``advantages_PGT``. With
  ``probability_mask=True`` (the paper's SPO-chain and the official code)
  only the low-probability tokens carry their segment's advantage, and
  ``mask_PGT`` is multiplied by the probability mask so the other tokens
  leave the loss and its token mean (the code's action mask
  ``exp(old_logp) < 0.9``); False gives every token of a segment its
  advantage and keeps the mask (the paper's ablation).
  """
  checks.one_of("normalize", normalize, _NORMALIZE)
  checks.non_negative(eps=eps)

  def fn(batch: Batch) -> Batch:
    by = "spo_chain_advantages"
    low = batch.get(low_prob, by=by) if probability_mask else None
    adv = spo_chain_advantages_of(
      sequence_rewards(batch),
      batch.get(cuts, by=by),
      batch.get(values, by=by),
      batch.loss_mask(),
      low,
      normalize=normalize,
      eps=eps,
    )
    if low is None:
      return batch._replace(advantages_PGT=adv)
    mask = stats.f32(batch.mask_PGT) * stats.f32(jnp.asarray(low) > 0)
    return batch._replace(advantages_PGT=adv, mask_PGT=mask)

  return stateless_prepare(fn)
