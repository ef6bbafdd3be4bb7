"""Tasks with verifiable answers: datasets, default rewards, prompt format.

A `Task` holds train and held-out test grain `MapDataset`s of example dicts
({"question", "answer", ...}), the default reward spec for
`rljax.rewards.score` and `format_prompt` (example -> prompt text). Built in:
`arithmetic` (no extra dependency); `reasoning_gym` adapts reasoning-gym's
generators (`pip install 'rljax[tasks]'`). `get("arithmetic")` or
`get("reasoning_gym:countdown")` builds one by name. Task rewards never
evaluate model text in the trainer: reasoning-gym's scorers run in
`rljax.sandbox`, countdown's natively without eval.
"""

from rljax.tasks._arithmetic import ARITHMETIC_ALPHABET
from rljax.tasks._arithmetic import arithmetic
from rljax.tasks._base import Task
from rljax.tasks._reasoning_gym import reasoning_gym
from rljax.tasks._registry import get

__all__ = [
  "ARITHMETIC_ALPHABET",
  "Task",
  "arithmetic",
  "get",
  "reasoning_gym",
]
