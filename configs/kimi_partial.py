"""Kimi k1.5's RL recipe on 2-digit addition (see _arithmetic.py).

Kimi k1.5 (arXiv 2501.12599): online policy mirror descent (preset
`kimi_opmd`) with partial rollouts (section 2.6.2): long samples are paused
at a per-step token budget and continued in the next step from where they
stopped (`rljax.rollouts.PartialRollouts`, twice the batch in flight, 2
tokens per sample per check). The paper's budgets are thousands of tokens;
the answers here are at most 4.

python -m rljax.training --config configs/kimi_partial.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "kimi_opmd",
    sampler={
      "groups": "partial",
      "groups_kwargs": {"segment": 2, "in_flight": 2.0},
    },
  )
