"""Answer rewards: extract the final answer from a completion and check it."""

from collections.abc import Mapping
from fractions import Fraction
import re
import threading
from typing import Any

import numpy as np

from rljax import sandbox
from rljax._src import checks
from rljax.rewards._base import RewardFn
from rljax.rewards._base import RewardResult
from rljax.rewards._base import Samples

EXTRACT_MODES = ("last_number", "boxed", "hash", "answer_tag", "full")

# A sign counts only where it cannot be a binary operator ("10-3" ends in 3,
# "x = -3" in -3). Thousands groups must be whole ("1,2345" is not 12,345).
_NUMBER = re.compile(
  r"(?:(?<![\w)\]])[-+])?"
  r"(?:\d{1,3}(?:,\d{3})+(?![\d])(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
)
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_EXPONENT = re.compile(r"[eE][-+]?([\d_]+)")
_OPEN_TAG, _CLOSE_TAG = "<answer>", "</answer>"
_BOXED = "\\boxed{"
# `Fraction("1e999999999")` builds a billion-digit integer: numbers longer
# than this, or with a larger exponent, are compared as strings instead.
MAX_NUMBER_CHARS = 1000
MAX_EXPONENT = 10_000


def extract_answer(text: str, *, mode: str = "last_number") -> str | None:
  """The final answer in a completion, or None when there is none.

  Modes:
    "last_number": the last number ("1,234", "-5", "0.5", ".5"; a "-" right
      after a digit, letter or bracket is an operator, not a sign).
    "boxed": the contents of the last \\boxed{...}, nested braces included.
    "hash": the first line of the text after the last "####" (GSM8K).
    "answer_tag": the contents of the last <answer>...</answer>.
    "full": the whole text.
  Answers are stripped of surrounding whitespace; an empty one is None.

  Args:
    text: a decoded completion.
    mode: one of the modes above.

  Returns:
    The answer string, or None.
  """
  checks.one_of("mode", mode, EXTRACT_MODES)
  if mode == "last_number":
    found = _NUMBER.findall(text)
    answer = found[-1] if found else None
  elif mode == "boxed":
    answer = _last_boxed(text)
  elif mode == "hash":
    start = text.rfind("####")
    answer = None if start < 0 else text[start + 4 :].strip().split("\n")[0]
  elif mode == "answer_tag":
    answer = _last_tagged(text)
  else:
    answer = text
  answer = None if answer is None else answer.strip()
  return answer or None


def _last_tagged(text: str) -> str | None:
  """The last of re.findall("<answer>(.*?)</answer>", text, DOTALL), O(n).

  The regex is quadratic on a text of many unclosed "<answer>" tags; this
  walks the same non-overlapping matches with str.find.
  """
  answer, position = None, 0
  while True:
    start = text.find(_OPEN_TAG, position)
    if start < 0:
      return answer
    end = text.find(_CLOSE_TAG, start + len(_OPEN_TAG))
    if end < 0:
      return answer
    answer = text[start + len(_OPEN_TAG) : end]
    position = end + len(_CLOSE_TAG)


def _last_boxed(text: str) -> str | None:
  """Contents of the last \\boxed{...}, matching nested braces."""
  start = text.rfind(_BOXED)
  if start < 0:
    return None
  begin, depth = start + len(_BOXED), 0
  for i in range(begin, len(text)):
    if text[i] == "{":
      depth += 1
    elif text[i] == "}":
      if depth == 0:
        return text[begin:i]
      depth -= 1
  return None


def _as_number(text: str) -> Fraction | None:
  """Exact value of a number string ("1,234", "+68", "0.5", "1/2") or None.

  None too for texts over `MAX_NUMBER_CHARS` characters or with an exponent
  beyond `MAX_EXPONENT` (which `Fraction` would expand into a huge integer).
  """
  text = text.strip()
  if len(text) > MAX_NUMBER_CHARS:
    return None
  for exponent in _EXPONENT.findall(text):
    if int(exponent.replace("_", "") or "0") > MAX_EXPONENT:
      return None
  if _THOUSANDS.fullmatch(text):
    text = text.replace(",", "")
  try:
    return Fraction(text)
  except (ValueError, ZeroDivisionError):
    return None


def _answers_match(answer: str, gold: str, tolerance: float) -> bool:
  """|a - g| <= tolerance if both are numbers, else stripped equality."""
  a, g = _as_number(answer), _as_number(gold)
  if a is not None and g is not None:
    return abs(a - g) <= Fraction(tolerance)
  return answer.strip() == gold.strip()


def exact_answer(
  *, extract: str = "last_number", key: str = "answer", tolerance: float = 0.0
) -> RewardFn:
  """Reward 1.0 when the extracted answer equals the gold answer, else 0.0.

  r = 1[|extract(text) - metadata[key]| <= tolerance] when both parse as
  numbers ("68", "68.0", "+68", " 68 ", "1,234", "1/2"; exact rationals, no
  float rounding), stripped string equality otherwise; parsed =
  extract(text) is not None. Numbers longer than 1000 characters or with an
  exponent beyond 1e10000 (which would take hours to expand) count as
  strings. Linear time in the completion's length.

  Args:
    extract: how to find the answer (`extract_answer` modes), default
      "last_number" (the usual GSM8K-style rule-based reward).
    key: the metadata entry that holds the gold answer, default "answer".
    tolerance: absolute tolerance for numeric answers, default 0 (exact).

  Returns:
    A reward function `fn(samples) -> RewardResult`.

  References:
    DeepSeek-R1 rule-based accuracy reward, arXiv 2501.12948; Cobbe et al.
    GSM8K "####" answers, arXiv 2110.14168.
  """
  checks.one_of("extract", extract, EXTRACT_MODES)
  checks.non_negative(tolerance=tolerance)

  def reward(samples: Samples) -> RewardResult:
    answers = [extract_answer(t, mode=extract) for t in samples.texts]
    golds = [_gold_answer(m, key) for m in samples.metadata]
    values = [
      a is not None and _answers_match(a, g, tolerance)
      for a, g in zip(answers, golds)
    ]
    parsed = [a is not None for a in answers]
    return RewardResult(np.asarray(values, np.float32), np.asarray(parsed))

  return reward


def _gold_answer(metadata: Mapping[str, Any], key: str) -> str:
  """metadata[key] as a string, with an error that names the key."""
  if key not in metadata:
    raise ValueError(
      f"the sample metadata has no gold answer under key={key!r}; its keys"
      f" are {sorted(metadata)}. Pass the right key to the reward factory."
    )
  return str(metadata[key])


def math_answer(*, key: str = "answer", timeout_seconds: int = 5) -> RewardFn:
  """Reward 1.0 when math-verify finds the completion equal to the gold.

  r = verify(parse(gold), parse(text)); parsed = parse(text) is not empty.
  A gold answer without \\boxed{} is wrapped in one, since math-verify reads
  bare LaTeX golds such as "\\frac12" as nothing. Errors and time-outs on a
  completion give r = 0 (parsed False on parse errors), never an exception;
  a gold answer that math-verify cannot parse raises ValueError, because
  that prompt could never be rewarded.

  math-verify's time limits use SIGALRM, which only works in the main
  thread: there it runs in this process with `timeout_seconds` per parse
  and per verify. Called from any other thread (where a hostile answer
  such as "\\boxed{2^{2^{40}}}" would run for ever holding the GIL), each
  completion is parsed and verified in a `rljax.sandbox.Sandbox` worker,
  started then, killed after 2 * timeout_seconds + 2 s (a time-out scores
  0, unparsed). Only digits, spaces and + - * / ^ ( ) reach math-verify's
  `sympy.parse_expr` (its expression regex), so no answer can run code.

  Args:
    key: the metadata entry that holds the gold answer, default "answer".
    timeout_seconds: math-verify's time limit per parse and per verify
      (its default, 5).

  Returns:
    A reward function `fn(samples) -> RewardResult`.

  References:
    Hugging Face `math-verify` (used by TRL and open-r1 accuracy rewards).
  """
  if not isinstance(timeout_seconds, int) or timeout_seconds <= 0:
    raise ValueError(
      "timeout_seconds must be a positive int (math-verify uses"
      f" signal.alarm); got {timeout_seconds!r}."
    )
  import math_verify  # noqa: F401  (fail now, not at the first rollout)

  box = sandbox.Sandbox(
    timeout=2 * timeout_seconds + 2, preload=("math_verify", __name__)
  )

  def reward(samples: Samples) -> RewardResult:
    in_main = threading.current_thread() is threading.main_thread()
    timeout = timeout_seconds if in_main else None
    golds: dict[str, list[Any]] = {}
    for metadata in samples.metadata:
      gold = _gold_answer(metadata, key)
      if gold not in golds:  # trusted text: checked here, in any thread
        golds[gold] = _parse_gold(gold, timeout)
    pairs = zip(samples.texts, samples.metadata)
    if in_main:
      results = [
        _math_verify(text, golds[_gold_answer(m, key)], timeout)
        for text, m in pairs
      ]
    else:
      calls = [(t, _gold_answer(m, key), timeout_seconds) for t, m in pairs]
      outcomes = box.map(_math_verify_in_worker, calls)
      results = [
        _checked_pair(o.value) if o.ok else (False, False) for o in outcomes
      ]
    values = [correct for _, correct in results]
    parsed = [is_parsed for is_parsed, _ in results]
    return RewardResult(np.asarray(values, np.float32), np.asarray(parsed))

  return reward


def _math_verify(
  text: str, gold: list[Any], timeout: int | None
) -> tuple[bool, bool]:
  """(parsed, correct) of one completion against a parsed gold."""
  pred = _parse(text, timeout)
  return bool(pred), bool(pred) and _verify(gold, pred, timeout)


def _checked_pair(value: Any) -> tuple[bool, bool]:
  """A worker's (parsed, correct), or (False, False) if it is anything else."""
  if isinstance(value, tuple) and len(value) == 2:
    if all(isinstance(v, bool) for v in value):
      return value
  return False, False


def _math_verify_in_worker(
  text: str, gold: str, timeout: int
) -> tuple[bool, bool]:
  """`_math_verify` in the sandbox worker (its main thread: SIGALRM works)."""
  boxed = gold if _BOXED in gold else _BOXED + gold + "}"
  return _math_verify(text, _parse(boxed, timeout), timeout)


def _parse_gold(gold: str, timeout: int | None) -> list[Any]:
  """math-verify's parse of a gold answer (boxed first); raises if empty."""
  boxed = gold if _BOXED in gold else _BOXED + gold + "}"
  parsed = _parse(boxed, timeout)
  if not parsed:
    raise ValueError(
      f"math_verify cannot parse the gold answer {gold!r} (as {boxed!r}); fix"
      " the dataset's answer or use exact_answer for this task."
    )
  return parsed


def _parse(text: str, timeout: int | None) -> list[Any]:
  """math_verify.parse that returns [] on any error or time-out."""
  import math_verify
  from math_verify.errors import TimeoutException

  try:
    return math_verify.parse(text, parsing_timeout=timeout)
  except (Exception, TimeoutException):
    return []


def _verify(gold: list[Any], pred: list[Any], timeout: int | None) -> bool:
  """math_verify.verify that returns False on any error or time-out."""
  import math_verify
  from math_verify.errors import TimeoutException

  try:
    return bool(math_verify.verify(gold, pred, timeout_seconds=timeout))
  except (Exception, TimeoutException):
    return False
