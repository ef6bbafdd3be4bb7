"""Tree rollouts: each group's samples are the leaves of a tree of segments
that fork at fixed depths (TreePO's segment trees, Polychromic vines)."""

from collections.abc import Sequence
import dataclasses

import jax
import numpy as np

from rljax import sampling
from rljax.rollouts._base import GroupStrategy
from rljax.sampling import Rollout

_ENDED = ("stop_id", "stop_rule")


def sample_trees(
  engine: sampling.Engine,
  model,
  prompts: Sequence[Sequence[int]],
  *,
  key: jax.Array,
  branching: Sequence[int],
  segment: int,
  max_new_tokens: int,
  width: int,
  temperature: float,
) -> tuple[Rollout, np.ndarray]:
  """One tree of samples per prompt, in group layout.

  A prompt's first segment is drawn ``branching[0]`` times (at most
  `segment` tokens each); every node that did not end (stop id or rule)
  and has budget left forks ``branching[d]`` ways at depth d, all forks
  sharing their ancestors' KV cache; the last depth's nodes run to the end
  of the `max_new_tokens` budget. A node that ends is a leaf; so is every
  node of the last depth. The leaves of prompt p, depth-first, are its
  samples (G = prod(branching); a tree whose branches ended early has
  fewer leaves, the rest invalid in ``sample_mask_PG``). Node j of a
  node's children draws with ``fold_in(node key, j)``; the roots'
  parent is the prompt with key ``fold_in(key, p)``.

  Returns:
    (the `Rollout`, tree_PGD int32 [P, G, D]: the id of each leaf's
    ancestor at depths 1..D, unique within its prompt, -1 below a leaf
    that ended earlier and for invalid samples).
  """
  branching = [int(b) for b in branching]
  if not branching or min(branching) < 1:
    raise ValueError(
      f"branching={branching}; give the forks at each depth, each >= 1."
    )
  depth, g = len(branching), int(np.prod(branching))
  if int(segment) < 1:
    raise ValueError(f"segment={segment}; it must be >= 1.")
  if max_new_tokens > width:
    raise ValueError(
      f"max_new_tokens={max_new_tokens} exceeds the rollout width {width}."
    )
  p = len(prompts)
  # Level 1: the roots' children, one add per prompt.
  level = []  # (prompt index, node id, its path of node ids, sequence)
  counter = [0] * p
  for i, prompt in enumerate(prompts):
    budget = max_new_tokens if depth == 1 else min(segment, max_new_tokens)
    seqs = engine.add(
      list(prompt),
      key=jax.random.fold_in(key, i),
      max_new_tokens=budget,
      num_samples=branching[0],
      temperature=temperature,
      keep=depth > 1,
      shard=i * engine.shards // p,
    )
    for s in seqs:
      level.append((i, [counter[i]], s))
      counter[i] += 1
  leaves: list[list] = [[] for _ in range(p)]
  for d in range(1, depth + 1):
    engine.run(model)
    last = d == depth
    children = []
    for i, path, seq in level:
      ended = sampling.REASONS[seq.stop_reason] in _ENDED
      left = max_new_tokens - len(seq.completion)
      if last or ended or left <= 0:
        leaves[i].append((path, seq))
        if seq.keep:
          engine.release(seq)
        continue
      budget = left if d + 1 == depth else min(segment, left)
      for s in engine.fork(
        seq,
        branching[d],
        max_new_tokens=budget,
        keep=d + 1 < depth,
      ):
        children.append((i, path + [counter[i]], s))
        counter[i] += 1
      engine.release(seq)
    level = children
  out = sampling.RolloutBuilder(p, g, width)
  tree = np.full((p, g, depth), -1, np.int32)
  for i, group in enumerate(leaves):
    group.sort(key=lambda leaf: leaf[0])  # depth-first order
    for j, (path, seq) in enumerate(group):
      out.put(i, j, seq)
      tree[i, j, : len(path)] = path
  width_s = max(len(x) for x in prompts)
  tokens = np.zeros((p, width_s), np.int32)
  mask = np.zeros((p, width_s), np.int32)
  for i, prompt in enumerate(prompts):  # left-padded
    tokens[i, width_s - len(prompt) :] = prompt
    mask[i, width_s - len(prompt) :] = 1
  rollout = out.rollout(
    np.broadcast_to(tokens[:, None], (p, g, width_s)),
    np.broadcast_to(mask[:, None], (p, g, width_s)),
  )
  return rollout, tree


@dataclasses.dataclass(frozen=True)
class TreeRollouts(GroupStrategy):
  """Each group's samples are the leaves of a segment tree
  (`sample_trees`); ``Batch.extra["tree_PG"]`` holds each leaf's
  ancestors ([P, G, D]) for tree advantages.

  * TreePO (catalog row 2.46, arXiv 2508.17445): segments of a fixed
    length forking at each depth, leaves sharing their prefixes' cache;
    with `rljax.transforms.treepo_advantages`.
  * Polychromic vines (row 2.26, arXiv 2509.25424): several rollouts from
    the same intermediate states (``branching=(n, k)``), with
    `rljax.transforms.polychromic_advantages`.

  The group's sample count must be prod(branching) (``sampler.num_samples``).

  Args:
    branching: forks at each depth.
    segment: tokens per segment before the next fork (the last depth runs
      to the end of the budget).
  """

  branching: Sequence[int] = (2, 2, 2)
  segment: int = 64

  def __post_init__(self):
    branching = tuple(int(b) for b in self.branching)
    if not branching or min(branching) < 1:
      raise ValueError(
        f"branching={self.branching}; give the forks at each depth, >= 1."
      )
    if int(self.segment) < 1:
      raise ValueError(f"segment={self.segment}; it must be >= 1.")
    object.__setattr__(self, "branching", branching)

  @property
  def num_leaves(self) -> int:
    return int(np.prod(self.branching))

  def draw(self, engine, model, prompts, counts, **kwargs):
    for k in ("groups", "step", "state", "batch", "score"):
      kwargs.pop(k, None)
    counts = np.asarray(counts)
    if np.any(counts != self.num_leaves):
      raise ValueError(
        f"TreeRollouts with branching {self.branching} makes"
        f" {self.num_leaves} leaves per group; the prompt sampler gave"
        f" {counts.min()}..{counts.max()} samples (set sampler.num_samples"
        f" = {self.num_leaves})."
      )
    rollout, tree = sample_trees(
      engine,
      model,
      prompts,
      branching=self.branching,
      segment=self.segment,
      **kwargs,
    )
    return rollout, {"tree_PG": tree}
