"""`ToolEnvironment`: answer a task's question with tools."""

from collections.abc import Callable, Mapping
import copy
from typing import Any, Optional

from rljax.envs._base import Action
from rljax.envs._base import Content
from rljax.envs._base import Environment
from rljax.envs._base import Start
from rljax.envs._base import Step


class ToolEnvironment(Environment):
  """A question answered over several turns, with tools.

  Each action either calls tools, written in `call_format`
  (`rljax.tools.HermesFormat`, `TagFormat`): the calls run in `toolbox`
  and their results are the observation (a malformed or unknown call is an
  error result the policy sees, never an exception); or it calls none, and
  is the final answer: ``answer_reward(text, example)`` scores it and the
  episode ends. An episode that reaches `max_turns` without answering gets
  0. The turn's tool calls and failed calls are reported in the `Step`.

  Make one per episode with a factory, e.g.
  ``functools.partial(ToolEnvironment, box, fmt, reward)`` as a task's
  ``environment``; the toolbox is shared by all episodes (and branches).

  Args:
    toolbox: the tools (`rljax.tools.Toolbox`).
    call_format: how calls are written and results shown.
    answer_reward: ``(final answer text, example) -> float``.
    prompt: ``example -> Content``, the first context; default the
      example's "question".
    max_turns: the most actions.
    error_text: when set, what a failed call's result shows instead of its
      error message (for character-level models whose alphabet cannot
      spell the message).
    tools_in_prompt: list the tools' schemas for the chat template.
  """

  def __init__(
    self,
    toolbox,
    call_format,
    answer_reward: Callable[[str, Mapping[str, Any]], float],
    *,
    prompt: Optional[Callable[[Mapping[str, Any]], Content]] = None,
    max_turns: int = 4,
    error_text: Optional[str] = None,
    tools_in_prompt: bool = True,
  ):
    if max_turns < 1:
      raise ValueError(f"max_turns must be >= 1; got {max_turns!r}.")
    self.toolbox = toolbox
    self.call_format = call_format
    self.answer_reward = answer_reward
    self.prompt = prompt
    self.max_turns = int(max_turns)
    self.error_text = error_text
    self.tools_in_prompt = tools_in_prompt
    self.stop_strings = tuple(call_format.stop_strings)
    self.example: Mapping[str, Any] = {}

  def reset(self, example: Mapping[str, Any]) -> Start:
    self.example = example
    prompt = (
      example["question"] if self.prompt is None else self.prompt(example)
    )
    tools = self.toolbox.schemas() if self.tools_in_prompt else ()
    return Start(prompt, tools=tools)

  def step(self, action: Action) -> Step:
    calls = self.call_format.parse(action.text)
    if not calls:
      reward = float(self.answer_reward(action.text, self.example))
      return Step(reward=reward, done=True)
    results = self.toolbox.execute_all(calls)
    if self.error_text is not None:
      results = [
        r if r.ok else r._replace(text=self.error_text) for r in results
      ]
    return Step(
      observation=self.call_format.messages(results),
      tool_calls=len(results),
      tool_errors=sum(not r.ok for r in results),
    )

  def fork(self) -> "ToolEnvironment":
    return copy.copy(self)  # the toolbox is shared
