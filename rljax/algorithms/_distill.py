"""On-policy distillation presets: the student samples, a frozen teacher
scores its tokens (`Batch.teacher_logp_PGT`: ``Trainer(config,
teacher=model)``, same tokenizer), and the per-token reverse KL to the
teacher is the advantage of an importance-weighted policy gradient."""

from rljax import advantages
from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms
from rljax._src import checks
from rljax._src.base import Algorithm
from rljax._src.base import Transform
from rljax._src.base import chain
from rljax.transforms import _distill as transforms_distill


def _policy(eps: float | None) -> Transform:
  if eps is None:
    return objectives.policy(losses.ratio_pg)
  checks.positive(eps=eps)
  return objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps)


def opd(
  *, coef: float = 1.0, gamma: float = 0.0, eps: float | None = None
) -> Algorithm:
  """On-policy distillation (Thinking Machines 2025; GKD arXiv 2306.13649
  with lambda = 1 and reverse KL): advantage A_t = coef (log pi_T(y_t) -
  log pi_old(y_t)) (`transforms.opd_advantages`; ``gamma`` > 0 adds the
  discounted future terms), the unclipped importance-weighted loss -A r
  (`losses.ratio_pg`, Tinker's ``importance_sampling``, the loss of the
  official recipe), token mean. ``eps`` switches to PPO's clip (for
  several optimizer steps per batch, where r drifts from 1); with one step
  per batch r = 1 and both give the same gradient. No reward is read."""
  return Algorithm(
    chain(
      transforms_distill.opd_advantages(coef, gamma=gamma),
      _policy(eps),
    ),
    aggregate.token_mean,
  )


def opd_grpo(
  *, coef: float = 1.0, gamma: float = 0.0, eps: float = 0.2
) -> Algorithm:
  """GRPO's reward advantages plus the on-policy distillation term: A_t =
  (R - mean_G R) / std_G R + coef (log pi_T(y_t) - log pi_old(y_t)) (the
  teacher term added after the group normalisation, as Tinker adds it to
  the reward advantages), PPO clip 0.2, token mean (the distillation
  signal is per token, so every token weighs the same)."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      transforms_distill.opd_advantages(coef, gamma=gamma),
      _policy(eps),
    ),
    aggregate.token_mean,
  )


PRESETS = {
  "opd": opd,
  "opd_grpo": opd_grpo,
}
