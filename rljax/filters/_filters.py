"""Batch filters: which prompt groups train, as float32 0/1 keep masks.

A filter never drops rows (shapes stay static under jit): the caller
multiplies keep_P into the sample mask (`sample_mask_PG * keep_P[..., None]`)
and the training loop refills the batch from the kept count. Rewards are
[..., G] with the group (samples of one prompt) on the LAST axis; an optional
`sample_mask_PG` of the same shape marks the valid samples (None: all valid).
"""

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import sharding
from rljax._src import stats


def _rewards_and_valid(rewards_PG, sample_mask_PG) -> tuple[jax.Array, ...]:
  """float32 rewards and a boolean validity mask of the same shape."""
  if jnp.ndim(rewards_PG) < 1:
    raise ValueError(
      "rewards_PG must have a last axis G (samples per prompt); got a scalar."
    )
  checks.same_shape(
    ["rewards_PG", "sample_mask_PG"], rewards_PG, sample_mask_PG
  )
  r = stats.f32(rewards_PG)
  if sample_mask_PG is None:
    return r, jnp.ones(r.shape, bool)
  return r, stats.f32(sample_mask_PG) > 0


def dynamic_sampling(
  rewards_PG: ArrayLike, sample_mask_PG: ArrayLike | None = None
) -> jax.Array:
  """DAPO dynamic sampling: keep groups whose rewards are not all equal.

  keep = 1[max_valid r != min_valid r] (equivalently population std > 0).
  A group with fewer than 2 valid samples is dropped: it carries no
  group-relative signal (verl keeps G == 1 groups; rljax does not).

  Args:
    rewards_PG: outcome rewards, [..., G].
    sample_mask_PG: valid samples, [..., G]; None = all valid.

  Returns:
    float32 0/1 keep mask [...].

  References:
    Yu et al., "DAPO", arXiv 2503.14476; verl `RayDAPOTrainer.fit`
    (`algorithm.filter_groups`).
  """
  r, valid = _rewards_and_valid(rewards_PG, sample_mask_PG)
  hi = jnp.max(jnp.where(valid, r, -jnp.inf), axis=-1)
  lo = jnp.min(jnp.where(valid, r, jnp.inf), axis=-1)
  # One valid sample gives hi == lo; none gives hi = -inf < lo = inf.
  return (hi > lo).astype(jnp.float32)


def reward_range_filter(
  rewards_PG: ArrayLike,
  sample_mask_PG: ArrayLike | None = None,
  *,
  low: float = 0.0,
  high: float = 1.0,
) -> jax.Array:
  """Keep groups whose mean valid reward lies strictly inside (low, high).

  keep = 1[low < mean_valid(r) < high]; a group with no valid sample is
  dropped. With 0/1 rewards the defaults drop all-wrong and all-right groups.

  Args:
    rewards_PG: outcome rewards, [..., G].
    sample_mask_PG: valid samples, [..., G]; None = all valid.
    low: exclusive lower bound (OpenRLHF `--algo.dynamic_filtering_range`, 0).
    high: exclusive upper bound (OpenRLHF, 1).

  Returns:
    float32 0/1 keep mask [...].

  References:
    OpenRLHF `samples_generator._generate_vllm` (dynamic filtering).
  """
  if not low < high:
    raise ValueError(f"high must be > low; got low={low!r}, high={high!r}.")
  r, valid = _rewards_and_valid(rewards_PG, sample_mask_PG)
  mean = stats.masked_mean(r, valid, axis=-1)
  nonempty = jnp.any(valid, axis=-1)
  return (nonempty & (mean > low) & (mean < high)).astype(jnp.float32)


def informative_groups(
  rewards_PG: ArrayLike,
  sample_mask_PG: ArrayLike | None = None,
  *,
  num_keep: int,
) -> jax.Array:
  """Keep the `num_keep` groups with the largest reward variance.

  score_p = population variance of the valid rewards of group p (groups with
  no valid sample rank below every other); keep the num_keep largest scores,
  ties broken by lower index. PODS applies max-variance down-sampling to the
  rollouts inside a group; this is the same criterion applied across groups.

  Args:
    rewards_PG: outcome rewards, [P, G].
    sample_mask_PG: valid samples, [P, G]; None = all valid.
    num_keep: number of groups kept, a static int in [1, P].

  Returns:
    float32 0/1 keep mask [P] with exactly num_keep ones.

  References:
    Xu et al., "Not All Rollouts are Useful: Down-Sampling Rollouts in LLM
    Reinforcement Learning" (PODS), arXiv 2504.13818.
  """
  checks.rank("rewards_PG", rewards_PG, 2, "P prompts, G samples")
  num_groups = jnp.shape(rewards_PG)[0]
  if not isinstance(num_keep, int) or not 1 <= num_keep <= num_groups:
    raise ValueError(
      f"num_keep must be an int in [1, P={num_groups}]; got {num_keep!r}."
    )
  r, valid = _rewards_and_valid(rewards_PG, sample_mask_PG)
  var = stats.masked_var(r, valid, axis=-1, ddof=0)
  score = jnp.where(jnp.any(valid, axis=-1), var, -1.0)
  order = jnp.argsort(-sharding.replicated(score), stable=True)
  keep = jnp.zeros((num_groups,), jnp.float32)
  return keep.at[order[:num_keep]].set(1.0)
