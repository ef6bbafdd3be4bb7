"""Packed RL batches: every forward and backward over real tokens only.

A rollout's [P, G, L] sequences (prompt left-padded, completion
right-padded) are mostly padding when completions are short. A `Packing`
lays each sample's real span (its first to its last attended token) end to
end into rows of the same width L, with a segment id per sample and the
positions the padded row would give, so each token attends to exactly the
tokens it would in its own row; log-probs, entropies and values are read
back into [P, G, T] by index. The algorithm's loss then sees the same
[P, G, T] arrays as on the padded batch, so every aggregation (token mean,
sequence mean, per group, per prompt) and every side field is unchanged:
exact up to float summation order.

The update's micro-batches are the units packed: unit k is the k-th block of
P / K prompts (minibatch j, micro-batch i: k = j * M + i). Each unit's samples
are split into one block per batch shard of the mesh and each block is
packed first-fit-decreasing into R rows of its own, so the packed rows split
over the devices as the padded rows do. R is the same for every unit (one
compiled shape), rounded up to one of 8 sizes per power of two, so a run
compiles a bounded number of shapes.

``train.max_tokens_per_microbatch`` (tokens per device per micro-batch, as
verl's ``ppo_max_token_len_per_gpu``) turns packing on and picks the number
of micro-batches per minibatch: the fewest (a divisor of the minibatch's
prompts) whose packed rows fit the budget.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np


class Packing(NamedTuple):
  """Where the samples of K units sit in packed rows [R, C] (C = L).

  ``source_KRC``: flat index into the unit's [N * L] tokens (N = P / K * G
  samples) of the token at each packed slot (0 on empty slots);
  ``segment_KRC``: 1, 2, ... per sample of a row, 0 on empty slots;
  ``back_KNT``: flat index into the unit's [R * C] packed outputs of each
  sample's columns L - T - 1, ..., L - 1 (T + 1 of them: the value before
  each completion token and the completion tokens), R * C where a column is
  outside the sample's span (its output is 0).
  """

  source_KRC: np.ndarray
  segment_KRC: np.ndarray
  back_KNT: np.ndarray

  @property
  def units(self) -> int:
    return self.source_KRC.shape[0]

  def unit(self, k):
    """Unit k's arrays (a traced `k` inside the update's loops)."""
    return jax.tree.map(lambda x: x[k], self)

  def merged(self) -> "Packing":
    """The K units as one: the whole batch's samples in K * R rows (the
    scoring passes, which run on the whole batch at once)."""
    k, r, c = self.source_KRC.shape
    n = self.back_KNT.shape[1]
    source = self.source_KRC + (np.arange(k) * (n * c))[:, None, None]
    back = self.back_KNT + (np.arange(k) * (r * c))[:, None, None]
    back = np.where(self.back_KNT == r * c, k * r * c, back)
    return Packing(
      source.reshape(1, k * r, c),
      self.segment_KRC.reshape(1, k * r, c),
      back.reshape(1, k * n, -1),
    )

  def computed_tokens(self) -> int:
    """Token slots the model computes over (real and empty)."""
    return int(self.segment_KRC.size)


def spans(mask_PGL) -> np.ndarray:
  """[P, G, 2] (first, last + 1) attended column of each sample; (0, 0)
  for a sample without one."""
  mask = np.asarray(mask_PGL) > 0
  length = mask.shape[-1]
  any_ = mask.any(-1)
  first = np.where(any_, mask.argmax(-1), 0)
  last = np.where(any_, length - mask[..., ::-1].argmax(-1), 0)
  return np.stack([first, last], -1).astype(np.int64)


def bucket(rows: int) -> int:
  """`rows` rounded up to one of 8 sizes per power of two (1, ..., 16, 18,
  20, ..., 32, 36, ...): at most 1/8 more, a bounded number of shapes."""
  if rows <= 8:
    return max(int(rows), 1)
  step = 1 << (int(rows - 1).bit_length() - 4)
  return -(-int(rows) // step) * step


def _first_fit(lengths: np.ndarray, width: int) -> list[list[int]]:
  """Indices of `lengths` in rows of `width` (first fit, longest first)."""
  rows: list[list[int]] = []
  free: list[int] = []
  for i in np.argsort(-lengths, kind="stable"):
    n = int(lengths[i])
    if n == 0:
      continue
    r = next((r for r, f in enumerate(free) if f >= n), None)
    if r is None:
      rows.append([])
      free.append(width)
      r = len(rows) - 1
    rows[r].append(int(i))
    free[r] -= n
  return rows


def _unit_rows(spans_N2: np.ndarray, shards: int, width: int):
  """Per batch shard, the first-fit rows of its block of samples."""
  lengths = spans_N2[:, 1] - spans_N2[:, 0]
  blocks = np.array_split(np.arange(len(lengths)), shards)
  return [
    [[b[i] for i in row] for row in _first_fit(lengths[b], width)]
    for b in blocks
  ]


def rows_needed(spans_PG2, units: int, shards: int, width: int) -> int:
  """The packed rows per shard the fullest unit needs (before `bucket`)."""
  per_unit = np.asarray(spans_PG2).reshape(units, -1, 2)
  return max(
    max(len(rows) for rows in _unit_rows(s, shards, width)) for s in per_unit
  )


def pack_plan(
  spans_PG2,
  *,
  length: int,
  completion_width: int,
  units: int = 1,
  shards: int = 1,
  rows: Optional[int] = None,
) -> Packing:
  """The `Packing` of a batch's samples (their `spans`) in `units` units.

  Args:
    spans_PG2: each sample's (first, last + 1) attended column.
    length: L, the padded rows' width (and the packed rows').
    completion_width: T, the completion's columns (the last T of L).
    units: K; P must be a multiple.
    shards: the batch shards of the mesh (each unit's samples split into
      that many blocks, each packed into rows of its own).
    rows: R, packed rows per shard (default: `bucket` of what the fullest
      unit needs).
  """
  spans_PG2 = np.asarray(spans_PG2)
  p = spans_PG2.shape[0]
  if p % units:
    raise ValueError(f"{p} prompts do not split into {units} micro-batches.")
  per_unit = spans_PG2.reshape(units, -1, 2)
  layouts = [_unit_rows(s, shards, length) for s in per_unit]
  needed = max(len(rows_) for layout in layouts for rows_ in layout)
  r = bucket(needed) if rows is None else int(rows)
  if r < needed:
    raise ValueError(f"rows={r} cannot hold a unit that needs {needed}.")
  k, n, _ = per_unit.shape
  c, t = int(length), int(completion_width)
  source = np.zeros((k, shards * r, c), np.int32)
  segment = np.zeros((k, shards * r, c), np.int32)
  back = np.full((k, n, t + 1), shards * r * c, np.int32)
  columns = np.arange(c - t - 1, c)
  for u, layout in enumerate(layouts):
    for d, block in enumerate(layout):
      for j, row in enumerate(block):
        row_index = d * r + j
        at = 0
        for s_id, i in enumerate(row, 1):
          first, last = (int(x) for x in per_unit[u, i])
          size = last - first
          source[u, row_index, at : at + size] = i * c + np.arange(first, last)
          segment[u, row_index, at : at + size] = s_id
          inside = (columns >= first) & (columns < last)
          back[u, i, inside] = row_index * c + at + columns[inside] - first
          at += size
  return Packing(source, segment, back)


def choose_microbatches(
  spans_PG2,
  *,
  budget: int,
  minibatches: int,
  length: int,
  shards: int,
  least: int = 1,
) -> int:
  """The fewest micro-batches per minibatch (a divisor of its prompts, at
  least `least`) whose packed rows fit `budget` tokens per device (rows x
  `length`).

  Raises a ValueError naming ``train.max_tokens_per_microbatch`` when even
  one prompt's group per micro-batch does not fit.
  """
  spans_PG2 = np.asarray(spans_PG2)
  per_minibatch = spans_PG2.shape[0] // minibatches
  for m in range(1, per_minibatch + 1):
    if per_minibatch % m or m < least:
      continue
    need = bucket(rows_needed(spans_PG2, minibatches * m, shards, length))
    if need * length <= budget:
      return m
  raise ValueError(
    f"train.max_tokens_per_microbatch={budget} cannot hold one prompt's"
    f" samples per device: a packed row is {length} tokens (the prompt and"
    f" completion widths) and one micro-batch of a single prompt needs"
    f" {need} rows ({need * length} tokens); raise it to at least"
    f" {need * length}, or unset it to update on padded rows."
  )


def gather_rows(x_NL, unit: Packing) -> jax.Array:
  """The packed [R, C, ...] rows of one unit's [N, L, ...] per-token
  values (`Packing.source_KRC`; 0 on empty slots)."""
  n, length = x_NL.shape[:2]
  flat = x_NL.reshape(n * length, *x_NL.shape[2:])
  out = jnp.take(flat, unit.source_KRC, axis=0)
  keep = (unit.segment_KRC > 0).reshape(
    unit.segment_KRC.shape + (1,) * (out.ndim - 2)
  )
  return jnp.where(keep, out, jnp.zeros((), out.dtype))


def scatter_back(y_RC, unit: Packing) -> jax.Array:
  """One unit's [N, T + 1] outputs at columns L - T - 1 ... L - 1 from
  packed [R, C] outputs (0 outside each sample's span)."""
  flat = jnp.concatenate([y_RC.reshape(-1), jnp.zeros((1,), y_RC.dtype)])
  return jnp.take(flat, unit.back_KNT, axis=0)


def padding_fraction(packing: Packing, mask_PGL) -> float:
  """Share of the token slots the model computes over that are not real
  tokens (attended), 0 when every slot is one."""
  real = int(np.count_nonzero(np.asarray(mask_PGL)))
  return 1.0 - real / max(packing.computed_tokens(), 1)
