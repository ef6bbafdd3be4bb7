"""PPO on 2-digit addition (see _arithmetic.py).

PPO with a value model (GAE); the critic starts as a copy of the warm-started policy.

python -m rljax.training --config configs/ppo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base("ppo")
