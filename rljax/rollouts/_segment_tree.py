"""SPO-tree's sampler: each group is a tree of fixed-length segments.

Segment Policy Optimization (SPO, Guo et al., 2025, arXiv 2505.23564;
official code AIFrameResearch/SPO), its long chain-of-thought instance:
each prompt's responses are the leaves of a tree whose nodes are segments
of M tokens, every node forking into K continuations of its prefix, so
the tree values every node (the mean of its children's values) with no
extra Monte Carlo samples. The tree is `rljax.rollouts.sample_trees`'s
(leaves share their ancestors' KV cache);
`rljax.transforms.spo_tree_advantages` turns it into segment advantages.
"""

from collections.abc import Sequence
import dataclasses

import numpy as np

from rljax.rollouts._base import Drawn
from rljax.rollouts._base import GroupStrategy
from rljax.rollouts._trees import sample_trees


def segment_depths(
  mask_PGT, tree_PGD, *, segment: int, sample_mask_PG=None
) -> np.ndarray:
  """The level (1..D) of the tree node that generated each token.

  `sample_trees` forks a node only after it drew its whole segment budget
  (`segment` tokens) without ending, so the level-l ancestor of a leaf
  generated its tokens (l - 1) * segment .. l * segment - 1 and the leaf
  (at level L, the number of its ids >= 0) the rest:
  ``min(t // segment, L - 1) + 1`` on completion tokens, 0 elsewhere and
  on invalid samples.

  Args:
    mask_PGT: [P, G, T] completion tokens.
    tree_PGD: [P, G, D] ancestor ids, -1 below each leaf.
    segment: the tree's segment length.
    sample_mask_PG: [P, G] validity (default: all valid).

  Returns:
    int32 [P, G, T].
  """
  mask, tree = np.asarray(mask_PGT) > 0, np.asarray(tree_PGD)
  if tree.ndim != 3 or tree.shape[:2] != mask.shape[:2]:
    raise ValueError(
      f"tree_PGD has shape {tree.shape} and mask_PGT {mask.shape}; give"
      " [P, G, D] ancestor ids for the [P, G, T] samples."
    )
  if int(segment) < 1:
    raise ValueError(f"segment={segment}; it must be >= 1.")
  levels = (tree >= 0).sum(-1)  # [P, G] the leaf's own level
  valid = levels > 0
  if sample_mask_PG is not None:
    valid &= np.asarray(sample_mask_PG) > 0
  t = np.arange(mask.shape[-1]) // int(segment)
  depth = np.minimum(t, levels[..., None] - 1) + 1
  return np.where(mask & valid[..., None], depth, 0).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class SegmentTree(GroupStrategy):
  """SPO-tree's sampler (catalog row 2.44, arXiv 2505.23564).

  `draw` samples each group as one tree (`sample_trees`): the prompt's
  first segment ``branching[0]`` times, each node that did not end forking
  ``branching[d]`` ways after `segment` tokens, the last level running to
  the end of the budget (the official `HybridInferenceStrategy`: M tokens
  a segment, branch factors per depth, free last level; its SPO-tree runs
  use 6-6-6 with M = 100 (Rho-1B, GSM8K/MATH) or 600 (R1-Distill-1.5B,
  MATH)). The leaves are the group's samples (G = prod(branching));
  ``Batch.extra`` gets ``tree_PG`` (each leaf's ancestor ids, [P, G, D]),
  ``spo_depth_PGT`` (the level of the node that generated each token,
  `segment_depths`) and ``spo_low_prob_PGT`` (1 where pi(y_t) < rho under
  the sampler's full distribution) for
  `rljax.transforms.spo_tree_advantages` (preset ``spo_tree``).

  Why a strategy of its own and not a mode of `SegmentRollouts`: SPO-chain
  samples independent responses and values cut states with extra Monte
  Carlo continuations that are not trained on; SPO-tree's samples are the
  tree and its values come from the tree. The code trains one episode per
  node (its parent's text -> its segment); here the samples are the leaves
  and the transform trains each segment on the first leaf below its node,
  which gives the loss the same tokens in the same contexts and keeps the
  group a fixed prod(branching) samples of one prompt.

  Args:
    branching: forks at each level (the code's branch factors).
    segment: tokens per segment before the next fork (the code's M).
    rho: the probability-mask threshold (0.9 in the code).
  """

  branching: Sequence[int] = (6, 6, 6)
  segment: int = 100
  rho: float = 0.9

  def __post_init__(self):
    branching = tuple(int(b) for b in self.branching)
    if not branching or min(branching) < 1:
      raise ValueError(
        f"branching={self.branching}; give the forks at each level, >= 1."
      )
    if isinstance(self.segment, bool) or int(self.segment) < 1:
      raise ValueError(f"segment={self.segment!r}; it must be an int >= 1.")
    if not 0 < self.rho <= 1:
      raise ValueError(
        f"rho={self.rho}; the probability threshold is in (0, 1]."
      )
    object.__setattr__(self, "branching", branching)

  @property
  def num_leaves(self) -> int:
    return int(np.prod(self.branching))

  def draw(
    self,
    engine,
    model,
    prompts,
    counts,
    *,
    key,
    max_new_tokens,
    width,
    temperature,
    groups=(),
    step=0,
    state=None,
    batch=None,
    score=None,
  ) -> Drawn:
    del groups, step, state, batch, score
    counts = np.asarray(counts)
    if np.any(counts != self.num_leaves):
      raise ValueError(
        f"SegmentTree with branching {self.branching} makes"
        f" {self.num_leaves} leaves per group; the prompt sampler gave"
        f" {counts.min()}..{counts.max()} samples (set sampler.num_samples"
        f" = {self.num_leaves})."
      )
    rollout, tree = sample_trees(
      engine,
      model,
      prompts,
      key=key,
      branching=self.branching,
      segment=self.segment,
      max_new_tokens=max_new_tokens,
      width=width,
      temperature=temperature,
    )
    mask = np.asarray(rollout.mask_PGT) > 0
    low = np.exp(np.asarray(rollout.full_logp_PGT, np.float64)) < self.rho
    extra = {
      "tree_PG": tree,
      "spo_depth_PGT": segment_depths(
        mask, tree, segment=self.segment, sample_mask_PG=rollout.sample_mask_PG
      ),
      "spo_low_prob_PGT": (low & mask).astype(np.int32),
    }
    return Drawn(rollout, extra)
