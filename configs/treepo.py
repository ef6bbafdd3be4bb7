"""TreePO on 2-digit addition (see _arithmetic.py).

TreePO (arXiv 2508.17445): each prompt's 16 samples are the leaves of a
segment tree (`rljax.rollouts.TreeRollouts`), trained on the tree advantage
averaged over each leaf's ancestor subtrees
(`rljax.transforms.treepo_advantages`, preset `treepo`). The sampler is the
official training script's (`TreeRollouts.treepo`): 2 first segments, each
live node forking 2 ways, a budget of 16 leaves passed from branches that
end to the survivors (``divergence="even"``, the code's ``fixed_avg``), and
a fallback that regrows a group whose branches all ended from its stopped
leaves (``fallback="random"``). The paper's segments are 512 tokens over
14 depths; the answers here are at most 4 tokens, so 4 depths of 1 token
(2, 4, 8, 16 nodes when no branch ends early).

python -m rljax.training --config configs/treepo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "treepo",
    sampler={
      "groups": "tree",
      "groups_kwargs": {
        "branching": [2, 2, 2, 2],
        "segment": 1,
        "leaves": 16,
        "divergence": "even",
        "fallback": "random",
      },
    },
  )
