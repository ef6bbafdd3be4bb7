"""Presets of the token- and confidence-level family: Thinkless's DeGRPO,
ProGRPO (ARM), RAPO, RED-Drop, GTPO, D3S and ARES. HICRA and AdaCoT's
decision-token mask are stages (`transforms.hicra`,
`transforms.decision_token_mask`) that need a vocabulary's token ids, so
they have no preset."""

from rljax import advantages
from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import chain
from rljax.losses import _offpolicy as offpolicy_losses


def _ppo_clip(eps: float):
  return objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps)


def thinkless(
  *, alpha: float = 1e-3, kl_coef: float = 1e-3, eps: float = 0.2
) -> Algorithm:
  """Thinkless DeGRPO (arXiv 2505.13379): A = r - group mean (the official
  script's ``std_normalizer=False``), PPO clip, k3 KL to the reference,
  and the control token (the first completion token) weighed by ``alpha``
  apart from the response (`aggregate.decoupled`). Defaults from the
  official training script: alpha 1e-3, KL 1e-3 (low-variance, i.e. k3),
  clip 0.2."""
  stages = [
    transforms.group_advantages(advantages.dr_grpo),
    _ppo_clip(eps),
  ]
  if kl_coef:
    stages.append(objectives.kl_penalty(losses.kl_k3, coef=kl_coef))
  return Algorithm(chain(*stages), aggregate.decoupled(alpha=alpha))


def progrpo(
  *, alpha: float = 0.1, low_fraction: float = 0.2, eps: float = 0.2
) -> Algorithm:
  """ProGRPO (arXiv 2602.05281): GRPO whose advantages are reweighted by
  the answers' confidence (`transforms.arm_advantages`)."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      transforms.arm_advantages(alpha=alpha, low_fraction=low_fraction),
      _ppo_clip(eps),
    ),
    aggregate.seq_mean_token_mean,
  )


def rapo(
  *, kl_coef: float = 1e-3, temperature: float = 1.0, eps: float = 0.2
) -> Algorithm:
  """RAPO (arXiv 2510.03865): GRPO with the forward KL (k3, whose expected
  gradient is the forward KL's) toward the reward-tilted reference
  (`transforms.rapo_weights`) instead of the reverse KL. The coefficient
  1e-3 is our choice."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      transforms.rapo_weights(temperature=temperature),
      _ppo_clip(eps),
      objectives.kl_penalty(losses.kl_k3, coef=kl_coef, weight="kl_weight_PG"),
    ),
    aggregate.seq_mean_token_mean,
  )


def red_drop(*, std_normalize: bool = False) -> Algorithm:
  """RED-Drop (arXiv 2509.24203): drop surplus negatives per group
  (`transforms.red_drop_advantages`), then plain REINFORCE (`losses.rec`
  without clipping or weights), token mean, as Trinity-RFT's RED-Drop
  configuration."""
  return Algorithm(
    chain(
      transforms.red_drop_advantages(std_normalize=std_normalize),
      objectives.policy(offpolicy_losses.rec, clip_mode="none"),
    ),
    aggregate.token_mean,
  )


def d3s(
  *,
  sample_keep=(0.5, 1.0),
  token_keep=(0.5, 1.0),
  steps: int = 100,
  eps: float = 0.2,
) -> Algorithm:
  """D3S (arXiv 2509.22115): GRPO with dynamic dual-level down-sampling
  (`transforms.d3s_downsampling`: a maximum-variance subset of each group,
  then the tokens with the largest |A| H, both relaxing to everything over
  ``steps`` batches). The schedule's defaults are our choice."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      transforms.d3s_downsampling(
        sample_keep=sample_keep, token_keep=token_keep, steps=steps
      ),
      _ppo_clip(eps),
    ),
    aggregate.seq_mean_token_mean,
  )


def ares(
  *, kl_coef: float = 1e-2, window: int = 4, eps: float = 0.2
) -> Algorithm:
  """ARES (arXiv 2510.08457): the difficulty-aware high-window-entropy
  reward (`transforms.ares_entropy_shaping`) before GRPO's advantages,
  PPO clip, and the k3 KL to the reference with its per-difficulty
  adaptive coefficient (`objectives.ares_kl_penalty`). KL 1e-2 and the
  window 4 are the official code's."""
  return Algorithm(
    chain(
      transforms.ares_entropy_shaping(window=window),
      transforms.group_advantages(advantages.grpo),
      _ppo_clip(eps),
      objectives.ares_kl_penalty(losses.kl_k3, coef=kl_coef),
    ),
    aggregate.seq_mean_token_mean,
  )


def gtpo(*, weight: float = 2.0, positions: str = "all") -> Algorithm:
  """GTPO (arXiv 2508.03772): GRPO advantages, conflict-token weights and
  the entropy filter (`transforms.gtpo_advantages`), the official code's
  REINFORCE loss (ratio 1 carrying the gradient) as a token mean per
  completion averaged over completions; no KL, no reference model."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      transforms.gtpo_advantages(weight=weight, positions=positions),
      objectives.policy(losses.reinforce),
    ),
    aggregate.seq_mean_token_mean,
  )


PRESETS = {
  "gtpo": gtpo,
  "ares": ares,
  "d3s": d3s,
  "progrpo": progrpo,
  "rapo": rapo,
  "red_drop": red_drop,
  "thinkless": thinkless,
}
