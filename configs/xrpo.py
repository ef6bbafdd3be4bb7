"""XRPO's rollout allocation on 2-digit addition (see _arithmetic.py).

GRPO whose per-prompt rollouts follow XRPO's uncertainty-reduction
priority (arXiv 2510.06672, `rljax.selection.XRPO`). Its novelty-sharpened
advantages are `rljax.transforms.xrpo_novelty_advantages` (chain it after
the GRPO advantages); its in-context seeding is not implemented.

python -m rljax.training --config configs/xrpo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "grpo",
    sampler={
      "prompts": "xrpo",
      "prompts_kwargs": {"min_samples": 4, "max_samples_per_prompt": 32},
    },
  )
