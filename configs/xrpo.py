"""XRPO on 2-digit addition (see _arithmetic.py).

GRPO whose per-prompt rollouts follow XRPO's uncertainty-reduction
priority (arXiv 2510.06672, `rljax.selection.XRPO`), with its in-context
seeding (`rljax.rollouts.ICLSeeding`): half the samples of a group that
all failed are drawn again with the two most similar earlier successes in
the prompt, separated by "*" (the character vocabulary has no newline) and
cut to 3 answer characters so the prompt fits 27 tokens. Its
novelty-sharpened advantages are `rljax.transforms.xrpo_novelty_advantages`
(chain it after the GRPO advantages).

python -m rljax.training --config configs/xrpo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "grpo",
    task={"max_prompt_tokens": 27},
    sampler={
      "prompts": "xrpo",
      "prompts_kwargs": {"min_samples": 4, "max_samples_per_prompt": 32},
      "groups": "icl_seeding",
      "groups_kwargs": {
        "num_demos": 2,
        "fraction": 0.5,
        "separator": "*",
        "max_solution_chars": 3,
      },
    },
  )
