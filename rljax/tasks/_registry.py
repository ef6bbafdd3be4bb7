"""`get`: build a task from its name."""

from typing import Any

from rljax.tasks._arithmetic import arithmetic
from rljax.tasks._base import Task
from rljax.tasks._reasoning_gym import reasoning_gym

_REASONING_GYM = "reasoning_gym:"


def get(name: str, **kwargs: Any) -> Task:
  """Build a task by name: "arithmetic" or "reasoning_gym:<dataset>".

  Args:
    name: "arithmetic" (`arithmetic`) or "reasoning_gym:<dataset>"
      (`reasoning_gym`, e.g. "reasoning_gym:countdown").
    **kwargs: passed on to the task's factory.

  Returns:
    The `Task`.
  """
  if name == "arithmetic":
    return arithmetic(**kwargs)
  if name.startswith(_REASONING_GYM) and len(name) > len(_REASONING_GYM):
    return reasoning_gym(name[len(_REASONING_GYM) :], **kwargs)
  raise ValueError(
    f"unknown task {name!r}; choices: 'arithmetic', 'reasoning_gym:<dataset>'"
    " (e.g. 'reasoning_gym:countdown', 'reasoning_gym:basic_arithmetic',"
    " 'reasoning_gym:gsm_symbolic')."
  )
