"""A policy term mixed from several advantages (COPO, HDPO per channel).

  L_t = sum_j w_j * loss_fn(logp, old_logp, A_j, mask).loss_t

Each A_j is ``Batch.advantages_PGT`` or an ``extra`` ``_PGT`` array written
by a batch stage, each weight w_j a constant or an ``extra`` ``_PG`` array
(one weight per sample, broadcast over T). The per-token loss is aggregated
by the algorithm like any policy term, so micro-batching is exact.
"""

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import LossTerms
from rljax._src.base import Transform
from rljax._src.base import mean_metric
from rljax._src.base import old_logp
from rljax._src.base import stateless_apply
from rljax.objectives._policy import _name
from rljax.objectives._policy import _validate

Weight = float | str


def _check_mix(mix: Sequence[tuple[str, Weight]]) -> tuple:
  mix = tuple(mix)
  if not mix:
    raise ValueError("mixed_policy: mix must name at least one advantage.")
  for entry in mix:
    if not (isinstance(entry, tuple) and len(entry) == 2):
      raise ValueError(
        "mixed_policy: each mix entry is (advantage, weight), e.g."
        f" ('advantages_global_PGT', 'copo_global_weight_PG'); got {entry!r}."
      )
    adv, weight = entry
    if not (isinstance(adv, str) and adv.endswith("_PGT")):
      raise ValueError(
        "mixed_policy: an advantage is 'advantages_PGT' or an extra name"
        f" ending in _PGT; got {adv!r}."
      )
    if isinstance(weight, str):
      if not weight.endswith("_PG"):
        raise ValueError(
          "mixed_policy: a weight is a number or an extra name ending in _PG;"
          f" got {weight!r}."
        )
    elif not float(weight) >= 0:
      raise ValueError(f"mixed_policy: weights must be >= 0; got {weight!r}.")
  return mix


def _advantage(batch: Batch, name: str, by: str) -> jax.Array:
  if name == "advantages_PGT":
    batch.require("advantages_PGT", by=by)
    return batch.advantages_PGT
  return batch.get(name, by=by)


def _weight(batch: Batch, weight: Weight, by: str) -> jax.Array:
  if isinstance(weight, str):
    return stats.f32(batch.get(weight, by=by))[..., None]
  return jnp.float32(weight)


def mixed_policy(
  loss_fn: Callable,
  *,
  mix: Sequence[tuple[str, Weight]],
  **hyper,
) -> Transform:
  """Add sum_j w_j * loss_fn(..., A_j, ...) to the policy term.

  Example (COPO, arXiv 2508.04138: L = w_q L(A^loc) + (1 - w_q) L(A^glob)):
    >>> t = mixed_policy(  # doctest: +SKIP
    ...     rljax.losses.ppo_clip,
    ...     mix=rljax.transforms.COPO_MIX)

  Args:
    loss_fn: a per-token loss ``f(logp, old_logp, adv, mask, **hyper) ->
      TokenLoss`` (`rljax.losses`).
    mix: pairs (advantage, weight): the advantage ``"advantages_PGT"`` or an
      ``extra`` ``_PGT`` name; the weight a number >= 0 or an ``extra``
      ``_PG`` name.
    **hyper: hyperparameters of ``loss_fn``.

  Metrics: ``clip_frac_low`` / ``clip_frac_high`` are the weight-averaged
  clip indicators of the terms.
  """
  mix = _check_mix(mix)
  _validate(loss_fn, hyper, with_key=False)
  by = f"objectives.mixed_policy({_name(loss_fn)})"

  def fn(terms: LossTerms, batch: Batch) -> LossTerms:
    mask = batch.loss_mask()
    old = old_logp(terms.logp_PGT, batch)
    loss = jnp.zeros(batch.shape, jnp.float32)
    low = jnp.zeros_like(loss)
    high = jnp.zeros_like(loss)
    total = jnp.zeros_like(loss)
    for adv_name, weight in mix:
      adv = _advantage(batch, adv_name, by)
      w = jnp.broadcast_to(_weight(batch, weight, by), loss.shape)
      out = loss_fn(terms.logp_PGT, old, adv, mask, **hyper)
      loss = loss + w * out.loss
      low, high, total = (
        low + w * out.clip_low,
        high + w * out.clip_high,
        total + w,
      )
    metrics = dict(terms.metrics)
    metrics["clip_frac_low"] = mean_metric(stats.safe_div(low, total), mask)
    metrics["clip_frac_high"] = mean_metric(stats.safe_div(high, total), mask)
    return terms._replace(
      policy_loss_PGT=terms.policy_loss_PGT + loss, metrics=metrics
    )

  return stateless_apply(fn)
