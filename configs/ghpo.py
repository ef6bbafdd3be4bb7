"""GHPO on 2-digit addition (see _arithmetic.py).

GRPO with GHPO's adaptive guidance (arXiv 2507.10628, `rljax.rollouts.
SolutionHints`): a group whose samples all fail is regenerated with the
first 25%, then 50%, then 75% of the solution (here the answer's digits)
appended to the prompt, and trained on the hinted prompt.

python -m rljax.training --config configs/ghpo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "grpo",
    task={"max_prompt_tokens": 10},
    sampler={
      "groups": "solution_hints",
      "groups_kwargs": {"solution": "answer", "template": "{prompt}{hint}"},
    },
  )
