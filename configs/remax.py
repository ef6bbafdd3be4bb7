"""ReMax on 2-digit addition (see _arithmetic.py).

ReMax: the greedy completion's reward is the baseline.

python -m rljax.training --config configs/remax.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base("remax")
