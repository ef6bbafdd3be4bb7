"""Tasks with verifiable answers: datasets, default rewards, prompt format.

A `Task` holds train and held-out test grain `MapDataset`s of example dicts
({"question", "answer", ...}), the default reward spec for
`rljax.rewards.score` and `format_prompt` (example -> prompt text). Built in:
`arithmetic` (no extra dependency); `calculator` (multi-digit arithmetic
with a calculator tool); the text games `grid_world` and `sokoban`
(multi-turn, with an `rljax.envs` environment); `reasoning_gym` adapts
reasoning-gym's generators (`pip install 'rljax[tasks]'`).
`get("arithmetic")` or `get("reasoning_gym:countdown")` builds one by name;
`with_tools(task)` (or the name prefix "python:") makes any task a
multi-turn episode with a sandboxed Python tool. Task rewards never
evaluate model text in the trainer: reasoning-gym's scorers run in
`rljax.sandbox`, countdown's natively without eval.
"""

from rljax.tasks._agentic import with_tools
from rljax.tasks._arithmetic import ARITHMETIC_ALPHABET
from rljax.tasks._arithmetic import arithmetic
from rljax.tasks._base import Task
from rljax.tasks._calculator import CALCULATOR_ALPHABET
from rljax.tasks._calculator import calculator
from rljax.tasks._games import GRID_WORLD_ALPHABET
from rljax.tasks._games import SOKOBAN_ALPHABET
from rljax.tasks._games import grid_world
from rljax.tasks._games import sokoban
from rljax.tasks._reasoning_gym import reasoning_gym
from rljax.tasks._registry import PYTHON_PREFIX
from rljax.tasks._registry import get

__all__ = [
  "ARITHMETIC_ALPHABET",
  "CALCULATOR_ALPHABET",
  "GRID_WORLD_ALPHABET",
  "PYTHON_PREFIX",
  "SOKOBAN_ALPHABET",
  "Task",
  "arithmetic",
  "calculator",
  "get",
  "grid_world",
  "reasoning_gym",
  "sokoban",
  "with_tools",
]
