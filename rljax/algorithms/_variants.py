"""Presets built on the advantage and reward variants (`rljax.advantages.
_variants`, `rljax.transforms._variants`): GRPO with PPO clip and the
sequence-mean aggregation, plus each paper's stage. Answer-cluster presets
read ``Batch.extra['answer_ids_PG']`` (``Trainer(annotate=rljax.rewards.
cluster_annotate())``)."""

from rljax import advantages
from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax._src.base import Algorithm
from rljax._src.base import Transform
from rljax._src.base import chain
from rljax.objectives import _mixed
from rljax.transforms import _advantages as T
from rljax.transforms import _variants as V


def _grpo() -> Transform:
  return T.group_advantages(advantages.grpo)


def _clip(eps: float) -> Transform:
  return objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps)


def _algo(*stages: Transform) -> Algorithm:
  return Algorithm(chain(*stages), aggregate.seq_mean_token_mean)


def aspo(
  *,
  feature="tool_position_PG",
  delta: float = -2.0,
  k: float = 0.7,
  eps: float = 0.2,
) -> Algorithm:
  """ASPO (arXiv 2508.19201): GRPO advantages shaped by a clipped bias that
  favours earlier tool calls among correct, tool-using samples; PPO clip."""
  return _algo(_grpo(), V.aspo_shaping(feature, delta=delta, k=k), _clip(eps))


def hdpo(
  *, cost="tool_calls_PG", weight: float = 1.0, eps: float = 0.2
) -> Algorithm:
  """HDPO (Metis): accuracy advantage + weight x efficiency advantage among
  correct samples, each channel PPO-clipped separately (the paper combines
  them "at the loss level")."""
  return _algo(
    V.hdpo_advantages(cost, weight=weight, combine="loss"),
    _mixed.mixed_policy(
      losses.ppo_clip,
      mix=(("advantages_PGT", 1.0), ("advantages_efficiency_PGT", weight)),
      eps_low=eps,
      eps_high=eps,
    ),
  )


def adora(*, kappa=(0.1, 1.0), eps: float = 0.2) -> Algorithm:
  """ADORA (arXiv 2602.10019): GRPO advantages damped (kappa[0]) on groups
  without ADORA's length advantage; PPO clip."""
  return _algo(_grpo(), V.adora_advantages(kappa=kappa), _clip(eps))


def copo(
  *, k: float = 1.0, b: float = 0.5, forced: bool = False, eps: float = 0.2
) -> Algorithm:
  """COPO (arXiv 2508.04138): L = w_q L(A^loc) + (1 - w_q) L(A^glob), the
  global advantage from answer consistency, w_q = sigmoid(k (H_q - b))."""
  return _algo(
    V.copo_advantages(k=k, b=b, forced=forced),
    _mixed.mixed_policy(
      losses.ppo_clip, mix=V.COPO_MIX, eps_low=eps, eps_high=eps
    ),
  )


def seed_grpo(
  *,
  alpha: float = 1.0,
  f: str = "linear",
  weighting: str = "sequence",
  eps: float = 0.2,
) -> Algorithm:
  """SEED-GRPO (arXiv 2505.12346): GRPO advantages scaled by
  f(alpha SE(q) / SE_max), SE the semantic entropy of the answers."""
  return _algo(
    _grpo(),
    V.seed_grpo_advantages(alpha=alpha, f=f, weighting=weighting),
    _clip(eps),
  )


def polychromic(*, set_size: int = 4, eps: float = 0.2) -> Algorithm:
  """Polychromic PPO (arXiv 2509.25424) without vine sampling: set-level
  advantages of reward x answer diversity over the group's subsets."""
  return _algo(V.polychromic_advantages(set_size=set_size), _clip(eps))


def pf_ppo(
  *, mode: str = "pow", k: float = 2.0, axis: str = "group", eps: float = 0.2
) -> Algorithm:
  """PF-PPO (arXiv 2409.06957) on GRPO: resample samples by reward
  reliability after the advantages (as multiplicities), token-mean loss.
  Needs ``prepare(..., key=...)``."""
  return Algorithm(
    chain(_grpo(), V.pf_ppo_resample(mode=mode, k=k, axis=axis), _clip(eps)),
    aggregate.token_mean,  # verl's default; exact for the draw's duplicates
  )


def grpo_lambda(
  *, fraction: float = 0.2, coef: float = 1.0, eps: float = 0.2
) -> Algorithm:
  """GRPO-lambda (arXiv 2505.18086): Kimi length reward for the top-lambda
  groups by correctness ratio, 0/1 reward for the rest; GRPO."""
  return _algo(
    V.grpo_lambda_rewards(fraction=fraction, coef=coef), _grpo(), _clip(eps)
  )


def l_grpo(
  *, max_length=None, alpha: float = 1.0, eps: float = 0.2
) -> Algorithm:
  """ConciseR L-GRPO (arXiv 2505.21178), stage 2: length bonus in
  all-correct groups; GRPO. (Stage 1, GRPO++, is `dapo`.)"""
  return _algo(
    V.l_grpo_rewards(max_length=max_length, alpha=alpha), _grpo(), _clip(eps)
  )


PRESETS = {
  "adora": adora,
  "aspo": aspo,
  "copo": copo,
  "grpo_lambda": grpo_lambda,
  "hdpo": hdpo,
  "l_grpo": l_grpo,
  "pf_ppo": pf_ppo,
  "polychromic": polychromic,
  "seed_grpo": seed_grpo,
}
