"""Call formats: how a turn's text becomes tool calls, and results text."""

from collections.abc import Mapping, Sequence
import json
import re
from typing import Any, Protocol

from rljax.tools._base import ParseError
from rljax.tools._base import ToolCall
from rljax.tools._base import ToolResult
from rljax.tools._base import one_line

_TAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


class CallFormat(Protocol):
  """How tool calls are written in a model's turn and results shown back.

  Attributes:
    stop_strings: strings that end a turn at a call (the episode runner
      stops decoding there, runs the calls and appends the results).
  """

  stop_strings: tuple[str, ...]

  def parse(self, text: str) -> list[ToolCall | ParseError]:
    """The calls in one turn's text, in order (malformed ones as errors)."""
    ...

  def render(self, results: Sequence[ToolResult]) -> str:
    """The results as the text appended after the turn."""
    ...

  def messages(self, results: Sequence[ToolResult]) -> list[dict[str, Any]]:
    """The results as chat messages, for the chat template to render."""
    ...

  def format_call(self, call: ToolCall) -> str:
    """A call written as the model should write it (demonstrations)."""
    ...


class HermesFormat:
  """Hermes / Qwen tool calls: JSON between <tool_call> tags.

  A turn calls tools by writing, once or several times,

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12*34"}}
    </tool_call>

  ("arguments" may also be a JSON string of the object, as in OpenAI's
  format, or be called "parameters"; missing means no arguments). Results
  come back as {"role": "tool", "content": ...} messages for the chat
  template (Qwen's renders them as <tool_response> blocks in a user turn),
  or as plain <tool_response>...</tool_response> text. `instructions`
  writes Qwen's system-prompt text that lists the tools, for chat templates
  that do not render `tools=` themselves.

  Args:
    call_tags: the (open, close) tags of a call.
    response_tags: the (open, close) tags of a result in `render`.
  """

  def __init__(
    self,
    *,
    call_tags: tuple[str, str] = ("<tool_call>", "</tool_call>"),
    response_tags: tuple[str, str] = ("<tool_response>", "</tool_response>"),
  ):
    for key, tags in (
      ("call_tags", call_tags),
      ("response_tags", response_tags),
    ):
      if (
        not isinstance(tags, (tuple, list))
        or len(tags) != 2
        or not all(isinstance(t, str) and t for t in tags)
      ):
        raise ValueError(
          f"HermesFormat {key} must be two non-empty strings (open, close);"
          f" got {tags!r}."
        )
    self.call_tags = tuple(call_tags)
    self.response_tags = tuple(response_tags)
    self.stop_strings = (self.call_tags[1],)

  def __repr__(self) -> str:
    return f"HermesFormat(call_tags={self.call_tags!r})"

  def parse(self, text: str) -> list[ToolCall | ParseError]:
    """The calls in a turn's text; bad JSON or a missing name is an error.

    Args:
      text: the model's turn (text outside the tags is ignored).

    Returns:
      A `ToolCall` or `ParseError` per call, in order; an unclosed call at
      the end (the turn ran out of tokens) is a `ParseError`.
    """
    return [
      _hermes_call(body, whole) if closed else ParseError(_unclosed(tag), whole)
      for body, whole, closed, tag in _spans(text, dict([self.call_tags]))
    ]

  def render(self, results: Sequence[ToolResult]) -> str:
    """Each result as <tool_response>\\n{text}\\n</tool_response>, one a
    line."""
    start, end = self.response_tags
    return "\n".join(f"{start}\n{r.text}\n{end}" for r in results)

  def messages(self, results: Sequence[ToolResult]) -> list[dict[str, Any]]:
    """Each result as {"role": "tool", "name": ..., "content": text}."""
    return [_tool_message(r, r.text) for r in results]

  def format_call(self, call: ToolCall) -> str:
    """The call as <tool_call>\\n{"name": ..., "arguments": ...}\\n
    </tool_call>."""
    if not isinstance(call.arguments, Mapping):
      raise ValueError(
        f"HermesFormat writes calls with an arguments dict; got {call!r}."
      )
    payload = json.dumps(
      {"name": call.name, "arguments": dict(call.arguments)},
      ensure_ascii=False,
    )
    return f"{self.call_tags[0]}\n{payload}\n{self.call_tags[1]}"

  def instructions(self, schemas: Sequence[Mapping[str, Any]]) -> str:
    """Qwen2.5's system-prompt text listing the tools and the call format.

    Args:
      schemas: the tools' schemas (`Toolbox.schemas()`).

    Returns:
      Text to put in the system message.
    """
    start, end = self.call_tags
    listed = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return (
      "# Tools\n\nYou may call one or more functions to assist with the user"
      " query.\n\nYou are provided with function signatures within"
      f" <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\nFor each"
      " function call, return a json object with function name and arguments"
      f" within {start}{end} XML tags:\n{start}\n"
      '{"name": <function-name>, "arguments": <args-json-object>}\n'
      f"{end}"
    )


class TagFormat:
  """A compact format for tiny (character-level) models: <calc>12*34</calc>.

  The tag names the tool and its body is the tool's single string argument
  (whitespace around it stripped). A result is rendered with `result`, a
  format string of {text} and {name}: "<out>{text}</out>" (default) or
  "={text}\\n". Tags not in `tags` are ordinary text.

  Args:
    tags: tag names; or {tag: tool name} when they differ.
    result: how one result is written back.
  """

  def __init__(
    self,
    tags: Sequence[str] | Mapping[str, str],
    *,
    result: str = "<out>{text}</out>",
  ):
    if isinstance(tags, str):
      raise ValueError(
        f"TagFormat tags must be a sequence of names; got {tags!r} (write"
        f" tags=({tags!r},))."
      )
    tools = dict(tags) if isinstance(tags, Mapping) else {t: t for t in tags}
    bad = [
      t for t in tools if not isinstance(t, str) or not _TAG_NAME.fullmatch(t)
    ]
    if not tools or bad:
      raise ValueError(
        "TagFormat tags must be non-empty names of letters, digits, _ . -;"
        f" got {list(tools) if not bad else bad!r}."
      )
    try:
      result.format(text="", name="")
    except (AttributeError, IndexError, KeyError, ValueError) as e:
      raise ValueError(
        f"TagFormat result must be a format string of {{text}} and {{name}};"
        f" got {result!r} ({e})."
      ) from None
    if "{text}" not in result:
      raise ValueError(
        f"TagFormat result must contain {{text}}; got {result!r}."
      )
    self.tools = tools
    self.result = result
    self.stop_strings = tuple(f"</{t}>" for t in tools)

  def __repr__(self) -> str:
    return f"TagFormat({self.tools!r}, result={self.result!r})"

  def parse(self, text: str) -> list[ToolCall | ParseError]:
    """The <tag>body</tag> calls in a turn's text, in order.

    Args:
      text: the model's turn.

    Returns:
      A `ToolCall(tool, body)` per call; an unclosed one at the end is a
      `ParseError`.
    """
    names = {f"<{t}>": name for t, name in self.tools.items()}
    calls = []
    pairs = {f"<{t}>": f"</{t}>" for t in self.tools}
    for body, whole, closed, tag in _spans(text, pairs):
      name = names[tag]
      if closed:
        calls.append(ToolCall(name, body.strip(), whole))
      else:
        calls.append(ParseError(_unclosed(tag), whole, name))
    return calls

  def render(self, results: Sequence[ToolResult]) -> str:
    """The results, each written with `result`, concatenated."""
    return "".join(
      self.result.format(text=r.text, name=r.name) for r in results
    )

  def messages(self, results: Sequence[ToolResult]) -> list[dict[str, Any]]:
    """Each result as {"role": "tool", "content": its rendered text}."""
    return [_tool_message(r, self.render([r])) for r in results]

  def format_call(self, call: ToolCall) -> str:
    """The call as <tag>body</tag> (its arguments must be one string)."""
    tag = next((t for t, name in self.tools.items() if name == call.name), None)
    if tag is None or not isinstance(call.arguments, str):
      raise ValueError(
        f"TagFormat writes calls of {list(self.tools.values())} with one"
        f" string argument; got {call!r}."
      )
    return f"<{tag}>{call.arguments}</{tag}>"


def _spans(text: str, closes: Mapping[str, str]):
  """(body, whole call text, closed, open tag) of each call in `text`.

  A call starts at an open tag (a key of `closes`) and ends at its close
  tag (the value); an unclosed one runs to the end of the text and ends
  the scan.
  """
  if not isinstance(text, str):
    raise ValueError(f"parse needs the turn's text as str; got {text!r}.")
  pattern = re.compile("|".join(re.escape(t) for t in closes))
  position = 0
  while True:
    found = pattern.search(text, position)
    if found is None:
      return
    tag = found.group(0)
    end = text.find(closes[tag], found.end())
    if end < 0:
      yield text[found.end() :], text[found.start() :], False, tag
      return
    stop = end + len(closes[tag])
    yield text[found.end() : end], text[found.start() : stop], True, tag
    position = stop


def _unclosed(tag: str) -> str:
  """The error of a call that was opened but never closed."""
  return f"the call opened with {tag} was never closed"


def _hermes_call(body: str, whole: str) -> ToolCall | ParseError:
  """A Hermes call's JSON body as a ToolCall, or why it is not one."""
  try:
    payload = json.loads(body)
  except json.JSONDecodeError as e:
    return ParseError(
      f"the tool call is not valid JSON ({e.msg} at character {e.pos})", whole
    )
  except RecursionError:
    return ParseError("the tool call's JSON is nested too deeply", whole)
  if not isinstance(payload, dict):
    return ParseError(
      'the tool call must be a JSON object {"name": ..., "arguments": {...}}',
      whole,
    )
  name = payload.get("name")
  if not isinstance(name, str) or not name:
    return ParseError('the tool call has no "name" string', whole)
  arguments = payload.get("arguments", payload.get("parameters", {}))
  if isinstance(arguments, str):
    try:
      arguments = json.loads(arguments) if arguments.strip() else {}
    except (json.JSONDecodeError, RecursionError):
      pass  # reported as not an object below
  if not isinstance(arguments, dict):
    return ParseError(
      f'the "arguments" of {one_line(name, 60)} must be a JSON object; got'
      f" {one_line(json.dumps(arguments), 60)}",
      whole,
      name,
    )
  return ToolCall(name, arguments, whole)


def _tool_message(result: ToolResult, content: str) -> dict[str, Any]:
  """A chat message of role "tool" for one result (named when known)."""
  if result.name:
    return {"role": "tool", "name": result.name, "content": content}
  return {"role": "tool", "content": content}
