"""reasoning-gym's countdown scoring rule, without sympy (no eval).

reasoning-gym's `CountdownDataset.score_answer` runs the answer through
`sympy.parse_expr`, which evaluates it as Python. This is the same rule on
`rewards.evaluate_arithmetic`'s safe grammar.
"""

from collections.abc import Mapping
from fractions import Fraction
import re
from typing import Any

from rljax._src.errors import UserError
from rljax.rewards import _arithmetic

MALFORMED = 0.01  # reasoning-gym's default: no expression
WRONG = 0.05  # an expression, but the wrong numbers or the wrong value
SOLVED = 1.0
_INTEGER = re.compile(r"\b\d+\b")  # reasoning-gym's `_extract_ints`


def countdown_score(answer: str | None, entry: Mapping[str, Any]) -> float:
  """reasoning-gym's countdown score of an answer, computed safely.

  0.01 for an empty answer or one that is not an expression of the safe
  grammar; 0.05 when the integers written in it are not the given numbers
  as a multiset, or its value is not the target; 1.0 when it is, within
  `numpy.isclose(value, target, atol=1e-6)` (so also rtol=1e-5, as
  reasoning-gym). As sympy: x/0 (complex infinity) scores 0.01, NaN
  results (0/0) 0.05.

  Where reasoning-gym's sympy would accept what the safe grammar refuses
  ("**", "^", "!", names such as "pi", implicit multiplication), the
  answer scores 0.01: it never reaches sympy, in this process or another.
  The task's instructions ask for + - * / only, so a solved answer is never
  among them.

  Args:
    answer: the extracted answer text (untrusted).
    entry: the example dict; entry["metadata"] holds "numbers" and "target".

  Returns:
    0.01, 0.05 or 1.0.

  Raises:
    UserError: the metadata lacks "numbers" or "target".
  """
  metadata = entry.get("metadata", {})
  if "numbers" not in metadata or "target" not in metadata:
    raise UserError(
      "countdown rewards need each sample's metadata['metadata'] to hold"
      f" 'numbers' and 'target'; got the keys {sorted(metadata)}."
    )
  if answer is None or not answer.strip():
    return MALFORMED
  value = _arithmetic.evaluate_extended(answer)
  if value is None or value == _arithmetic.ZOO:
    return MALFORMED
  used = sorted(int(m) for m in _INTEGER.findall(answer))
  if used != sorted(metadata["numbers"]):
    return WRONG
  if isinstance(value, Fraction) and _isclose(value, metadata["target"]):
    return SOLVED
  return WRONG


def _isclose(value: Fraction, target: Any) -> bool:
  """numpy.isclose(float(value), target, atol=1e-6) in float64."""
  try:
    a, b = float(value), float(target)
  except OverflowError:
    return False
  return abs(a - b) <= 1e-6 + 1e-5 * abs(b)
