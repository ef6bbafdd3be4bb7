"""Presets over segment-valued samples (Monte Carlo values at cutpoints)."""

from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import chain


def spo_segment(
  *,
  eps: float = 0.2,
  kl_coef: float = 1e-4,
  probability_mask: bool = True,
  normalize: str = "batch",
) -> Algorithm:
  """SPO-chain (Segment Policy Optimization, arXiv 2505.23564): PPO clip
  on segment advantages with the probability mask.

  Needs the groups of `rljax.rollouts.SegmentRollouts` (``sampler.groups=
  'segments'``), whose ``Batch.extra`` values and cutpoints
  `transforms.spo_chain_advantages` turns into A_k = V(s_{k+1}) - V(s_k)
  on the low-probability tokens of segment k, whitened over those tokens;
  the other tokens leave the loss. Then PPO clip with eps 0.2, the token
  mean over the kept tokens of the batch, and k3 KL to the reference in
  the loss with coefficient 1e-4 (0: no reference model). Defaults of the
  official SPO-chain runs (AIFrameResearch/SPO configs/
  polIter_rho1bSft2_spo_chain_GSM8K.jsonnet with trainers/ppo_MATH,
  refKl0.0001 and klLoss: cliprange 0.2, `whiten_advantages`,
  `use_prob_mask`, `control_variate` KL 1e-4, no critic). The code sums
  the KL over each response's kept tokens and averages over responses;
  here it is aggregated like the policy term (token mean)."""
  return Algorithm(
    chain(
      transforms.spo_chain_advantages(
        probability_mask=probability_mask, normalize=normalize
      ),
      objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps),
      *([objectives.kl_penalty(losses.kl_k3, coef=kl_coef)] if kl_coef else []),
    ),
    aggregate.token_mean,
  )


def spo_tree(
  *,
  eps: float = 0.2,
  kl_coef: float = 1e-4,
  probability_mask: bool = True,
  value: str = "children",
  sibling_std: bool = False,
  drop_zero: bool = True,
  normalize: str = "batch",
) -> Algorithm:
  """SPO-tree (Segment Policy Optimization, arXiv 2505.23564): PPO clip on
  the tree-based segment advantages with the probability mask.

  Needs the groups of `rljax.rollouts.SegmentTree` (``sampler.groups=
  'segment_tree'``), whose tree `transforms.spo_tree_advantages` turns into
  A(n) = V(n) - V(Pa(n)) (V the mean of a node's children's values) on the
  low-probability tokens of each segment, each segment trained once and
  those with A = 0 left out, whitened over the kept tokens. Then PPO clip
  with eps 0.2, the token mean over the kept tokens of the batch, and k3 KL
  to the reference in the loss with coefficient 1e-4 (0: no reference
  model). Defaults of the official SPO-tree runs (AIFrameResearch/SPO
  configs/polIter_*_spo_tree_*.jsonnet, which inherit the SPO-chain
  trainer: cliprange 0.2, `whiten_advantages`, `use_prob_mask`, KL 1e-4 in
  the loss, no critic; `hybrid_episode_generator` with its default
  ``adv_method="rloo"``, i.e. no sibling std)."""
  return Algorithm(
    chain(
      transforms.spo_tree_advantages(
        probability_mask=probability_mask,
        value=value,
        sibling_std=sibling_std,
        drop_zero=drop_zero,
        normalize=normalize,
      ),
      objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps),
      *([objectives.kl_penalty(losses.kl_k3, coef=kl_coef)] if kl_coef else []),
    ),
    aggregate.token_mean,
  )


PRESETS = {"spo_segment": spo_segment, "spo_tree": spo_tree}
