"""DAPO on 2-digit addition (see _arithmetic.py).

DAPO: dynamic sampling (refilled), overlong shaping, clip-higher, token mean.

python -m rljax.training --config configs/dapo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base("dapo", max_length=4, overlong_buffer=1)
