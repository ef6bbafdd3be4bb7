"""Scaf-GRPO on 2-digit addition (see _arithmetic.py).

GRPO with Scaf-GRPO's hints (arXiv 2510.19807, `rljax.rollouts.
TieredHints`): after 20 steps, a group whose 16 samples all fail gets a
sample regenerated with a hint in the prompt, kept if it is correct and
trained on the hinted prompt. The arithmetic task has one hint tier, the
answer itself (the paper's last, "solution" tier); a task with
knowledge and planning hints lists their example fields first.

python -m rljax.training --config configs/scaf_grpo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "grpo",
    task={"max_prompt_tokens": 10},
    sampler={
      "groups": "tiered_hints",
      "groups_kwargs": {
        "hints": ["answer"],
        "exempt_steps": 20,
        "template": "{prompt}{hint}=",
      },
    },
  )
