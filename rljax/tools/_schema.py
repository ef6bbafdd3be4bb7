"""JSON schemas of Python functions, and checking call arguments against them.

The schema format is the OpenAI/Hugging Face function-calling one that chat
templates render (`apply_chat_template(..., tools=[schema, ...])`):

  {"type": "function",
   "function": {"name": ..., "description": ...,
                "parameters": {"type": "object", "properties": {...},
                               "required": [...]}}}

`function_schema` writes it from a signature, its type hints and a
Google-style docstring, as `transformers.utils.get_json_schema` does for the
types it covers (str, int, float, bool, list[...], dict, Literal[...],
Optional/`X | None`), without depending on transformers.
"""

from collections.abc import Callable, Mapping
import inspect
import re
import types
import typing
from typing import Any

_SIMPLE = {
  str: "string",
  int: "integer",
  float: "number",
  bool: "boolean",
  list: "array",
  tuple: "array",
  dict: "object",
}
_SECTION = re.compile(
  r"^\s*(Args|Arguments|Parameters|Returns|Return|Yields|Raises|Examples?"
  r"|Notes?|References?|Attributes):\s*$"
)
_ARG = re.compile(r"^(\s*)(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def function_schema(
  fn: Callable[..., Any],
  *,
  name: str | None = None,
  description: str | None = None,
) -> dict[str, Any]:
  """The function-calling JSON schema of `fn`.

  Each parameter needs a type hint among str, int, float, bool, list[X],
  tuple[X, ...], dict, Literal["a", "b"] and Optional[X] / `X | None`
  (marked "nullable", as transformers does). Parameters without a default
  are "required". Descriptions come from the docstring: the text before
  its first section is the function's, and the "Args:" entries
  ("name: text", continued on indented lines) are the parameters'.

  Args:
    fn: a function (or callable object) with keyword-passable parameters.
    name: the tool's name; default `fn.__name__`.
    description: the tool's description; default from the docstring.

  Returns:
    {"type": "function", "function": {"name", "description", "parameters"}}.

  Raises:
    ValueError: a parameter has no type hint, an unsupported one, or is
      *args / **kwargs / positional-only.
  """
  name = name or getattr(fn, "__name__", None)
  if not isinstance(name, str) or not name:
    raise ValueError(f"function_schema needs name= for {fn!r}.")
  summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
  try:
    hints = typing.get_type_hints(fn)
  except (NameError, TypeError) as e:
    raise ValueError(f"cannot read the type hints of {name}: {e}") from e
  properties, required = {}, []
  for param in inspect.signature(fn).parameters.values():
    if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
      raise ValueError(
        f"tool {name}: parameter {param.name!r} is {param.kind.description};"
        " tools are called with keyword arguments only."
      )
    if param.name not in hints:
      raise ValueError(
        f"tool {name}: parameter {param.name!r} has no type hint; add one"
        " (str, int, float, bool, list[...], ...)."
      )
    prop = _type_schema(hints[param.name], f"{name}({param.name})")
    if param.name in arg_docs:
      prop["description"] = arg_docs[param.name]
    properties[param.name] = prop
    if param.default is param.empty:
      required.append(param.name)
  parameters: dict[str, Any] = {"type": "object", "properties": properties}
  if required:
    parameters["required"] = required
  return {
    "type": "function",
    "function": {
      "name": name,
      "description": summary if description is None else description,
      "parameters": parameters,
    },
  }


def _type_schema(hint: Any, where: str) -> dict[str, Any]:
  """The JSON schema of one type hint."""
  if hint in _SIMPLE:
    return {"type": _SIMPLE[hint]}
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin in (typing.Union, types.UnionType):
    rest = [a for a in args if a is not type(None)]
    if len(rest) == 1 and len(args) == 2:
      return {**_type_schema(rest[0], where), "nullable": True}
  if origin is typing.Literal and args:
    kinds = {type(a) for a in args}
    if len(kinds) == 1 and kinds <= set(_SIMPLE):
      return {"type": _SIMPLE[kinds.pop()], "enum": list(args)}
  if origin in (list, tuple) and (
    len(args) == 1 or (origin is tuple and len(args) == 2 and args[1] == ...)
  ):
    return {"type": "array", "items": _type_schema(args[0], where)}
  if origin is dict:
    return {"type": "object"}
  raise ValueError(
    f"tool {where}: the type hint {hint!r} has no JSON schema here; use str,"
    " int, float, bool, list[X], dict, Literal[...] or Optional[X], or pass"
    " the schema to Tool explicitly."
  )


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
  """(the summary before the first section, {arg: its description})."""
  lines = doc.splitlines()
  summary, args = [], {}
  section, current, indent = None, None, None
  for line in lines:
    match = _SECTION.match(line)
    if match:
      section, current, indent = match.group(1), None, None
      continue
    if section is None:
      summary.append(line)
    elif section in ("Args", "Arguments", "Parameters") and line.strip():
      arg = _ARG.match(line)
      level = len(line) - len(line.lstrip())
      if arg and (indent is None or level <= indent):
        indent, current = level, arg.group(2).lstrip("*")
        args[current] = arg.group(3).strip()
      elif current is not None:
        args[current] = f"{args[current]} {line.strip()}".strip()
  return "\n".join(summary).strip(), args


def check_arguments(
  schema: Mapping[str, Any], arguments: Mapping[str, Any]
) -> str:
  """Why `arguments` do not fit a tool's schema, or "" when they do.

  Checks missing "required" names, names not in "properties" and each
  value's JSON type ("integer" takes ints, "number" ints and floats, never
  bools; "nullable" or a "null" type admits None; "enum"; array "items").

  Args:
    schema: the tool's function-calling schema.
    arguments: the call's arguments.

  Returns:
    A one-line reason, or "".
  """
  parameters = schema["function"].get("parameters") or {}
  properties = parameters.get("properties") or {}
  missing = [k for k in parameters.get("required", ()) if k not in arguments]
  if missing:
    return f"missing required argument(s): {', '.join(missing)}"
  extra = [k for k in arguments if k not in properties]
  if extra:
    known = ", ".join(properties) or "none"
    return f"unexpected argument(s): {', '.join(extra)} (takes: {known})"
  for key, value in arguments.items():
    why = _check_value(value, properties[key], key)
    if why:
      return why
  return ""


def _check_value(value: Any, prop: Mapping[str, Any], path: str) -> str:
  """Why `value` does not fit the property schema `prop`, or ""."""
  if value is None and (prop.get("nullable") or "null" in _types(prop)):
    return ""
  if "enum" in prop and value not in prop["enum"]:
    return f"argument {path} must be one of {prop['enum']}; got {value!r}"
  kinds = _types(prop)
  if kinds and not any(_is(value, kind) for kind in kinds):
    wanted = " or ".join(kinds)
    return (
      f"argument {path} must be of type {wanted}; got"
      f" {_json_type(value)} {_short(value)}"
    )
  if isinstance(value, list) and isinstance(prop.get("items"), Mapping):
    for i, item in enumerate(value):
      why = _check_value(item, prop["items"], f"{path}[{i}]")
      if why:
        return why
  return ""


def _types(prop: Mapping[str, Any]) -> list[str]:
  """The JSON type names a property admits ([] for any)."""
  kind = prop.get("type")
  if kind is None:
    return []
  return [kind] if isinstance(kind, str) else list(kind)


def _is(value: Any, kind: str) -> bool:
  """Whether value has JSON type `kind`."""
  if kind == "integer":
    return isinstance(value, int) and not isinstance(value, bool)
  if kind == "number":
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if kind == "null":
    return value is None
  python = {
    "string": str,
    "boolean": bool,
    "array": (list, tuple),
    "object": Mapping,
  }.get(kind)
  return python is None or isinstance(value, python)


def _json_type(value: Any) -> str:
  """The JSON type name of a decoded JSON value."""
  for kind in ("null", "boolean", "integer", "number", "string", "array"):
    if _is(value, kind):
      return kind
  return "object" if isinstance(value, Mapping) else type(value).__name__


def _short(value: Any, limit: int = 40) -> str:
  """repr(value), cut to `limit` characters."""
  text = repr(value)
  return text if len(text) <= limit else text[: limit - 3] + "..."
