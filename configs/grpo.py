"""GRPO on 2-digit addition (see _arithmetic.py).

python -m rljax.training --config configs/grpo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base("grpo")
