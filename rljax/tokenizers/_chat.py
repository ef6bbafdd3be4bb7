"""Chat templates rendered the way transformers renders them.

Chat templates are Jinja programs shipped with a model (often from the Hub,
so untrusted): they run in jinja2's immutable sandbox with `trim_blocks`,
`lstrip_blocks`, the `loopcontrols` extension and the globals and filters
that `transformers.utils.chat_template_utils` provides (`raise_exception`,
`strftime_now`, `dict`, `namespace`, a `tojson` that does not escape HTML).
"""

from collections.abc import Mapping, Sequence
import datetime
import functools
import json
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils

# transformers copies a message's reasoning under all of these names, so that
# templates reading any one of them see it.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationBlock(jinja2.ext.Extension):
  """`{% generation %}...{% endgeneration %}` renders its body unchanged."""

  tags = {"generation"}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return jinja2.nodes.CallBlock(
      self.call_method("_render"), [], [], body
    ).set_lineno(lineno)

  def _render(self, caller):
    return caller()


class _Namespace(jinja2.utils.Namespace):
  """A `namespace()` that refuses underscore names (sandbox hardening)."""

  def __init__(*args, **kwargs):  # noqa: N805 - jinja's own signature trick
    self, args = args[0], args[1:]
    attrs = dict(*args, **kwargs)
    for name in attrs:
      _check_namespace_name(name)
    jinja2.utils.Namespace.__init__(self, attrs)

  def __setitem__(self, name, value):
    _check_namespace_name(name)
    jinja2.utils.Namespace.__setitem__(self, name, value)


class _Dict:
  """`dict(...)` and `dict.fromkeys(...)` without attribute access to `dict`."""

  def __call__(self, *args, **kwargs):
    return dict(*args, **kwargs)

  def fromkeys(self, *args, **kwargs):
    return dict.fromkeys(*args, **kwargs)


def _check_namespace_name(name: Any) -> None:
  """Raise SecurityError for underscore-prefixed namespace attributes."""
  if isinstance(name, str) and name.startswith("_"):
    raise jinja2.exceptions.SecurityError(
      "chat templates cannot store underscore-prefixed attributes on a"
      f" namespace; got {name!r}."
    )


def _raise_exception(message: str) -> None:
  """The `raise_exception` global: templates use it to reject a chat."""
  raise jinja2.exceptions.TemplateError(message)


def _tojson(
  x, ensure_ascii=False, indent=None, separators=None, sort_keys=False
):
  """Jinja's `tojson` escapes HTML characters; templates expect plain JSON."""
  return json.dumps(
    x,
    ensure_ascii=ensure_ascii,
    indent=indent,
    separators=separators,
    sort_keys=sort_keys,
  )


def _strftime_now(fmt: str) -> str:
  """The `strftime_now` global (templates stamp today's date with it)."""
  return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
  """Compile `source` in the sandboxed environment transformers uses."""
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True,
    lstrip_blocks=True,
    extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
  )
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise_exception
  env.globals["strftime_now"] = _strftime_now
  env.globals["dict"] = _Dict()
  env.globals["namespace"] = _Namespace
  return env.from_string(source)


def _plain_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
  """Copy messages into fresh dicts, aliasing reasoning like transformers."""
  if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence):
    raise ValueError(
      "messages must be a list of dicts like"
      f" {{'role': 'user', 'content': '...'}}; got {type(messages).__name__}."
    )
  plain = []
  for i, message in enumerate(messages):
    if not isinstance(message, Mapping) or "role" not in message:
      raise ValueError(
        f"messages[{i}] must be a dict with a 'role' key; got {message!r}."
      )
    message = dict(message)
    reasoning = next(
      (message[k] for k in _REASONING_FIELDS if message.get(k) is not None),
      None,
    )
    if reasoning is not None:
      message = {"thinking": reasoning, **message}
      message["reasoning_content"] = reasoning
    plain.append(message)
  return plain


def render(
  source: str,
  messages: Sequence[Mapping[str, Any]],
  *,
  add_generation_prompt: bool,
  special_tokens: Mapping[str, str],
  **template_kwargs: Any,
) -> str:
  """Render one conversation; `template_kwargs` override special tokens."""
  variables = {
    "tools": None,
    "documents": None,
    **special_tokens,
    **template_kwargs,
  }
  return compile_template(source).render(
    messages=_plain_messages(messages),
    add_generation_prompt=add_generation_prompt,
    **variables,
  )
