"""Turn-level credit stages for agent episodes (`rljax.envs`).

They read the episode runner's side data from ``Batch.extra``
(``turn_ids_PGT``, ``turns_PG``, ``turn_rewards_PG`` [P, G, N],
``state_ids_PG`` [P, G, N]; a [P, G] per-turn array is one turn) and write
``advantages_PGT``: each turn's advantage on its action tokens (the loss
mask, actions only, zeroes the observation tokens).

Rewards. The training return of an episode is the task's reward
``Batch.rewards_PG``, as for every outcome estimator; the environment's turn
rewards say when it was earned. So action k's reward is its turn reward,
and the part of ``rewards_PG`` the turn rewards do not account for
(rewards_PG - sum_k turn_rewards_k) arrives with the last action: with the
reward function `rljax.rewards.episode_return` the turn rewards are used as
they are; with a correctness reward the whole score is credited to the
last action. Without ``rewards_PG`` the return is the sum of the turn
rewards. Per-token rewards (KL in the reward) add to their turn's reward.
"""

from collections.abc import Callable
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax import advantages
from rljax import losses
from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import LossTerms
from rljax._src.base import Transform
from rljax._src.base import mean_metric
from rljax._src.base import old_logp
from rljax._src.base import stateless_prepare
from rljax.advantages import _turns
from rljax.transforms._advantages import _need_group

_TURN_IDS = "turn_ids_PGT"
_TURNS = "turns_PG"
_REWARDS = "turn_rewards_PG"
_STATES = "state_ids_PG"
_SEEUPO = "seeupo_policy"


def _per_turn(batch: Batch, name: str, by: str) -> jax.Array:
  """``extra[name]`` as [P, G, N] (a [P, G] array is one turn)."""
  x = jnp.asarray(batch.get(name, by=by))
  if x.ndim == 2:
    x = x[..., None]
  checks.rank(f"Batch.extra[{name!r}]", x, 3, "[P, G, N]")
  return x


def _turn_ids(batch: Batch, by: str) -> jax.Array:
  return jnp.asarray(batch.get(_TURN_IDS, by=by))


def _turn_counts(batch: Batch, by: str) -> jax.Array:
  return jnp.asarray(batch.get(_TURNS, by=by))


def turn_rewards(batch: Batch, *, by: str = "turn_rewards") -> jax.Array:
  """[P, G, N] reward of each action (see the module docstring).

  r_k = turn_rewards_k + [k = last] (rewards_PG - sum_l turn_rewards_l)
  + the per-token rewards of turn k; 0 past the episode.
  """
  r = stats.f32(_per_turn(batch, _REWARDS, by))
  turns = _turn_counts(batch, by)
  n = r.shape[-1]
  valid = _turns.turn_valid(turns, n)
  r = jnp.where(valid, r, 0.0)
  if batch.rewards_PG is not None:
    rest = stats.f32(batch.rewards_PG) - jnp.sum(r, -1)
    last = jnp.arange(n)[None, None, :] == (turns - 1)[..., None]
    r = r + jnp.where(last, rest[..., None], 0.0)
  if batch.token_rewards_PGT is not None:
    r = r + _turns.per_turn_sum(
      batch.token_rewards_PGT, _turn_ids(batch, by), batch.mask_PGT, n
    )
  return r


def episode_returns(batch: Batch, *, by: str = "episode_returns") -> jax.Array:
  """[P, G] training return of each episode: the sum of `turn_rewards`."""
  return jnp.sum(turn_rewards(batch, by=by), -1)


def _on_tokens(batch: Batch, adv_PGN: jax.Array, by: str) -> Batch:
  adv = _turns.turns_to_tokens(adv_PGN, _turn_ids(batch, by))
  return batch._replace(advantages_PGT=adv * batch.loss_mask())


def episode_advantages(
  estimator: Callable[..., jax.Array], **kwargs
) -> Transform:
  """Episode-level credit: ``estimator(episode_returns, sample_mask)``
  (`advantages.grpo`, `advantages.rloo`, ...) on every action token.

  The multi-turn form of `group_advantages`, on `episode_returns`: with a
  task reward the episode's return is that reward (plus any per-token
  rewards), so this is `group_advantages` on the action tokens; without
  one (``rewards_PG`` None) it is the sum of the turn rewards.
  """
  by = f"episode_advantages({getattr(estimator, '__name__', estimator)})"

  def fn(batch: Batch) -> Batch:
    _need_group(batch, by)
    adv = estimator(episode_returns(batch, by=by), batch.samples(), **kwargs)
    return batch._replace(advantages_PGT=adv[..., None] * batch.loss_mask())

  return stateless_prepare(fn)


def turn_advantages(
  *,
  gamma: float = 1.0,
  over: str = "position",
  scale: str = "std",
  eps: float = 1e-6,
) -> Transform:
  """Turn-level credit: `advantages.turn_grpo` of the discounted returns
  from each turn (`advantages.turn_returns` of `turn_rewards`)."""
  checks.in_range("gamma", gamma, 0.0, 1.0)
  checks.one_of("over", over, ("position", "group"))
  checks.one_of("scale", scale, ("std", "none"))
  by = "turn_advantages"

  def fn(batch: Batch) -> Batch:
    _need_group(batch, by)
    turns = _turn_counts(batch, by)
    returns = _turns.turn_returns(
      turn_rewards(batch, by=by), turns, gamma=gamma
    )
    adv = _turns.turn_grpo(
      returns, turns, batch.samples(), over=over, scale=scale, eps=eps
    )
    return _on_tokens(batch, adv, by)

  return stateless_prepare(fn)


def gigpo_advantages(
  *,
  gamma: float = 0.95,
  omega: float = 1.0,
  scale: str = "std",
  episode_stats: str = "episodes",
  eps: float = 1e-6,
) -> Transform:
  """GiGPO (arXiv 2505.10978): `advantages.gigpo` with the runner's anchor
  states (``state_ids_PG``) on the action tokens of each turn."""
  checks.in_range("gamma", gamma, 0.0, 1.0)
  checks.one_of("scale", scale, ("std", "none"))
  checks.one_of("episode_stats", episode_stats, ("episodes", "steps"))
  by = "gigpo_advantages"

  def fn(batch: Batch) -> Batch:
    _need_group(batch, by)
    adv = advantages.gigpo(
      turn_rewards(batch, by=by),
      _per_turn(batch, _STATES, by),
      _turn_counts(batch, by),
      batch.samples(),
      gamma=gamma,
      omega=omega,
      scale=scale,
      episode_stats=episode_stats,
      eps=eps,
    )
    return _on_tokens(batch, adv, by)

  return stateless_prepare(fn)


def hgpo_advantages(
  *,
  gamma: float = 0.95,
  history: int = 2,
  alpha: float = 1.0,
  scale: str = "std",
  base_group: bool = False,
  eps: float = 1e-6,
) -> Transform:
  """HGPO (arXiv 2602.22817): `advantages.hgpo`, groups by the runner's
  state histories (``state_ids_PG``), on each turn's action tokens."""
  checks.in_range("gamma", gamma, 0.0, 1.0)
  checks.non_negative(history=history, alpha=alpha)
  checks.one_of("scale", scale, ("std", "none"))
  by = "hgpo_advantages"

  def fn(batch: Batch) -> Batch:
    _need_group(batch, by)
    adv = advantages.hgpo(
      turn_rewards(batch, by=by),
      _per_turn(batch, _STATES, by),
      _turn_counts(batch, by),
      batch.samples(),
      gamma=gamma,
      history=history,
      alpha=alpha,
      scale=scale,
      base_group=base_group,
      eps=eps,
    )
    return _on_tokens(batch, adv, by)

  return stateless_prepare(fn)


def salt_advantages(
  estimator: Callable[..., jax.Array] = advantages.grpo, **kwargs
) -> Transform:
  """SALT (arXiv 2510.20022): `advantages.salt` over the trajectory
  advantages ``estimator(episode_returns, sample_mask, **kwargs)``.

  Steps are identified by the runner's state ids and by a hash of each
  action's tokens (`advantages.action_hashes` of ``Batch.tokens_PGT``).
  """
  by = f"salt_advantages({getattr(estimator, '__name__', estimator)})"

  def fn(batch: Batch) -> Batch:
    _need_group(batch, by)
    batch.require("tokens_PGT", by=by)
    states = _per_turn(batch, _STATES, by)
    traj = estimator(episode_returns(batch, by=by), batch.samples(), **kwargs)
    actions = _turns.action_hashes(
      batch.tokens_PGT, _turn_ids(batch, by), batch.mask_PGT, states.shape[-1]
    )
    adv = advantages.salt(
      traj, states, actions, _turn_counts(batch, by), batch.samples()
    )
    return _on_tokens(batch, adv, by)

  return stateless_prepare(fn)


def poad_advantages(
  *, gamma: float = 0.95, lam: float = 0.95, whiten: bool = True
) -> Transform:
  """POAD (arXiv 2405.15821): `advantages.action_gae` over the value
  model's ``old_values_PGT``; writes advantages and value ``returns_PGT``.

  Each action's reward (`turn_rewards`) sits on its last token; per-token
  rewards (KL in the reward) stay on their tokens, which
  `turn_rewards` would otherwise add to the turn: here they are not
  counted twice. Advantages are whitened over the action tokens of the
  batch unless ``whiten=False`` (as `gae_advantages`); returns never are.
  """
  checks.in_range("gamma", gamma, 0.0, 1.0)
  checks.in_range("lam", lam, 0.0, 1.0)
  by = "poad_advantages"

  def fn(batch: Batch) -> Batch:
    batch.require("old_values_PGT", by=by)
    mask = batch.loss_mask()
    ids = _turn_ids(batch, by)
    per_turn = turn_rewards(batch._replace(token_rewards_PGT=None), by=by)
    rewards = _turns.turn_rewards_to_tokens(per_turn, ids, mask)
    if batch.token_rewards_PGT is not None:
      rewards = rewards + stats.f32(batch.token_rewards_PGT)
    adv, returns = advantages.action_gae(
      rewards, batch.old_values_PGT, mask, ids, gamma=gamma, lam=lam
    )
    if whiten:
      adv = advantages.whiten(adv, mask)
    return batch._replace(advantages_PGT=adv, returns_PGT=returns)

  return stateless_prepare(fn)


def drop_small_advantages(*, threshold: float = 0.01) -> Transform:
  """Leave out samples whose advantage is below `threshold` in magnitude
  on every token (``sample_mask_PG`` 0): LOOP's ``abs_adv_threshold``
  (apple/ml-loop, default 0.01), which drops the rollouts that carry no
  signal before the minibatches are formed. Put it after the advantages."""
  checks.non_negative(threshold=threshold)

  def fn(batch: Batch) -> Batch:
    batch.require("advantages_PGT", by="drop_small_advantages")
    mask = batch.loss_mask()
    size = jnp.max(jnp.abs(stats.f32(batch.advantages_PGT)) * mask, -1)
    keep = stats.f32(size >= threshold) * batch.samples()
    return batch._replace(sample_mask_PG=keep)

  return stateless_prepare(fn)


def seeupo_advantages(*, clip: float = 3.0) -> Transform:
  """SeeUPO (arXiv 2602.06554): `advantages.seeupo` of the episode
  returns, each turn's value on its action tokens (train them with
  `seeupo_policy`)."""
  checks.positive(clip=clip)
  by = "seeupo_advantages"

  def fn(batch: Batch) -> Batch:
    _need_group(batch, by)
    r = turn_rewards(batch, by=by)
    adv = advantages.seeupo(
      jnp.sum(r, -1),
      _turn_counts(batch, by),
      r.shape[-1],
      batch.samples(),
      clip=clip,
    )
    return _on_tokens(batch, adv, by)

  return stateless_prepare(fn)


class SeeupoState(NamedTuple):
  """Optimizer steps taken on the current batch (reset by ``prepare``)."""

  step: jax.Array  # shape=(), dtype=int32


def _validate_loss(loss_fn: Callable, hyper: dict) -> None:
  """Trace the loss once on tiny shapes so bad hyperparameters fail here."""
  x = jax.ShapeDtypeStruct((1, 2, 3), jnp.float32)
  jax.eval_shape(functools.partial(loss_fn, **hyper), x, x, x, x)


def seeupo_turn(step: jax.Array, num_turns: int, minibatches: int) -> jax.Array:
  """The turn SeeUPO trains at the batch's `step`-th optimizer step (1 =
  the first): N - 1 for the first `minibatches` steps, then N - 2, ...,
  0, and again N - 1 (reverse execution order, one epoch per turn)."""
  phase = jnp.maximum(step - 1, 0) // minibatches
  return num_turns - 1 - phase % num_turns


def _later_turn_ratios(
  logp, old, mask, ids, n: int, low: float, high: float
) -> jax.Array:
  """[P, G, N]: M_k = clip(M_{k+1} s_{k+1}), M_{N-1} = 1, with s_j the
  clipped geometric-mean ratio of action j (1 where it has no tokens)."""
  lr = _turns.per_turn_sum(jax.lax.stop_gradient(logp) - old, ids, mask, n)
  count = _turns.per_turn_sum(jnp.ones_like(mask), ids, mask, n)
  s = jnp.exp(jnp.clip(stats.safe_div(lr, count), -10.0, 10.0))
  s = jnp.where(count > 0, jnp.clip(s, 1.0 - low, 1.0 + high), 1.0)

  def step(carry, s_j):
    return jnp.clip(carry * s_j, 1.0 - low, 1.0 + high), carry

  init = jnp.ones_like(s[..., 0])
  _, m = jax.lax.scan(step, init, jnp.moveaxis(s, -1, 0), reverse=True)
  return jnp.moveaxis(m, 0, -1)


def seeupo_policy(
  loss_fn: Callable = losses.gspo,
  *,
  minibatches: int = 1,
  ratio_clip_low: float = 0.2,
  ratio_clip_high: float = 0.2,
  **hyper,
) -> Transform:
  """SeeUPO (arXiv 2602.06554): sequential per-turn updates, last turn
  first, with the HAML advantage correction.

  SeeUPO treats turn k as agent k of a sequential multi-agent bandit and
  updates the agents one at a time in reverse execution order (backward
  induction). One rollout batch is trained in N phases (N = the turn axis
  of ``turn_rewards_PG``), one epoch each: set the trainer's ``epochs`` to
  N (or a multiple: the phases cycle) and `minibatches` to its
  minibatches. At the s-th optimizer step the stage trains turn
  k = `seeupo_turn`(s): the policy term is ``loss_fn`` (default GSPO, each
  turn its own sequence) on turn k's action tokens with the advantage
  multiplied by

    M_k = clip(M_{k+1} s_{k+1}, 1 - c_low, 1 + c_high),  M_{N-1} = 1,
    s_j = clip(exp(mean_{t in action j} log pi(y_t) / pi_old(y_t)),
               1 - c_low, 1 + c_high),

  the (clipped) ratio of the later, already updated turns' actions under
  the current policy (HAPPO's M). The stage is an objective: use it
  instead of `objectives.policy`, LAST in the chain, and aggregate with
  `aggregate.seq_mean_token_mean`. It also restricts the earlier stages'
  penalties (KL, entropy) to turn k, and weighs turn k's tokens of each
  row by (row's action tokens) / (turn k's tokens) so that each row's
  token mean is the mean over its turn-k action (the code's sequence is
  one turn); a row without turn k adds 0 (the code leaves it out of the
  phase, so here the step is scaled by the fraction of rows that reached
  turn k). Phases of a turn no episode reached train nothing (the
  optimizer still steps).

  What was checked: the official code (modelscope/AgentEvolver branch
  `seeupo`: `ba_ray_trainer.py` `get_agent_update_order` "reverse",
  `update_ratios`, `compute_advantage(ratios=...)`; launcher
  qwen3-seeupo-appworld.yaml: ``loss_mode`` gspo, ``seq-mean-token-mean``,
  ``adv_clip_ratio`` 0.2 both sides, one PPO epoch per turn, KL loss
  low_var_kl 0.002, advantages `advantages.seeupo`). In the code each
  phase's factor s_j compares the policy right after phase j with the one
  before it; here the policy at phase k with the behaviour policy: the same
  number when each turn has its own policy (the paper's multi-agent model),
  not exactly with one shared LLM. Skipped (non-finite) steps do not
  advance the phase. The paper was read through its abstract and the
  README's summary.

  Args:
    loss_fn: per-token surrogate ``f(logp, old_logp, adv, mask, **hyper)``
      (`rljax.losses`), called with turn k's tokens as the mask.
    minibatches: optimizer steps per phase (the trainer's minibatches).
    ratio_clip_low, ratio_clip_high: the clip of s_j and M (code: 0.2).
    **hyper: `loss_fn`'s hyperparameters (eps_low, eps_high, ...).
  """
  checks.positive(minibatches=minibatches)
  checks.positive(
    ratio_clip_low=ratio_clip_low, ratio_clip_high=ratio_clip_high
  )
  _validate_loss(loss_fn, hyper)
  apply = functools.partial(
    _seeupo_apply,
    loss_fn=loss_fn,
    minibatches=minibatches,
    clip=(ratio_clip_low, ratio_clip_high),
    hyper=hyper,
  )
  return Transform(
    init=lambda: SeeupoState(jnp.zeros((), jnp.int32)),
    prepare=_seeupo_prepare,
    apply=apply,
    observe=_seeupo_observe,
  )


def _seeupo_prepare(batch: Batch, state):
  """Check the turn data; every rollout batch starts at phase 0."""
  del state
  _per_turn(batch, _REWARDS, _SEEUPO)
  _turn_ids(batch, _SEEUPO)
  return batch, SeeupoState(jnp.zeros((), jnp.int32))


def _seeupo_observe(state, stats_):
  """One optimizer step taken: the next phase's step count."""
  del stats_
  return SeeupoState(state.step + 1)


def _seeupo_apply(
  terms: LossTerms,
  batch: Batch,
  state,
  *,
  loss_fn: Callable,
  minibatches: int,
  clip: tuple[float, float],
  hyper: dict,
) -> LossTerms:
  """Turn k's policy loss with the advantage times M_k, row-reweighted."""
  batch.require("advantages_PGT", by=_SEEUPO)
  n = _per_turn(batch, _REWARDS, _SEEUPO).shape[-1]
  ids = _turn_ids(batch, _SEEUPO)
  k = seeupo_turn(state.step, n, minibatches)
  mask = batch.loss_mask()
  sel = mask * stats.f32(ids == k)
  old = old_logp(terms.logp_PGT, batch)
  ratios = _later_turn_ratios(terms.logp_PGT, old, mask, ids, n, *clip)
  m = jnp.take(ratios, k, axis=-1)[..., None]  # [P, G, 1]
  adv = stats.f32(batch.advantages_PGT) * m
  out = loss_fn(terms.logp_PGT, old, adv, sel, **hyper)
  per_row = stats.safe_div(jnp.sum(mask, -1), jnp.sum(sel, -1))
  w = sel * per_row[..., None]
  metrics = dict(terms.metrics)
  metrics["clip_frac_low"] = mean_metric(out.clip_low, sel)
  metrics["clip_frac_high"] = mean_metric(out.clip_high, sel)
  metrics["seeupo_turn"] = mean_metric(jnp.full_like(mask, k), mask)
  metrics["seeupo_ratio"] = mean_metric(m[..., 0], jnp.any(sel > 0, -1))
  return terms._replace(
    policy_loss_PGT=terms.policy_loss_PGT + out.loss * w,
    penalty_PGT=terms.penalty_PGT * w,
    metrics=metrics,
  )
