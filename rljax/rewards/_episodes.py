"""Rewards of agent episodes, read from the episode runner's side data."""

import numpy as np

from rljax.rewards._base import RewardFn
from rljax.rewards._base import Samples


def episode_side(samples: Samples, name: str, by: str) -> np.ndarray:
  """``samples.extra[name]`` as a float array, or a clear error."""
  extra = samples.extra or {}
  if name not in extra:
    raise ValueError(
      f"{by} reads samples.extra[{name!r}], which agent episodes carry"
      f" (present: {sorted(extra)}); use it with a task that has an"
      " environment (rljax.envs)."
    )
  return np.asarray(extra[name], np.float32)


def episode_return() -> RewardFn:
  """The environment's return: the sum of an episode's turn rewards
  (``episode_return_PG``, `rljax.envs`)."""

  def reward(samples: Samples) -> np.ndarray:
    return episode_side(samples, "episode_return_PG", "episode_return")

  return reward


def tool_calls(*, failed: bool = False) -> RewardFn:
  """The number of tool calls of each episode (with ``failed``: the calls
  that failed); with weight 0 in a task's rewards it is logged, not
  trained on (``reward/<name>`` is then the mean calls per episode)."""
  name = "tool_errors_PG" if failed else "tool_calls_PG"

  def reward(samples: Samples) -> np.ndarray:
    return episode_side(samples, name, "tool_calls").sum(-1)

  return reward
