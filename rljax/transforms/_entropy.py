"""Batch stages for D3S (arXiv 2509.22115) and ARES / AEPO (arXiv 2510.08457).

* `d3s_downsampling`: dual-level down-sampling after the advantage stage:
  a maximum-variance subset of each group (``sample_mask_PG``) and the
  tokens with the largest |A| * H (``policy_weights_PGT``), with keep ratios
  that follow a curriculum schedule (state: a step counter).
* `ares_entropy_shaping`: a reward stage (before the advantage stage) that
  adds ARES's difficulty-aware high-window-entropy reward to ``rewards_PG``
  and writes a per-sample KL weight ``extra["kl_weight_PG"]``.

Both run in ``prepare`` on the whole rollout batch, so their batch-wide
statistics (D3S's token quantile, ARES's threshold and bucket targets) are
the batch's whatever the micro-batching; the results travel with the batch
into the micro-batches.
"""

from collections.abc import Callable
import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import _keep_terms
from rljax.advantages import _entropy as E
from rljax.transforms._advantages import sequence_rewards
from rljax.transforms._variants import correctness

Ratio = float | tuple[float, float] | Callable[[jax.Array], jax.Array]

# ---------------------------------------------------------------------------
# D3S.
# ---------------------------------------------------------------------------


def _check_ratio(name: str, value: float) -> None:
  checks.positive(**{name: value})
  checks.in_range(name, value, 0.0, 1.0)


def keep_schedule(ratio: Ratio, steps: int, *, name: str) -> optax.Schedule:
  """A keep ratio as an `optax.Schedule` of the step count.

  A float is constant; ``(start, end)`` is `optax.linear_schedule` from
  start to end over `steps` steps (then constant); a callable is used as
  is (any `optax.Schedule`, e.g. ``optax.cosine_decay_schedule``); its
  values are clipped to [0, 1] where used.
  """
  if callable(ratio):
    return ratio
  if isinstance(ratio, (int, float)):
    _check_ratio(name, float(ratio))
    return optax.constant_schedule(float(ratio))
  if isinstance(ratio, (tuple, list)) and len(ratio) == 2:
    start, end = (float(x) for x in ratio)
    _check_ratio(f"{name}[0]", start)
    _check_ratio(f"{name}[1]", end)
    checks.positive(steps=steps)
    return optax.linear_schedule(start, end, int(steps))
  raise ValueError(
    f"{name} must be a float in (0, 1], a (start, end) pair or an"
    f" optax.Schedule callable; got {ratio!r}."
  )


class D3SState(NamedTuple):
  step: jax.Array  # int32 count of prepared rollout batches


def d3s_downsampling(
  *,
  sample_keep: Ratio = (0.5, 1.0),
  token_keep: Ratio = (0.5, 1.0),
  steps: int = 100,
  min_samples: int = 2,
  recompute: Optional[Callable[..., jax.Array]] = None,
) -> Transform:
  """D3S (arXiv 2509.22115): dynamic dual-level down-sampling.

  Goes after the advantage stage. At step s (the number of batches prepared
  before this one), with rho_S = sample_keep(s) and rho_T = token_keep(s):

  1. Sample level: in each group keep the k = clip(round(rho_S * G),
     min_samples, G) valid samples whose sequence advantages (masked mean
     over T of ``advantages_PGT``) have the largest variance, exactly
     (`rljax.advantages.max_variance_subset`); the others leave
     ``sample_mask_PG`` (and so the loss and its normaliser).
  2. Optionally recompute the advantages on the kept subset: `recompute`
     is an outcome estimator ``f(rewards_PG, sample_mask_PG) -> adv_PG``
     (e.g. `rljax.advantages.grpo`).
  3. Token level: among the kept samples' valid tokens, keep those with
     |A_{i,t}| * H_{i,t} >= quantile_{1 - rho_T} over ALL valid tokens of
     the batch (`rljax.advantages.adv_entropy_token_mask`, H =
     ``old_entropy_PGT``, the behaviour policy's); ``policy_weights_PGT``
     (ones if absent) is multiplied by that 0/1 mask. The quantile is taken
     here in prepare on the whole batch, so it is exact under
     micro-batching.

  Checked against the paper's abstract and summaries only (the code is in
  the paper's supplementary material; no public repository was found):
  sample level max Var(A), token level |A| * H, a curriculum that starts
  aggressive and relaxes. Choices where that is silent: the intra-group
  variant ("D3S-I"); the default ratios (0.5 -> 1.0 for both, linear over
  100 steps), `min_samples` = 2 and keeping the advantages as computed on
  the whole group (``recompute=None``); the token mask multiplies the
  policy term only (the loss normaliser still counts dropped tokens, like
  `rljax.objectives.top_entropy_mask`).

  Args:
    sample_keep: k / G: a float, a (start, end) pair (linear over `steps`)
      or an `optax.Schedule`.
    token_keep: rho_T, same forms.
    steps: length of the linear schedules.
    min_samples: smallest k (a variance needs 2).
    recompute: optional estimator to recompute advantages on the subset.
  """
  sample_fn = keep_schedule(sample_keep, steps, name="sample_keep")
  token_fn = keep_schedule(token_keep, steps, name="token_keep")
  if not isinstance(min_samples, int) or min_samples < 1:
    raise ValueError(f"min_samples must be an int >= 1; got {min_samples!r}.")

  def init():
    return D3SState(step=jnp.zeros((), jnp.int32))

  def prepare(batch: Batch, state: D3SState):
    by = "d3s_downsampling"
    batch.require("advantages_PGT", "old_entropy_PGT", by=by)
    g = batch.shape[1]
    rho_s = jnp.clip(stats.f32(sample_fn(state.step)), 0.0, 1.0)
    rho_t = jnp.clip(stats.f32(token_fn(state.step)), 0.0, 1.0)
    k = jnp.clip(jnp.round(rho_s * g), min(min_samples, g), g)
    mask = batch.loss_mask()
    a_seq = stats.masked_mean(batch.advantages_PGT, mask, axis=-1)
    keep = E.max_variance_subset(a_seq, batch.samples(), k.astype(jnp.int32))
    batch = batch._replace(sample_mask_PG=batch.samples() * keep)
    if recompute is not None:
      adv = recompute(sequence_rewards(batch), batch.samples())
      batch = batch._replace(advantages_PGT=adv[..., None] * batch.loss_mask())
    tokens = E.adv_entropy_token_mask(
      batch.advantages_PGT,
      batch.old_entropy_PGT,
      batch.loss_mask(),
      keep_fraction=rho_t,
    )
    weights = batch.policy_weights_PGT
    weights = jnp.ones(batch.shape) if weights is None else stats.f32(weights)
    batch = batch._replace(policy_weights_PGT=weights * tokens)
    return batch, D3SState(step=state.step + 1)

  return Transform(init=init, prepare=prepare, apply=_keep_terms)


# ---------------------------------------------------------------------------
# ARES / AEPO.
# ---------------------------------------------------------------------------


class AresState(NamedTuple):
  threshold: jax.Array  # float32 EMA of the HWE threshold (NaN before any)
  alpha_3: jax.Array  # float32 [3] entropy-reward scale per bucket


def ares_entropy_shaping(
  *,
  window: int = 4,
  lookahead: bool = False,
  threshold: Optional[float] = None,
  percentile: float = 95.0,
  ema: float = 0.99,
  candidates: Optional[str] = None,
  alpha_init: tuple[float, float, float] = (0.5, 0.5, 0.5),
  alpha_lr: float = 0.05,
  alpha_max: float = 2.0,
  kl_weights: tuple[float, float, float] = (1.0, 1.0, 1.0),
  table: E.AresRewardTable = E.ARES_TABLE,
) -> Transform:
  """ARES / AEPO (arXiv 2510.08457): difficulty-aware HWE reward shaping.

  A reward stage: goes before the advantage stage. Per rollout batch:

  1. Window entropies of ``old_entropy_PGT`` (`rljax.advantages.
     window_entropy`); the threshold tau is `threshold` when given, else an
     EMA (decay `ema`, seeded by the first batch) of the batch median of
     each sequence's `percentile`-th percentile (`hwe_threshold`); this
     batch's value enters before use.
  2. n_i = number of HWE triggers (`hwe_trigger_count`), at the positions
     of ``extra[candidates]`` (0/1 ``_PGT``) when given, else everywhere.
  3. Difficulty per prompt from the group accuracy (`ares_difficulty`:
     easy >= 2/3 > medium >= 1/3 > hard), correctness from
     ``extra["correct_PG"]``, else reward column 0, else rewards_PG > 0.
  4. Per bucket: target_d = round(batch mean of the group-mean n), then
     alpha_d += alpha_lr * (mean_d - target_d) (easy, medium) or
     alpha_lr * (target_d - mean_d) (hard), clipped to [0, alpha_max].
  5. rewards_PG += `ares_entropy_reward` (valid samples only).
  6. ``extra["kl_weight_PG"]`` = kl_weights[difficulty] per sample, plus
     ``extra["hwe_triggers_PG"]`` (n_i) and ``extra["difficulty_P"]``.

  A KL penalty reads it as a per-sample factor on its per-token term:
  penalty_PGT = coef * kl_weight_PG[..., None] * kl_PGT.

  Checked against the official code (github.com/shawn0728/ARES:
  `examples/reward_function/aepo.py`, `verl/trainer/ray_trainer.py`,
  `verl/workers/rollout/vllm_rollout_spmd.py`, `dp_actor.py`); every
  default is the code's except where stated. Differences: the window is
  the paper's [t, t+w) unless `lookahead` (the code's (t, t+w]); entropies
  are the behaviour policy's full-vocabulary ones (the code uses vLLM's
  top-10 log-probs with a tail bucket); the code counts triggers only at
  reasoning words (pass `candidates`); its percentile also counts
  incomplete windows padded by a running mean (here only complete ones);
  the code's threshold is the EMA before the current batch (and seeded from
  validation); its per-bucket KL beta follows a slow PPO-style controller
  starting at 1.0 (target KL 0.01, log-space steps every 100 updates) that
  is not reproduced: `kl_weights` are fixed, default (1, 1, 1), the code's
  initial value, so the default is neutral; its dual-ascent soft-cost
  lambda is computed but unused by its reward, and is omitted. The bucket
  targets and tau are batch-wide statistics of the batch given to prepare.

  Args:
    window, lookahead: see `rljax.advantages.window_entropy` (w = 4).
    threshold: a fixed tau; None = the adaptive EMA above.
    percentile, ema: the adaptive threshold's percentile (95) and decay
      (0.99).
    candidates: optional extra ``_PGT`` name of 0/1 candidate positions.
    alpha_init, alpha_lr, alpha_max: the per-bucket reward scale (0.5 each,
      0.05, 2.0); the lower clip is 0.
    kl_weights: KL factor per bucket (easy, medium, hard).
    table: per-bucket constants of `ares_entropy_reward`.
  """
  _check_ares(threshold, ema, alpha_init, alpha_lr, alpha_max, kl_weights)
  if candidates is not None and not candidates.endswith("_PGT"):
    raise ValueError(
      f"ares_entropy_shaping: candidates={candidates!r} must be an extra"
      " name ending in _PGT (0/1 per token)."
    )
  prepare = functools.partial(
    _ares_prepare,
    window_kw=dict(window=window, lookahead=lookahead),
    threshold=threshold,
    percentile=percentile,
    ema=ema,
    candidates=candidates,
    alpha_step=(alpha_lr, alpha_max),
    kl_weights=kl_weights,
    table=table,
  )
  init = functools.partial(_ares_init, alpha_init)
  return Transform(init=init, prepare=prepare, apply=_keep_terms)


def _check_ares(threshold, ema, alpha_init, alpha_lr, alpha_max, kl_weights):
  """`ares_entropy_shaping`'s hyperparameter checks."""
  if threshold is not None:
    checks.non_negative(threshold=threshold)
  checks.in_range("ema", ema, 0.0, 1.0)
  checks.non_negative(
    alpha_init=alpha_init, alpha_lr=alpha_lr, kl_weights=kl_weights
  )
  checks.positive(alpha_max=alpha_max)
  if len(alpha_init) != 3 or len(kl_weights) != 3:
    raise ValueError(
      "alpha_init and kl_weights need 3 values (easy, medium, hard); got"
      f" {alpha_init!r} and {kl_weights!r}."
    )


def _ares_init(alpha_init) -> AresState:
  return AresState(
    threshold=jnp.full((), jnp.nan, jnp.float32),
    alpha_3=jnp.asarray(alpha_init, jnp.float32),
  )


def _ares_prepare(
  batch: Batch,
  state: AresState,
  *,
  window_kw: dict,
  threshold: Optional[float],
  percentile: float,
  ema: float,
  candidates: Optional[str],
  alpha_step: tuple[float, float],
  kl_weights: tuple[float, float, float],
  table: E.AresRewardTable,
):
  """Steps 1-6 of `ares_entropy_shaping` on one rollout batch."""
  by = "ares_entropy_shaping"
  batch.require("old_entropy_PGT", "rewards_PG", by=by)
  mask = batch.loss_mask()
  samples = batch.samples()
  h = batch.old_entropy_PGT
  if threshold is None:
    stat = E.hwe_threshold(h, mask, percentile=percentile, **window_kw)
    tau = _ema_threshold(state.threshold, stat, ema)
  else:
    tau = jnp.asarray(threshold, jnp.float32)
  cand = None if candidates is None else batch.get(candidates, by=by)
  counts = E.hwe_trigger_count(h, mask, tau, candidates_BT=cand, **window_kw)
  correct = correctness(batch)
  difficulty = E.ares_difficulty(correct, samples)
  mean_3, target_3, present_3 = E.ares_bucket_targets(
    counts, samples, difficulty
  )
  alpha_3 = _ares_alpha(state.alpha_3, mean_3, target_3, present_3, alpha_step)
  d_pg = jnp.broadcast_to(difficulty[:, None], counts.shape)
  bonus = E.ares_entropy_reward(
    counts, target_3[d_pg], d_pg, correct, alpha_3[d_pg], table
  )
  rewards = stats.f32(batch.rewards_PG) + jnp.where(samples > 0, bonus, 0.0)
  kl_w = jnp.asarray(kl_weights, jnp.float32)[d_pg]
  batch = batch._replace(rewards_PG=rewards).with_extra(
    kl_weight_PG=kl_w,
    hwe_triggers_PG=counts,
    difficulty_P=difficulty.astype(jnp.int32),
  )
  new_threshold = tau if threshold is None else state.threshold
  return batch, AresState(threshold=new_threshold, alpha_3=alpha_3)


def _ema_threshold(old, stat, ema: float) -> jax.Array:
  """tau: the EMA of the batch statistic, seeded by the first one (NaN:
  none yet); this batch's value enters before use."""
  return jnp.where(
    jnp.isnan(stat),
    old,
    jnp.where(jnp.isnan(old), stat, ema * old + (1.0 - ema) * stat),
  )


def _ares_alpha(alpha_3, mean_3, target_3, present_3, alpha_step):
  """alpha_d += lr (mean_d - target_d) (easy, medium) or lr (target_d -
  mean_d) (hard), clipped to [0, alpha_max]; absent buckets keep theirs."""
  lr, alpha_max = alpha_step
  sign_3 = jnp.array([1.0, 1.0, -1.0])
  step = lr * sign_3 * (mean_3 - target_3)
  return jnp.where(present_3, jnp.clip(alpha_3 + step, 0.0, alpha_max), alpha_3)
