"""GMPO on 2-digit addition (see _arithmetic.py).

python -m rljax.training --config configs/gmpo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base("gmpo")
