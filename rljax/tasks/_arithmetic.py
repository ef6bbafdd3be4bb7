"""Built-in arithmetic task ("23+45=" -> "68"); no extra dependency.

Example i of a split is a pure function of (seed, split, i): the problem
space (every (a, op, b)) is put in a keyed pseudo-random order; the first
`test_size` problems of that order are the test split and the rest the
train pool, so the splits never share a problem and nothing is materialised.
"""

from collections.abc import Mapping, Sequence
import dataclasses
import hashlib
import operator
from typing import Any

from rljax import rewards
from rljax._src import checks
from rljax.tasks._base import Task

# Every character of a bare prompt ("23*45=") and of its answer ("-22").
ARITHMETIC_ALPHABET = "0123456789+-*="
OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
PROMPT_STYLES = ("bare", "question")
_MASK64 = (1 << 64) - 1


def arithmetic(
  *,
  digits: int = 2,
  operations: Sequence[str] = ("+",),
  train_size: int = 10_000,
  test_size: int | None = None,
  seed: int = 0,
  prompt_style: str = "bare",
  extract: str | None = None,
) -> Task:
  """Integer arithmetic a op b with operands in [0, 10**digits).

  Prompts: "bare" gives "23+45=" (for tiny models trained from scratch with
  a character vocabulary, `ARITHMETIC_ALPHABET`), "question" gives "What is
  23 + 45? Put the final answer after ####." (for instruct models). The
  answer is str(a op b), e.g. "68" (negative for "-"). The reward "correct"
  is `rewards.exact_answer` on the whole completion ("bare") or on the text
  after "####" ("question"), weight 1.

  Test problems are distinct. Train example i walks the remaining problems
  in an order reshuffled every pass (i // pool size), so `train_size` may
  exceed the pool.

  Args:
    digits: operand digits; operands are uniform in [0, 10**digits).
    operations: a subset of "+", "-", "*".
    train_size: length of the train dataset.
    test_size: number of held-out problems, < the number of problems
      len(operations) * 100**digits; default min(500, a fifth of them).
    seed: selects the split and the order; same seed, same examples.
    prompt_style: "bare" or "question".
    extract: how the reward reads the answer (`rewards.exact_answer`
      modes); None: "full" for "bare", "hash" for "question". Small
      instruct models rarely write "####": "last_number" suits them.

  Returns:
    A `Task` named "arithmetic"; examples are {"question", "answer", "a",
    "op", "b", "split", "index"}.
  """
  operations = _check(digits, operations, train_size, seed, prompt_style)
  num_problems = len(operations) * 100**digits
  if test_size is None:
    test_size = min(500, num_problems // 5)
  if not isinstance(test_size, int) or not 0 < test_size < num_problems:
    raise ValueError(
      f"test_size must be in [1, {num_problems}) ({len(operations)}"
      f" operation(s) on {digits}-digit operands give {num_problems}"
      f" problems); got {test_size!r}."
    )
  import grain

  key = _key("arithmetic", seed, digits, operations)
  splits = {
    split: grain.MapDataset.range(size).map(
      _Example(digits, operations, test_size, key, split, prompt_style)
    )
    for split, size in (("train", train_size), ("test", test_size))
  }
  bare = prompt_style == "bare"
  if extract is None:
    extract = "full" if bare else "hash"
  correct = rewards.exact_answer(extract=extract)
  return Task(
    name="arithmetic",
    train=splits["train"],
    test=splits["test"],
    rewards=(("correct", correct, 1.0),),
    format_prompt=_bare_prompt if bare else _question_prompt,
    alphabet=ARITHMETIC_ALPHABET if bare else None,
  )


def _check(digits, operations, train_size, seed, prompt_style) -> tuple:
  """Validate the arguments of `arithmetic`; the operations as a tuple."""
  operations = tuple(operations)  # a str such as "+-" lists one op per char
  unknown = [op for op in operations if op not in OPERATIONS]
  if not operations or unknown or len(set(operations)) != len(operations):
    raise ValueError(
      "operations must be distinct entries of"
      f" {list(OPERATIONS)}; got {operations!r}."
    )
  for name, value in (("digits", digits), ("train_size", train_size)):
    if not isinstance(value, int) or value <= 0:
      raise ValueError(f"{name} must be a positive int; got {value!r}.")
  checks.non_negative(seed=seed)
  checks.one_of("prompt_style", prompt_style, PROMPT_STYLES)
  return operations


def _bare_prompt(example: Mapping[str, Any]) -> str:
  """The bare prompt: the question and "=", e.g. "23+45="."""
  return example["question"] + "="


def _question_prompt(example: Mapping[str, Any]) -> str:
  """The question and the instruction to answer after "####"."""
  return example["question"] + " Put the final answer after ####."


@dataclasses.dataclass(frozen=True)
class _Example:
  """index -> example dict of one split (a picklable grain map function)."""

  digits: int
  operations: tuple[str, ...]
  test_size: int
  key: int
  split: str
  prompt_style: str

  def __call__(self, index: int) -> dict[str, Any]:
    index = int(index)
    n = 10**self.digits
    num_problems = len(self.operations) * n * n
    problem = _permute(self._position(index), num_problems, self.key)
    op_index, ab = divmod(problem, n * n)
    (a, b), op = divmod(ab, n), self.operations[op_index]
    bare = self.prompt_style == "bare"
    return {
      "question": f"{a}{op}{b}" if bare else f"What is {a} {op} {b}?",
      "answer": str(OPERATIONS[op](a, b)),
      "a": a,
      "op": op,
      "b": b,
      "split": self.split,
      "index": index,
    }

  def _position(self, index: int) -> int:
    """Rank of the example's problem in the keyed order of all problems."""
    if self.split == "test":
      return index
    pool = len(self.operations) * 100**self.digits - self.test_size
    epoch, i = divmod(index, pool)
    return self.test_size + _permute(i, pool, _mix64(self.key ^ epoch))


def _key(*parts: Any) -> int:
  """A 64-bit key from hashable parts, the same in every process."""
  digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little")


def _mix64(x: int) -> int:
  """SplitMix64's finaliser: a bijective 64-bit hash."""
  x = (x + 0x9E3779B97F4A7C15) & _MASK64
  x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
  x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
  return x ^ (x >> 31)


def _permute(x: int, n: int, key: int) -> int:
  """A keyed bijection of range(n) (4-round Feistel net, cycle walking)."""
  half = max(1, ((n - 1).bit_length() + 1) // 2)
  mask = (1 << half) - 1
  while True:
    left, right = x >> half, x & mask
    for r in range(4):
      round_key = _mix64(key + r)
      left, right = right, left ^ (_mix64(right ^ round_key) & mask)
    x = (left << half) | right
    if x < n:
      return x
