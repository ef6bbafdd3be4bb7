"""CAMPO's repetition penalty: how much of a completion is a trailing loop."""

from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from rljax.rewards._base import RewardFn
from rljax.rewards._base import RewardResult
from rljax.rewards._base import Samples

_VARIANTS = ("paper", "code")


def _check_min_repeats(min_repeats: Any) -> None:
  if (
    not isinstance(min_repeats, (int, np.integer))
    or isinstance(min_repeats, bool)
    or min_repeats < 2
  ):
    raise ValueError(
      f"min_repeats={min_repeats!r}; it must be an int >= 2 (a loop is a"
      " block repeated at least twice)."
    )


def loop_fraction(sequence: Sequence[Any], *, min_repeats: int = 2) -> float:
  """f(o): the fraction of `sequence` inside its trailing repeating loop.

  A trailing loop of period L is the longest run of back-to-back copies of
  the last L items that ends the sequence, if it has at least
  `min_repeats` copies; the loop is the earliest-starting one over all L
  (the repetition that began earliest), and f = (items from its start to
  the end) / (all items), in [0, 1]; 0 without a loop or for an empty
  sequence. E.g. "xyzabab" -> "abab" (L = 2, 2 copies) -> 4/7; "baaaaa"
  -> 5/6 (L = 1, 5 copies).

  Args:
    sequence: token ids or a text (its characters are the items).
    min_repeats: the fewest copies that make a loop (>= 2).
  """
  _check_min_repeats(min_repeats)
  seq = sequence if isinstance(sequence, str) else tuple(sequence)
  n = len(seq)
  start = n
  for period in range(1, n // min_repeats + 1):
    block = seq[n - period :]
    copies, left = 1, n - period
    while left >= period and seq[left - period : left] == block:
      copies, left = copies + 1, left - period
    if copies >= min_repeats:
      start = min(start, left)
      if start == 0:
        break
  return (n - start) / n if n else 0.0


def repetition_penalty(
  *,
  variant: str = "paper",
  min_repeats: int = 2,
  tokenize: Optional[Callable[[str], Sequence[Any]]] = None,
) -> RewardFn:
  """CAMPO's repetition penalty as a reward, -rep(o) per completion.

  Add it to the task's rewards with weight gamma: r = r_acc - gamma rep(o).

  * ``variant="paper"``: rep(o) = f(o) = `loop_fraction` (Eq. 6's f, the
    proportion of the sequence inside the detected repeating loop: the
    earlier the loop starts, the heavier the penalty), on every
    completion; gamma = 1 in the paper.
  * ``variant="code"``: rep(o) = 1 if the completion was truncated (it
    filled the generation window) and ends in a loop, else 0 (the
    official code's constant penalty, gamma 0.1 there).

  Args:
    variant: "paper" or "code".
    min_repeats: the fewest copies of a block that make a loop (2 in the
      paper's code).
    tokenize: maps a completion text to the items compared (token ids);
      None: its characters (the tokens of a character vocabulary).

  Returns:
    A reward function `fn(samples) -> RewardResult` (parsed None) with
    values -rep(o) in [-1, 0].

  References:
    MiroMind-M1, CAMPO, arXiv 2507.14683 (catalog row 2.108), Section 4.3,
    Eq. 6: A_i = (r(o_i, a) - f(o_i) - mean) / std over the group, f(o)
    in [0, 1] "the proportion of the whole token sequence that lies inside
    the detected repeating loop". Checked against MiroMindAsia/MiroMind-M1
    (``verl/trainer/ppo/core_algos.py``: ``find_infinite_loop_start``,
    ``compute_campo_outcome_advantage``): loops of any period repeated >=
    2 times at the end of the token ids; the code penalizes only responses
    whose mask fills the window, by a constant 0.1 (the function's default;
    the config's 0.2 and the scripts' "dynamic" are not passed to it), and
    takes the loop of the largest repeating period rather than the
    earliest-starting one ("baaaaa": 4/6 there, 5/6 here); we follow the
    paper's words.
  """
  if variant not in _VARIANTS:
    raise ValueError(f"variant={variant!r}; it must be one of {_VARIANTS}.")
  _check_min_repeats(min_repeats)
  if tokenize is not None and not callable(tokenize):
    raise ValueError(
      f"tokenize={tokenize!r}; give a callable text -> token ids, or None"
      " for characters."
    )

  def reward(samples: Samples) -> RewardResult:
    items = [tokenize(t) if tokenize else t for t in samples.texts]
    f = np.asarray(
      [loop_fraction(x, min_repeats=min_repeats) for x in items], np.float32
    )
    if variant == "code":
      truncated = np.asarray(samples.truncated, bool)
      f = (truncated & (f > 0)).astype(np.float32)
    return RewardResult(-f)

  return reward
