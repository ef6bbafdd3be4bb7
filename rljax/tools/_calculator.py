"""An exact calculator tool: + - * / // % ** over ints and decimals, no eval."""

import ast
from fractions import Fraction
import math

from rljax.tools._base import Tool
from rljax.tools._base import ToolError

MAX_LENGTH = 1000  # characters of an expression
MAX_DEPTH = 100  # nested operations
MAX_DIGITS = 1000  # decimal digits of every numerator and denominator
PRECISION = 12  # decimal places of a result that is not an exact decimal

_BINARY = {
  ast.Add: lambda a, b: a + b,
  ast.Sub: lambda a, b: a - b,
  ast.Mult: lambda a, b: a * b,
  ast.Div: lambda a, b: a / b,
  ast.FloorDiv: lambda a, b: Fraction(a // b),
  ast.Mod: lambda a, b: a % b,
}
_HINTS = {
  ast.BitXor: "use ** for powers, not ^",
  ast.Name: "names are not allowed, only numbers",
  ast.Call: "function calls are not allowed",
  ast.MatMult: "@ is not allowed",
}


def calculate(
  expression: str,
  *,
  max_length: int = MAX_LENGTH,
  max_depth: int = MAX_DEPTH,
  max_digits: int = MAX_DIGITS,
) -> Fraction:
  """The exact value of an arithmetic expression (an `ast` walk, never eval).

  The grammar is Python's, restricted to int and decimal literals ("12",
  "0.1", "1e3", "1_000"; a decimal counts as written, "0.1" is 1/10),
  binary + - * / // % **, unary + -, and parentheses. "/" is exact
  division; "//" and "%" are Python's floor division and modulo, "**"
  takes an integer exponent. Bounded: at most `max_length` characters,
  `max_depth` nested operations, and `max_digits` decimal digits in every
  intermediate numerator and denominator. A power whose result would exceed
  that is refused before it is computed, so "9**9**9" fails at once.

  Args:
    expression: untrusted text, e.g. "(2**64 + 1) * 3 / 7".
    max_length: longest expression (after stripping whitespace).
    max_depth: deepest expression tree.
    max_digits: most decimal digits of any numerator or denominator.

  Returns:
    The value as a Fraction.

  Raises:
    ToolError: not such an expression, a bound exceeded, or a division by
      zero (the message says which).
  """
  if not isinstance(expression, str):
    raise ToolError(f"the expression must be text; got {expression!r}")
  text = expression.strip()
  if not text:
    raise ToolError("the expression is empty")
  if len(text) > max_length:
    raise ToolError(f"the expression is longer than {max_length} characters")
  try:
    tree = ast.parse(text, mode="eval")
  except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
    reason = getattr(e, "msg", None) or type(e).__name__
    raise ToolError(f"not an arithmetic expression ({reason})") from None
  if _depth(tree.body) > max_depth:
    raise ToolError(f"the expression is nested deeper than {max_depth}")
  evaluator = _Evaluator(text, max_digits)
  return evaluator.value(tree.body)


def format_number(value: Fraction, precision: int = PRECISION) -> str:
  """A Fraction as text: an int, else a decimal rounded to `precision` places.

  Integers are exact ("408", any length); other values are rounded half to
  even to `precision` decimal places with trailing zeros dropped ("0.5",
  "0.333333333333" for 1/3 at 12 places), so a terminating decimal that
  fits is exact.

  Args:
    value: the number.
    precision: decimal places kept.

  Returns:
    The text.
  """
  if value.denominator == 1:
    return str(value.numerator)
  scaled = round(value * 10**precision)  # Fraction rounding: half to even
  sign = "-" if scaled < 0 else ""
  whole, frac = divmod(abs(scaled), 10**precision)
  digits = str(frac).rjust(precision, "0").rstrip("0")
  if not digits:
    return f"{sign}{whole}" if whole else "0"
  return f"{sign}{whole}.{digits}"


def calculator(expression: str) -> str:
  """Evaluate an arithmetic expression exactly.

  Supports + - * / // % ** and parentheses over integers and decimals.

  Args:
    expression: the expression, e.g. "12345 * 6789" or "(3 + 4.5) / 7".
  """
  return format_number(calculate(expression))


def calculator_tool(
  *,
  name: str = "calculator",
  precision: int = PRECISION,
  max_digits: int = MAX_DIGITS,
) -> Tool:
  """The calculator as a `Tool`, with its precision and size bound.

  Args:
    name: the tool's name (e.g. "calc" for the compact tag format).
    precision: decimal places of results that are not integers.
    max_digits: most decimal digits of any intermediate value.

  Returns:
    A Tool taking one string argument, "expression".

  Raises:
    ValueError: precision is negative or max_digits not positive.
  """
  if (
    isinstance(precision, bool)
    or not isinstance(precision, int)
    or precision < 0
  ):
    raise ValueError(
      f"calculator_tool precision must be an int >= 0; got {precision!r}."
    )
  if (
    isinstance(max_digits, bool)
    or not isinstance(max_digits, int)
    or max_digits < 1
  ):
    raise ValueError(
      f"calculator_tool max_digits must be a positive int; got {max_digits!r}."
    )

  def fn(expression: str) -> str:
    value = calculate(expression, max_digits=max_digits)
    return format_number(value, precision)

  schema = Tool.from_function(calculator, name=name).schema
  return Tool(fn, schema)


def _depth(node: ast.AST) -> int:
  """The depth of an expression tree (iterative: deep trees are refused)."""
  deepest, stack = 0, [(node, 1)]
  while stack:
    node, depth = stack.pop()
    deepest = max(deepest, depth)
    stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
  return deepest


class _Evaluator:
  """Walks an admitted expression tree with exact, bounded arithmetic."""

  def __init__(self, text: str, max_digits: int):
    self.text = text
    self.max_digits = max_digits
    self.limit = 10**max_digits
    # Bits above which a number surely has more than max_digits digits.
    self.max_bits = math.ceil(max_digits * math.log2(10)) + 1

  def value(self, node: ast.AST) -> Fraction:
    """The value of a node, or ToolError."""
    if isinstance(node, ast.Constant):
      return self.bounded(self.literal(node))
    if isinstance(node, ast.UnaryOp) and isinstance(
      node.op, (ast.UAdd, ast.USub)
    ):
      operand = self.value(node.operand)
      return operand if isinstance(node.op, ast.UAdd) else -operand
    if isinstance(node, ast.BinOp) and type(node.op) in (*_BINARY, ast.Pow):
      left, right = self.value(node.left), self.value(node.right)
      if isinstance(node.op, ast.Pow):
        return self.bounded(self.power(left, right))
      if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
        raise ToolError("division by zero")
      return self.bounded(_BINARY[type(node.op)](left, right))
    what = type(getattr(node, "op", node))
    hint = _HINTS.get(what, f"{what.__name__} is not allowed")
    raise ToolError(
      f"only numbers, + - * / // % ** and parentheses are allowed ({hint})"
    )

  def literal(self, node: ast.Constant) -> Fraction:
    """An int literal, or a decimal literal exactly as written."""
    if type(node.value) is int:
      return Fraction(node.value)
    if type(node.value) is float:
      source = ast.get_source_segment(self.text, node) or repr(node.value)
      try:
        return Fraction(source.replace("_", ""))
      except (ValueError, ZeroDivisionError):
        raise ToolError(f"the number {source} is not allowed") from None
    raise ToolError(
      f"only numbers are allowed, not {type(node.value).__name__} literals"
    )

  def power(self, base: Fraction, exponent: Fraction) -> Fraction:
    """base ** exponent for an integer exponent, refused before it is huge."""
    if exponent.denominator != 1:
      raise ToolError("exponents must be integers")
    n = exponent.numerator
    if base == 0 and n < 0:
      raise ToolError("division by zero (0 to a negative power)")
    if base in (0, 1, -1) or n == 0:
      return base ** abs(n)  # 0 ** 0 == 1, as Python; (-1) ** n is +-1
    # |p| ** |n| has more than (bits(p) - 1) * |n| bits; refuse early.
    bits = max(base.numerator.bit_length(), base.denominator.bit_length())
    if (bits - 1) * abs(n) > self.max_bits:
      raise ToolError(
        f"the power is too large (more than {self.max_digits} digits)"
      )
    return base**n

  def bounded(self, value: Fraction) -> Fraction:
    """value, unless a numerator or denominator exceeds max_digits digits."""
    if abs(value.numerator) >= self.limit or value.denominator >= self.limit:
      raise ToolError(
        f"the result is too large (more than {self.max_digits} digits)"
      )
    return value
