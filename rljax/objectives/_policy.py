"""Policy-surrogate stages: wrap a per-token loss from `rljax.losses`.

Any function ``f(logp_BT, old_logp_BT, adv_BT, mask_BT, **hyper) -> TokenLoss``
plugs in, so a new objective is one small function (see the README).
"""

from collections.abc import Callable
import functools

import jax
import jax.numpy as jnp

from rljax._src.base import Batch
from rljax._src.base import LossTerms
from rljax._src.base import Transform
from rljax._src.base import mean_metric
from rljax._src.base import old_logp
from rljax._src.base import stateless_apply


def _name(fn: Callable) -> str:
  return getattr(fn, "__name__", type(fn).__name__)


def _validate(loss_fn: Callable, hyper: dict, with_key: bool) -> None:
  """Trace the loss once on tiny shapes so bad hyperparameters fail here."""
  x = jax.ShapeDtypeStruct((1, 2, 3), jnp.float32)
  extra = {"key": jax.random.key(0)} if with_key else {}
  jax.eval_shape(functools.partial(loss_fn, **hyper, **extra), x, x, x, x)


def _add_policy(terms: LossTerms, out, mask: jax.Array) -> LossTerms:
  metrics = dict(terms.metrics)
  metrics["clip_frac_low"] = mean_metric(out.clip_low, mask)
  metrics["clip_frac_high"] = mean_metric(out.clip_high, mask)
  return terms._replace(
    policy_loss_PGT=terms.policy_loss_PGT + out.loss, metrics=metrics
  )


def _policy(loss_fn: Callable, hyper: dict, with_key: bool) -> Transform:
  _validate(loss_fn, hyper, with_key)
  name = f"objectives.policy({_name(loss_fn)})"

  def fn(terms: LossTerms, batch: Batch) -> LossTerms:
    batch.require("advantages_PGT", by=name)
    extra = {}
    if with_key:
      if terms.key is None:
        raise ValueError(f"{name} is randomised: pass key= to Algorithm.loss.")
      extra["key"] = terms.key
    mask = batch.loss_mask()
    out = loss_fn(
      terms.logp_PGT,
      old_logp(terms.logp_PGT, batch),
      batch.advantages_PGT,
      mask,
      **hyper,
      **extra,
    )
    return _add_policy(terms, out, mask)

  return stateless_apply(fn)


def policy(loss_fn: Callable, **hyper) -> Transform:
  """Add the per-token surrogate `loss_fn` (with `hyper`) to the policy term.

  Example:
    >>> import rljax
    >>> t = rljax.objectives.policy(rljax.losses.ppo_clip, eps_high=0.28)
  """
  return _policy(loss_fn, hyper, with_key=False)


def randomized_policy(loss_fn: Callable, **hyper) -> Transform:
  """Like `policy` for losses that take a PRNG ``key`` (e.g. clip_cov).

  The key comes from ``Algorithm.loss(..., key=...)``.
  """
  return _policy(loss_fn, hyper, with_key=True)
