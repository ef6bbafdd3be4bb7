"""Batch stages over a group's streams (`rljax.rollouts` strategies mark
each sample's recipe in ``Batch.extra["stream_PG"]``): per-stream sample
weights and ICPO's expert bonus."""

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import _keep_terms
from rljax._src.base import stateless_prepare


def stream_weights(**streams: Sequence[int]) -> Transform:
  """Write ``extra[name]`` = 1.0 for the samples whose stream is one of
  `streams[name]`, else 0.0, e.g. ``stream_weights(on_policy_PG=(0, 2),
  expert_PG=(1,))``, for `rljax.objectives.mixed_policy` weights. Names end
  in ``_PG``."""
  for name, values in streams.items():
    if not name.endswith("_PG") or not values:
      raise ValueError(
        f"stream_weights: {name}={values!r}; give a name ending in _PG and"
        " the stream ids it selects, e.g. on_policy_PG=(0,)."
      )
  by = "transforms.stream_weights"

  def fn(batch: Batch) -> Batch:
    stream = jnp.asarray(batch.get("stream_PG", by=by))
    return batch.with_extra(
      **{
        name: jnp.isin(stream, jnp.asarray(values)).astype(jnp.float32)
        for name, values in streams.items()
      }
    )

  return stateless_prepare(fn)


def icpo_bonus(
  correct_PG: ArrayLike,
  expert_PG: ArrayLike,
  step: ArrayLike,
  *,
  beta: float = 1.0,
  horizon: float = 400.0,
) -> jax.Array:
  """ICPO's annealed expert bonus, [P, G]:
  ``beta * max(0, 1 - step / horizon) * 1[expert and correct]``."""
  decay = jnp.maximum(0.0, 1.0 - stats.f32(step) / horizon)
  return beta * decay * stats.f32(correct_PG) * stats.f32(expert_PG)


class StepState(NamedTuple):
  """How many rollout batches a stage has seen."""

  step: jax.Array  # int32 scalar


def icpo_expert_bonus(
  *, beta: float = 1.0, horizon: int = 400, expert_streams: Sequence[int] = (1,)
) -> Transform:
  """ICPO's reward shaping: correct implicit-expert-forcing samples earn a
  bonus that decays linearly to 0 over `horizon` rollout batches,

      R' = R + beta * max(0, 1 - t / horizon) * 1[expert and correct],

  t the number of batches seen before this one (the state). Expert samples
  are those whose ``extra["stream_PG"]`` is in `expert_streams` (stream 1
  is `rljax.rollouts.PRIVILEGED`, which `rljax.rollouts.InContextDemos`
  writes); correct means the task's first reward > 0
  (``rewards_PGK[..., 0]``, or ``rewards_PG`` without it).

  References:
    ICPO, In-Context Steered Policy Optimization, arXiv 2510.26519
    (catalog row 1.90): R' = R + alpha(t) 1[IEF and correct], alpha(t)
    annealed to 0. Checked against Celine-hxy/ICPO (``reward_score.py::
    compute_score_icpo_bonus``): 1 + beta max(0, 1 - t / T) for a correct
    IEF sample, beta = 1, T = 400 (the defaults); its ``alpha`` argument is
    unused there. The paper's reject sampling (ERRS) has no filter in the
    code; keep only correct expert samples with `stream_weights` and
    `rljax.filters` if wanted.
  """
  checks.non_negative(beta=beta)
  checks.positive(horizon=horizon)
  by = "transforms.icpo_expert_bonus"

  def prepare(batch: Batch, state: StepState):
    batch.require("rewards_PG", by=by)
    stream = jnp.asarray(batch.get("stream_PG", by=by))
    expert = jnp.isin(stream, jnp.asarray(tuple(expert_streams)))
    first = (
      batch.rewards_PG
      if batch.rewards_PGK is None
      else batch.rewards_PGK[..., 0]
    )
    bonus = icpo_bonus(
      stats.f32(first) > 0, expert, state.step, beta=beta, horizon=horizon
    )
    rewards = stats.f32(batch.rewards_PG) + bonus * batch.samples()
    return batch._replace(rewards_PG=rewards), StepState(state.step + 1)

  return Transform(
    lambda: StepState(jnp.zeros((), jnp.int32)), prepare, _keep_terms
  )
