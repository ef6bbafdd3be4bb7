"""Built-in reward functions by name, for configs (``task.extra_rewards``)."""

from typing import Any

from rljax.rewards._answers import exact_answer
from rljax.rewards._answers import math_answer
from rljax.rewards._base import RewardFn
from rljax.rewards._format import answer_format
from rljax.rewards._format import length_penalty
from rljax.rewards._repetition import repetition_penalty

REWARDS = {
  "answer_format": answer_format,
  "exact_answer": exact_answer,
  "length_penalty": length_penalty,
  "math_answer": math_answer,
  "repetition_penalty": repetition_penalty,
}


def get(name: str, **kwargs: Any) -> RewardFn:
  """A built-in reward function by name, built with `kwargs`."""
  if name not in REWARDS:
    raise ValueError(f"unknown reward {name!r}; known: {sorted(REWARDS)}.")
  return REWARDS[name](**kwargs)
