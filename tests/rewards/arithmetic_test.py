"""evaluate_arithmetic: exact values, and refusal of everything else."""

import faulthandler
from fractions import Fraction

import pytest

from rljax import rewards


@pytest.mark.parametrize(
  "text, value",
  [
    ("1 + 2", 3),
    ("(25 + 75) * 3 / 2", 150),
    ("1/3 + 1/6", Fraction(1, 2)),
    ("0.1 + 0.2", Fraction(3, 10)),  # exact decimals, not binary floats
    ("-(-4)", 4),
    ("+-5", -5),
    (" 2*(3+4) ", 14),
    ("1e3 - 1", 999),
    ("0x10 + 0b1 + 0o7", 24),
    ("1_000", 1000),
    ("(" * 150 + "7" + ")" * 150, 7),
    ("1 + 2 # a comment", 3),
    ("2*2*2", 8),
  ],
)
def test_values(text, value):
  assert rewards.evaluate_arithmetic(text) == value


@pytest.mark.parametrize(
  "text",
  [
    "",
    "   ",
    "x + 1",
    "pi",
    "2 ** 10",
    "2 ^ 10",
    "7 // 2",
    "7 % 2",
    "5!",
    "2(3)",
    "2 3",
    "1 = 1",
    "1 < 2",
    "True + 1",
    "1j",
    "'1'",
    "1 / 0",
    "0 / 0",
    "1e400",
    "__import__('os').system('touch pwned')",
    "exec('1')",
    "(lambda: 1)()",
    "().__class__",
    "[1, 2]",
    "1 if 1 else 2",
    "9" * 400,  # more than 1024 bits
    "9" * 200 + " * " + "9" * 200,
    "1" + "+1" * 200,  # deeper than 100
    "-" * 500 + "1",
    "(" * 300 + "1" + ")" * 300,  # Python's own nesting limit
    "1 " * 600,  # longer than 1000 characters
    "1\x00+2",
    "\ud800",
    "６８",
    "\u202e68",
  ],
)
def test_refused(text):
  assert rewards.evaluate_arithmetic(text) is None


def test_bounds_are_keywords():
  assert rewards.evaluate_arithmetic("9" * 400, max_bits=2000) == int("9" * 400)
  assert rewards.evaluate_arithmetic("1+1+1", max_depth=2) is None
  assert rewards.evaluate_arithmetic("1 + 2", max_length=4) is None


def test_huge_inputs_are_refused_without_evaluating_them():
  # Each would take minutes or gigabytes if it were evaluated. Hang guard:
  # the process dies with a traceback if this does not return.
  faulthandler.dump_traceback_later(300, exit=True)
  try:
    for text in ("9**9**9**9", "1e999999999", "9" * 1_000_000, "(" * 10**5):
      assert rewards.evaluate_arithmetic(text) is None
  finally:
    faulthandler.cancel_dump_traceback_later()


def test_never_calls_eval(monkeypatch):
  import builtins

  def refuse(*args, **kwargs):
    raise AssertionError("eval called")

  monkeypatch.setattr(builtins, "eval", refuse)
  monkeypatch.setattr(builtins, "exec", refuse)
  assert rewards.evaluate_arithmetic("(1 + 2) * 3") == 9
  assert rewards.evaluate_arithmetic("__import__('os')") is None
