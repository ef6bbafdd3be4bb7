"""ARPO's success replay on 2-digit addition (see _arithmetic.py).

GRPO with Agentic Replay Policy Optimization's buffer (arXiv 2505.16282,
`rljax.rollouts.ReplaySuccesses`): each prompt keeps its last 8 correct
completions; a group that nearly all fails (reward std < 0.05, mean < 0.2)
gets one in place of its first sample.

python -m rljax.training --config configs/arpo_replay.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base("grpo", sampler={"groups": "replay"})
