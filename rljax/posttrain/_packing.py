"""Sequence packing: several encoded examples per row, kept apart.

`Packed` rows carry, for every token, its segment id (1, 2, ... for the
examples of the row in order, 0 on padding) and its position within its
example (restarting at 0). Passed to `rljax.models.token_logprobs` as
``segment_ids_BS`` and ``positions_BS``, they make each example attend only
to itself, so a packed batch gives every example the log-probs, loss and
gradients it would get in a row of its own (`pad`), with less padding.
"""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from rljax.posttrain._encode import Encoded


class Packed(NamedTuple):
  """Rows of B x L tokens (numpy), padding at the end of each row."""

  tokens_BL: np.ndarray  # int32, 0 on padding
  loss_mask_BL: np.ndarray  # float32, 1 on target tokens
  segment_ids_BL: np.ndarray  # int32, 1.. per example of a row, 0: padding
  positions_BL: np.ndarray  # int32, position within the example


def pack(
  encoded: Sequence[Encoded], *, rows: int, length: int
) -> tuple[Packed, list[Encoded]]:
  """Greedy first-fit of whole examples into `rows` rows of `length` tokens.

  Examples are taken in order; each goes into the first row with room for
  all of it. Examples are never split; those that fit nowhere are returned,
  in order, for the next batch.

  Args:
    encoded: the examples, each at most `length` tokens.
    rows: B, the rows of the batch.
    length: L, tokens per row.

  Returns:
    (packed, leftover): the [B, L] batch and the examples left out.
  """
  _check_sizes(encoded, rows=rows, length=length)
  free = [length] * rows
  placed: list[list[Encoded]] = [[] for _ in range(rows)]
  leftover = []
  for example in encoded:
    n = len(example.tokens)
    row = next((r for r in range(rows) if free[r] >= n), None)
    if row is None:
      leftover.append(example)
      continue
    placed[row].append(example)
    free[row] -= n
  return _fill(placed, length), leftover


def pad(encoded: Sequence[Encoded], *, length: int) -> Packed:
  """One example per row, right-padded to `length` (segment id 1)."""
  _check_sizes(encoded, rows=max(len(encoded), 1), length=length)
  return _fill([[example] for example in encoded], length)


def packing_efficiency(packed: Packed) -> float:
  """Real tokens / all tokens of a batch (1.0: no padding)."""
  segments = np.asarray(packed.segment_ids_BL)
  return float(np.count_nonzero(segments)) / max(segments.size, 1)


def _fill(placed: list[list[Encoded]], length: int) -> Packed:
  """[len(placed), length] arrays holding each row's examples in order."""
  shape = (len(placed), length)
  tokens = np.zeros(shape, np.int32)
  loss_mask = np.zeros(shape, np.float32)
  segments = np.zeros(shape, np.int32)
  positions = np.zeros(shape, np.int32)
  for r, examples in enumerate(placed):
    start = 0
    for segment, example in enumerate(examples, start=1):
      end = start + len(example.tokens)
      tokens[r, start:end] = example.tokens
      loss_mask[r, start:end] = example.loss_mask
      segments[r, start:end] = segment
      positions[r, start:end] = np.arange(end - start)
      start = end
  return Packed(tokens, loss_mask, segments, positions)


def _check_sizes(encoded, *, rows: int, length: int) -> None:
  """Positive sizes; every example non-empty, consistent, <= `length`."""
  for name, value in (("rows", rows), ("length", length)):
    if not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(f"{name} must be a positive int; got {value!r}.")
  for i, example in enumerate(encoded):
    n = len(example.tokens)
    if n == 0 or len(example.loss_mask) != n:
      raise ValueError(
        f"encoded[{i}] has {n} tokens and {len(example.loss_mask)} loss-mask"
        " entries; an example needs at least one token and one mask entry"
        " per token."
      )
    if n > length:
      raise ValueError(
        f"encoded[{i}] has {n} tokens, more than a row's length={length};"
        f" encode with max_length <= {length} (encode_supervised truncates)"
        " or raise length."
      )
