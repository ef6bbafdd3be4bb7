"""Outcome advantages relative to a group: rewards [..., G] -> adv [..., G].

Conventions shared by every estimator in this module:

* The group (the samples of one prompt) is the LAST axis; leading axes are
  batch axes, usually [P, G]. Estimators that use batch statistics (batch_std,
  gpg, gdpo) reduce over every leading axis too.
* ``sample_mask_PG`` (default: all ones) marks valid samples; any non-zero
  entry counts as valid. Invalid samples are left out of every statistic, may
  hold any value (even NaN) and get advantage exactly 0. Padding groups of
  different sizes to [P, G_max] therefore gives each group the advantages it
  would get alone.
* A group with fewer than 2 valid samples gets advantage 0: no baseline can be
  formed from one sample. (verl instead uses mean 0 and std 1 there, i.e.
  A = R; rljax prefers no update over an unbaselined one.)
* A static group axis smaller than 2 raises (except remax, which needs no
  group).
* Standard deviations are unbiased (ddof=1); outputs are float32. Advantages
  are targets, but their gradients w.r.t. the rewards stay finite, also at
  zero-variance groups.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax._src import stats


def _validity(
  name: str, rewards: ArrayLike, sample_mask: Optional[ArrayLike]
) -> jax.Array:
  """float32 0/1 validity of each sample, the shape of `rewards`."""
  if sample_mask is None:
    return jnp.ones_like(stats.f32(rewards))  # keeps the rewards' sharding
  checks.same_shape([name, "sample_mask_PG"], rewards, sample_mask)
  return stats.f32(jnp.asarray(sample_mask) != 0)


def _prepare(
  rewards_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike],
  name: str = "rewards_PG",
  minimum: int = 2,
) -> tuple[jax.Array, jax.Array]:
  """Checked float32 rewards (0 at invalid samples) and their validity."""
  checks.group_size(name, rewards_PG, minimum)
  valid = _validity(name, rewards_PG, sample_mask_PG)
  # Zero the padding so that NaN or garbage there cannot leak into sums.
  return jnp.where(valid > 0, stats.f32(rewards_PG), 0.0), valid


def _member(r: jax.Array, valid: jax.Array) -> jax.Array:
  """One valid reward of each group (0 for empty groups), [..., 1]."""
  best = jnp.max(jnp.where(valid > 0, r, -jnp.inf), axis=-1, keepdims=True)
  return jnp.where(jnp.isfinite(best), best, 0.0)


def _group_stats(
  r: jax.Array, valid: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Valid count, mean and unbiased std of each group, each [..., 1]."""
  # Moments of r - ref, ref a member of the group: a constant group then has
  # mean exactly ref and std exactly 0, where float32 rounding of a plain mean
  # (e.g. of seven 0.7s) would be blown up by the division by std + eps.
  ref = _member(r, valid)
  n = jnp.sum(valid, axis=-1, keepdims=True)
  mean = stats.masked_mean(r - ref, valid, axis=-1, keepdims=True)
  var = stats.masked_var(r - ref, valid, axis=-1, keepdims=True)
  return n, ref + mean, stats.safe_sqrt(var)


def _scorable(valid: jax.Array, n: jax.Array) -> jax.Array:
  """True for valid samples of groups with at least 2 valid samples."""
  return (valid > 0) & (n >= 2)


def _finish(adv: jax.Array, valid: jax.Array, n: jax.Array) -> jax.Array:
  """Exactly 0 for invalid samples and for groups without a baseline."""
  return jnp.where(_scorable(valid, n), adv, 0.0)


def _grpo(r: jax.Array, valid: jax.Array, eps: float) -> jax.Array:
  """Group z-scores of already prepared rewards."""
  n, mean, std = _group_stats(r, valid)
  return _finish(stats.safe_div(r - mean, std + eps), valid, n)


def grpo(
  rewards_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  eps: float = 1e-6,
) -> jax.Array:
  """GRPO: each reward as a z-score within its group.

  A_i = (R_i - mean_g R) / (std_g R + eps), mean and unbiased std over the
  valid samples of the group.

  Args:
    rewards_PG: [..., G] outcome rewards; the last axis is the group.
    sample_mask_PG: [..., G] validity of each sample (default: all valid).
    eps: added to the std. Default 1e-6 (verl); TRL uses 1e-4, OpenRLHF 1e-9.

  Returns:
    [..., G] float32 advantages; 0 for invalid samples and for groups with
    fewer than 2 valid samples.

  References:
    Shao et al., 2024, DeepSeekMath, arXiv:2402.03300; verl
    `compute_grpo_outcome_advantage`, TRL `scale_rewards="group"`.
  """
  checks.non_negative(eps=eps)
  r, valid = _prepare(rewards_PG, sample_mask_PG)
  return _grpo(r, valid, eps)


def dr_grpo(
  rewards_PG: ArrayLike, sample_mask_PG: Optional[ArrayLike] = None
) -> jax.Array:
  """Dr. GRPO: the reward minus its group mean, not scaled by the std.

  A_i = R_i - mean_g R.

  Args:
    rewards_PG: [..., G] outcome rewards; the last axis is the group.
    sample_mask_PG: [..., G] validity of each sample (default: all valid).

  Returns:
    [..., G] float32 advantages; 0 for invalid samples and for groups with
    fewer than 2 valid samples.

  References:
    Liu et al., 2025, Understanding R1-Zero-Like Training, arXiv:2503.20783;
    verl `norm_adv_by_std_in_grpo=False`, TRL `scale_rewards="none"`,
    OpenRLHF `dr_grpo`.
  """
  r, valid = _prepare(rewards_PG, sample_mask_PG)
  n, mean, _ = _group_stats(r, valid)
  return _finish(r - mean, valid, n)


def batch_std(
  rewards_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  eps: float = 1e-4,
) -> jax.Array:
  """Group mean baseline, scaled by the std of the whole batch of rewards.

  A_i = (R_i - mean_g R) / (std_batch R + eps), where std_batch is the
  unbiased std over every valid sample of the array (all groups, including
  groups too small for a baseline).

  Args:
    rewards_PG: [..., G] outcome rewards; the last axis is the group.
    sample_mask_PG: [..., G] validity of each sample (default: all valid).
    eps: added to the std. Default 1e-4 (TRL).

  Returns:
    [..., G] float32 advantages; 0 for invalid samples and for groups with
    fewer than 2 valid samples.

  References:
    Hu et al., 2025, REINFORCE++, arXiv:2501.03262 ("group mean, batch std");
    TRL `GRPOConfig(scale_rewards="batch")`.
  """
  checks.non_negative(eps=eps)
  r, valid = _prepare(rewards_PG, sample_mask_PG)
  n, mean, _ = _group_stats(r, valid)
  adv = stats.safe_div(r - mean, stats.masked_std(r, valid) + eps)
  return _finish(adv, valid, n)


def rloo(
  rewards_PG: ArrayLike, sample_mask_PG: Optional[ArrayLike] = None
) -> jax.Array:
  """RLOO: the reward minus the mean reward of the other samples.

  A_i = R_i - mean_{j != i} R_j = n / (n - 1) (R_i - mean_g R), with n the
  number of valid samples in the group.

  Args:
    rewards_PG: [..., G] outcome rewards; the last axis is the group.
    sample_mask_PG: [..., G] validity of each sample (default: all valid).

  Returns:
    [..., G] float32 advantages; 0 for invalid samples and for groups with
    fewer than 2 valid samples (verl gives A = R there).

  References:
    Ahmadian et al., 2024, Back to Basics, arXiv:2402.14740; verl
    `compute_rloo_outcome_advantage`, OpenRLHF `rloo`.
  """
  r, valid = _prepare(rewards_PG, sample_mask_PG)
  n, mean, _ = _group_stats(r, valid)
  return _finish(stats.safe_div(n, n - 1) * (r - mean), valid, n)


def opo(
  rewards_PG: ArrayLike,
  lengths_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
) -> jax.Array:
  """OPO: the reward minus the length-weighted mean reward of its group.

  b_g = sum_j |o_j| R_j / sum_j |o_j| over the valid samples j of the group;
  A_i = R_i - b_g. A group whose valid samples have total length 0 gets b = 0.

  Args:
    rewards_PG: [..., G] outcome rewards; the last axis is the group.
    lengths_PG: [..., G] completion lengths |o_i| (number of tokens).
    sample_mask_PG: [..., G] validity of each sample (default: all valid).

  Returns:
    [..., G] float32 advantages; 0 for invalid samples and for groups with
    fewer than 2 valid samples (verl gives A = R there).

  References:
    Hao et al., 2025, On-Policy RL with Optimal Reward Baseline,
    arXiv:2505.23585; verl `compute_opo_outcome_advantage`.
  """
  checks.same_shape(["rewards_PG", "lengths_PG"], rewards_PG, lengths_PG)
  r, valid = _prepare(rewards_PG, sample_mask_PG)
  weight = jnp.where(valid > 0, stats.f32(lengths_PG), 0.0)
  n = jnp.sum(valid, axis=-1, keepdims=True)
  ref = _member(r, valid)  # exact 0 for constant groups, as in grpo
  baseline = ref + stats.masked_mean(r - ref, weight, axis=-1, keepdims=True)
  return _finish(r - baseline, valid, n)


def gpg(
  rewards_PG: ArrayLike, sample_mask_PG: Optional[ArrayLike] = None
) -> jax.Array:
  """GPG: the group-centred reward, scaled up by the share of zero rewards.

  alpha = N / max(M, 1), N = number of valid samples in the whole array,
  M = number of those with R != 0; A_i = alpha (R_i - mean_g R).

  Args:
    rewards_PG: [..., G] outcome rewards; the last axis is the group.
    sample_mask_PG: [..., G] validity of each sample (default: all valid).

  Returns:
    [..., G] float32 advantages; 0 for invalid samples and for groups with
    fewer than 2 valid samples.

  References:
    Chu et al., 2025, GPG: Group Policy Gradient, arXiv:2504.02546; verl
    `compute_gpg_outcome_advantage` (F_norm = 1).
  """
  r, valid = _prepare(rewards_PG, sample_mask_PG)
  n, mean, _ = _group_stats(r, valid)
  nonzero = jnp.sum(valid * (r != 0))
  alpha = jnp.sum(valid) / jnp.maximum(nonzero, 1.0)
  return _finish(alpha * (r - mean), valid, n)


def pass_at_k(
  rewards_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  normalize: bool = True,
  eps: float = 1e-6,
) -> jax.Array:
  """Pass@k: only the best sample of each group gets an advantage.

  The first valid sample with the largest reward gets A = R_max - R_2nd
  (divided by std_g R + eps if `normalize`), where R_2nd is the largest
  reward among the other valid samples; all other samples get 0.

  Args:
    rewards_PG: [..., G] outcome rewards; the last axis is the group.
    sample_mask_PG: [..., G] validity of each sample (default: all valid).
    normalize: divide by the group std (verl `norm_adv_by_std_in_grpo`,
      default True).
    eps: added to the std. Default 1e-6 (verl).

  Returns:
    [..., G] float32 advantages; 0 for invalid samples and for groups with
    fewer than 2 valid samples (verl raises there).

  References:
    Chen et al., 2025, Pass@k Training, arXiv:2503.19595 (cited by verl);
    verl `compute_grpo_passk_outcome_advantage`.
  """
  checks.non_negative(eps=eps)
  r, valid = _prepare(rewards_PG, sample_mask_PG)
  n, _, std = _group_stats(r, valid)
  candidates = jnp.where(valid > 0, r, -jnp.inf)
  best = jnp.argmax(candidates, axis=-1)  # ties: the earliest sample wins
  is_best = jax.nn.one_hot(best, r.shape[-1], dtype=bool)
  r_max = jnp.max(candidates, axis=-1, keepdims=True)
  r_2nd = jnp.max(jnp.where(is_best, -jnp.inf, candidates), -1, keepdims=True)
  # Groups with < 2 valid samples have an infinite gap; replace it before it
  # reaches a division, whose gradient would then be NaN.
  gap = jnp.where(n >= 2, r_max - r_2nd, 0.0)
  if normalize:
    gap = stats.safe_div(gap, std + eps)
  return _finish(jnp.where(is_best, gap, 0.0), valid, n)


def remax(
  rewards_PG: ArrayLike,
  baseline_P: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
) -> jax.Array:
  """ReMax: the reward minus the reward of the prompt's greedy completion.

  A_i = R_i - b, b = reward of the greedy (do_sample=False) completion of the
  same prompt. Needs no group, so G = 1 is allowed.

  Args:
    rewards_PG: [..., G] outcome rewards; the last axis is the group.
    baseline_P: [...] greedy-completion rewards, ``rewards_PG.shape[:-1]``.
    sample_mask_PG: [..., G] validity of each sample (default: all valid).

  Returns:
    [..., G] float32 advantages; 0 for invalid samples.

  References:
    Li et al., 2023, ReMax, arXiv:2310.10505; verl
    `compute_remax_outcome_advantage`.
  """
  r, valid = _prepare(rewards_PG, sample_mask_PG, minimum=1)
  leading = r.shape[:-1]
  checks.rank("baseline_P", baseline_P, len(leading), "rewards_PG.shape[:-1]")
  checks.leading_shape(
    "baseline_P", baseline_P, leading, of="rewards_PG[..., 0]"
  )
  adv = r - stats.f32(baseline_P)[..., None]
  return jnp.where(valid > 0, adv, 0.0)


def gdpo(
  rewards_PGK: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  weights: Optional[ArrayLike] = None,
  eps: float = 1e-4,
) -> jax.Array:
  """GDPO: normalise each of K rewards in its group, sum, then batch-normalise.

  z_ik = (r_ik - mean_g r_k) / (std_g r_k + eps) per reward k;
  S_i = sum_k w_k z_ik;
  A_i = (S_i - mean_batch S) / (std_batch S + eps), batch statistics over the
  valid samples of groups with at least 2 valid samples (elsewhere S has no
  meaning: those samples get 0 and stay out of the batch statistics).

  Args:
    rewards_PGK: [..., G, K] rewards, K reward functions per sample.
    sample_mask_PG: [..., G] validity of each sample (default: all valid).
    weights: [K] weights w_k of the rewards (default: all ones).
    eps: added to every std. Default 1e-4 (TRL).

  Returns:
    [..., G] float32 advantages; 0 for invalid samples and for groups with
    fewer than 2 valid samples.

  References:
    NVIDIA, 2026, GDPO, arXiv:2601.05242; TRL
    `GRPOConfig(multi_objective_aggregation="normalize_then_sum")`.
  """
  checks.non_negative(eps=eps)
  if np.ndim(rewards_PGK) < 2:
    checks.rank("rewards_PGK", rewards_PGK, 2, "[..., G, K]")
  *leading, num_k = np.shape(rewards_PGK)
  # A free stand-in with the [..., G] shape, so that the error shows it.
  checks.group_size("rewards_PGK[..., 0]", np.broadcast_to(0, leading))
  w = jnp.ones((num_k,)) if weights is None else stats.f32(weights)
  checks.rank("weights", w, 1, f"[K] with K = {num_k} rewards")
  checks.leading_shape("weights", w, (num_k,), of="the K axis of rewards_PGK")
  # The K axis goes first so that the group is the last axis again.
  r_KPG = jnp.moveaxis(stats.f32(rewards_PGK), -1, 0)
  r_KPG, valid = _prepare(r_KPG, _k_mask(sample_mask_PG, r_KPG), "rewards_PGK")
  z_KPG = _grpo(r_KPG, valid, eps)
  s = jnp.tensordot(w, z_KPG, axes=1)
  valid, n = valid[0], jnp.sum(valid[0], axis=-1, keepdims=True)
  scored = stats.f32(_scorable(valid, n))
  mean = stats.masked_mean(s, scored)
  adv = stats.safe_div(s - mean, stats.masked_std(s, scored) + eps)
  return _finish(adv, valid, n)


def _k_mask(
  sample_mask_PG: Optional[ArrayLike], r_KPG: jax.Array
) -> Optional[jax.Array]:
  """The [..., G] sample mask repeated over the leading K axis of `r_KPG`."""
  if sample_mask_PG is None:
    return None
  checks.same_shape(
    ["rewards_PGK[..., 0]", "sample_mask_PG"], r_KPG[0], sample_mask_PG
  )
  return jnp.broadcast_to(jnp.asarray(sample_mask_PG), r_KPG.shape)
