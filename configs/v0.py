"""V0-style budget scheduling on 2-digit addition (see _arithmetic.py).

GRPO whose prompts are screened by a predicted success rate before
rollout (arXiv 2602.03584, `rljax.selection.V0`; the predictor here is
each prompt's Beta posterior, not the paper's trained value model):
predicted all-pass or all-fail prompts are skipped and the budget goes to
high p(1 - p).

python -m rljax.training --config configs/v0.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "grpo",
    sampler={
      "prompts": "v0",
      "prompts_kwargs": {"max_samples_per_prompt": 32, "pool": 2},
    },
  )
