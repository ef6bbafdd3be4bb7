"""Turn-level credit for multi-turn episodes: per-turn arrays [P, G, N].

An agent episode is one completion: action 0, observation 0, action 1, ...
The episode runner (`rljax.envs`) records for each sample and turn k < N
(N = the environment's max_turns):

* ``turn_ids_PGT`` int [P, G, T]: the turn of each completion token (action
  k's tokens and the observation that answers it), -1 on padding;
* ``turns_PG`` int [P, G]: the number of actions the episode took;
* ``turn_rewards_PGN`` [P, G, N]: the reward for action k;
* ``state_ids_PGN`` int [P, G, N]: an id of the state action k acted in
  (equal ids = identical states, comparable across the batch), -1 where the
  environment reports none.

Turn k of sample (p, g) is valid when k < turns_PG[p, g] and the sample is
valid (``sample_mask_PG``). Groups are the G samples of a prompt, as for the
outcome estimators of `rljax.advantages`; a statistic over fewer than 2
members gives advantage 0 (verl-agent uses mean 0 and std 1 there, i.e.
A = R; rljax prefers no update over an unbaselined one). Outputs are float32
and exactly 0 at invalid turns. `turns_to_tokens` puts each turn's value on
its tokens; the loss mask then keeps the action tokens only.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax._src import stats
from rljax.advantages import _group
from rljax.advantages import _returns

_SCALES = ("std", "none")
_OVER = ("position", "group")
_EPISODE_STATS = ("episodes", "steps")


def _integer(name: str, x: ArrayLike) -> None:
  if not jnp.issubdtype(jnp.result_type(x), jnp.integer):
    raise ValueError(
      f"{name} must hold integer ids, got dtype {jnp.result_type(x)}; pass"
      " the episode runner's int32 array."
    )


def _check_turns(turns_PG: ArrayLike, **per_turn: ArrayLike) -> None:
  """turns_PG is [P, G] integers; each per-turn array is [P, G, N]."""
  checks.rank("turns_PG", turns_PG, 2, "[P, G]")
  _integer("turns_PG", turns_PG)
  for name, x in per_turn.items():
    checks.rank(name, x, 3, "[P, G, N]")
    checks.leading_shape(name, x, np.shape(turns_PG), "turns_PG")
  if len({np.shape(x) for x in per_turn.values()}) > 1:
    listed = ", ".join(f"{k} {np.shape(v)}" for k, v in per_turn.items())
    raise ValueError(f"per-turn arrays must have one shape: {listed}.")


def turn_valid(
  turns_PG: ArrayLike,
  num_turns: int,
  sample_mask_PG: Optional[ArrayLike] = None,
) -> jax.Array:
  """[P, G, N] bool: turn k < turns_PG of a valid sample.

  Args:
    turns_PG: [P, G] int number of actions of each episode.
    num_turns: N, the static length of the turn axis.
    sample_mask_PG: [P, G] validity of each sample (default: all valid).
  """
  checks.rank("turns_PG", turns_PG, 2, "[P, G]")
  _integer("turns_PG", turns_PG)
  checks.positive(num_turns=num_turns)
  k = jax.lax.broadcasted_iota(jnp.int32, (1, 1, num_turns), 2)
  valid = k < jnp.asarray(turns_PG)[..., None]
  if sample_mask_PG is not None:
    checks.same_shape(["turns_PG", "sample_mask_PG"], turns_PG, sample_mask_PG)
    valid = valid & (jnp.asarray(sample_mask_PG) != 0)[..., None]
  return valid


def turn_returns(
  turn_rewards_PGN: ArrayLike, turns_PG: ArrayLike, *, gamma: float = 1.0
) -> jax.Array:
  """Discounted return from each turn: G_k = sum_{l >= k} gamma^(l-k) r_l.

  The sum runs over the episode's turns l < turns_PG (rewards past the end
  are ignored); G_k = 0 for k >= turns_PG. With gamma = 1, G_0 is the
  episode's return.

  Args:
    turn_rewards_PGN: [P, G, N] reward of each action.
    turns_PG: [P, G] int number of actions taken.
    gamma: discount per turn in [0, 1]. Default 1.

  Returns:
    [P, G, N] float32 returns, 0 past each episode.

  References:
    verl-agent `compute_step_discounted_returns` (GiGPO, arXiv 2505.10978,
    Eq. 5).
  """
  checks.in_range("gamma", gamma, 0.0, 1.0)
  _check_turns(turns_PG, turn_rewards_PGN=turn_rewards_PGN)
  valid = stats.f32(turn_valid(turns_PG, np.shape(turn_rewards_PGN)[-1]))
  r = jnp.where(valid > 0, stats.f32(turn_rewards_PGN), 0.0)

  def step(carry, rv):
    r_k, v_k = rv
    g = r_k + gamma * carry[0]
    return (g,), g * v_k

  return _returns._reverse_scan(step, 1, r, valid)


def turns_to_tokens(
  values_PGN: ArrayLike, turn_ids_PGT: ArrayLike
) -> jax.Array:
  """Each token gets its turn's value: out[p, g, t] = v[p, g, turn_ids[t]].

  Tokens with turn id -1 (padding) or >= N get 0. Observation tokens carry
  their turn's id and get its value too: multiply by the loss mask
  (actions only) to train on actions.

  Args:
    values_PGN: [P, G, N] per-turn values (advantages, returns).
    turn_ids_PGT: [P, G, T] int turn of each completion token.

  Returns:
    [P, G, T] float32.
  """
  checks.rank("values_PGN", values_PGN, 3, "[P, G, N]")
  checks.rank("turn_ids_PGT", turn_ids_PGT, 3, "[P, G, T]")
  checks.leading_shape(
    "turn_ids_PGT", turn_ids_PGT, np.shape(values_PGN)[:2], "values_PGN[:2]"
  )
  _integer("turn_ids_PGT", turn_ids_PGT)
  ids = jnp.asarray(turn_ids_PGT)
  n = np.shape(values_PGN)[-1]
  out = jnp.take_along_axis(stats.f32(values_PGN), jnp.clip(ids, 0, n - 1), -1)
  return jnp.where((ids >= 0) & (ids < n), out, 0.0)


def _turn_onehot(turn_ids_PGT, mask_PGT, n: int) -> jax.Array:
  """[P, G, T, N] bool: token t is a valid (mask > 0) token of turn k."""
  ids = jnp.asarray(turn_ids_PGT)[..., None]
  k = jax.lax.broadcasted_iota(jnp.int32, (1, 1, 1, n), 3)
  return (ids == k) & (jnp.asarray(mask_PGT) > 0)[..., None]


def _check_tokens(turn_ids_PGT, mask_PGT) -> None:
  checks.rank("turn_ids_PGT", turn_ids_PGT, 3, "[P, G, T]")
  checks.same_shape(["turn_ids_PGT", "mask_PGT"], turn_ids_PGT, mask_PGT)
  _integer("turn_ids_PGT", turn_ids_PGT)


def per_turn_sum(
  x_PGT: ArrayLike, turn_ids_PGT: ArrayLike, mask_PGT: ArrayLike, num_turns: int
) -> jax.Array:
  """[P, G, N] sum of x over the valid (mask > 0) tokens of each turn."""
  _check_tokens(turn_ids_PGT, mask_PGT)
  checks.same_shape(["x_PGT", "mask_PGT"], x_PGT, mask_PGT)
  checks.positive(num_turns=num_turns)
  hot = _turn_onehot(turn_ids_PGT, mask_PGT, num_turns)
  return jnp.sum(jnp.where(hot, stats.f32(x_PGT)[..., None], 0.0), axis=2)


def turn_rewards_to_tokens(
  turn_rewards_PGN: ArrayLike, turn_ids_PGT: ArrayLike, mask_PGT: ArrayLike
) -> jax.Array:
  """Each turn's reward on the last valid (mask > 0) token of its action.

  The token layout of a Bellman backup over actions: r_t = r_k at the last
  action token of turn k, 0 elsewhere (observation tokens are masked).

  Args:
    turn_rewards_PGN: [P, G, N] reward of each action.
    turn_ids_PGT: [P, G, T] int turn of each token.
    mask_PGT: [P, G, T] action-token mask (the loss mask).

  Returns:
    [P, G, T] float32 token rewards.
  """
  _check_tokens(turn_ids_PGT, mask_PGT)
  checks.rank("turn_rewards_PGN", turn_rewards_PGN, 3, "[P, G, N]")
  n, t_len = np.shape(turn_rewards_PGN)[-1], np.shape(mask_PGT)[-1]
  hot = _turn_onehot(turn_ids_PGT, mask_PGT, n)
  t = jax.lax.broadcasted_iota(jnp.int32, (1, 1, t_len, 1), 2)
  last_PGN = jnp.max(jnp.where(hot, t, -1), axis=2)
  last_PGT = jnp.sum(jnp.where(hot, last_PGN[:, :, None, :], 0), axis=-1)
  is_last = jnp.any(hot, axis=-1) & (t[..., 0] == last_PGT)
  return jnp.where(
    is_last, turns_to_tokens(turn_rewards_PGN, turn_ids_PGT), 0.0
  )


def _flat(x_PGN: jax.Array) -> jax.Array:
  p, g, n = x_PGN.shape
  return x_PGN.reshape(p, g * n)


def _grouped(
  values_PS: jax.Array,
  valid_PS: jax.Array,
  same_PSS: jax.Array,
  *,
  scale: str,
  eps: float,
  ddof: int = 1,
) -> tuple[jax.Array, jax.Array]:
  """(R_a - mean) / F over a's group {b: same[a, b], b valid}, and its size.

  F = std (with `ddof`) + eps, or 1 for scale "none". The mean is taken of
  the differences R_b - R_a, so a group of equal values gives exactly 0.
  Steps in groups of fewer than 2, and invalid steps, get 0.
  """
  member = same_PSS & valid_PS[:, :, None] & valid_PS[:, None, :]
  w = stats.f32(member)
  n = jnp.sum(w, axis=-1)
  diff = values_PS[:, None, :] - values_PS[:, :, None]  # [p, a, b] R_b - R_a
  shift = stats.safe_div(jnp.sum(w * diff, axis=-1), n)  # mean - R_a
  centered = -shift
  if scale == "std":
    sq = jnp.square(diff - shift[:, :, None])
    var = stats.safe_div(jnp.sum(w * sq, axis=-1), n - ddof)
    centered = stats.safe_div(centered, stats.safe_sqrt(var) + eps)
  return jnp.where(valid_PS & (n >= 2), centered, 0.0), n


def turn_grpo(
  returns_PGN: ArrayLike,
  turns_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  over: str = "position",
  scale: str = "std",
  eps: float = 1e-6,
) -> jax.Array:
  """Turn-level group-relative advantages of per-turn returns.

  A_{i,k} = (G_{i,k} - mean G) / F, F = std G + eps (unbiased std) or 1
  (``scale="none"``), the statistics over:

  * ``over="position"`` (default): turn k of the group's episodes that
    reached turn k. A baseline that depends only on the prompt and the turn
    index leaves the policy gradient unbiased, and comparing turn k with
    turn k compares returns over the same remaining horizon: with
    discounting or per-turn rewards, returns of early and late turns differ
    systematically, and pooling them would favour one end of the episode.
    A turn only one episode of the group reached has no baseline and gets 0.
  * ``over="group"``: every valid turn of the group's episodes pooled (the
    statistics of verl-agent's `episode_norm_reward` with
    ``compute_mean_std_cross_steps``); every turn of a group of >= 2 turns
    gets a baseline.

  With one turn per episode both are `advantages.grpo` (or
  `advantages.dr_grpo` for scale "none") on the returns.

  Args:
    returns_PGN: [P, G, N] per-turn returns (`turn_returns`).
    turns_PG: [P, G] int number of actions.
    sample_mask_PG: [P, G] validity of each sample (default: all valid).
    over: "position" or "group".
    scale: "std" or "none".
    eps: added to the std. Default 1e-6 (verl).

  Returns:
    [P, G, N] float32 advantages, 0 at invalid turns.
  """
  checks.one_of("over", over, _OVER)
  checks.one_of("scale", scale, _SCALES)
  checks.non_negative(eps=eps)
  _check_turns(turns_PG, returns_PGN=returns_PGN)
  p, g, n = np.shape(returns_PGN)
  valid = turn_valid(turns_PG, n, sample_mask_PG)
  if over == "position":
    k = jnp.tile(jnp.arange(n), g)
    same = (k[:, None] == k[None, :])[None]
  else:
    same = jnp.ones((1, g * n, g * n), bool)
  r = jnp.where(valid, stats.f32(returns_PGN), 0.0)
  adv, _ = _grouped(_flat(r), _flat(valid), same, scale=scale, eps=eps)
  return adv.reshape(p, g, n)


def _state_ids(state_ids_PGN: ArrayLike) -> jax.Array:
  _integer("state_ids_PGN", state_ids_PGN)
  return jnp.asarray(state_ids_PGN)


def anchor_advantages(
  returns_PGN: ArrayLike,
  state_ids_PGN: ArrayLike,
  turns_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  scale: str = "std",
  eps: float = 1e-6,
) -> jax.Array:
  """GiGPO's step-level advantage A^S over anchor-state groups.

  The valid steps of a prompt's episodes that acted in the same state
  (equal ``state_ids``; a trajectory that revisits a state contributes each
  visit) form a step group; A^S = (R_t - mean R) / F within it, F = std + eps
  (unbiased std) or 1. Steps alone in their state, and steps with state id
  -1 (not reported), get A^S = 0: in verl-agent's `step_norm_reward` a
  singleton group has mean = its own return, hence 0 as well.

  Args:
    returns_PGN: [P, G, N] discounted returns R_t (`turn_returns`).
    state_ids_PGN: [P, G, N] int state id of each step (-1: unknown).
    turns_PG: [P, G] int number of actions.
    sample_mask_PG: [P, G] validity of each sample (default: all valid).
    scale: "std" (verl-agent ``mean_std_norm``) or "none" (``mean_norm``).
    eps: added to the std. Default 1e-6 (verl-agent).

  Returns:
    [P, G, N] float32 step advantages.
  """
  checks.one_of("scale", scale, _SCALES)
  checks.non_negative(eps=eps)
  _check_turns(turns_PG, returns_PGN=returns_PGN, state_ids_PGN=state_ids_PGN)
  p, g, n = np.shape(returns_PGN)
  sid = _flat(_state_ids(state_ids_PGN))
  valid = _flat(turn_valid(turns_PG, n, sample_mask_PG)) & (sid >= 0)
  same = sid[:, :, None] == sid[:, None, :]
  r = jnp.where(valid, _flat(stats.f32(returns_PGN)), 0.0)
  adv, _ = _grouped(r, valid, same, scale=scale, eps=eps)
  return adv.reshape(p, g, n)


def _episode_return(turn_rewards_PGN, turns_PG) -> jax.Array:
  """[P, G] undiscounted sum of the rewards of each episode's turns."""
  return turn_returns(turn_rewards_PGN, turns_PG)[..., 0]


def _episode_advantages(
  episode_PG: jax.Array,
  turns_PG: ArrayLike,
  n: int,
  sample_mask_PG: Optional[ArrayLike],
  *,
  scale: str,
  stats_over: str,
  eps: float,
) -> jax.Array:
  """GiGPO's A^E, [P, G]: GRPO over episodes, or over steps (each episode
  counted once per turn, verl-agent's ``compute_mean_std_cross_steps``)."""
  if stats_over == "episodes":
    # An episode that took no action has no step to credit: leave it out.
    took = turn_valid(turns_PG, 1, sample_mask_PG)[..., 0]
    if scale == "std":
      return _group.grpo(episode_PG, took, eps=eps)
    return _group.dr_grpo(episode_PG, took)
  p, g = episode_PG.shape
  valid = _flat(turn_valid(turns_PG, n, sample_mask_PG))
  r = jnp.broadcast_to(episode_PG[..., None], (p, g, n))
  r = jnp.where(valid, _flat(r), 0.0)
  same = jnp.ones((1, g * n, g * n), bool)
  adv, _ = _grouped(r, valid, same, scale=scale, eps=eps)
  # Every valid step of an episode has the same value: take their mean.
  steps = jnp.sum(stats.f32(valid.reshape(p, g, n)), -1)
  return stats.safe_div(jnp.sum(adv.reshape(p, g, n), -1), steps)


def gigpo(
  turn_rewards_PGN: ArrayLike,
  state_ids_PGN: ArrayLike,
  turns_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  gamma: float = 0.95,
  omega: float = 1.0,
  scale: str = "std",
  episode_stats: str = "episodes",
  eps: float = 1e-6,
) -> jax.Array:
  """GiGPO (arXiv 2505.10978): episode- plus anchor-state step advantages.

    A^E(tau_i) = (R(tau_i) - mean_j R(tau_j)) / F       (Eq. 3)
    R_t = sum_{k >= t} gamma^(k-t) r_k                   (Eq. 5)
    A^S(a_t) = (R_t - mean_{step group} R) / F           (Eq. 7)
    A(a_t) = A^E(tau_i) + omega A^S(a_t)                 (Eq. 8)

  R(tau) is the undiscounted episode return (sum of the turn rewards); the
  step group of a step holds every valid step of the prompt's episodes that
  acted in the same anchor state (`anchor_advantages`: a step alone in its
  state, or with state id -1, gets A^S = 0). F = std + eps or 1.

  What was checked: the official code (langfengQ/verl-agent
  `gigpo/core_gigpo.py`, read in the mirrors vanzll/verl-agent and
  CazeroZ/hgpo; `compute_step_discounted_returns`, `episode_norm_reward`,
  `build_step_group`, `step_norm_reward`; the run scripts): gamma 0.95
  (``algorithm.gamma``), omega 1 (``step_advantage_w``), F from
  ``mode`` = ``mean_std_norm`` (std, unbiased, eps 1e-6; the trainer's
  default) or ``mean_norm`` (F = 1, the function's default; scripts use
  both), exact-match grouping of anchor observations within a prompt group
  (the similarity-threshold variant needs text, not ids). The code computes
  the episode statistics over step rows, each episode counted once per
  step it took (``compute_mean_std_cross_steps=True``); the paper's Eq. 3
  is over trajectories: ``episode_stats="episodes"`` (default) follows the
  paper, ``"steps"`` the code. A prompt with one valid episode gets A^E = 0
  (the code: mean 0, std 1, i.e. A^E = R). The paper's text itself was read
  only through its abstract.

  Args:
    turn_rewards_PGN: [P, G, N] reward of each action.
    state_ids_PGN: [P, G, N] int anchor-state id of each step (-1: none).
    turns_PG: [P, G] int number of actions.
    sample_mask_PG: [P, G] validity of each sample (default: all valid).
    gamma: discount of the step returns. Default 0.95 (paper, code).
    omega: weight of A^S. Default 1.
    scale: "std" (``mean_std_norm``) or "none" (``mean_norm``).
    episode_stats: "episodes" (paper) or "steps" (code).
    eps: added to the stds. Default 1e-6.

  Returns:
    [P, G, N] float32 advantages, 0 at invalid turns.
  """
  checks.one_of("scale", scale, _SCALES)
  checks.one_of("episode_stats", episode_stats, _EPISODE_STATS)
  checks.non_negative(eps=eps)
  returns = turn_returns(turn_rewards_PGN, turns_PG, gamma=gamma)
  step = anchor_advantages(
    returns, state_ids_PGN, turns_PG, sample_mask_PG, scale=scale, eps=eps
  )
  n = returns.shape[-1]
  episode = _episode_advantages(
    _episode_return(turn_rewards_PGN, turns_PG),
    turns_PG,
    n,
    sample_mask_PG,
    scale=scale,
    stats_over=episode_stats,
    eps=eps,
  )
  valid = turn_valid(turns_PG, n, sample_mask_PG)
  return jnp.where(valid, episode[..., None] + omega * step, 0.0)


def _history(sid_PGN: jax.Array, depth: int) -> jax.Array:
  """[P, G, N, depth]: h[..., k, d] = sid[..., k - d], -1 before the start."""
  p, g, n = sid_PGN.shape
  cols = [sid_PGN]
  for d in range(1, depth):
    pad = jnp.full((p, g, min(d, n)), -1, sid_PGN.dtype)
    cols.append(jnp.concatenate([pad, sid_PGN[..., : max(n - d, 0)]], -1))
  return jnp.stack(cols, -1)


def hgpo(
  turn_rewards_PGN: ArrayLike,
  state_ids_PGN: ArrayLike,
  turns_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  gamma: float = 0.95,
  history: int = 2,
  alpha: float = 1.0,
  scale: str = "std",
  base_group: bool = False,
  eps: float = 1e-6,
) -> jax.Array:
  """HGPO (arXiv 2602.22817): step advantages over a hierarchy of groups.

  For step t of a prompt's episode and level k = 1..history + 1, the group
  G_k(t) holds the valid steps of the prompt's episodes whose last k states
  (the current one and the k - 1 before it, ``state_ids``) equal t's; the
  groups are nested, G_1 (GiGPO's anchor-state group) containing G_2 ...
  Within each group of >= 2 steps

    A_k(t) = (R_t - mean_{G_k} R) / F,   R_t = sum_l gamma^l r_{t+l},

  F = std + eps (biased std, as the code) or 1, and

    A(t) = sum_k w_k A_k(t) / (sum_k w_k + eps),   w_k = (k + 1)^alpha,

  over the levels with A_k(t) != 0, so deeper (more context-consistent)
  groups weigh more; alpha = 0 averages the levels. ``base_group`` adds the
  episode level k = 0 (weight 1): GiGPO's A^E with step-weighted
  statistics. A step in no group of >= 2 (or whose levels are all 0) gets 0.
  States -1 (not reported) match nothing, and a step with fewer than
  k - 1 earlier steps has no level k.

  What was checked: the official recipe (langfengQ/verl-agent
  `recipe/hgpo/core_hgpo.py`, `hgpo_advantage_estimate`, read in the
  mirror zzj1111/alfworldauto, with its run scripts and config):
  ``history_length`` 2 (scripts: 2 or 4) so levels 1..3, ``mode``
  ``mean_std_norm`` (biased std, eps 1e-6), ``length_weight_alpha`` 1
  with weight (k + 1)^alpha for k matched states, zero advantages left out
  of the weighted sum, weights divided by their sum + eps,
  ``base_group`` False, gamma 0.95; the returned advantage is the
  hierarchical step advantage alone (no separate episode term). The paper
  was read only through its abstract and a secondary summary
  (w_k = (k+1)^alpha / sum (k+1)^alpha, K = 0 being GiGPO's grouping),
  which agree with the code.

  Args:
    turn_rewards_PGN: [P, G, N] reward of each action.
    state_ids_PGN: [P, G, N] int state id of each step (-1: none).
    turns_PG: [P, G] int number of actions.
    sample_mask_PG: [P, G] validity of each sample (default: all valid).
    gamma: discount of the step returns. Default 0.95.
    history: K, the earlier states the deepest level matches. Default 2.
    alpha: weight exponent (>= 0). Default 1.
    scale: "std" (``mean_std_norm``) or "none" (``mean_norm``).
    base_group: add the episode-level group as level 0.
    eps: added to the stds and to the weights' sum. Default 1e-6.

  Returns:
    [P, G, N] float32 advantages, 0 at invalid turns.
  """
  checks.one_of("scale", scale, _SCALES)
  checks.non_negative(history=history, alpha=alpha, eps=eps)
  returns = turn_returns(turn_rewards_PGN, turns_PG, gamma=gamma)
  _check_turns(turns_PG, returns_PGN=returns, state_ids_PGN=state_ids_PGN)
  p, g, n = returns.shape
  valid = _flat(turn_valid(turns_PG, n, sample_mask_PG))
  r = jnp.where(valid, _flat(returns), 0.0)
  hist = _history(_state_ids(state_ids_PGN), history + 1).reshape(p, g * n, -1)
  num = jnp.zeros_like(r)
  den = jnp.zeros_like(r)
  same = jnp.ones((p, g * n, g * n), bool)
  known = valid
  for k in range(1, history + 2):
    h = hist[..., k - 1]
    known = known & (h >= 0)
    same = same & (h[:, :, None] == h[:, None, :])
    adv, size = _grouped(r, known, same, scale=scale, eps=eps, ddof=0)
    on = known & (size >= 2) & (adv != 0)
    num += jnp.where(on, (k + 1.0) ** alpha * adv, 0.0)
    den += jnp.where(on, (k + 1.0) ** alpha, 0.0)
  if base_group:
    episode = _episode_advantages(
      _episode_return(turn_rewards_PGN, turns_PG),
      turns_PG,
      n,
      sample_mask_PG,
      scale=scale,
      stats_over="steps",
      eps=eps,
    )
    base = _flat(jnp.broadcast_to(episode[..., None], (p, g, n)))
    on = valid & (base != 0)
    num += jnp.where(on, base, 0.0)
    den += jnp.where(on, 1.0, 0.0)
  adv = jnp.where(den > 0, num / (den + eps), 0.0)
  return jnp.where(valid, adv, 0.0).reshape(p, g, n)


def _mix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finaliser (uint32 arithmetic wraps)."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def action_hashes(
  tokens_PGT: ArrayLike,
  turn_ids_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  num_turns: int,
) -> jax.Array:
  """[P, G, N] uint32 hash of each action's token sequence.

  Equal actions (the same tokens in the same order) get equal hashes;
  different ones collide with probability about 2^-32. Hashes each valid
  (mask > 0) token with its position in the action, sums the token hashes
  of a turn (uint32, wrapping) and mixes in the action's length.

  Args:
    tokens_PGT: [P, G, T] int completion token ids.
    turn_ids_PGT: [P, G, T] int turn of each token.
    mask_PGT: [P, G, T] action-token mask.
    num_turns: N.
  """
  _check_tokens(turn_ids_PGT, mask_PGT)
  checks.same_shape(["tokens_PGT", "mask_PGT"], tokens_PGT, mask_PGT)
  _integer("tokens_PGT", tokens_PGT)
  hot = _turn_onehot(turn_ids_PGT, mask_PGT, num_turns)
  pos = jnp.sum(jnp.where(hot, jnp.cumsum(hot, axis=2) - 1, 0), -1)
  tok = jnp.asarray(tokens_PGT).astype(jnp.uint32)
  x = _mix32(tok * jnp.uint32(0x9E3779B1) ^ _mix32(pos.astype(jnp.uint32)))
  h = jnp.sum(jnp.where(hot, x[..., None], jnp.uint32(0)), 2, jnp.uint32)
  length = jnp.sum(hot, axis=2).astype(jnp.uint32)
  return _mix32(h ^ (length * jnp.uint32(0x27D4EB2F)))


def salt(
  adv_PG: ArrayLike,
  state_ids_PGN: ArrayLike,
  action_ids_PGN: ArrayLike,
  turns_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
) -> jax.Array:
  """SALT (arXiv 2510.20022): step advantages over a prompt's trajectory graph.

  The valid steps of a prompt's trajectories are merged into one node when
  the trajectories agree up to and including that step: the same turn k,
  the same state ids and the same actions at turns 0..k. Each node v gets
  the mean advantage of the trajectories through it,

    A_step(v) = mean_{tau through v} A(tau),

  and each step takes its node's value: a step shared by good and bad
  trajectories gets a near-neutral advantage, a decisive step (where the
  trajectories part) keeps its trajectories' signal. Unshared steps keep
  A(tau). State id -1 (not reported) matches only -1, so without states
  the nodes follow the action history alone.

  What was checked: the paper's abstract (arXiv 2510.20022: a graph built
  from the trajectories of one prompt, step-level advantages from outcome
  rewards, a plug-in for GRPO/RLOO without rollout changes) and the
  catalog's reconstruction (A_step(v) = mean over the trajectories through
  v). The paper's body and code were not available: the merge criterion
  (here: identical prefix of states and actions, i.e. a prefix tree; the
  paper may also merge equal steps reached through different histories)
  and any extra normalisation are our reading, not verified.

  Args:
    adv_PG: [P, G] trajectory advantages (e.g. `advantages.grpo`).
    state_ids_PGN: [P, G, N] int state ids (-1: none).
    action_ids_PGN: [P, G, N] int action ids (`action_hashes`).
    turns_PG: [P, G] int number of actions.
    sample_mask_PG: [P, G] validity of each sample (default: all valid).

  Returns:
    [P, G, N] float32 step advantages, 0 at invalid turns.
  """
  _check_turns(
    turns_PG, state_ids_PGN=state_ids_PGN, action_ids_PGN=action_ids_PGN
  )
  checks.same_shape(["adv_PG", "turns_PG"], adv_PG, turns_PG)
  _integer("action_ids_PGN", action_ids_PGN)
  n = np.shape(state_ids_PGN)[-1]
  valid = turn_valid(turns_PG, n, sample_mask_PG)
  sid, aid = _state_ids(state_ids_PGN), jnp.asarray(action_ids_PGN)
  pair = lambda x: x[:, :, None, :] == x[:, None, :, :]  # noqa: E731
  both = valid[:, :, None, :] & valid[:, None, :, :]
  eq = pair(sid) & pair(aid) & both  # [P, G, G', N]
  node = jnp.cumprod(eq.astype(jnp.int32), axis=-1) > 0
  adv = stats.f32(adv_PG)[:, None, :, None]  # trajectory g' of node (g, k)
  num = jnp.sum(jnp.where(node, adv, 0.0), axis=2)
  den = jnp.sum(stats.f32(node), axis=2)
  return jnp.where(valid, stats.safe_div(num, den), 0.0)


def action_gae(
  token_rewards_PGT: ArrayLike,
  values_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  turn_ids_PGT: ArrayLike,
  *,
  gamma: float = 1.0,
  lam: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """POAD/BAD (arXiv 2405.15821): GAE over the tokens of language actions.

  From the last token back over the valid (mask > 0) tokens, with V' = 0
  and A' = 0 after the episode:

    g_t = gamma at an action's last token (the next valid token belongs to
          another turn, or there is none), 1 inside an action;
    delta_t = r_t + g_t V' - V_t;   A_t = delta_t + g_t lam A'.

  So inside an action the backup has discount 1 (BAD's intra-action
  Bellman backup, Q(s, w_1:j) <- V(s, w_1:j+1)), and at its last token the
  action's reward r plus gamma times the value of the next action's first
  token: observation tokens (mask 0) are skipped. With gamma = 1 this is
  `advantages.gae`. Returns are A + V.

  What was checked: the official code (morning9393/ADRL
  `mappo/utils/language_buffer.py`, `batch_process_tppo` with
  algorithm "POAD"): inside an action delta = V(next token) - V and
  gae = delta + lam gae; at the last token delta = r + gamma V(next
  action's first token) - V and gae = delta + gamma lam gae; returns
  gae + V; defaults gamma 0.95, lam 0.95 (`mappo/config.py`). The
  reward enters at the action's last token only (put per-turn rewards
  there with `turn_rewards_to_tokens`). The paper's equations were read
  through the catalog only.

  Args:
    token_rewards_PGT: [P, G, T] per-token rewards.
    values_PGT: [P, G, T] token values V_t of the sampling policy.
    mask_PGT: [P, G, T] action-token mask (observations and padding 0).
    turn_ids_PGT: [P, G, T] int turn of each token.
    gamma: discount between actions, in [0, 1].
    lam: GAE lambda in [0, 1].

  Returns:
    (advantages, returns), each [P, G, T] float32, 0 at masked tokens.
  """
  checks.in_range("gamma", gamma, 0.0, 1.0)
  checks.in_range("lam", lam, 0.0, 1.0)
  names = ["token_rewards_PGT", "values_PGT", "mask_PGT", "turn_ids_PGT"]
  checks.same_shape(
    names, token_rewards_PGT, values_PGT, mask_PGT, turn_ids_PGT
  )
  _integer("turn_ids_PGT", turn_ids_PGT)
  r, v, m = (stats.f32(a) for a in (token_rewards_PGT, values_PGT, mask_PGT))
  ids = jnp.asarray(turn_ids_PGT).astype(jnp.int32)

  def step(carry, xs):
    next_value, last_adv, next_turn = carry
    r_t, v_t, m_t, k_t = xs
    g = jnp.where(k_t != next_turn, gamma, 1.0)
    adv = r_t + g * next_value - v_t + g * lam * last_adv
    keep = m_t > 0
    carry = (
      jnp.where(keep, v_t, next_value),
      jnp.where(keep, adv, last_adv),
      jnp.where(keep, k_t, next_turn),
    )
    return carry, jnp.where(keep, adv, 0.0)

  xs = tuple(jnp.moveaxis(x, -1, 0) for x in (r, v, m, ids))
  zero = jnp.zeros_like(xs[0][0])
  init = (zero, zero, jnp.full_like(xs[3][0], -2))
  _, adv = jax.lax.scan(step, init, xs, reverse=True)
  adv = jnp.moveaxis(adv, 0, -1)
  return adv * m, (adv + v) * m


def seeupo(
  returns_PG: ArrayLike,
  turns_PG: ArrayLike,
  num_turns: int,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  clip: float = 3.0,
) -> jax.Array:
  """SeeUPO's (arXiv 2602.06554) per-turn advantages, [P, G, N].

  Turn k of episode i, trained in the turn-k update phase:

    a_{i,k} = R_i - mean_{j: turns_j > k} R_j   (the prompt's episodes that
                                                reached turn k; no std)
    A_{i,k} = clip((a - mean_k a) / std_k a, -clip, clip)

  with mean_k and the unbiased std_k over every scored turn-k row of the
  batch (std_k <= 1e-6: only the mean is removed). R is the episode
  return (critic-free, undiscounted: the setting of the paper's
  convergence result).

  What was checked: the official code (modelscope/AgentEvolver branch
  `seeupo`, `compute_grpo_outcome_advantage_local` with
  ``norm_adv_by_std_in_grpo=False`` and ``special_norm=True`` in the
  launchers; groups are the task's rollouts that have the turn's row).
  A turn reached by one episode of its prompt gets 0 and stays out of the
  whitening (the code: mean 0, i.e. a = R).

  Args:
    returns_PG: [P, G] episode returns.
    turns_PG: [P, G] int number of actions.
    num_turns: N.
    sample_mask_PG: [P, G] validity of each sample (default: all valid).
    clip: bound on |A| after whitening (> 0). Default 3 (code).

  Returns:
    [P, G, N] float32 advantages, 0 at invalid or unscored turns.
  """
  checks.positive(clip=clip)
  checks.same_shape(["returns_PG", "turns_PG"], returns_PG, turns_PG)
  valid = turn_valid(turns_PG, num_turns, sample_mask_PG)
  p, g, n = valid.shape
  r = jnp.broadcast_to(stats.f32(returns_PG)[..., None], (p, g, n))
  r = jnp.where(valid, r, 0.0)
  k = jnp.tile(jnp.arange(n), g)
  same = (k[:, None] == k[None, :])[None]
  centered, size = _grouped(_flat(r), _flat(valid), same, scale="none", eps=0.0)
  centered = centered.reshape(p, g, n)
  scored = valid & (size.reshape(p, g, n) >= 2)
  mean = stats.masked_mean(centered, scored, axis=(0, 1), keepdims=True)
  std = stats.masked_std(centered, scored, axis=(0, 1), keepdims=True)
  z = centered - mean
  z = jnp.where(std > 1e-6, stats.safe_div(z, std), z)
  return jnp.where(scored, jnp.clip(z, -clip, clip), 0.0)
