"""`get`: build a task from its name."""

from typing import Any

from rljax.tasks._agentic import with_tools
from rljax.tasks._arithmetic import arithmetic
from rljax.tasks._base import Task
from rljax.tasks._calculator import calculator
from rljax.tasks._games import grid_world
from rljax.tasks._games import sokoban
from rljax.tasks._reasoning_gym import reasoning_gym

_REASONING_GYM = "reasoning_gym:"
_PYTHON = "python:"  # a task answered with a sandboxed Python tool
_GAMES = {"grid_world": grid_world, "sokoban": sokoban}


def get(name: str, **kwargs: Any) -> Task:
  """Build a task by name: "arithmetic", a game or "reasoning_gym:<dataset>".

  Args:
    name: "arithmetic" (`arithmetic`), "grid_world" (`grid_world`),
      "sokoban" (`sokoban`) or "reasoning_gym:<dataset>" (`reasoning_gym`,
      e.g. "reasoning_gym:countdown").
    **kwargs: passed on to the task's factory.

  Returns:
    The `Task`.
  """
  if name == "arithmetic":
    return arithmetic(**kwargs)
  if name == "calculator":  # multi-turn, with a calculator tool
    return calculator(**kwargs)
  if name.startswith(_PYTHON) and len(name) > len(_PYTHON):
    max_turns = kwargs.pop("max_turns", 4)
    return with_tools(get(name[len(_PYTHON) :], **kwargs), max_turns=max_turns)
  if name in _GAMES:
    return _GAMES[name](**kwargs)
  if name.startswith(_REASONING_GYM) and len(name) > len(_REASONING_GYM):
    return reasoning_gym(name[len(_REASONING_GYM) :], **kwargs)
  raise ValueError(
    f"unknown task {name!r}; choices: 'arithmetic', 'calculator',"
    " 'grid_world', 'sokoban', 'reasoning_gym:<dataset>', 'python:<task>'"
    " (e.g. 'reasoning_gym:countdown', 'reasoning_gym:basic_arithmetic',"
    " 'reasoning_gym:gsm_symbolic')."
  )
