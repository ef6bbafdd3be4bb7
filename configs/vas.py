"""GRPO with MMR1's variance-aware sampling on 2-digit addition (see
_arithmetic.py).

Half of each step's prompts are drawn by their Variance Promotion Score
p(1 - p) (arXiv 2509.21268, `rljax.selection.VAS`), half from the shuffled
stream; the official code's defaults.

python -m rljax.training --config configs/vas.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "grpo",
    sampler={
      "prompts": "vas",
      "prompts_kwargs": {"mixture": 0.5, "update_every": 4},
    },
  )
