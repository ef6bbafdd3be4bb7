"""SPO-tree on 2-digit addition (see _arithmetic.py).

Segment Policy Optimization (arXiv 2505.23564), its long-CoT instance:
each prompt's 16 samples are the leaves of a tree of segments
(`rljax.rollouts.SegmentTree`: 4 draws of the first token, each forked
twice for the second token and each of those twice for the rest; leaves
share their ancestors' KV cache), every node valued by the mean of its
children's values, and each segment trained once with A(n) = V(n) -
V(Pa(n)) on its tokens with probability < 0.9 (preset `spo_tree`: PPO
clip 0.2, whitened advantages, k3 KL 1e-4). The paper's trees are 6-6-6
with 100- or 600-token segments; the answers here are at most 4 tokens.

python -m rljax.training --config configs/spo_tree.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "spo_tree",
    sampler={
      "groups": "segment_tree",
      "groups_kwargs": {"branching": [4, 2, 2], "segment": 1, "rho": 0.9},
    },
  )
