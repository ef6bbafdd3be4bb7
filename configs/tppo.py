"""T-PPO on 2-digit addition (see _arithmetic.py).

Truncated PPO (arXiv 2506.15050): each step decodes one window of 2 tokens
per sample of the batch's groups and trains on it, finished or not
(`rljax.rollouts.PartialRollouts` with ``train_unfinished``); extended GAE
bootstraps the responses still running from their last value, each token
is trained in the window that drew it, and the critic learns from finished
responses only (preset `tppo`). A group leaves the batch when all its
samples end and a new prompt takes its place. The paper's windows are
thousands of tokens; the answers here are at most 4.

python -m rljax.training --config configs/tppo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "tppo",
    sampler={
      "groups": "partial",
      "groups_kwargs": {
        "segment": 2,
        "in_flight": 1.0,
        "train_unfinished": True,
      },
    },
  )
