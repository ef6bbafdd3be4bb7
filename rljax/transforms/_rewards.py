"""Reward stages: shaping, multi-reward weighting and KL folded into rewards."""

from collections.abc import Callable
from typing import Optional

import jax
import jax.numpy as jnp

from rljax import shaping
from rljax._src import checks
from rljax._src import controllers
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare


def weighted_rewards(weights=None) -> Transform:
  """rewards_PG = sum_k w_k rewards_PGK (TRL `reward_weights`)."""

  def fn(batch: Batch) -> Batch:
    batch.require("rewards_PGK", by="weighted_rewards")
    return batch._replace(
      rewards_PG=shaping.weighted_sum(batch.rewards_PGK, weights)
    )

  return stateless_prepare(fn)


def overlong_penalty(
  *, max_length: int, buffer: int, factor: float = 1.0
) -> Transform:
  """DAPO soft overlong punishment, lengths counted in completion tokens."""
  checks.positive(max_length=max_length, buffer=buffer)

  def fn(batch: Batch) -> Batch:
    batch.require("rewards_PG", by="overlong_penalty")
    lengths = stats.sequence_lengths(batch.mask_PGT)
    penalty = shaping.overlong_penalty(
      lengths, max_length=max_length, buffer=buffer, factor=factor
    )
    return batch._replace(rewards_PG=stats.f32(batch.rewards_PG) + penalty)

  return stateless_prepare(fn)


def stop_properly_penalty(*, coef: float) -> Transform:
  """ProRL: scale (coef in [0, 1]) or replace (coef < 0) truncated rewards."""

  def fn(batch: Batch) -> Batch:
    batch.require("rewards_PG", "truncated_PG", by="stop_properly_penalty")
    rewards = shaping.stop_properly_penalty(
      batch.rewards_PG, batch.truncated_PG, coef=coef
    )
    return batch._replace(rewards_PG=rewards)

  return stateless_prepare(fn)


def clip_rewards(*, low: float = -10.0, high: float = 10.0) -> Transform:
  """Clip outcome rewards to [low, high] (OpenRLHF `--reward.clip_range`)."""

  def fn(batch: Batch) -> Batch:
    batch.require("rewards_PG", by="clip_rewards")
    return batch._replace(
      rewards_PG=shaping.clip_rewards(batch.rewards_PG, low=low, high=high)
    )

  return stateless_prepare(fn)


def _with_kl_reward(batch: Batch, estimator, coef) -> tuple[Batch, jax.Array]:
  """Subtract coef * KL(old || ref) per token; also return the batch KL."""
  batch.require("old_logp_PGT", "ref_logp_PGT", by="kl_in_reward")
  mask = batch.loss_mask()
  base = batch.token_rewards_PGT
  base = jnp.zeros(batch.shape, jnp.float32) if base is None else base
  rewards = shaping.kl_in_reward(
    base,
    batch.old_logp_PGT,
    batch.ref_logp_PGT,
    mask,
    coef=coef,
    estimator=estimator,
  )
  kl = estimator(batch.old_logp_PGT, batch.ref_logp_PGT)
  # verl's controller input: batch mean of per-sequence token means.
  seq_kl = stats.masked_mean(kl, mask, axis=-1)
  current = stats.masked_mean(seq_kl, stats.sequence_lengths(mask) > 0)
  return batch._replace(token_rewards_PGT=rewards), current


def kl_in_reward(
  estimator: Callable[..., jax.Array], *, coef: float = 1e-3
) -> Transform:
  """Fold -coef * KL(old || ref) into the per-token rewards (verl, RLOO).

  Use the k1 estimator here (its expectation is the KL); the penalty enters
  the advantages, so it needs no gradient.
  """
  checks.non_negative(coef=coef)

  def fn(batch: Batch) -> Batch:
    return _with_kl_reward(batch, estimator, coef)[0]

  return stateless_prepare(fn)


def adaptive_kl_in_reward(
  estimator: Callable[..., jax.Array],
  *,
  init_coef: float = 1e-3,
  target: float = 0.1,
  horizon: float = 10_000,
  n_steps: Optional[float] = None,
) -> Transform:
  """`kl_in_reward` with the adaptive controller (Ziegler et al., 2019).

  The coefficient in the state is used for this batch, then updated from the
  batch's measured KL; ``n_steps`` defaults to the number of samples (verl).
  """
  checks.positive(target=target, horizon=horizon)

  def prepare(batch, state):
    batch, kl = _with_kl_reward(batch, estimator, state.coef)
    steps = batch.shape[0] * batch.shape[1] if n_steps is None else n_steps
    state = controllers.adaptive_kl(
      state, kl, target=target, horizon=horizon, n_steps=steps
    )
    return batch, state

  return Transform(
    init=lambda: controllers.init_coef(init_coef),
    prepare=prepare,
    apply=lambda terms, batch, state: terms,
  )
