"""ICPO on 2-digit addition (see _arithmetic.py).

In-Context Steered Policy Optimization (arXiv 2510.26519): 2 of each
group's 16 samples are drawn with a solved example in context (implicit
expert forcing, `rljax.rollouts.InContextDemos`) and trained on the plain
prompt with the shaped loss -A pi / (pi + 0.1) and an annealed bonus for
correct expert samples (preset `icpo`). "*" separates the demonstration
from the prompt (the character vocabulary has no newline).

python -m rljax.training --config configs/icpo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "icpo",
    horizon=100,
    task={"max_prompt_tokens": 16},
    sampler={
      "groups": "icpo_demos",
      "groups_kwargs": {"num_privileged": 2, "separator": "*"},
    },
  )
