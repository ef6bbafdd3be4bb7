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
PYTHON_PREFIX = "python:"  # a task answered with a sandboxed Python tool
_GAMES = {"grid_world": grid_world, "sokoban": sokoban}


def get(name: str, **kwargs: Any) -> Task:
  """Build a task by name: "arithmetic", a game or "reasoning_gym:<dataset>".

  Args:
    name: "arithmetic" (`arithmetic`), "grid_world" (`grid_world`),
      "sokoban" (`sokoban`), "reasoning_gym:<dataset>" (`reasoning_gym`,
      e.g. "reasoning_gym:countdown") or "python:<task>" (`with_tools`:
      <task> answered with a sandboxed Python tool; kwargs ``max_turns``
      and ``allow_weaker`` go to `with_tools`).
    **kwargs: passed on to the task's factory.

  Returns:
    The `Task`.
  """
  if name == "arithmetic":
    return arithmetic(**kwargs)
  if name == "calculator":  # multi-turn, with a calculator tool
    return calculator(**kwargs)
  if name.startswith(PYTHON_PREFIX) and len(name) > len(PYTHON_PREFIX):
    max_turns = kwargs.pop("max_turns", 4)
    allow_weaker = kwargs.pop("allow_weaker", None)
    return with_tools(
      get(name[len(PYTHON_PREFIX) :], **kwargs),
      max_turns=max_turns,
      allow_weaker=allow_weaker,
    )
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
