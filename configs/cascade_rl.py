"""Cascade RL on 2-digit addition then subtraction (see _arithmetic.py).

Sequential domain-wise RL (Nemotron-Cascade, arXiv 2512.13607): the
training set mixes two domains, "+" and "-" problems, and the run trains
on one domain after the other with a `rljax.selection.Stages` schedule
(75 steps of "+", then "-"), each stage with its own shuffled stream.

python -m rljax.training --config configs/cascade_rl.py [train.steps=150 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "grpo",
    task={
      "kwargs": {"digits": 2, "prompt_style": "bare", "operations": ("+", "-")}
    },
    sampler={
      "prompts": "stages",
      "prompts_kwargs": {
        "stages": [
          {"steps": 75, "where": {"op": "+"}},
          {"where": {"op": "-"}},
        ]
      },
    },
  )
