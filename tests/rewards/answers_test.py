"""Answer extraction, exact_answer and math_answer on hand-written strings."""

import faulthandler
import random
import re
import threading

import numpy as np
import pytest

from rljax import rewards


def _samples(texts, golds, key="answer"):
  n = len(texts)
  return rewards.Samples(
    texts=list(texts),
    num_tokens=np.full((n,), 10),
    truncated=np.zeros((n,), bool),
    metadata=[{key: g} for g in golds],
  )


# ----------------------------------------------------------------------------
# extract_answer


@pytest.mark.parametrize(
  "text, expected",
  [
    ("The total is 1,234 apples.", "1,234"),
    ("1,234,567", "1,234,567"),
    ("first 3 then 17 and finally 42", "42"),
    ("It drops to -5 degrees", "-5"),
    ("x = -3.5", "-3.5"),
    ("10-3", "3"),  # a minus after a digit is an operator
    ("(-4)", "-4"),
    ("2+-3", "-3"),
    ("The answer is 68.", "68"),  # a sentence's full stop is not a decimal
    ("pi is about 3.14159", "3.14159"),
    ("half is .5", ".5"),
    ("1,2345", "2345"),  # not a thousands group
    ("values 1, 2, 3", "3"),
    ("no digits at all", None),
    ("", None),
  ],
)
def test_last_number(text, expected):
  assert rewards.extract_answer(text, mode="last_number") == expected


@pytest.mark.parametrize(
  "text, expected",
  [
    ("so \\boxed{42}.", "42"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{1} then \\boxed{ \\sqrt{\\frac{a}{b}} }", "\\sqrt{\\frac{a}{b}}"),
    ("\\boxed{\\frac{1}{2}", None),  # unbalanced
    ("\\boxed{}", None),
    ("no box 5", None),
  ],
)
def test_boxed(text, expected):
  assert rewards.extract_answer(text, mode="boxed") == expected


@pytest.mark.parametrize(
  "text, expected",
  [
    ("48/2 = 24\n#### 24", "24"),
    ("#### 1\nwait\n####  72 \nthat is all", "72"),
    ("####", None),
    ("no marker 5", None),
  ],
)
def test_hash(text, expected):
  assert rewards.extract_answer(text, mode="hash") == expected


@pytest.mark.parametrize(
  "text, expected",
  [
    ("<think>a</think><answer> 12 </answer>", "12"),
    ("<answer>1</answer> no, <answer>\n3 + 4\n</answer>", "3 + 4"),
    ("<answer></answer>", None),
    ("<answer>7", None),
  ],
)
def test_answer_tag(text, expected):
  assert rewards.extract_answer(text, mode="answer_tag") == expected


def test_answer_tag_matches_its_regex_in_linear_time():
  regex = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
  pieces = ["<answer>", "</answer>", "a", " ", "\n", "<", ">"]
  rng = random.Random(0)
  for _ in range(3000):
    text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 9)))
    found = regex.findall(text)
    expected = found[-1].strip() if found else None
    got = rewards.extract_answer(text, mode="answer_tag")
    assert got == (expected or None), text
  # The regex is quadratic here (hours for this text); hang guard: the
  # process dies with a traceback if this hangs.
  faulthandler.dump_traceback_later(300, exit=True)
  try:
    bomb = "<answer>" * 200_000
    assert rewards.extract_answer(bomb, mode="answer_tag") is None
    assert rewards.extract_answer(bomb + "1</answer>", mode="answer_tag") == (
      "<answer>" * 199_999 + "1"
    )
  finally:
    faulthandler.cancel_dump_traceback_later()


def test_full_and_bad_mode():
  assert rewards.extract_answer("  68 \n", mode="full") == "68"
  assert rewards.extract_answer(" \n ", mode="full") is None
  with pytest.raises(ValueError, match="mode"):
    rewards.extract_answer("1", mode="last")


# ----------------------------------------------------------------------------
# exact_answer


def test_exact_answer_numeric_equivalences():
  texts = ["68", "68.0", "+68", " 68 ", "0068", "67", "sixty-eight", ""]
  out = rewards.exact_answer(extract="full")(_samples(texts, ["68"] * 8))
  np.testing.assert_array_equal(out.values, [1, 1, 1, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(out.parsed, [1, 1, 1, 1, 1, 1, 1, 0])
  assert out.values.dtype == np.float32


def test_exact_answer_modes_and_commas():
  fn = rewards.exact_answer()  # last_number
  texts = ["so 1,234 in all", "1234", "I get 12 or 1,234.5", "none"]
  out = fn(_samples(texts, ["1234", "1,234", "1234.50", "1"]))
  np.testing.assert_array_equal(out.values, [1, 1, 1, 0])
  np.testing.assert_array_equal(out.parsed, [1, 1, 1, 0])
  hashed = rewards.exact_answer(extract="hash")
  out = hashed(_samples(["#### 24", "#### 24 apples", "24"], ["24"] * 3))
  np.testing.assert_array_equal(out.values, [1, 0, 0])
  np.testing.assert_array_equal(out.parsed, [1, 1, 0])


def test_exact_answer_string_compare_and_tolerance():
  fn = rewards.exact_answer(extract="answer_tag", key="label")
  texts = ["<answer> B </answer>", "<answer>b</answer>", "<answer>1/2</answer>"]
  out = fn(_samples(texts, ["B", "B", "0.5"], key="label"))
  np.testing.assert_array_equal(out.values, [1, 0, 1])  # 1/2 == 0.5 exactly
  tol = rewards.exact_answer(tolerance=0.01)
  out = tol(_samples(["3.141", "3.13"], ["3.14159", "3.14159"]))
  # |3.141 - 3.14159| = 0.00059 <= 0.01; |3.13 - 3.14159| = 0.01159 > 0.01
  np.testing.assert_array_equal(out.values, [1, 0])


def test_exact_answer_bounds_huge_exponents_and_lengths():
  # Fraction("1e999999999") builds a billion-digit integer (it hangs); such
  # answers are compared as strings. Hang guard as above.
  fn = rewards.exact_answer(extract="full")
  texts = [
    "1e999999999",
    "-1E-999999999",
    "1e1_000_000_000",
    "9" * 10**6,
    "1e3",
  ]
  golds = ["1", "0", "1", "9", "1000"]
  faulthandler.dump_traceback_later(300, exit=True)
  try:
    out = fn(_samples(texts, golds))
  finally:
    faulthandler.cancel_dump_traceback_later()
  np.testing.assert_array_equal(out.values, [0, 0, 0, 0, 1])
  same = fn(_samples(["1e999999999"], ["1e999999999"]))
  np.testing.assert_array_equal(same.values, [1])  # equal strings still match


def test_exact_answer_errors():
  with pytest.raises(ValueError, match="extract"):
    rewards.exact_answer(extract="first_number")
  with pytest.raises(ValueError, match="tolerance"):
    rewards.exact_answer(tolerance=-1.0)
  with pytest.raises(ValueError, match="key='answer'"):
    rewards.exact_answer()(_samples(["1"], ["1"], key="gold"))


# ----------------------------------------------------------------------------
# math_answer


def _math_cases():
  texts = [
    "so the answer is \\boxed{\\frac{1}{2}}",
    "\\boxed{\\frac{1}{2}}",
    "\\boxed{\\frac{1}{3}}",
    "garbage words with no maths",
    "}{ \\boxed{ ",
  ]
  golds = ["0.5", "1/2", "0.5", "0.5", "0.5"]
  return _samples(texts, golds)


def _check_math(out):
  np.testing.assert_array_equal(out.values, [1, 1, 0, 0, 0])
  np.testing.assert_array_equal(out.parsed, [1, 1, 1, 0, 0])
  assert out.values.dtype == np.float32


def test_math_answer_main_thread():
  _check_math(rewards.math_answer()(_math_cases()))


def test_math_answer_in_a_worker_thread():
  # math-verify's default SIGALRM time-out raises outside the main thread;
  # there the reward runs it in the sandbox, whose kill bounds a hostile
  # answer that would otherwise run for ever holding the GIL.
  fn, result, errors = rewards.math_answer(timeout_seconds=1), [], []
  bomb = _samples(["\\boxed{2^{2^{40}}}", "\\boxed{68}"], ["5", "68"])

  def work():
    try:
      result.append(fn(_math_cases()))
      result.append(fn(bomb))
    except BaseException as e:  # noqa: BLE001  (re-raised below)
      errors.append(e)

  faulthandler.dump_traceback_later(300, exit=True)
  try:
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
  finally:
    faulthandler.cancel_dump_traceback_later()
  assert not errors, errors
  _check_math(result[0])
  np.testing.assert_array_equal(result[1].values, [0, 1])
  np.testing.assert_array_equal(result[1].parsed, [1, 1])  # timed-out verify


def test_math_answer_latex_gold_gets_boxed():
  fn = rewards.math_answer(key="gold")
  out = fn(_samples(["it is 0.5", "it is 2"], ["\\frac12", "\\frac12"], "gold"))
  np.testing.assert_array_equal(out.values, [1, 0])


def test_math_answer_errors():
  with pytest.raises(ValueError, match="timeout_seconds"):
    rewards.math_answer(timeout_seconds=0.5)
  with pytest.raises(ValueError, match="gold answer"):
    rewards.math_answer()(_samples(["1"], ["}{"]))
