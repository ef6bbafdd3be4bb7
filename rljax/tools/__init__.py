"""Tools for agentic RL: a registry, call formats and built-in tools.

An agent's turn may call tools; the environment (`rljax.envs`) parses the
calls, runs them and appends the results as observation tokens. This
package is that host-side layer, independent of JAX:

Registry. A `Tool` is a Python function with its function-calling JSON
schema ({"type": "function", "function": {"name", "description",
"parameters"}}), read from the signature and Google-style docstring by
`Tool.from_function` (`function_schema`) or given explicitly. A `Toolbox`
holds tools by name; `schemas()` feeds the chat template
(`tokenizer.apply_chat_template(messages, tools=box.schemas())`), and
`execute(call)` returns a `ToolResult(text, ok, error)` and never raises:
an unknown tool, missing, unexpected or mistyped arguments, a parse error,
an exception and a timeout are all `ok=False` results whose text,
"Error: <one line>", is what the model sees. Output is cut at
`max_output_chars` per call.

Formats (`CallFormat`): how calls are written in a turn and results shown.
  HermesFormat  <tool_call>{"name": ..., "arguments": {...}}</tool_call>
                (Hermes, Qwen; several per turn), results as "tool"
                messages for the chat template or <tool_response> text.
  TagFormat     <calc>12*34</calc> -> <out>408</out>, for tiny models: the
                tag is the tool, the body its one string argument.
Each has `parse(text) -> [ToolCall | ParseError]`, `stop_strings` (where
decoding stops for a call), `render(results)`, `messages(results)` and
`format_call(call)` (for demonstrations).

Built-ins:
  calculator / calculator_tool  exact + - * / // % ** by an `ast` walk
                                (never eval), bounded ("9**9**9" is
                                refused at once).
  python_tool / PythonExecutor  code in `rljax.sandbox` (a fresh process
                                per call; CPU, memory, output and
                                wall-clock limits; no network; a scratch
                                directory; no host environment).
  search_tool / BM25            Okapi BM25 over a local corpus (texts,
                                dicts or JSONL), offline.

Threat model: tool arguments are untrusted model output. The calculator
and search never execute them; the Python tool relies on `rljax.sandbox`,
whose docstring says what it stops and what it does not (it is defence in
depth, not a kernel sandbox: for adversarial code add a container).

Example:
  box = tools.Toolbox([tools.calculator_tool(), tools.python_tool()])
  fmt = tools.HermesFormat()
  prompt = tokenizer.apply_chat_template(messages, tools=box.schemas())
  results = box.execute_all(fmt.parse(turn_text))
  observation = fmt.messages(results)  # or fmt.render(results)
"""

from rljax.tools._base import ParseError
from rljax.tools._base import Tool
from rljax.tools._base import Toolbox
from rljax.tools._base import ToolCall
from rljax.tools._base import ToolError
from rljax.tools._base import ToolResult
from rljax.tools._calculator import calculate
from rljax.tools._calculator import calculator
from rljax.tools._calculator import calculator_tool
from rljax.tools._calculator import format_number
from rljax.tools._formats import CallFormat
from rljax.tools._formats import HermesFormat
from rljax.tools._formats import TagFormat
from rljax.tools._python import PythonExecutor
from rljax.tools._python import python_tool
from rljax.tools._schema import check_arguments
from rljax.tools._schema import function_schema
from rljax.tools._search import BM25
from rljax.tools._search import load_corpus
from rljax.tools._search import search_tool

__all__ = [
  "BM25",
  "CallFormat",
  "HermesFormat",
  "ParseError",
  "PythonExecutor",
  "TagFormat",
  "Tool",
  "ToolCall",
  "ToolError",
  "ToolResult",
  "Toolbox",
  "calculate",
  "calculator",
  "calculator_tool",
  "check_arguments",
  "format_number",
  "function_schema",
  "load_corpus",
  "python_tool",
  "search_tool",
]
