"""Adaptive coefficients: the update rules behind stateful transforms."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks


class CoefState(NamedTuple):
  """An adaptive coefficient and whether its term is active this step."""

  coef: jax.Array  # shape=(), float32
  active: jax.Array  # shape=(), float32 in {0, 1}


def init_coef(coef: float) -> CoefState:
  checks.non_negative(coef=coef)
  return CoefState(jnp.asarray(coef, jnp.float32), jnp.ones((), jnp.float32))


def adaptive_kl(
  state: CoefState,
  kl: ArrayLike,
  *,
  target: float,
  horizon: float,
  n_steps: float,
) -> CoefState:
  """Ziegler et al. (2019): beta *= 1 + clip(KL/target - 1, +-0.2) n/horizon.

  The rule of verl's and OpenRLHF's `AdaptiveKLController`; verl passes the
  batch size as ``n_steps``.
  """
  error = jnp.clip(jnp.asarray(kl, jnp.float32) / target - 1.0, -0.2, 0.2)
  return state._replace(coef=state.coef * (1.0 + error * n_steps / horizon))


def adaptive_entropy(
  state: CoefState,
  entropy: ArrayLike,
  *,
  target: float,
  delta: float,
  min_coef: float,
  max_coef: float,
) -> CoefState:
  """Skywork-OR1 (TRL `use_adaptive_entropy`): raise c while H <= target.

  c <- min(c + delta, max) if H <= target else max(c - delta, min); the bonus
  is applied only while the last measured entropy is at or below the target.
  """
  low = jnp.asarray(entropy, jnp.float32) <= target
  coef = jnp.where(
    low,
    jnp.minimum(state.coef + delta, max_coef),
    jnp.maximum(state.coef - delta, min_coef),
  )
  return CoefState(coef, low.astype(jnp.float32))
