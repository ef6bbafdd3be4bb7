"""`with_tools`: any task as a multi-turn episode with tools."""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rljax import envs
from rljax import rewards
from rljax import tools
from rljax.tasks._base import Task


def with_tools(
  task: Task,
  toolbox=None,
  *,
  call_format=None,
  max_turns: int = 4,
  system: str | None = None,
  allow_weaker: bool | None = None,
) -> Task:
  """`task` answered over several turns with tools (`envs.ToolEnvironment`).

  Each episode starts from a system message that lists the tools and how to
  call them (`call_format.instructions`, Hermes-style ``<tool_call>`` JSON by
  default, for chat templates without tool support such as SmolLM2's) and
  the task's prompt as the user message. The policy's first turn without a
  call is its answer, scored by the task's first reward ("correct"); the
  episode's return is that score. Tool calls are logged ("tool_calls",
  weight 0).

  Args:
    task: the task (e.g. ``tasks.get("reasoning_gym:basic_arithmetic")``).
    toolbox: the tools; default a sandboxed Python tool
      (`rljax.tools.python_tool`, 4 sandboxes, so episodes run it
      concurrently).
    call_format: default `rljax.tools.HermesFormat()`.
    max_turns: the most actions of an episode.
    system: text before the tool instructions in the system message.
    allow_weaker: the default Python tool may run without the kernel's
      namespaces where this machine cannot create them (`python_tool`).

  Returns:
    A `Task` named "<task>+tools" with an ``environment``.
  """
  toolbox = toolbox or tools.Toolbox(
    [tools.python_tool(workers=4, allow_weaker=allow_weaker)]
  )
  call_format = call_format or tools.HermesFormat()
  instructions = call_format.instructions(toolbox.schemas())
  system = instructions if system is None else f"{system}\n\n{instructions}"
  make = _Factory(toolbox, call_format, _Scorer(task), max_turns, system, task)
  return Task(
    name=f"{task.name}+tools",
    train=task.train,
    test=task.test,
    rewards=(
      ("correct", rewards.episode_return(), 1.0),
      ("tool_calls", rewards.tool_calls(), 0.0),
    ),
    format_prompt=task.format_prompt,
    alphabet=None,
    environment=make,
  )


class _Scorer:
  """The task's first reward on one final answer."""

  def __init__(self, task: Task):
    self.name, self.fn, _ = task.rewards[0]

  def __call__(self, text: str, example: Mapping[str, Any]) -> float:
    out = self.fn(
      rewards.Samples(
        texts=[text],
        num_tokens=np.zeros(1, np.int64),
        truncated=np.zeros(1, bool),
        metadata=[example],
      )
    )
    values = out.values if isinstance(out, rewards.RewardResult) else out
    value = float(np.asarray(values, np.float32)[0])
    return 0.0 if np.isnan(value) else value


class _Factory:
  def __init__(self, toolbox, call_format, scorer, max_turns, system, task):
    self.toolbox, self.call_format, self.scorer = toolbox, call_format, scorer
    self.max_turns, self.system, self.task = max_turns, system, task

  def __call__(self) -> envs.ToolEnvironment:
    return envs.ToolEnvironment(
      self.toolbox,
      self.call_format,
      self.scorer,
      prompt=self._prompt,
      max_turns=self.max_turns,
      tools_in_prompt=False,
    )

  def _prompt(self, example) -> Sequence[Mapping[str, str]]:
    return [
      {"role": "system", "content": self.system},
      {"role": "user", "content": self.task.format_prompt(example)},
    ]
