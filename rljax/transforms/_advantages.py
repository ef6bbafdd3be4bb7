"""Advantage stages: read rewards from the batch, write `advantages_PGT`.

Outcome estimators use the sequence reward R_i = rewards_PG + sum_t
token_rewards_PGT (so a KL penalty folded into the reward is part of R_i, as in
verl), and broadcast A_i over the completion tokens.
"""

from collections.abc import Callable

import jax

from rljax import advantages
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare


def sequence_rewards(batch: Batch) -> jax.Array:
  """[P, G] R_i: the outcome reward plus any per-token rewards."""
  batch.require("rewards_PG", by="an outcome advantage estimator")
  rewards = stats.f32(batch.rewards_PG)
  if batch.token_rewards_PGT is not None:
    rewards += stats.masked_sum(batch.token_rewards_PGT, batch.mask_PGT, -1)
  return rewards


def token_rewards(batch: Batch) -> jax.Array:
  """[P, G, T] rewards per token: the outcome reward on the last token."""
  batch.require("rewards_PG", by="a token-level advantage estimator")
  rewards = advantages.outcome_to_token_rewards(
    batch.rewards_PG, batch.mask_PGT
  )
  if batch.token_rewards_PGT is not None:
    rewards += stats.f32(batch.token_rewards_PGT)
  return rewards


def _per_token(batch: Batch, adv_PG: jax.Array) -> Batch:
  return batch._replace(advantages_PGT=adv_PG[..., None] * batch.loss_mask())


def _need_group(batch: Batch, by: str) -> None:
  """A group baseline needs G >= 2; say so before an estimator divides by
  G - 1 or takes the std of one sample."""
  if batch.shape[1] < 2:
    raise ValueError(
      f"{by} computes a group baseline and needs at least 2 samples per"
      f" prompt; this batch has G = {batch.shape[1]}. Set"
      " sampler.num_samples >= 2, or train on a single stream with the"
      " preset 'spo' (transforms.single_stream_advantages: a per-prompt"
      " tracker baseline for sampler.num_samples=1)."
    )


def group_advantages(
  estimator: Callable[..., jax.Array], **kwargs
) -> Transform:
  """Any estimator ``f(rewards_PG, sample_mask_PG, **kwargs) -> adv_PG``.

  Covers grpo, dr_grpo, batch_std, rloo, gpg, pass_at_k and user estimators.
  A batch of one sample per prompt (G = 1) raises a ValueError naming
  ``sampler.num_samples`` and the single-stream preset ``spo``; wrap an
  estimator that needs no group in `rljax.stateless_prepare` instead.

  Example:
    >>> t = group_advantages(rljax.advantages.grpo, eps=1e-4)  # doctest: +SKIP
  """

  by = f"group_advantages({getattr(estimator, '__name__', estimator)})"

  def fn(batch: Batch) -> Batch:
    _need_group(batch, by)
    adv = estimator(sequence_rewards(batch), batch.samples(), **kwargs)
    return _per_token(batch, adv)

  return stateless_prepare(fn)


def opo_advantages() -> Transform:
  """OPO: baseline = length-weighted group mean of the rewards (verl `opo`)."""

  def fn(batch: Batch) -> Batch:
    _need_group(batch, "opo_advantages")
    lengths = stats.sequence_lengths(batch.mask_PGT)
    adv = advantages.opo(sequence_rewards(batch), lengths, batch.samples())
    return _per_token(batch, adv)

  return stateless_prepare(fn)


def remax_advantages() -> Transform:
  """ReMax: baseline = reward of the greedy completion (`baseline_rewards_P`)."""

  def fn(batch: Batch) -> Batch:
    batch.require("baseline_rewards_P", by="remax_advantages")
    adv = advantages.remax(
      sequence_rewards(batch), batch.baseline_rewards_P, batch.samples()
    )
    return _per_token(batch, adv)

  return stateless_prepare(fn)


def gdpo_advantages(weights=None, *, eps: float = 1e-4) -> Transform:
  """GDPO: normalise each of K rewards in its group, weight, batch-normalise."""

  def fn(batch: Batch) -> Batch:
    batch.require("rewards_PGK", by="gdpo_advantages")
    _need_group(batch, "gdpo_advantages")
    adv = advantages.gdpo(
      batch.rewards_PGK, batch.samples(), weights=weights, eps=eps
    )
    return _per_token(batch, adv)

  return stateless_prepare(fn)


def reinforce_pp_advantages(*, gamma: float = 1.0) -> Transform:
  """REINFORCE++: discounted returns whitened over all valid tokens."""

  def fn(batch: Batch) -> Batch:
    adv = advantages.reinforce_pp(
      token_rewards(batch), batch.loss_mask(), gamma=gamma
    )
    return batch._replace(advantages_PGT=adv)

  return stateless_prepare(fn)


def reinforce_pp_baseline_advantages() -> Transform:
  """REINFORCE++-baseline: group mean subtracted, then batch whitening."""

  def fn(batch: Batch) -> Batch:
    _need_group(batch, "reinforce_pp_baseline_advantages")
    adv = advantages.reinforce_pp_baseline(
      sequence_rewards(batch), batch.loss_mask(), batch.samples()
    )
    return batch._replace(advantages_PGT=adv)

  return stateless_prepare(fn)


def gae_advantages(
  *, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True
) -> Transform:
  """GAE over `old_values_PGT`; writes advantages and value `returns_PGT`.

  The advantages are whitened over the valid tokens of the batch (verl,
  OpenRLHF) unless ``whiten=False``; returns are never whitened.
  """

  def fn(batch: Batch) -> Batch:
    batch.require("old_values_PGT", by="gae_advantages")
    mask = batch.loss_mask()
    adv, returns = advantages.gae(
      token_rewards(batch), batch.old_values_PGT, mask, gamma=gamma, lam=lam
    )
    if whiten:
      adv = advantages.whiten(adv, mask)
    return batch._replace(advantages_PGT=adv, returns_PGT=returns)

  return stateless_prepare(fn)


def egae_advantages(
  *, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True
) -> Transform:
  """T-PPO's advantages (arXiv 2506.15050) over windows of partial
  rollouts (`rljax.rollouts.PartialRollouts` with ``train_unfinished``).

  * `rljax.advantages.egae` over `old_values_PGT`, the samples still
    running (``Batch.extra["unfinished_PG"]``) bootstrapped from their
    last value and given no outcome reward;
  * the policy trains each token once, in the window that drew it
    (``extra["lag_PG"]`` 0): earlier windows' tokens get policy weight 0;
  * the value model trains on finished responses only (``extra
    ["value_mask_PGT"]``, read by `rljax.objectives.value_loss`).

  Whitening as `gae_advantages`, over the tokens the policy trains.
  Without those extras it is `gae_advantages`.
  """

  def fn(batch: Batch) -> Batch:
    batch.require("old_values_PGT", by="egae_advantages")
    extra = batch.extra or {}
    mask = batch.loss_mask()
    unfinished = stats.f32(
      extra.get("unfinished_PG", jax.numpy.zeros(batch.shape[:2]))
    )
    rewards = token_rewards(batch) * (1 - unfinished)[..., None]
    adv, returns = advantages.egae(
      rewards,
      batch.old_values_PGT,
      mask,
      unfinished,
      gamma=gamma,
      lam=lam,
    )
    window = mask
    if "lag_PG" in extra:
      window = mask * (extra["lag_PG"] == 0)
    if whiten:
      adv = advantages.whiten(adv, window)
    weights = (
      window
      if batch.policy_weights_PGT is None
      else (stats.f32(batch.policy_weights_PGT) * window)
    )
    return batch._replace(
      advantages_PGT=adv * window,
      returns_PGT=returns,
      policy_weights_PGT=weights,
    ).with_extra(value_mask_PGT=mask * (1 - unfinished)[..., None])

  return stateless_prepare(fn)
