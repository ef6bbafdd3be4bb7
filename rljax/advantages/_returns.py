"""Token-level returns and advantages: arrays [..., T] with a token mask.

``mask_PGT`` marks completion tokens (1) against padding and, in multi-turn
data, observation tokens (0). Every output is multiplied by the mask, so
masked positions are exactly 0. Recursions over tokens run as a reverse
`lax.scan` over T; leading axes are batch axes. Outputs are float32.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats
from rljax.advantages import _group


def _reverse_scan(step, num_carry: int, *xs_T: jax.Array, init=None):
  """Runs `step` from the last token to the first; outputs [..., T].
  `init`: the first carry (default zeros)."""
  xs = tuple(jnp.moveaxis(x, -1, 0) for x in xs_T)
  # Zeros built from the data keep its sharding (explicit-axes meshes
  # require the carry to have the same sharding type as the scan body's).
  zero = jnp.zeros_like(xs[0][0])
  init = (zero,) * num_carry if init is None else init
  _, ys = jax.lax.scan(step, init, xs, reverse=True)
  return jnp.moveaxis(ys, 0, -1)


def outcome_to_token_rewards(
  rewards_PG: ArrayLike, mask_PGT: ArrayLike
) -> jax.Array:
  """Places each sequence's scalar reward on its last valid token.

  r_t = R if t is the last token with m_t > 0, else 0. A sequence without
  valid tokens gets no reward anywhere.

  Args:
    rewards_PG: [...] scalar outcome rewards, one per sequence.
    mask_PGT: [..., T] completion-token mask.

  Returns:
    [..., T] float32 token rewards.

  References:
    verl reward managers (reward at `valid_response_length - 1`).
  """
  checks.rank(
    "mask_PGT", mask_PGT, len(jnp.shape(rewards_PG)) + 1, "rewards_PG + [T]"
  )
  checks.leading_shape(
    "mask_PGT", mask_PGT, jnp.shape(rewards_PG), "rewards_PG"
  )
  valid = jnp.asarray(mask_PGT) != 0
  # Valid tokens at or after t; it is 1 exactly at the last valid token.
  remaining = jnp.cumsum(valid[..., ::-1], axis=-1)[..., ::-1]
  last = valid & (remaining == 1)
  return jnp.where(last, stats.f32(rewards_PG)[..., None], 0.0)


def discounted_returns(
  token_rewards_PGT: ArrayLike, mask_PGT: ArrayLike, *, gamma: float = 1.0
) -> jax.Array:
  """Discounted reward-to-go of every valid token, skipping masked tokens.

  G_t = r_t + gamma G_t', t' the next valid token after t (G = 0 past the
  last one), i.e. G_t = sum_{k >= t, m_k > 0} gamma^(k - t) r_k with k - t
  counted in valid tokens only. Masked tokens (padding, multi-turn
  observations) neither add reward nor discount, as in `gae`, so
  ``gae(r, 0, m, gamma=g, lam=1)`` gives these returns. For the usual
  right-padded masks this is verl's REINFORCE++ return (reset after EOS);
  on masks with holes verl instead restarts the sum at each hole.

  Args:
    token_rewards_PGT: [..., T] per-token rewards.
    mask_PGT: [..., T] completion-token mask.
    gamma: discount factor in [0, 1]. Default 1 (verl, OpenRLHF).

  Returns:
    [..., T] float32 returns, 0 at masked tokens.

  References:
    verl `compute_reinforce_plus_plus_outcome_advantage`, OpenRLHF
    `get_cumulative_returns`.
  """
  checks.in_range("gamma", gamma, 0.0, 1.0)
  checks.same_shape(
    ["token_rewards_PGT", "mask_PGT"], token_rewards_PGT, mask_PGT
  )
  r, m = stats.f32(token_rewards_PGT), stats.f32(mask_PGT)

  def step(carry, rm):
    r_t, m_t = rm
    running = m_t * (r_t + gamma * carry[0]) + (1 - m_t) * carry[0]
    return (running,), running * m_t

  return _reverse_scan(step, 1, r, m)


def whiten(
  x: ArrayLike, mask: ArrayLike, *, eps: float = 1e-8, shift_mean: bool = True
) -> jax.Array:
  """Standardises `x` over all its masked entries.

  y = (x - mu) / sqrt(var + eps), mu and unbiased var over every entry with
  mask > 0; if not `shift_mean`, mu is added back (only the scale changes).
  With fewer than 2 masked entries var is taken as 0.

  Args:
    x: values, any shape.
    mask: 0/1 mask, the shape of `x`.
    eps: added to the variance. Default 1e-8 (verl `masked_whiten`).
    shift_mean: whether the output has mean 0 (True, verl default).

  Returns:
    float32 array the shape of `x`, 0 where the mask is 0.

  References:
    verl `verl.utils.torch_functional.masked_whiten`.
  """
  checks.positive(eps=eps)
  checks.same_shape(["x", "mask"], x, mask)
  x, mask = stats.f32(x), stats.f32(mask)
  mean, var = stats.masked_mean(x, mask), stats.masked_var(x, mask)
  y = (x - mean) * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    y += mean
  return y * mask


def reinforce_pp(
  token_rewards_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  *,
  gamma: float = 1.0,
  eps: float = 1e-8,
) -> jax.Array:
  """REINFORCE++: discounted returns whitened over the whole batch.

  A_t = whiten(G_t) over every valid token of the batch, G from
  `discounted_returns`.

  Args:
    token_rewards_PGT: [..., T] per-token rewards (outcome reward on the
      last token, see `outcome_to_token_rewards`, plus any KL penalty).
    mask_PGT: [..., T] completion-token mask.
    gamma: discount factor in [0, 1]. Default 1 (verl, OpenRLHF).
    eps: added to the variance. Default 1e-8 (verl; OpenRLHF instead
      clamps the biased variance at 1e-8).

  Returns:
    [..., T] float32 advantages, 0 at masked tokens.

  References:
    Hu et al., 2025, REINFORCE++, arXiv:2501.03262; verl
    `reinforce_plus_plus`, OpenRLHF `reinforce`.
  """
  returns = discounted_returns(token_rewards_PGT, mask_PGT, gamma=gamma)
  return whiten(returns, mask_PGT, eps=eps)


def reinforce_pp_baseline(
  rewards_PG: ArrayLike,
  mask_PGT: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  eps: float = 1e-8,
) -> jax.Array:
  """REINFORCE++-baseline: group mean baseline, then batch whitening.

  A_i = R_i - mean_g R (`dr_grpo`), broadcast over the tokens of sample i and
  whitened over every valid token of the batch. Samples of groups with fewer
  than 2 valid samples get 0 and are left out of the whitening (verl uses
  mean 0 there, i.e. A = R before whitening).

  Args:
    rewards_PG: [..., G] outcome rewards; the last axis is the group.
    mask_PGT: [..., G, T] completion-token mask.
    sample_mask_PG: [..., G] validity of each sample (default: all valid).
    eps: added to the variance. Default 1e-8 (verl `masked_whiten`).

  Returns:
    [..., G, T] float32 advantages, 0 at masked tokens and invalid samples.

  References:
    Hu et al., 2025, REINFORCE++, arXiv:2501.03262; verl
    `reinforce_plus_plus_baseline`, OpenRLHF `reinforce_baseline`.
  """
  adv_PG = _group.dr_grpo(rewards_PG, sample_mask_PG)
  checks.rank("mask_PGT", mask_PGT, adv_PG.ndim + 1, "rewards_PG + [T]")
  checks.leading_shape("mask_PGT", mask_PGT, adv_PG.shape, "rewards_PG")
  valid = _group._validity("rewards_PG", rewards_PG, sample_mask_PG)
  n = jnp.sum(valid, axis=-1, keepdims=True)
  scored = stats.f32(_group._scorable(valid, n))
  mask = stats.f32(mask_PGT) * scored[..., None]
  adv_PGT = jnp.broadcast_to(adv_PG[..., None], mask.shape)
  return whiten(adv_PGT, mask, eps=eps)


def gae(
  token_rewards_PGT: ArrayLike,
  values_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  *,
  gamma: float = 1.0,
  lam: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """Generalised advantage estimation, skipping masked tokens (verl).

  From the last token back, with V' = 0 and A' = 0 after the end:
    delta_t = r_t + gamma V' - V_t;  a_t = delta_t + gamma lam A';
    where m_t > 0: V' <- V_t and A' <- a_t (masked tokens leave both as
    they are, so multi-turn observation tokens are skipped); A_t = A'.
  Returns are A + V. Neither output is whitened (see `whiten`).

  Args:
    token_rewards_PGT: [..., T] per-token rewards.
    values_PGT: [..., T] value estimates V_t (of the policy that sampled).
    mask_PGT: [..., T] completion-token mask.
    gamma: discount factor in [0, 1]. Default 1 (verl, OpenRLHF).
    lam: GAE lambda in [0, 1]. Default 1 (verl, OpenRLHF; TRL PPO 0.95).

  Returns:
    (advantages, returns), each [..., T] float32 and 0 at masked tokens.

  References:
    Schulman et al., 2015, GAE, arXiv:1506.02438; verl
    `compute_gae_advantage_return`.
  """
  checks.in_range("gamma", gamma, 0.0, 1.0)
  checks.in_range("lam", lam, 0.0, 1.0)
  names = ["token_rewards_PGT", "values_PGT", "mask_PGT"]
  checks.same_shape(names, token_rewards_PGT, values_PGT, mask_PGT)
  r, v, m = (stats.f32(a) for a in (token_rewards_PGT, values_PGT, mask_PGT))

  def step(carry, rvm):
    next_value, last_adv = carry
    r_t, v_t, m_t = rvm
    adv = r_t + gamma * next_value - v_t + gamma * lam * last_adv
    next_value = v_t * m_t + (1 - m_t) * next_value
    last_adv = adv * m_t + (1 - m_t) * last_adv
    return (next_value, last_adv), last_adv

  adv = _reverse_scan(step, 2, r, v, m)
  return adv * m, (adv + v) * m


def egae(
  token_rewards_PGT: ArrayLike,
  values_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  unfinished_PG: ArrayLike,
  *,
  gamma: float = 1.0,
  lam: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """Extended GAE of T-PPO (arXiv 2506.15050, section 3): GAE on responses
  that are still being generated.

  A response cut at its l-th token has no next state's value; EGAE uses
  the last one, V(s_l) ~ V(s_{l-1}), so the last step of an unfinished
  response is delta = r + gamma V(s_{l-1}) - V(s_{l-1}), and the rest
  is `gae` (whose value after the end is 0, as for finished responses):
  A_t = sum_k (gamma lam)^k delta_{t+k}. Unfinished responses have no
  outcome yet: give them 0 rewards. We read the method from the paper's
  abstract and the catalog's formula (row 1.8: the body was not
  available here).

  Args:
    token_rewards_PGT, values_PGT, mask_PGT: as `gae`.
    unfinished_PG: [...] 1 for a response still running.
    gamma, lam: as `gae`.

  Returns:
    (advantages, returns), [..., T] float32, 0 at masked tokens.
  """
  checks.in_range("gamma", gamma, 0.0, 1.0)
  checks.in_range("lam", lam, 0.0, 1.0)
  names = ["token_rewards_PGT", "values_PGT", "mask_PGT"]
  checks.same_shape(names, token_rewards_PGT, values_PGT, mask_PGT)
  if jnp.shape(unfinished_PG) != jnp.shape(mask_PGT)[:-1]:
    raise ValueError(
      f"unfinished_PG has shape {jnp.shape(unfinished_PG)}; it must be"
      f" mask_PGT's without the token axis, {jnp.shape(mask_PGT)[:-1]}."
    )
  r, v, m = (stats.f32(a) for a in (token_rewards_PGT, values_PGT, mask_PGT))
  last = (m > 0) & (jnp.cumsum(m[..., ::-1] > 0, -1)[..., ::-1] == 1)
  v_last = jnp.sum(jnp.where(last, v, 0.0), -1)
  bootstrap = v_last * stats.f32(unfinished_PG)

  def step(carry, rvm):
    next_value, last_adv = carry
    r_t, v_t, m_t = rvm
    adv = r_t + gamma * next_value - v_t + gamma * lam * last_adv
    next_value = v_t * m_t + (1 - m_t) * next_value
    last_adv = adv * m_t + (1 - m_t) * last_adv
    return (next_value, last_adv), last_adv

  adv = _reverse_scan(
    step, 2, r, v, m, init=(bootstrap, jnp.zeros_like(bootstrap))
  )
  return adv * m, (adv + v) * m
