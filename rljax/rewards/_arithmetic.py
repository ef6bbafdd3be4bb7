"""A safe evaluator of arithmetic expressions (no eval, no sympy)."""

import ast
from fractions import Fraction
import re

MAX_LENGTH = 1000
MAX_DEPTH = 100
MAX_BITS = 1024

# Characters an expression may hold: digits, the letters of Python number
# literals (1e5, 0x1F, 0o7, 0b1), "_", ".", + - * / ( ), whitespace; or a
# "#" comment to the end of the line. Everything else is refused before
# Python's parser sees it (no names, strings, calls or attributes).
_ALLOWED = re.compile(r"(?:[0-9a-fA-FoOxX_.+\-*/()\s]|#[^\n]*)*")
_OPERATORS = {ast.Add, ast.Sub, ast.Mult, ast.Div}

# Results that are not numbers, as sympy names them: x/0 for x != 0 is
# complex infinity, 0/0 and inf - inf are NaN.
ZOO = "zoo"
NAN = "nan"


def evaluate_arithmetic(
  text: str,
  *,
  max_length: int = MAX_LENGTH,
  max_depth: int = MAX_DEPTH,
  max_bits: int = MAX_BITS,
) -> Fraction | None:
  """The exact value of an arithmetic expression, or None.

  The grammar is Python's, restricted to numeric literals (int, float,
  "1e3", "0x1F"; not bool or complex), binary + - * /, unary + and -,
  parentheses and comments. The text is parsed with `ast` (which never
  executes it) and walked; nothing else is admitted: no names ("pi", "x"),
  calls, "**", "^", "//", "%", "!", implicit multiplication ("2(3)", "2 3")
  or "=". Arithmetic is exact (`Fraction`; a float literal counts as its
  shortest decimal, "0.1" as 1/10). Bounded: at most `max_length`
  characters, `max_depth` nested operations, `max_bits` bits in every
  intermediate numerator and denominator.

  Args:
    text: untrusted text, e.g. "(25 + 75) * 3 / 2".
    max_length: longest text evaluated (after stripping whitespace).
    max_depth: deepest expression tree evaluated.
    max_bits: largest numerator or denominator, in bits.

  Returns:
    The value, or None when the text is not such an expression, exceeds a
    bound, or divides by zero.
  """
  value = evaluate_extended(
    text, max_length=max_length, max_depth=max_depth, max_bits=max_bits
  )
  return value if isinstance(value, Fraction) else None


def evaluate_extended(
  text: str,
  *,
  max_length: int = MAX_LENGTH,
  max_depth: int = MAX_DEPTH,
  max_bits: int = MAX_BITS,
) -> Fraction | str | None:
  """`evaluate_arithmetic`, with sympy's results for divisions by zero.

  Args:
    text: untrusted text.
    max_length: longest text evaluated.
    max_depth: deepest expression tree evaluated.
    max_bits: largest numerator or denominator, in bits.

  Returns:
    A Fraction; `ZOO` (x/0 for x != 0, as sympy) or `NAN` (0/0, zoo - zoo,
    zoo * 0); None when the text is not an expression or exceeds a bound.
  """
  if not isinstance(text, str):
    return None
  text = text.strip()
  if not text or len(text) > max_length or not _ALLOWED.fullmatch(text):
    return None
  try:
    tree = ast.parse(text, mode="eval")
  except (SyntaxError, ValueError, MemoryError, RecursionError):
    return None
  if not _shallow(tree.body, max_depth):
    return None
  try:
    return _value(tree.body, max_bits)
  except (_Rejected, RecursionError):
    return None


class _Rejected(Exception):
  """The expression is outside the grammar or a bound."""


def _shallow(node: ast.AST, max_depth: int) -> bool:
  """True when the tree is at most max_depth deep (iterative)."""
  stack = [(node, 1)]
  while stack:
    node, depth = stack.pop()
    if depth > max_depth:
      return False
    stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
  return True


def _value(node: ast.AST, max_bits: int) -> Fraction | str:
  """The value of an admitted node; raises _Rejected for anything else."""
  if isinstance(node, ast.Constant):
    return _bounded(_literal(node.value), max_bits)
  if isinstance(node, ast.UnaryOp) and isinstance(
    node.op, (ast.UAdd, ast.USub)
  ):
    operand = _value(node.operand, max_bits)
    if isinstance(node.op, ast.UAdd) or isinstance(operand, str):
      return operand  # -zoo is zoo, -nan is nan
    return -operand
  if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
    left = _value(node.left, max_bits)
    right = _value(node.right, max_bits)
    return _bounded(_apply(type(node.op), left, right), max_bits)
  raise _Rejected


def _literal(value: object) -> Fraction:
  """An int or float literal as an exact Fraction."""
  if type(value) is int:
    return Fraction(value)
  if type(value) is float:
    try:
      return Fraction(repr(value))  # "0.1" -> 1/10; inf and nan raise
    except (ValueError, OverflowError):
      raise _Rejected from None
  raise _Rejected  # bool, complex, str, bytes, None, ...


def _bounded(value: Fraction | str, max_bits: int) -> Fraction | str:
  """value, unless its numerator or denominator exceeds max_bits."""
  if isinstance(value, Fraction) and (
    value.numerator.bit_length() > max_bits
    or value.denominator.bit_length() > max_bits
  ):
    raise _Rejected
  return value


def _apply(op: type, a: Fraction | str, b: Fraction | str) -> Fraction | str:
  """a op b, with sympy's complex infinity and NaN for divisions by zero."""
  if NAN in (a, b):
    return NAN
  if op is ast.Div:
    if b == ZOO:
      return NAN if a == ZOO else Fraction(0)
    if b == 0:
      return NAN if a == 0 else ZOO
    return ZOO if a == ZOO else a / b
  if ZOO in (a, b):
    if op is ast.Mult:
      return NAN if 0 in (a, b) else ZOO
    return NAN if a == b else ZOO  # zoo +- zoo is nan, zoo +- x is zoo
  if op is ast.Add:
    return a + b
  if op is ast.Sub:
    return a - b
  return a * b
