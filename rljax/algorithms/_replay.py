"""Presets over replayed past-policy samples (`rljax.rollouts` replay)."""

from typing import Optional

from rljax import advantages
from rljax import aggregate
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import chain


def remix(
  *,
  eps: float = 0.2,
  kl_coef: float = 1e-3,
  lam: float = 0.5,
  reincarnate_at: Optional[int] = None,
) -> Algorithm:
  """ReMix (arXiv 2507.06892) on GRPO: group advantages over groups that mix
  fresh and replayed samples (`rljax.rollouts.MixPolicyReplay`, stream 6),
  PPO clip with r = pi_theta / mu (mu the sampler's log-probs on replayed
  samples), the KL-Convex penalty kl_coef (lam KL(pi || pi_base) +
  (1 - lam) KL(pi || pi_prev)) and reincarnation at `reincarnate_at`
  (`transforms.remix`; give the strategy the same step); each sequence's
  token mean averaged over sequences, as GRPO. The paper's update-to-data
  ratio > 1 is ``train.epochs`` x ``train.minibatches``. lam, kl_coef and
  eps are our defaults (not verified)."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      transforms.remix(
        eps_low=eps,
        eps_high=eps,
        kl_coef=kl_coef,
        lam=lam,
        reincarnate_at=reincarnate_at,
      ),
    ),
    aggregate.seq_mean_token_mean,
  )


PRESETS = {"remix": remix}
