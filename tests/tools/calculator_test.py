"""The calculator: exact values against Python's arithmetic, bounds, errors."""

import decimal
from fractions import Fraction
import random
import time

import pytest

from rljax import tools


def _random_expression(rng, depth):
  """(text, exact value) of a random fully parenthesised expression."""
  if depth == 0 or rng.random() < 0.3:
    if rng.random() < 0.7:
      n = rng.randint(-(10**6), 10**6)
      return str(n), Fraction(n)
    whole, frac = rng.randint(0, 999), rng.randint(0, 999)
    text = f"{whole}.{frac:03d}"
    return text, Fraction(whole) + Fraction(frac, 1000)
  (a, x), (b, y) = (_random_expression(rng, depth - 1) for _ in range(2))
  op = rng.choice(["+", "-", "*", "/", "//", "%", "**"])
  if op in ("/", "//", "%") and y == 0:
    op = "+"
  if op == "**":
    n = rng.randint(-3, 3)
    if x == 0 and n < 0:
      n = 2
    return f"({a})**{n}" if n >= 0 else f"({a})**({n})", x**n
  value = {
    "+": lambda: x + y,
    "-": lambda: x - y,
    "*": lambda: x * y,
    "/": lambda: x / y,
    "//": lambda: Fraction(x // y),
    "%": lambda: x % y,
  }[op]()
  return f"({a}) {op} ({b})", value


def _reference_text(value, precision):
  """A Fraction rounded half-even to `precision` places, via decimal."""
  with decimal.localcontext() as context:
    context.prec = 4000
    exact = decimal.Decimal(value.numerator) / decimal.Decimal(
      value.denominator
    )
    rounded = exact.quantize(
      decimal.Decimal(1).scaleb(-precision), rounding=decimal.ROUND_HALF_EVEN
    )
  text = format(rounded, "f")
  if "." in text:
    text = text.rstrip("0").rstrip(".")
  return "0" if text in ("-0", "") else text


def test_random_expressions_match_exact_python_arithmetic():
  rng = random.Random(0)
  for _ in range(400):
    text, value = _random_expression(rng, depth=4)
    try:
      got = tools.calculate(text)
    except tools.ToolError as e:
      assert "too large" in str(e), (text, e)  # > 1000 digits: refused
      continue
    assert got == value, text
    assert tools.format_number(got, 12) == _reference_text(value, 12), text
    assert tools.calculator(text) == _reference_text(value, 12), text


@pytest.mark.parametrize(
  "expression, expected",
  [
    ("12*34", "408"),
    ("2+3*4**2", "50"),  # precedence: 4**2 first, then *, then +
    ("-2**2", "-4"),  # unary minus binds looser than **, as in Python
    ("2**3**2", "512"),  # ** is right-associative: 2**9
    ("2**-2", "0.25"),
    ("7//2*2", "6"),
    ("-7//2", "-4"),  # floor division rounds down
    ("-7 % 3", "2"),  # modulo takes the divisor's sign
    ("7 % -3", "-2"),
    ("0.1 + 0.2", "0.3"),  # decimals are exact, not floats
    ("1.5e3 / 4", "375"),
    ("1_000 * 3", "3000"),
    ("1/3", "0.333333333333"),
    ("2/3", "0.666666666667"),  # half-even rounding at 12 places
    ("-1/8", "-0.125"),
    ("10**-13", "0"),  # below the 12 decimal places shown
    ("(10**20 + 1) - 10**20", "1"),
    (
      "99999999999999999999 * 99999999999999999999",
      str(99999999999999999999**2),
    ),
    ("123456789**5", str(123456789**5)),
    ("0**0", "1"),
    ("(-1)**(10**50)", "1"),  # huge exponent of -1 is cheap and exact
  ],
)
def test_values(expression, expected):
  assert tools.calculator(expression) == expected


def test_hand_worked_case():
  # 2**64 + 1 = 18446744073709551617 = 3 * 6148914691236517205 + 2, so the
  # quotient is 6148914691236517205 + 2/3 = ...205.666666666666|666...;
  # rounded at 12 places: 6148914691236517205.666666666667.
  assert tools.calculate("(2**64 + 1) / 3") == Fraction(2**64 + 1, 3)
  assert tools.calculator("(2**64 + 1) / 3") == (
    "6148914691236517205.666666666667"
  )
  assert tools.format_number(Fraction(2**64 + 1, 3), 2) == (
    "6148914691236517205.67"
  )


@pytest.mark.parametrize(
  "expression, error",
  [
    ("1/0", "division by zero"),
    ("5 // (2 - 2)", "division by zero"),
    ("5 % 0", "division by zero"),
    ("0**-1", "division by zero"),
    ("2**0.5", "exponents must be integers"),
    ("2^3", "use ** for powers"),
    ("pi * 2", "names are not allowed"),
    ("abs(-2)", "not allowed"),
    ("'a' * 3", "only numbers are allowed"),
    ("True + 1", "only numbers are allowed"),
    ("1 < 2", "Compare is not allowed"),
    ("12*", "not an arithmetic expression"),
    ("", "the expression is empty"),
    ("1+" * 600 + "1", "longer than 1000 characters"),
    ("-" * 200 + "1", "nested deeper than 100"),
    ("10**1000", "too large (more than 1000 digits)"),
    ("10**999 * 10", "too large"),
    ("1 / 10**999 / 10", "too large"),
    ("9**9**9", "the power is too large"),
    ("2**(2**2**2**2**2)", "the power is too large"),
    ("(10**500)**(10**500)", "the power is too large"),
  ],
)
def test_errors(expression, error):
  with pytest.raises(tools.ToolError) as info:
    tools.calculate(expression)
  assert error in str(info.value)


def test_huge_powers_are_refused_quickly():
  start = time.monotonic()
  for expression in ["9**9**9", "10**10**10", "(3/7)**-99999999", "7**(9**9)"]:
    with pytest.raises(tools.ToolError, match="too large"):
      tools.calculate(expression)
  assert time.monotonic() - start < 0.5


def test_as_a_tool():
  box = tools.Toolbox([tools.calculator_tool(name="calc", precision=3)])
  schema = box.schemas()[0]["function"]
  assert schema["name"] == "calc"
  assert schema["parameters"]["required"] == ["expression"]
  assert box.execute(tools.ToolCall("calc", "1/7")).text == "0.143"
  result = box.execute(tools.ToolCall("calc", {"expression": "9**9**9"}))
  assert not result.ok
  assert result.text == "Error: the power is too large (more than 1000 digits)"
  with pytest.raises(ValueError, match="precision"):
    tools.calculator_tool(precision=-1)
  with pytest.raises(ValueError, match="max_digits"):
    tools.calculator_tool(max_digits=0)
