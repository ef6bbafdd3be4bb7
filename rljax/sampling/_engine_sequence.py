"""The engine's sequences: what a sequence holds, why it stopped, what a
pause rule sees at each step (`StepInfo`), and the stop-string rule."""

from collections import abc
from collections.abc import Callable
import dataclasses
from typing import NamedTuple, Optional

import jax
import numpy as np

# Why a sequence stopped (`Sequence.stop_reason`).
RUNNING, STOP_ID, LENGTH, PAUSE, STOP_RULE, CAPACITY = range(6)
REASONS = ("running", "stop_id", "length", "pause", "stop_rule", "capacity")


class StepInfo(NamedTuple):
  """What a pause rule sees at each decode step, per slot [B]."""

  token: jax.Array  # int32 the token just sampled
  logp: jax.Array  # its log-prob under the processed distribution
  full_logp: jax.Array  # its log-prob under softmax(logits / temperature)
  entropy: jax.Array  # entropy of softmax(logits / temperature)
  steps: jax.Array  # tokens this sequence has sampled, this one included
  position: jax.Array  # the token's index in the whole sequence


@dataclasses.dataclass(eq=False)
class Sequence:
  """A sequence in the engine: its tokens and, per token after the prompt,
  whether the policy sampled it and with which log-probs.

  ``tokens[:prompt_length]`` is the prompt; every later token was either
  sampled (``sampled`` 1; ``logp`` under the processed distribution it was
  drawn from, ``full_logp`` under the full distribution at its
  ``temperature``) or appended by `Engine.extend` (``sampled`` 0, log-probs
  0); ``version`` is the weights' version (`Engine.run`'s ``refresh``)
  when it was. Read these; the engine owns the rest.
  """

  uid: int
  prompt_length: int
  tokens: list
  sampled: list
  logp: list
  full_logp: list
  temperature: list
  stop_reason: int = RUNNING
  version: list = dataclasses.field(default_factory=list)
  # Scheduling state (the engine's).
  key: Optional[np.ndarray] = None  # uint32 key data
  shard: int = 0
  base_temperature: float = 1.0
  limit: int = 0  # total sampled tokens allowed (this turn's budget)
  keep: bool = False  # keep pages after stopping (to extend or fork)
  pages: list = dataclasses.field(default_factory=list)
  cached: int = 0  # tokens written into the cache
  parent: Optional["Sequence"] = None  # forked from; pages not yet shared
  pending_children: int = 0
  forks: int = 0  # children forked so far (child j draws with key j)
  released: bool = False
  admitted: int = -1  # admission order (preemption picks the latest)
  turn_start: int = 0  # index of this turn's first sampled token

  @property
  def steps(self) -> int:
    """Tokens this sequence has sampled (its next draw's index)."""
    return int(sum(self.sampled))

  @property
  def completion(self) -> list:
    """The tokens after the prompt."""
    return self.tokens[self.prompt_length :]

  @property
  def turn(self) -> list:
    """The tokens sampled since the last `add`, `fork` or `extend`."""
    return self.tokens[self.turn_start :]

  @property
  def done(self) -> bool:
    return self.stop_reason != RUNNING


def stop_at_strings(
  decode: Callable[[list], str], strings: abc.Sequence[str]
) -> Callable[[Sequence], Optional[int]]:
  """A `stop_rule` that ends a completion at the first of `strings`.

  ``decode(ids) -> text`` is the tokenizer's decoder. The sequence keeps the
  shortest prefix of its turn (`Sequence.turn`) whose text contains a stop
  string (the string included, as vLLM's ``include_stop_str_in_output``).
  """
  strings = tuple(strings)
  if not strings or not all(isinstance(s, str) and s for s in strings):
    raise ValueError(f"strings must be non-empty strings; got {strings!r}.")

  def rule(seq: Sequence) -> Optional[int]:
    completion = seq.turn
    if not any(s in decode(completion) for s in strings):
      return None
    lo, hi = 1, len(completion)  # the shortest prefix that contains one
    while lo < hi:
      mid = (lo + hi) // 2
      if any(s in decode(completion[:mid]) for s in strings):
        hi = mid
      else:
        lo = mid + 1
    return lo

  return rule
