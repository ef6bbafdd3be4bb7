"""Per-token critic losses for PPO-style value models.

`values_BT` ([..., T], any leading axes) carries the gradient; old values and
returns are targets (stop_gradient). Losses are per token and unreduced: the
mask and the aggregation mode are applied by `rljax.aggregate`, as for the
policy loss (verl aggregates the value loss with the actor's mode).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats


class ValueLoss(NamedTuple):
  """Per-token value loss and where the clipped branch was taken.

  Attributes:
    loss: per-token loss, [..., T] float32.
    clipped: 1.0 where the clipped branch is strictly larger (so it is the
      one used), else 0.0; its masked mean is verl's `vf_clipfrac`.
  """

  loss: jax.Array
  clipped: jax.Array


def _target(x: ArrayLike) -> jax.Array:
  """A float32 constant (no gradient flows into targets)."""
  return jax.lax.stop_gradient(stats.f32(x))


def value_clip(
  values_BT: ArrayLike,
  old_values_BT: ArrayLike,
  returns_BT: ArrayLike,
  *,
  eps: float = 0.2,
) -> ValueLoss:
  """PPO clipped value loss.

  L = 0.5 * max((v - R)^2, (clip(v, v_old - eps, v_old + eps) - R)^2).

  The clipped branch keeps the critic from moving further than eps from the
  values it predicted at rollout time whenever that move would lower the
  loss; where that branch wins and v is outside the band, the gradient is 0.

  Args:
    values_BT: current value predictions, [..., T] (differentiated).
    old_values_BT: value predictions at rollout time, same shape (constant).
    returns_BT: value targets (e.g. GAE returns), same shape (constant).
    eps: half-width of the clip band around the old values, > 0. The default
      0.2 is TRL PPO's `cliprange_value`; verl (`critic.cliprange_value`) and
      OpenRLHF (`--critic.value_clip`) default to 0.5.

  Returns:
    `ValueLoss(loss, clipped)`, both [..., T] float32.

  References: verl `core_algos.compute_value_loss`; OpenRLHF `ValueLoss`;
  TRL PPO (`cliprange_value`).
  """
  names = ["values_BT", "old_values_BT", "returns_BT"]
  checks.same_shape(names, values_BT, old_values_BT, returns_BT)
  checks.positive(eps=eps)
  v, v_old, ret = (
    stats.f32(values_BT),
    _target(old_values_BT),
    _target(returns_BT),
  )
  unclipped = jnp.square(v - ret)
  clipped = jnp.square(jnp.clip(v, v_old - eps, v_old + eps) - ret)
  return ValueLoss(
    loss=0.5 * jnp.maximum(unclipped, clipped),
    clipped=(clipped > unclipped).astype(jnp.float32),
  )


def value_mse(values_BT: ArrayLike, returns_BT: ArrayLike) -> ValueLoss:
  """Unclipped value loss L = 0.5 * (v - R)^2.

  Args:
    values_BT: current value predictions, [..., T] (differentiated).
    returns_BT: value targets, same shape (constant).

  Returns:
    `ValueLoss(loss, clipped)` with `clipped` all zeros, both [..., T] float32.

  References: verl `compute_value_loss` / OpenRLHF `ValueLoss` without clipping.
  """
  checks.same_shape(["values_BT", "returns_BT"], values_BT, returns_BT)
  v = stats.f32(values_BT)
  loss = 0.5 * jnp.square(v - _target(returns_BT))
  return ValueLoss(loss=loss, clipped=jnp.zeros_like(loss))
