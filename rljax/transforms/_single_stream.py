"""Single-stream Policy Optimization (SPO, arXiv 2509.13232): no groups.

Each prompt is sampled once per visit (G = 1 works; larger G too). Its
baseline is a persistent, discounted Beta(alpha, beta) tracker of its
success rate kept across steps in a `PromptTable`, and the advantages are
normalised over the whole batch instead of within a group, so no sample
loses its signal to a degenerate group. The prioritized prompt sampler that
goes with it is `rljax.selection.SingleStream`.

This module is unrelated to `spo_win_rates` (another paper's SPO).
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax._src import sharding
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import _keep_terms
from rljax._src.tables import PromptTable
from rljax.selection._single_stream import single_stream_prior
from rljax.transforms._advantages import sequence_rewards

_FORGETTING = ("constant", "kl")
_BY = "single_stream_advantages"


def single_stream_rho(
  drift_P: ArrayLike,
  *,
  d_half: float = 0.06,
  rho_min: float = 0.875,
  rho_max: float = 0.96,
) -> jax.Array:
  """SPO's KL-adaptive discount: ``rho = clip(2^(-D / D_half), rho_min,
  rho_max)``.

  D is the drift of the policy since the prompt was last sampled: no drift
  keeps rho_max (a memory of 1 / (1 - 0.96) = 25 visits), a drift of
  D_half halves the weight of the old evidence, and rho_min (8 visits)
  bounds the forgetting. Defaults are the official code's.
  """
  d = stats.f32(drift_P)
  return jnp.clip(jnp.exp2(-d / d_half), rho_min, rho_max)


def single_stream_zscore(
  rewards_PG: ArrayLike,
  p_hat_P: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  eps: float = 1e-8,
) -> jax.Array:
  """SPO's advantage: ``A = r - p_hat(x)``, z-scored over the whole batch.

      A_i = r_i - p_hat(x_i),   A_i <- (A_i - mean_B A) / (std_B A + eps)

  with the mean and the unbiased std (torch's ``std``, as the official
  code) over every valid sample of the batch, not per prompt.

  Args:
    rewards_PG: [P, G] sequence rewards.
    p_hat_P: [P] the tracker's success rate of each prompt.
    sample_mask_PG: [P, G] valid samples (default: all).
    eps: added to the std (official code: 1e-8).

  Returns:
    [P, G] float32 advantages, 0 at invalid samples.
  """
  checks.rank("rewards_PG", rewards_PG, 2, "[prompts, samples]")
  p = jnp.shape(rewards_PG)[0]
  checks.leading_shape("p_hat_P", p_hat_P, (p,), "rewards_PG[:, 0]")
  checks.rank("p_hat_P", p_hat_P, 1, "[prompts]")
  if sample_mask_PG is None:
    valid = jnp.ones_like(stats.f32(rewards_PG))
  else:
    checks.same_shape(
      ["rewards_PG", "sample_mask_PG"], rewards_PG, sample_mask_PG
    )
    valid = stats.f32(jnp.asarray(sample_mask_PG) != 0)
  a = jnp.where(
    valid > 0, stats.f32(rewards_PG) - stats.f32(p_hat_P)[:, None], 0
  )
  # Moments of a - ref, ref one valid value, so that a constant batch has
  # mean exactly ref and std exactly 0 (then every advantage is exactly 0).
  ref = jnp.max(jnp.where(valid > 0, a, -jnp.inf))
  ref = jnp.where(jnp.isfinite(ref), ref, 0.0)
  centred = a - ref
  mean = stats.masked_mean(centred, valid)
  std = stats.masked_std(centred, valid)
  return jnp.where(valid > 0, stats.safe_div(centred - mean, std + eps), 0.0)


def _tracker(num_prompts: int, initial: Optional[ArrayLike]) -> PromptTable:
  """The initial table of (alpha, beta) per prompt."""
  if initial is None:
    initial = single_stream_prior(num_prompts)
  values = np.asarray(initial, np.float64)
  if values.shape != (num_prompts, 2) or not np.all(values >= 0):
    raise ValueError(
      f"single_stream_advantages initial has shape {values.shape}; it must"
      f" be ({num_prompts}, 2) non-negative (alpha, beta) per prompt, e.g."
      " rljax.selection.single_stream_prior(num_prompts, successes, trials)."
    )
  if not np.all(values.sum(-1) > 0):
    raise ValueError(
      "single_stream_advantages initial alpha + beta must be > 0."
    )
  return PromptTable(
    values=jnp.asarray(values, jnp.float32),
    seen=jnp.zeros((num_prompts,), jnp.int32),
    fill=jnp.full((2,), 0.5, jnp.float32),
  )


def _track(
  table: PromptTable,
  ids: jax.Array,
  rewards: jax.Array,
  valid: jax.Array,
  rho_P: jax.Array,
) -> PromptTable:
  """alpha <- rho alpha + sum r, beta <- rho beta + sum (1 - r) per prompt,
  summed over every row of the batch with the same id (one discount)."""
  wins = jnp.sum(jnp.clip(rewards, 0.0, 1.0) * valid, axis=-1)
  count = jnp.sum(valid, axis=-1)
  # Each row against every row of the batch: the second side gathered whole,
  # so that rows sharded over a mesh compare with all the others.
  same = ids[:, None] == sharding.replicated(ids)[None, :]
  wins = jnp.sum(jnp.where(same, sharding.replicated(wins)[None], 0.0), -1)
  count = jnp.sum(jnp.where(same, sharding.replicated(count)[None], 0.0), -1)
  old, _ = table.lookup(ids)
  new = jnp.stack(
    [rho_P * old[:, 0] + wins, rho_P * old[:, 1] + count - wins], axis=-1
  )
  return table.store(ids, new, count > 0)


def single_stream_advantages(
  num_prompts: int,
  *,
  forgetting: str = "constant",
  rho: float = 0.875,
  rho_min: float = 0.875,
  rho_max: float = 0.96,
  d_half: float = 0.06,
  drift: str = "policy_drift_P",
  initial: Optional[ArrayLike] = None,
  eps: float = 1e-8,
) -> Transform:
  """Single-stream SPO advantages from a persistent per-prompt tracker.

  The state is a `PromptTable` of (alpha, beta) per prompt id
  (``Batch.prompt_ids_P``). Per batch, with the tracker before it:

      p_hat(x) = alpha(x) / (alpha(x) + beta(x))
      A        = r - p_hat(x),  z-scored over the batch (`single_stream_zscore`)
      alpha(x) <- rho(x) alpha(x) + sum_g r_g
      beta(x)  <- rho(x) beta(x)  + sum_g (1 - r_g)

  r is the sequence reward (`sequence_rewards`); the tracker counts it
  clipped to [0, 1] (the paper's binary success). Invalid samples get A = 0
  and are not counted. A prompt that appears in several rows of a batch is
  discounted once and counts all of them.

  ``forgetting="constant"`` uses rho = `rho` (the official code's
  ``rho.type: constant``). ``forgetting="kl"`` is the paper's KL-adaptive
  tracker, rho(x) = `single_stream_rho`(D(x)) with D(x) the policy's drift
  since x was last sampled, read from ``Batch.extra[drift]`` ([P], 0 for
  prompts seen for the first time). The official code measures D as the
  token mean of |log pi_then - log pi_now| on the prompt's previous
  response; that needs the previous response re-scored by the current
  policy, which the `Trainer` does not do yet, so a caller supplies it
  (``Trainer(annotate=...)`` or `Batch.with_extra`).

  Args:
    num_prompts: the table size (``len(task.train)``).
    forgetting: "constant" or "kl" (see above).
    rho: the constant discount (official code: 0.875).
    rho_min, rho_max, d_half: the KL-adaptive discount's bounds and half
      drift (official code: 0.875, 0.96, 0.06).
    drift: the ``Batch.extra`` name of D under "kl".
    initial: [num_prompts, 2] (alpha, beta) to start from, e.g. offline
      estimates through `rljax.selection.single_stream_prior`; default
      alpha = beta = 0.5.
    eps: added to the batch std.

  References:
    Xu and Ding, "Single-stream Policy Optimization", arXiv 2509.13232
    (the abstract states the persistent KL-adaptive value tracker, global
    advantage normalisation and prioritized sampling).
    Checked: every formula against the official code (verl-project/
    verl-recipe `spo/spo_ray_trainer.py`: ``fit`` and ``_get_spo_rho``):
    the advantage from the tracker before the update, the z-score with
    torch's unbiased std + 1e-8, the update after the step with rho clipped
    to [0.875, 0.96], D_half = 0.06, and the offline initialisation. The
    paper's full text (its equation numbers and whether it states D as a KL
    or the code's absolute log-ratio) could not be read here.
  """
  checks.positive(num_prompts=num_prompts, d_half=d_half)
  checks.non_negative(eps=eps)
  checks.one_of("forgetting", forgetting, _FORGETTING)
  if not 0 < rho <= 1 or not 0 < rho_min <= rho_max <= 1:
    raise ValueError(
      f"single_stream_advantages needs 0 < rho <= 1 and 0 < rho_min <="
      f" rho_max <= 1; got rho={rho}, rho_min={rho_min}, rho_max={rho_max}."
    )
  table = _tracker(int(num_prompts), initial)

  def prepare(batch: Batch, table: PromptTable):
    batch.require("rewards_PG", "prompt_ids_P", by=_BY)
    ids = jnp.asarray(batch.prompt_ids_P, jnp.int32)
    rewards = sequence_rewards(batch)
    valid = batch.samples()
    ab, _ = table.lookup(ids)
    p_hat = stats.safe_div(ab[:, 0], ab[:, 0] + ab[:, 1])
    adv = single_stream_zscore(rewards, p_hat, valid, eps=eps)
    if forgetting == "kl":
      d = batch.get(drift, by=_BY)
      rho_P = single_stream_rho(
        d, d_half=d_half, rho_min=rho_min, rho_max=rho_max
      )
    else:
      rho_P = rho * jnp.ones_like(p_hat)  # sharded like the rows
    table = _track(table, ids, stats.f32(rewards), valid, rho_P)
    batch = batch._replace(advantages_PGT=adv[..., None] * batch.loss_mask())
    return batch, table

  return Transform(lambda: table, prepare, _keep_terms)
