"""VSPO's value-based prompt swapping on 2-digit addition (see
_arithmetic.py).

GRPO whose prompts that last gave a one-outcome group (zero advantage) are
swapped for informative prompts of high task value (arXiv 2512.07478,
`rljax.selection.VSPO`; the value metric is our reading, and the paper's
value-smoothing clipping is not implemented: its formula was not found).

python -m rljax.training --config configs/vspo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "grpo",
    sampler={"prompts": "vspo", "prompts_kwargs": {"difficulty": 1.0}},
  )
