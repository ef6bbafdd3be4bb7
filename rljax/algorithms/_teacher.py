"""Presets that read an extra scoring pass: a teacher (RTO's DPO policy,
KEPO's distillation teacher), the old policy at another temperature
(DCPO-dist) or a second sampling stream (AEPO)."""

from rljax import advantages
from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import chain
from rljax.objectives import _teacher as objectives_teacher
from rljax.transforms import _teacher as transforms_teacher


def rto(
  *,
  beta1: float = 0.05,
  beta2: float = 0.01,
  beta3: float = 1.0,
  dpo_clip: float | None = 0.05,
  reward_clip: float | None = 10.0,
  eps: float = 0.2,
  gamma: float = 1.0,
  lam: float = 0.95,
) -> Algorithm:
  """RTO (arXiv 2404.18922): PPO on RTO's dense token rewards.

  `transforms.rto_rewards` (DPO policy as the teacher, KL to the reference
  and the sentence reward on the last token), GAE over the value model
  (whitened, gamma 1, lambda 0.95: OpenRLHF defaults of the official
  code), PPO clip 0.2, each sequence's token mean averaged over sequences
  (OpenRLHF's PolicyLoss). Needs a DPO-trained model as the teacher
  (``Trainer(config, teacher=dpo_model)``), the reference and a critic
  (train it with `rljax.objectives.value_loss`).
  """
  return Algorithm(
    chain(
      transforms_teacher.rto_rewards(
        beta1=beta1,
        beta2=beta2,
        beta3=beta3,
        dpo_clip=dpo_clip,
        reward_clip=reward_clip,
      ),
      transforms.gae_advantages(gamma=gamma, lam=lam),
      objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps),
    ),
    aggregate.seq_mean_token_mean,
  )


def kepo(
  *,
  coef: float = 1.0,
  threshold: float = 0.5,
  eps: float = 0.2,
) -> Algorithm:
  """KEPO (arXiv 2602.00400): GRPO plus the quality-gated on-policy
  distillation penalty (`objectives.kepo_distill`, k2 reverse-KL to the
  teacher on trajectories with reward >= threshold). The hint-guided
  rejection sampling is not included (rollout feature)."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps),
      objectives_teacher.kepo_distill(coef=coef, threshold=threshold),
    ),
    aggregate.seq_mean_token_mean,
  )


def dcpo_dist(
  *,
  h_base: float = 0.5,
  eps: float = 0.2,
  dual_clip: float | None = 3.0,
) -> Algorithm:
  """DCPO, distribution-centric (arXiv 2601.12730): GRPO advantages mixed
  with the T*-ratio REINFORCE term (`transforms.dcpo_dist_advantages`; the
  Trainer runs its two temperature passes), PPO clip 0.2 with EasyR1's dual
  clip 3 and token-mean loss (the official code's EasyR1 defaults), no KL
  (its scripts: ``algorithm.disable_kl=true``)."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      transforms_teacher.dcpo_dist_advantages(h_base=h_base),
      objectives.policy(
        losses.ppo_clip, eps_low=eps, eps_high=eps, dual_clip=dual_clip
      ),
    ),
    aggregate.token_mean,
  )


def aepo_arbitrary(
  *,
  h_target: float = 0.5,
  alpha: float = 1.0,
  target: str = "paper",
  eps: float = 0.2,
  dual_clip: float | None = 3.0,
) -> Algorithm:
  """AEPO, arbitrary entropy (arXiv 2510.08141): GRPO on the main samples
  plus a REINFORCE term on the temperature stream marked by
  ``Batch.extra['from_stream_PG']`` (`transforms.aepo_stream_advantages`),
  PPO clip 0.2 with dual clip 3, token mean (EasyR1 defaults of the
  official code), no KL."""
  return Algorithm(
    chain(
      transforms_teacher.aepo_stream_advantages(
        advantages.grpo, h_target=h_target, alpha=alpha, target=target
      ),
      objectives.policy(
        losses.ppo_clip, eps_low=eps, eps_high=eps, dual_clip=dual_clip
      ),
    ),
    aggregate.token_mean,
  )


def vcpo(*, eps: float = 0.2, base_ess_ratio: float = 1.0) -> Algorithm:
  """VCPO (arXiv 2602.17616): the minimum-variance off-policy baseline
  from per-trajectory gradient norms (`transforms.vcpo_advantages`; the
  Trainer runs the per-sample backward passes, `rljax.Rescore`), PPO clip,
  token mean, and each optimizer step's update scaled by the minibatch's
  effective sample size (`objectives.vcpo_ess`, sqrt rule). Defaults of the
  official scripts (``shell/vcpo/math/vcpo_k=10.sh``)."""
  return Algorithm(
    chain(
      transforms_teacher.vcpo_advantages(),
      objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps),
      objectives_teacher.vcpo_ess(base_ess_ratio=base_ess_ratio),
    ),
    aggregate.token_mean,
  )


# aepo_arbitrary reads the temperature stream of
# `rljax.rollouts.TemperatureStream` (sampler.groups="temperature_stream").
PRESETS = {
  "aepo_arbitrary": aepo_arbitrary,
  "dcpo_dist": dcpo_dist,
  "rto": rto,
  "kepo": kepo,
  "vcpo": vcpo,
}
