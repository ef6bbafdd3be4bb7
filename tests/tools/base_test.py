"""Toolbox: schemas, execution, and every failure as an error observation."""

import threading
import time

import pytest

from rljax import tools


def add(a: int, b: int = 1) -> int:
  """Add two integers.

  Args:
    a: the first.
    b: the second.
  """
  return a + b


def shout(text: str) -> str:
  """Upper-case a text.

  Args:
    text: the text.
  """
  return text.upper()


def fail(reason: str) -> str:
  """Fail.

  Args:
    reason: why.
  """
  if reason == "clean":
    raise tools.ToolError("no luck\ntoday", output="partial output")
  if reason == "exit":
    raise SystemExit(3)
  raise KeyError(reason)


def sleepy(seconds: float) -> str:
  """Sleep.

  Args:
    seconds: how long.
  """
  time.sleep(seconds)
  return "awake"


@pytest.fixture
def box():
  return tools.Toolbox(
    [add, shout, fail, tools.Tool.from_function(sleepy, timeout=0.2)],
    max_output_chars=20,
    max_calls=6,
  )


def test_registry_and_schemas(box):
  assert box.names == ["add", "shout", "fail", "sleepy"]
  assert "add" in box and "nope" not in box and len(box) == 4
  schemas = box.schemas()
  assert [s["function"]["name"] for s in schemas] == box.names
  assert schemas[0] == tools.function_schema(add)
  schemas[0]["function"]["name"] = "changed"  # a copy
  assert box["add"].name == "add"


def test_successful_calls(box):
  assert box.execute(tools.ToolCall("add", {"a": 2, "b": 40})) == (
    tools.ToolResult("42", True, "", "add")
  )
  # A bare string binds to the one required parameter (the tag format).
  assert box.execute(tools.ToolCall("shout", "hi")).text == "HI"
  assert box.execute(tools.ToolCall("add", "2")).ok is False  # not an int

  def pair(a: str, b: str) -> str:
    """Join.

    Args:
      a: one.
      b: two.
    """
    return a + b

  result = tools.Toolbox([pair]).execute(tools.ToolCall("pair", "x"))
  assert "takes 2 arguments, not one string" in result.error


def test_failures_are_results_never_exceptions(box):
  cases = [
    (
      tools.ToolCall("nope", {}),
      "unknown tool 'nope' (available: add, shout, fail, sleepy)",
    ),
    (tools.ToolCall("add", {}), "add: missing required argument(s): a"),
    (
      tools.ToolCall("add", {"a": 1, "c": 2}),
      "add: unexpected argument(s): c (takes: a, b)",
    ),
    (
      tools.ToolCall("add", {"a": "1"}),
      "add: argument a must be of type integer; got string '1'",
    ),
    (tools.ToolCall("add", [1, 2]), "add: arguments must be an object"),
    (tools.ToolCall("fail", {"reason": "x"}), "KeyError: 'x'"),
    (tools.ToolCall("fail", {"reason": "exit"}), "SystemExit: 3"),
    (
      tools.ToolCall("sleepy", {"seconds": 5.0}),
      "sleepy timed out after 0.2 s",
    ),
    (tools.ParseError("bad JSON", "<tool_call>{</tool_call>"), "bad JSON"),
  ]
  for call, error in cases:
    result = box.execute(call)
    assert not result.ok, call
    assert result.error.startswith(error), (call, result)
    assert result.text == f"Error: {result.error}", result
    assert "\n" not in result.error
  result = box.execute(tools.ToolCall("fail", {"reason": "clean"}))
  assert result == tools.ToolResult(
    "partial output", False, "no luck today", "fail"
  )


def test_timeout_returns_quickly_and_abandons_the_thread(box):
  start = time.monotonic()
  result = box.execute(tools.ToolCall("sleepy", {"seconds": 3.0}))
  assert time.monotonic() - start < 1.0
  assert not result.ok and "timed out" in result.error
  assert box.execute(tools.ToolCall("sleepy", {"seconds": 0.0})).text == "awake"
  assert any(t.daemon for t in threading.enumerate() if "sleepy" in t.name)


def test_output_is_cut_and_calls_per_turn_are_bounded(box):
  result = box.execute(tools.ToolCall("shout", {"text": "a" * 50}))
  assert result.ok
  assert result.text == "A" * 20 + "... [30 more characters cut]"
  calls = [tools.ToolCall("add", {"a": i}) for i in range(8)]
  results = box.execute_all(calls)
  assert [r.text for r in results[:6]] == [str(i + 1) for i in range(6)]
  assert [r.ok for r in results[6:]] == [False, False]
  assert "too many tool calls in one turn (at most 6)" in results[6].error


def test_non_string_results_are_json():
  def listing() -> list:
    """List."""
    return [1, {"a": "é"}]

  box = tools.Toolbox([listing])
  assert box.execute(tools.ToolCall("listing", {})).text == '[1, {"a": "é"}]'


def test_bad_configuration():
  with pytest.raises(ValueError, match="two tools named 'add'"):
    tools.Toolbox([add, add])
  with pytest.raises(ValueError, match="max_output_chars"):
    tools.Toolbox([add], max_output_chars=0)
  with pytest.raises(ValueError, match="max_calls"):
    tools.Toolbox([add], max_calls=0)
  with pytest.raises(ValueError, match="schema must look like"):
    tools.Tool(add, {"name": "add"})
  with pytest.raises(ValueError, match="timeout"):
    tools.Tool.from_function(add, timeout=-1)
  with pytest.raises(ValueError, match="callable"):
    tools.Tool("add", tools.function_schema(add))


def test_close_closes_tools_that_hold_resources():
  closed = []

  class Resource:
    def __call__(self, text: str) -> str:
      return text

    def close(self):
      closed.append(True)

  schema = tools.function_schema(shout, name="res")
  with tools.Toolbox([tools.Tool(Resource(), schema), add]) as box:
    assert box.execute(tools.ToolCall("res", {"text": "a"})).text == "a"
  assert closed == [True]
