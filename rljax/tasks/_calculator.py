"""The calculator task: multi-digit arithmetic with a calculator tool."""

import hashlib
from typing import Any

from rljax import envs
from rljax import rewards
from rljax import tools
from rljax.tasks._arithmetic import arithmetic
from rljax.tasks._base import Task

#: the compact tool-call tags of the character-level demo
CALL, RESULT = "c", "o"
CALCULATOR_ALPHABET = "0123456789+-*=<>/?" + CALL + RESULT


def calculator(
  *,
  digits: int = 3,
  operations=("*",),
  train_size: int = 10_000,
  test_size: int | None = None,
  seed: int = 0,
  demo_rate: float = 0.3,
  max_turns: int = 3,
  use_tools: bool = True,
) -> Task:
  """Arithmetic a op b on `digits`-digit operands, with a calculator.

  The prompt is bare ("123*456="); the policy may call the calculator in
  the compact tag format, ``<c>123*456</c>``, and sees ``<o>56088</o>``;
  its first action without a call is its answer, rewarded 1 when it is
  exactly the result. A small character-level model cannot multiply
  3-digit numbers in its head but can copy them into a call and copy the
  result out.

  Train examples carry a "demonstration" for the supervised warm start:
  for a `demo_rate` share of them (chosen by a hash of the question) the
  whole tool-using transcript ``<c>123*456</c><o>56088</o>56088``, for
  the others the bare answer; so the warm-started policy calls the tool
  sometimes, and RL can learn that calling pays.

  Args:
    digits, operations, train_size, test_size, seed: as
      `rljax.tasks.arithmetic`.
    demo_rate: the share of warm-start demonstrations that use the tool.
    max_turns: the most actions of an episode.
    use_tools: False: the no-tool baseline (every call fails with
      ``<o>?</o>``, and no demonstration uses the tool).

  Returns:
    A `Task` named "calculator" with an ``environment``; rewards "correct"
    (the episode's return) and "tool_calls" (weight 0: logged).
  """
  if not 0 <= demo_rate <= 1:
    raise ValueError(f"demo_rate must be in [0, 1]; got {demo_rate!r}.")
  base = arithmetic(
    digits=digits,
    operations=operations,
    train_size=train_size,
    test_size=test_size,
    seed=seed,
  )
  fmt = tools.TagFormat({CALL: "calculator"}, result="<o>{text}</o>")
  box = tools.Toolbox([tools.calculator_tool()] if use_tools else [])
  make = _Factory(box, fmt, max_turns)
  rate = demo_rate if use_tools else 0.0
  return Task(
    name="calculator",
    train=base.train.map(_Demonstrate(rate)),
    test=base.test,
    rewards=(
      ("correct", rewards.episode_return(), 1.0),
      ("tool_calls", rewards.tool_calls(), 0.0),
    ),
    format_prompt=base.format_prompt,
    alphabet=CALCULATOR_ALPHABET,
    environment=make,
  )


class _Factory:
  """A picklable environment factory for the calculator task."""

  def __init__(self, box, fmt, max_turns):
    self.box, self.fmt, self.max_turns = box, fmt, max_turns

  def __call__(self):
    return envs.ToolEnvironment(
      self.box,
      self.fmt,
      _exact,
      prompt=_prompt,
      max_turns=self.max_turns,
      error_text="?",
      tools_in_prompt=False,
    )


def _prompt(example) -> str:
  return example["question"] + "="


def _exact(text: str, example) -> float:
  return float(text.strip() == str(example["answer"]))


class _Demonstrate:
  def __init__(self, rate: float):
    self.rate = rate

  def __call__(self, example: dict[str, Any]) -> dict[str, Any]:
    question, answer = example["question"], example["answer"]
    digest = hashlib.sha256(question.encode()).digest()
    if int.from_bytes(digest[:4], "big") / 2**32 < self.rate:
      demo = f"<{CALL}>{question}</{CALL}><{RESULT}>{answer}</{RESULT}>{answer}"
    else:
      demo = answer
    return {**example, "demonstration": demo}
