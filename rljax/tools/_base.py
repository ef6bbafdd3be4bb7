"""`Tool` and `Toolbox`: named functions the policy calls, and their results."""

from collections.abc import Callable, Iterable, Mapping, Sequence
import copy
import dataclasses
import json
import math
import threading
from typing import Any, NamedTuple

from rljax.tools import _schema

MAX_ERROR_CHARS = 300  # longest error line the model sees


class ToolCall(NamedTuple):
  """One tool call parsed from a model's turn.

  Attributes:
    name: the tool's name.
    arguments: keyword arguments (a dict), or one string for the tool's
      single parameter (the compact tag format's body).
    text: the call as it appeared in the turn.
  """

  name: str
  arguments: Mapping[str, Any] | str
  text: str = ""


class ParseError(NamedTuple):
  """A call in the turn that could not be parsed (bad JSON, no name, ...).

  Attributes:
    error: a one-line reason, shown to the model.
    text: the call as it appeared in the turn.
    name: the tool's name when it could be read, else "".
  """

  error: str
  text: str = ""
  name: str = ""


class ToolResult(NamedTuple):
  """What a call returned: the observation text and whether it worked.

  Attributes:
    text: what the model sees (the tool's output, or "Error: <error>").
    ok: False for an unknown tool, bad arguments, a parse error, an
      exception or a timeout.
    error: "" when ok, else a one-line reason.
    name: the tool called ("" when it could not be read).
  """

  text: str
  ok: bool
  error: str = ""
  name: str = ""


class ToolError(Exception):
  """Raised by a tool to report a failure to the model without a type name.

  The model sees "Error: <message>" (any other exception is shown as
  "Error: <Type>: <message>"), or `output` when given (e.g. a program's
  output up to its traceback).
  """

  def __init__(self, message: str, output: str | None = None):
    super().__init__(message)
    self.output = output


@dataclasses.dataclass(frozen=True, eq=False)
class Tool:
  """A Python function and the JSON schema the model sees.

  Build one from a function's signature and docstring with
  `Tool.from_function(fn)`, or give the schema explicitly (any
  function-calling schema; its "parameters" are what `Toolbox.execute`
  checks arguments against). The function is called with keyword
  arguments; it returns the observation (a str, or a value shown as JSON)
  or raises (`ToolError` for a clean message).

  Attributes:
    fn: the function.
    schema: {"type": "function", "function": {"name", "description",
      "parameters"}}.
    timeout: wall-clock seconds per call, or None for no limit. The call
      runs in a daemon thread and a late one is reported as timed out and
      abandoned (Python cannot stop a thread): give it to tools that may
      hang on I/O, and run untrusted code in `rljax.sandbox` instead.
  """

  fn: Callable[..., Any]
  schema: Mapping[str, Any]
  timeout: float | None = None

  def __post_init__(self):
    if not callable(self.fn):
      raise ValueError(f"Tool fn must be callable; got {self.fn!r}.")
    function = (
      self.schema.get("function") if isinstance(self.schema, Mapping) else None
    )
    if (
      not isinstance(function, Mapping)
      or not isinstance(function.get("name"), str)
      or not function["name"]
    ):
      raise ValueError(
        'Tool schema must look like {"type": "function", "function":'
        ' {"name": ..., "description": ..., "parameters": {...}}}; got'
        f" {self.schema!r}."
      )
    parameters = function.get("parameters", {})
    if not isinstance(parameters, Mapping) or not isinstance(
      parameters.get("properties", {}), Mapping
    ):
      raise ValueError(
        f"Tool {function['name']}: schema parameters must be an object schema"
        f' with "properties"; got {parameters!r}.'
      )
    if self.timeout is not None and not (
      isinstance(self.timeout, (int, float))
      and math.isfinite(self.timeout)
      and self.timeout > 0
    ):
      raise ValueError(
        f"Tool timeout must be a positive number or None; got {self.timeout!r}."
      )
    object.__setattr__(self, "schema", copy.deepcopy(dict(self.schema)))

  @classmethod
  def from_function(
    cls,
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
  ) -> "Tool":
    """A tool whose schema is read from `fn` (see `function_schema`).

    Args:
      fn: a function with type-hinted parameters and a Google-style
        docstring.
      name: the tool's name; default `fn.__name__`.
      description: default: the docstring's text before "Args:".
      timeout: wall-clock seconds per call, or None.

    Returns:
      The Tool.
    """
    schema = _schema.function_schema(fn, name=name, description=description)
    return cls(fn, schema, timeout)

  @property
  def name(self) -> str:
    """The tool's name, as the model calls it."""
    return self.schema["function"]["name"]

  @property
  def parameters(self) -> list[str]:
    """The names of the tool's parameters, in schema order."""
    parameters = self.schema["function"].get("parameters") or {}
    return list(parameters.get("properties") or {})


class Toolbox:
  """Tools by name, their schemas, and calls that never raise.

  `execute` turns a `ToolCall` (or a `ParseError`) into a `ToolResult`: an
  unknown tool, missing, unexpected or mistyped arguments, an exception in
  the tool and a timeout all give `ok=False` with a one-line error that the
  model sees as "Error: ..."; output longer than `max_output_chars` is cut
  and marked, so one call cannot flood the context (error lines are kept
  whole; they are at most 300 characters).

  Args:
    tools: `Tool`s, or functions (made into tools with
      `Tool.from_function`).
    max_output_chars: longest observation text of one call.
    max_calls: most calls executed per turn by `execute_all` (the rest get
      an error result); None for no limit.

  Raises:
    ValueError: two tools share a name, or a limit is not positive.
  """

  def __init__(
    self,
    tools: Iterable[Tool | Callable[..., Any]],
    *,
    max_output_chars: int = 4000,
    max_calls: int | None = None,
  ):
    self._tools: dict[str, Tool] = {}
    for tool in tools:
      if not isinstance(tool, Tool):
        tool = Tool.from_function(tool)
      if tool.name in self._tools:
        raise ValueError(
          f"Toolbox got two tools named {tool.name!r}; give one a different"
          " name (Tool.from_function(fn, name=...))."
        )
      self._tools[tool.name] = tool
    if not _positive_int(max_output_chars):
      raise ValueError(
        f"Toolbox max_output_chars must be a positive int; got"
        f" {max_output_chars!r}."
      )
    if max_calls is not None and not _positive_int(max_calls):
      raise ValueError(
        f"Toolbox max_calls must be a positive int or None; got {max_calls!r}."
      )
    self.max_output_chars = max_output_chars
    self.max_calls = max_calls

  def __getitem__(self, name: str) -> Tool:
    return self._tools[name]

  def __contains__(self, name: object) -> bool:
    return name in self._tools

  def __iter__(self):
    return iter(self._tools.values())

  def __len__(self) -> int:
    return len(self._tools)

  def __repr__(self) -> str:
    return f"Toolbox({', '.join(self._tools)})"

  @property
  def names(self) -> list[str]:
    """The tools' names, in the order given."""
    return list(self._tools)

  def schemas(self) -> list[dict[str, Any]]:
    """The tools' JSON schemas, for `apply_chat_template(..., tools=...)`."""
    return [copy.deepcopy(dict(tool.schema)) for tool in self._tools.values()]

  def execute(self, call: ToolCall | ParseError) -> ToolResult:
    """Run one call; every failure is an `ok=False` result, never a raise.

    Args:
      call: a parsed call, or the `ParseError` of one that did not parse.

    Returns:
      The `ToolResult` (its text is what the model sees).
    """
    if isinstance(call, ParseError):
      return _failure(call.error, call.name)
    if not isinstance(call, ToolCall):
      return _failure(f"not a tool call: {call!r}")
    tool = self._tools.get(call.name)
    if tool is None:
      known = ", ".join(self._tools) or "none"
      return _failure(
        f"unknown tool {call.name!r} (available: {known})", call.name
      )
    arguments, why = self._bind(tool, call.arguments)
    if why:
      return _failure(f"{tool.name}: {why}", tool.name)
    output, error = _invoke(tool, arguments)
    if error:
      if output is None:
        return _failure(error, tool.name)
      return ToolResult(self._cut(output), False, error, tool.name)
    return ToolResult(self._cut(output), True, "", tool.name)

  def execute_all(
    self, calls: Sequence[ToolCall | ParseError]
  ) -> list[ToolResult]:
    """`execute` each call of one turn, in order, up to `max_calls`.

    Args:
      calls: what a call format's `parse` returned for the turn.

    Returns:
      One `ToolResult` per call.
    """
    results = []
    for i, call in enumerate(calls):
      if self.max_calls is not None and i >= self.max_calls:
        name = call.name if isinstance(call, (ToolCall, ParseError)) else ""
        results.append(
          _failure(
            f"too many tool calls in one turn (at most {self.max_calls})", name
          )
        )
      else:
        results.append(self.execute(call))
    return results

  def close(self) -> None:
    """Close the tools that hold resources (e.g. the Python tool's sandbox)."""
    for tool in self._tools.values():
      close = getattr(tool.fn, "close", None)
      if callable(close):
        close()

  def __enter__(self) -> "Toolbox":
    return self

  def __exit__(self, *exc_info: Any) -> None:
    self.close()

  def _bind(
    self, tool: Tool, arguments: Mapping[str, Any] | str
  ) -> tuple[dict[str, Any], str]:
    """The keyword arguments of a call and "", or ({}, why not)."""
    if isinstance(arguments, str):
      names = tool.parameters
      required = tool.schema["function"].get("parameters", {}).get("required")
      names = list(required) if required else names
      if len(names) != 1:
        return {}, (
          f"takes {len(tool.parameters)} arguments, not one string; call it"
          " with JSON arguments"
        )
      arguments = {names[0]: arguments}
    if not isinstance(arguments, Mapping):
      return {}, f"arguments must be an object; got {arguments!r}"
    arguments = dict(arguments)
    return arguments, _schema.check_arguments(tool.schema, arguments)

  def _cut(self, text: str) -> str:
    """text, cut to max_output_chars with a marker saying how much went."""
    if len(text) <= self.max_output_chars:
      return text
    cut = len(text) - self.max_output_chars
    return f"{text[: self.max_output_chars]}... [{cut} more characters cut]"


def _positive_int(value: Any) -> bool:
  """Whether value is an int (not a bool) >= 1."""
  return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _failure(error: str, name: str = "") -> ToolResult:
  """An ok=False result showing "Error: <error>" (one line, bounded)."""
  error = one_line(error)
  return ToolResult(f"Error: {error}", False, error, name)


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
  """text on one line (whitespace runs become one space), cut to `limit`."""
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[: limit - 3] + "..."


def _invoke(tool: Tool, arguments: dict[str, Any]) -> tuple[str | None, str]:
  """(output text, "") or (output or None, error) of one tool call."""
  if tool.timeout is None:
    return _call(tool.fn, arguments)
  box: list[tuple[str | None, str]] = []
  thread = threading.Thread(
    target=lambda: box.append(_call(tool.fn, arguments)),
    name=f"rljax-tool-{tool.name}",
    daemon=True,
  )
  thread.start()
  thread.join(tool.timeout)
  if not box:
    return None, f"{tool.name} timed out after {tool.timeout:g} s"
  return box[0]


def _call(fn: Callable[..., Any], arguments: dict[str, Any]) -> tuple:
  """(text, "") or (output or None, one-line error) of fn(**arguments)."""
  try:
    value = fn(**arguments)
  except ToolError as e:
    return e.output, one_line(str(e))
  except (Exception, SystemExit) as e:
    return None, one_line(f"{type(e).__name__}: {e}")
  if isinstance(value, str):
    return value, ""
  try:
    return json.dumps(value, ensure_ascii=False, default=str), ""
  except (TypeError, ValueError) as e:
    return None, one_line(f"the tool returned {type(value).__name__}: {e}")
