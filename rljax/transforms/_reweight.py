"""Batch stages of `rljax.advantages._reweight`: ProGRPO's ARM, RED-Drop,
GRPO-S and RAPO's reward-tilted reference weights.
"""

from typing import Optional

import jax.numpy as jnp

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Rescore
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare
from rljax.advantages import _reweight as R
from rljax.transforms._advantages import sequence_rewards


def _behaviour_logp(batch: Batch, by: str):
  if batch.old_logp_PGT is not None:
    return batch.old_logp_PGT
  if batch.rollout_logp_PGT is not None:
    return batch.rollout_logp_PGT
  raise ValueError(
    f"{by} needs the behaviour log-probs: Batch.old_logp_PGT (the Trainer"
    " computes it when a stage reads it) or Batch.rollout_logp_PGT."
  )


def arm_advantages(
  *,
  alpha: float = 0.1,
  low_fraction: Optional[float] = 0.2,
  prompt_logp: Optional[str] = "prompt_logp_P",
) -> Transform:
  """ProGRPO (arXiv 2602.05281): ARM-reweighted advantages, after an
  advantage stage (the paper's is GRPO's).

  The answer confidence comes from the behaviour log-probs
  (``old_logp_PGT``, else ``rollout_logp_PGT``) through
  `rljax.advantages.answer_confidence` (``low_fraction`` of the
  lowest-probability tokens); the sequence advantage (the masked mean over
  T of ``advantages_PGT``) is shifted by `rljax.advantages.arm` and the
  shift added to every valid token. c(q) = exp(mean prompt token log-prob)
  (the inverse of the prompt's perplexity under the sampling policy, at
  temperature 1): ``extra[prompt_logp]``, which the stage asks the Trainer
  for (`rljax.Rescore` with ``span="prompt"``). ``prompt_logp=None`` uses
  the group's mean answer confidence as c(q) instead (the term is then
  zero-mean in each group).
  """
  checks.non_negative(alpha=alpha)
  R.check_low_fraction(low_fraction)

  def fn(batch: Batch) -> Batch:
    by = "arm_advantages"
    batch.require("advantages_PGT", by=by)
    mask = batch.loss_mask()
    conf = R.answer_confidence(
      _behaviour_logp(batch, by), mask, low_fraction=low_fraction
    )
    c_q = None
    if prompt_logp is not None:
      c_q = jnp.exp(stats.f32(batch.get(prompt_logp, by=by)))
    a_seq = stats.masked_mean(batch.advantages_PGT, mask, axis=-1)
    shaped = R.arm(
      a_seq,
      sequence_rewards(batch),
      conf,
      batch.samples(),
      alpha=alpha,
      prompt_confidence_P=c_q,
    )
    adv = stats.f32(batch.advantages_PGT) + (shaped - a_seq)[..., None] * mask
    return batch._replace(advantages_PGT=adv).with_extra(
      answer_confidence_PG=conf
    )

  rescores = ()
  if prompt_logp is not None:
    if not prompt_logp.endswith("_P"):
      raise ValueError(
        f"arm_advantages: prompt_logp must name an extra _P entry; got"
        f" {prompt_logp!r}."
      )
    rescores = (Rescore(prompt_logp, span="prompt"),)
  return stateless_prepare(fn)._replace(rescores=rescores)


def red_drop_advantages(
  *, std_normalize: bool = False, eps: float = 1e-6, drop: str = "mask"
) -> Transform:
  """RED-Drop (arXiv 2509.24203): the advantage stage of the RED family.

  Writes `rljax.advantages.red_drop`'s advantages. ``drop="mask"`` removes
  the dropped samples from the batch (``sample_mask_PG``, so they leave
  the loss's normalisers too): the paper's "drop". ``drop="zero"`` keeps
  them with advantage 0, as Trinity-RFT does (they still count in a
  token-mean's denominator). Randomised: needs the prepare key.
  """
  checks.one_of("drop", drop, ("mask", "zero"))

  def fn(batch: Batch) -> Batch:
    key = batch.require_key(by="red_drop_advantages")
    adv, kept = R.red_drop(
      sequence_rewards(batch),
      key,
      batch.samples(),
      std_normalize=std_normalize,
      eps=eps,
    )
    if drop == "mask":
      batch = batch._replace(sample_mask_PG=kept)
    return batch._replace(advantages_PGT=adv[..., None] * batch.loss_mask())

  return stateless_prepare(fn)


def grpo_s_rewards(
  hardness: str = "hardness_P",
  *,
  alpha: float = 1.0,
  beta: float = 1.0,
  temperature: float = 1.0,
) -> Transform:
  """GRPO-S (arXiv 2503.18991): scale ``rewards_PG`` by task difficulty
  (`rljax.advantages.grpo_s_scale`); goes before the advantage stage.

  Reads the data hardness from ``extra[hardness]`` (``_P``, in [0, 1]) and
  the reference response's reward from ``baseline_rewards_P``.
  """
  checks.non_negative(alpha=alpha, beta=beta)
  checks.positive(temperature=temperature)

  def fn(batch: Batch) -> Batch:
    by = "grpo_s_rewards"
    batch.require("rewards_PG", "baseline_rewards_P", by=by)
    scaled = R.grpo_s_scale(
      batch.rewards_PG,
      batch.get(hardness, by=by),
      batch.baseline_rewards_P,
      batch.samples(),
      alpha=alpha,
      beta=beta,
      temperature=temperature,
    )
    return batch._replace(rewards_PG=scaled)

  return stateless_prepare(fn)


def rapo_weights(
  *, temperature: float = 1.0, name: str = "kl_weight_PG"
) -> Transform:
  """RAPO (arXiv 2510.03865): write `rljax.advantages.rapo_weights` to
  ``extra[name]`` for ``objectives.kl_penalty(losses.kl_k3,
  weight=name)``, the KL toward the reward-tilted reference."""
  checks.positive(temperature=temperature)
  if not name.endswith("_PG"):
    raise ValueError(f"rapo_weights: name must end with _PG; got {name!r}.")

  def fn(batch: Batch) -> Batch:
    w = R.rapo_weights(
      sequence_rewards(batch), batch.samples(), temperature=temperature
    )
    return batch.with_extra(**{name: w})

  return stateless_prepare(fn)
