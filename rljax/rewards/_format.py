"""Shape rewards: the completion's format and its length in tokens."""

import re

import numpy as np

from rljax import shaping
from rljax.rewards._base import RewardFn
from rljax.rewards._base import RewardResult
from rljax.rewards._base import Samples

THINK_ANSWER = r"^<think>.*?</think>\s*<answer>.*?</answer>$"
_THINK_END = re.compile(r"</think>\s*<answer>")


def answer_format(*, pattern: str = THINK_ANSWER) -> RewardFn:
  """Reward 1.0 when the completion matches a regular expression, else 0.0.

  r = 1[re.search(pattern, text, re.DOTALL)]; the pattern anchors itself
  (the default spans the whole text). parsed is None. The default pattern
  is matched by an equivalent linear-time scan (as a regex it takes time
  quadratic in the text on some completions); a custom pattern runs on
  Python's `re`, which has no time limit: avoid nested or adjacent
  unbounded quantifiers that can backtrack catastrophically.

  Args:
    pattern: the regular expression; default DeepSeek-R1's
      "<think>...</think> <answer>...</answer>" layout (TRL's and open-r1's
      `format_reward`).

  Returns:
    A reward function `fn(samples) -> RewardResult`.

  References:
    DeepSeek-R1 format reward, arXiv 2501.12948; open-r1 `format_reward`.
  """
  try:
    compiled = re.compile(pattern, re.DOTALL)
  except re.error as e:
    raise ValueError(f"pattern {pattern!r} is not a valid regex: {e}") from e

  if pattern == THINK_ANSWER:
    matches = _think_answer
  else:
    matches = lambda text: compiled.search(text) is not None

  def reward(samples: Samples) -> RewardResult:
    hits = [matches(text) for text in samples.texts]
    return RewardResult(np.asarray(hits, np.float32))

  return reward


def _think_answer(text: str) -> bool:
  """re.search(THINK_ANSWER, text, re.DOTALL) is not None, in linear time.

  The lazy ".*?" groups match anything, so the text matches when it starts
  with "<think>", ends with "</answer>" (or "</answer>\\n", as "$" allows)
  and the first "</think>" + whitespace + "<answer>" after the opening tag
  ends before that closing tag.
  """
  if not text.startswith("<think>"):
    return False
  ends = [
    len(text) - len(suffix)
    for suffix in ("</answer>", "</answer>\n")
    if text.endswith(suffix)
  ]
  found = _THINK_END.search(text, len("<think>"))
  return bool(ends) and found is not None and found.end() <= max(ends)


def length_penalty(
  *, max_length: int, buffer: int, factor: float = 1.0
) -> RewardFn:
  """DAPO's soft overlong punishment on completion lengths in tokens.

  r(L) = -factor * min(max(L - (L_max - b), 0), b) / b: 0 up to L_max - b
  tokens, then linear down to -factor at L_max. Add it with weight 1 next to
  the answer reward. The maths is `rljax.shaping.overlong_penalty`, called
  here on `samples.num_tokens` (tokens, not characters as in Tunix's DAPO).

  Args:
    max_length: L_max, the generation limit in tokens.
    buffer: b in (0, max_length], the ramp length (verl
      `overlong_buffer.len`; DAPO uses 4096 with L_max = 20480).
    factor: the penalty at L_max (verl/OpenRLHF `penalty_factor`, 1.0).

  Returns:
    A reward function `fn(samples) -> RewardResult` (parsed None).

  References:
    Yu et al., "DAPO", arXiv 2503.14476; verl `DAPORewardManager`.
  """
  # An empty call validates the hyperparameters now, not at the first rollout.
  _penalty(np.zeros((0,), np.int32), max_length, buffer, factor)

  def reward(samples: Samples) -> RewardResult:
    num_tokens = np.asarray(samples.num_tokens)
    return RewardResult(_penalty(num_tokens, max_length, buffer, factor))

  return reward


def _penalty(lengths, max_length, buffer, factor) -> np.ndarray:
  """shaping.overlong_penalty as a float32 numpy array."""
  penalty = shaping.overlong_penalty(
    lengths, max_length=max_length, buffer=buffer, factor=factor
  )
  return np.asarray(penalty, np.float32)
