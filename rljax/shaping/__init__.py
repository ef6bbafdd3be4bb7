"""Reward shaping: overlong and truncation penalties, reward mixing, KL folded
into per-token rewards, clipping. Pure array functions, host or device side;
results are float32.
"""

from rljax.shaping._shaping import clip_rewards
from rljax.shaping._shaping import kl_in_reward
from rljax.shaping._shaping import overlong_penalty
from rljax.shaping._shaping import stop_properly_penalty
from rljax.shaping._shaping import weighted_sum

__all__ = [
  "clip_rewards",
  "kl_in_reward",
  "overlong_penalty",
  "stop_properly_penalty",
  "weighted_sum",
]
