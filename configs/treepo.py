"""TreePO on 2-digit addition (see _arithmetic.py).

TreePO (arXiv 2508.17445): each prompt's 16 samples are the leaves of a
segment tree (`rljax.rollouts.TreeRollouts`: 4 first tokens, each forked
twice at the second and third token; leaves share their ancestors' KV
cache), trained on the tree advantage averaged over each leaf's ancestor
subtrees (`rljax.transforms.treepo_advantages`, preset `treepo`). The
paper's segments are 512 tokens with adaptive branching; the answers here
are at most 4 tokens.

python -m rljax.training --config configs/treepo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "treepo",
    sampler={
      "groups": "tree",
      "groups_kwargs": {"branching": [4, 2, 2], "segment": 1},
    },
  )
