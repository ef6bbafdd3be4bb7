"""Presets of the off-policy REINFORCE / regression / discriminative family:
REC, Kimi OPMD, Reg-GRPO, MDPO and DisCO (see `rljax.losses._offpolicy`)."""

from rljax import advantages
from rljax import aggregate
from rljax import objectives
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import chain
from rljax.losses import _offpolicy as offpolicy_losses
from rljax.objectives import _offpolicy as offpolicy_objectives


def rec(
  *,
  clip_mode: str = "one_side",
  weight: str = "none",
  regularizer: str = "none",
  coef: float = 0.0,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
) -> Algorithm:
  """REC / REP / RED (arXiv 2509.24203): group-mean advantages without std
  scaling, the configurable off-policy REINFORCE loss `losses.rec`, token
  mean (Trinity-RFT's ``masked_mean``). The default is REC-OneSide-NoIS;
  ``regularizer="k2", coef=0.1`` is REP-OPMD, ``"forward_kl"`` REP-AsymRE."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.dr_grpo),
      objectives.policy(
        offpolicy_losses.rec,
        clip_mode=clip_mode,
        weight=weight,
        regularizer=regularizer,
        coef=coef,
        eps_low=eps_low,
        eps_high=eps_high,
      ),
    ),
    aggregate.token_mean,
  )


def kimi_opmd(*, tau: float = 0.2, normalize: bool = False) -> Algorithm:
  """Kimi k1.5 OPMD (arXiv 2501.12599): A = r - group mean r, the squared
  sequence loss (A - tau log pi/pi_old)^2, mean over samples."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.dr_grpo),
      objectives.policy(
        offpolicy_losses.kimi_opmd, tau=tau, normalize=normalize
      ),
    ),
    aggregate.seq_mean_token_mean,
  )


def reg_grpo(*, beta: float = 1.0, standardize: str = "mean_std") -> Algorithm:
  """Reg-GRPO (DeepVideo-R1, arXiv 2506.07464): regress the group-
  standardised sequence log-ratio onto the GRPO advantage; mean over
  samples. The paper's exact normalisation is not verified (see
  `losses.reg_grpo`)."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      objectives.policy(
        offpolicy_losses.reg_grpo, beta=beta, standardize=standardize
      ),
    ),
    aggregate.seq_mean_token_mean,
  )


def mdpo(*, iterations: int = 1000, anneal: str = "iterations") -> Algorithm:
  """MDPO (arXiv 2005.09814) for LLMs: GRPO advantages (our choice: the
  paper is GAE-based continuous control), -A r + (1/t_k) KL(pi || pi_old)
  with t_k = 1 - k/K annealed over ``iterations`` rollout batches; token
  mean."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      offpolicy_objectives.mdpo(iterations=iterations, anneal=anneal),
    ),
    aggregate.token_mean,
  )


def disco(
  *,
  score: str = "log_likelihood",
  tau: float = 10.0,
  beta: float = 1e3,
  delta: float = 1e-4,
  variant: str = "dro",
) -> Algorithm:
  """DisCO (arXiv 2505.12366): discriminative log-sum-exp objective over
  each group's positives and negatives, squared-hinge KL(pi_old || pi)
  constraint measured over the minibatch; no advantages, no clipping.
  Aggregated with `seq_mean_token_mean` (required by the KL scaling)."""
  return Algorithm(
    offpolicy_objectives.disco(
      score=score, tau=tau, beta=beta, delta=delta, variant=variant
    ),
    aggregate.seq_mean_token_mean,
  )


PRESETS = {
  "disco": disco,
  "kimi_opmd": kimi_opmd,
  "mdpo": mdpo,
  "rec": rec,
  "reg_grpo": reg_grpo,
}
