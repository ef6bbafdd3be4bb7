"""Knapsack-GRPO on 2-digit addition (see _arithmetic.py).

GRPO with Knapsack RL's rollout allocation (arXiv 2509.25849,
`rljax.selection.Knapsack`): each step's 16 x 16 samples are split among
its prompts to maximise the expected learning value, 2 to 32 per prompt.

python -m rljax.training --config configs/knapsack.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "grpo",
    sampler={
      "prompts": "knapsack",
      "prompts_kwargs": {"min_samples": 2, "max_samples_per_prompt": 32},
    },
  )
