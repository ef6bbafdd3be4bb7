"""Per-token policy objectives whose gradient is an elementwise coefficient.

Each objective is a pair of elementwise jnp functions of
``(logp, old_logp, adv, mask)`` (any equal shapes): ``value`` is the per-token
loss to minimise and ``coef`` is d value / d logp, written in closed form so
the fused backward (and a Pallas kernel body) can compute it without autodiff.
The fused backward then only needs dz = coef * (onehot - p): no logits are
kept between the passes.

The formulas reproduce `rljax.losses.sapo` and `rljax.losses.ppo_clip` per
token (this package must not import rljax, so they are restated): at masked
positions (mask <= 0) every input is replaced by 0, which makes the loss and
its coefficient 0; the log-ratio d = logp - old_logp is clamped to
[-log_ratio_clamp, log_ratio_clamp] before exp (verl / OpenRLHF: 20; None
disables it, as TRL does), and the clamp stops the gradient outside it.
Exact ties (r on a clip bound, |d| equal to the clamp) take coefficient 0 on
the clipped side, where autodiff of `jnp.clip` would give half; they have
measure zero in floating point training.
"""

from collections.abc import Callable
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

F32 = jnp.float32


class Objective(NamedTuple):
  """An elementwise per-token loss and its derivative w.r.t. logp.

  Attributes:
    value: (logp, old_logp, adv, mask) -> per-token loss, float32.
    coef: (logp, old_logp, adv, mask) -> d value / d logp, float32.
  """

  value: Callable[..., jax.Array]
  coef: Callable[..., jax.Array]


def _inert(logp, old_logp, adv, mask):
  """Float32 (logp, old_logp, adv) with masked entries replaced by 0."""
  valid = jnp.asarray(mask, F32) > 0
  return tuple(
    jnp.where(valid, jnp.asarray(x, F32), 0.0) for x in (logp, old_logp, adv)
  )


def _ratio(logp, old_logp, clamp):
  """(r = exp(clamped d), 1.0 where the clamp lets the gradient through)."""
  d = logp - old_logp
  if clamp is None:
    return jnp.exp(d), jnp.ones_like(d)
  return jnp.exp(jnp.clip(d, -clamp, clamp)), (jnp.abs(d) < clamp).astype(F32)


def sapo_value(logp, old_logp, adv, mask, *, tau_pos, tau_neg, log_ratio_clamp):
  """SAPO loss -(4 / tau) sigmoid(tau (r - 1)) A, tau = tau_pos if A > 0."""
  logp, old, adv = _inert(logp, old_logp, adv, mask)
  r, _ = _ratio(logp, old, log_ratio_clamp)
  tau = jnp.where(adv > 0, tau_pos, tau_neg)
  return -(4.0 / tau) * jax.nn.sigmoid(tau * (r - 1.0)) * adv


def sapo_coef(logp, old_logp, adv, mask, *, tau_pos, tau_neg, log_ratio_clamp):
  """d SAPO / d logp = -4 sigma (1 - sigma) r A = -sech^2(tau (r-1)/2) r A."""
  logp, old, adv = _inert(logp, old_logp, adv, mask)
  r, through = _ratio(logp, old, log_ratio_clamp)
  sig = jax.nn.sigmoid(jnp.where(adv > 0, tau_pos, tau_neg) * (r - 1.0))
  return -4.0 * sig * (1.0 - sig) * r * adv * through


def _ppo_branches(
  logp, old_logp, adv, mask, eps_low, eps_high, dual_clip, clamp
):
  """(loss, gradient-carrying flag, r, A, clamp pass-through) of PPO clip."""
  logp, old, adv = _inert(logp, old_logp, adv, mask)
  r, through = _ratio(logp, old, clamp)
  unclipped = -adv * r
  clipped = -adv * jnp.clip(r, 1.0 - eps_low, 1.0 + eps_high)
  loss = jnp.maximum(unclipped, clipped)
  live = ~(clipped > unclipped)
  if dual_clip is not None:
    capped = (adv < 0) & (loss > -dual_clip * adv)
    loss = jnp.where(capped, -dual_clip * adv, loss)
    live = live & ~capped
  return loss, live, r, adv, through


def ppo_clip_value(
  logp, old_logp, adv, mask, *, eps_low, eps_high, dual_clip, log_ratio_clamp
):
  """PPO clip max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) (+ dual clip)."""
  args = (eps_low, eps_high, dual_clip, log_ratio_clamp)
  return _ppo_branches(logp, old_logp, adv, mask, *args)[0]


def ppo_clip_coef(
  logp, old_logp, adv, mask, *, eps_low, eps_high, dual_clip, log_ratio_clamp
):
  """d PPO clip / d logp: -A r where the unclipped branch is live, else 0."""
  args = (eps_low, eps_high, dual_clip, log_ratio_clamp)
  _, live, r, adv, through = _ppo_branches(logp, old_logp, adv, mask, *args)
  return jnp.where(live, -adv * r, 0.0) * through


def sapo(*, tau_pos=1.0, tau_neg=1.05, log_ratio_clamp=20.0) -> Objective:
  """The SAPO objective (defaults: paper / verl / TRL; clamp 20 as verl)."""
  hyper = dict(
    tau_pos=tau_pos, tau_neg=tau_neg, log_ratio_clamp=log_ratio_clamp
  )
  return Objective(
    functools.partial(sapo_value, **hyper),
    functools.partial(sapo_coef, **hyper),
  )


def ppo_clip(
  *, eps_low=0.2, eps_high=0.2, dual_clip=None, log_ratio_clamp=20.0
) -> Objective:
  """The PPO clip objective (defaults: verl / TRL / OpenRLHF, no dual clip)."""
  hyper = dict(
    eps_low=eps_low,
    eps_high=eps_high,
    dual_clip=dual_clip,
    log_ratio_clamp=log_ratio_clamp,
  )
  return Objective(
    functools.partial(ppo_clip_value, **hyper),
    functools.partial(ppo_clip_coef, **hyper),
  )
