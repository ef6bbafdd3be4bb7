"""REINFORCE++ on 2-digit addition (see _arithmetic.py).

python -m rljax.training --config configs/reinforce_pp.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base("reinforce_pp")
