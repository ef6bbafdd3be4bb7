"""Function-calling schemas from signatures and docstrings; argument checks."""

from typing import Literal, Optional

import pytest

from rljax import tools


def lookup(
  query: str,
  limit: int = 3,
  weights: list[float] | None = None,
  exact: Optional[bool] = False,
  mode: Literal["fast", "full"] = "fast",
  extra: dict | None = None,
) -> str:
  """Look something up.

  A second paragraph of the description.

  Args:
    query: what to look for,
      on two lines.
    limit (int): how many results.
    weights: one weight per field.
    exact: match whole words only.
    mode: the search mode.
    extra: anything else.

  Returns:
    The results.
  """
  return query


def test_schema_from_signature_and_docstring():
  schema = tools.function_schema(lookup)
  assert schema == {
    "type": "function",
    "function": {
      "name": "lookup",
      "description": (
        "Look something up.\n\nA second paragraph of the description."
      ),
      "parameters": {
        "type": "object",
        "properties": {
          "query": {
            "type": "string",
            "description": "what to look for, on two lines.",
          },
          "limit": {"type": "integer", "description": "how many results."},
          "weights": {
            "type": "array",
            "items": {"type": "number"},
            "nullable": True,
            "description": "one weight per field.",
          },
          "exact": {
            "type": "boolean",
            "nullable": True,
            "description": "match whole words only.",
          },
          "mode": {
            "type": "string",
            "enum": ["fast", "full"],
            "description": "the search mode.",
          },
          "extra": {
            "type": "object",
            "nullable": True,
            "description": "anything else.",
          },
        },
        "required": ["query"],
      },
    },
  }


def test_schema_matches_transformers_get_json_schema():
  utils = pytest.importorskip("transformers.utils")
  theirs = utils.get_json_schema(lookup)
  theirs["function"].pop("return", None)  # transformers' own extra key
  assert tools.function_schema(lookup) == theirs


def test_schema_overrides_and_errors():
  schema = tools.function_schema(lookup, name="find", description="Finds.")
  assert schema["function"]["name"] == "find"
  assert schema["function"]["description"] == "Finds."

  def untyped(x):
    return x

  def star(*args: int):
    return args

  def odd(x: set):
    return x

  with pytest.raises(ValueError, match="'x' has no type hint"):
    tools.function_schema(untyped)
  with pytest.raises(ValueError, match="keyword arguments only"):
    tools.function_schema(star)
  with pytest.raises(ValueError, match="no JSON schema here"):
    tools.function_schema(odd)


@pytest.mark.parametrize(
  "arguments, why",
  [
    ({"query": "a"}, ""),
    ({"query": "a", "limit": 2, "weights": [1, 2.5], "exact": None}, ""),
    ({}, "missing required argument(s): query"),
    ({"query": "a", "page": 2}, "unexpected argument(s): page"),
    ({"query": 3}, "argument query must be of type string; got integer 3"),
    ({"query": "a", "limit": True}, "limit must be of type integer; got bool"),
    ({"query": "a", "limit": 2.0}, "limit must be of type integer; got number"),
    ({"query": "a", "weights": [1, "x"]}, "weights[1] must be of type number"),
    ({"query": "a", "mode": "slow"}, "mode must be one of ['fast', 'full']"),
  ],
)
def test_check_arguments(arguments, why):
  got = tools.check_arguments(tools.function_schema(lookup), arguments)
  if why:
    assert why in got
  else:
    assert got == ""
