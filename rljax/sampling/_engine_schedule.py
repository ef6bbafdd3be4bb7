"""The engine's scheduler: admission, prefill, page reservations,
preemption and decoding segments, between which `Engine.run` loops.

Admission fills free slots with waiting sequences, sharing a parent's
full pages with its forks and copying its partly filled last page; the
pages a segment writes are reserved before it runs. When the pool is
short, an idle kept sequence is evicted, else the latest admitted running
one is preempted (re-queued, to be re-prefilled from its tokens).
"""

from typing import Optional

import jax
import numpy as np

from rljax.sampling._engine_programs import _copy_pages
from rljax.sampling._engine_programs import _extend_program
from rljax.sampling._engine_programs import _segment_program
from rljax.sampling._engine_sequence import RUNNING
from rljax.sampling._engine_sequence import STOP_RULE
from rljax.sampling._engine_sequence import Sequence


class _Scheduler:
  """`Engine`'s scheduling steps (a mixin: they read and update the
  engine's slots, queues, page pool and statistics)."""

  def _free_slots(self, shard: int) -> list[int]:
    per = self.settings.slots // self.shards
    return [
      i for i in range(shard * per, (shard + 1) * per) if self._slots[i] is None
    ]

  def _admit(self, graphdef, state) -> None:
    """Fill free slots with waiting sequences (prefilling what they need)."""
    chosen = []
    for shard in range(self.shards):
      free = self._free_slots(shard)
      for seq in [s for s in self._waiting if s.shard == shard]:
        if not free:
          break
        chosen.append((free.pop(0), seq))
    if not chosen:
      return
    # Prefill the parents that children fork from, then the sequences.
    parents = []
    for _, seq in chosen:
      p = seq.parent
      if p is not None and p not in parents and _needs_prefill(p):
        parents.append(p)
    admitted, copies = [], []
    self._prefill(graphdef, state, parents)
    for slot, seq in chosen:
      if seq.parent is not None and _needs_prefill(seq.parent):
        continue  # the pool was short: the parent waits
      if seq.parent is not None and not self._fork_pages(seq, copies):
        continue
      admitted.append((slot, seq))
    self._copy(copies)
    ready = self._prefill(graphdef, state, [s for _, s in admitted])
    for slot, seq in admitted:
      if seq in ready:
        self._waiting.remove(seq)
        self._slots[slot] = seq
        seq.admitted = self._admitted
        self._admitted += 1

  def _fork_pages(self, child: Sequence, copies: list) -> bool:
    """Share the parent's full pages; its partly filled last page is to be
    copied (appended to `copies` as (shard, source, destination))."""
    parent = child.parent
    full, part = divmod(parent.cached, self.page_size)
    copy = self._alloc(child.shard, 1) if part else []
    if copy is None:
      return False
    shared = parent.pages[:full]
    self._refs[child.shard, shared] += 1
    if part:
      copies.append((child.shard, parent.pages[full], copy[0]))
    child.pages = shared + copy
    child.cached = parent.cached
    child.parent = None
    parent.pending_children -= 1
    self._maybe_free(parent)
    return True

  def _copy(self, copies: list) -> None:
    """Run the page copies of an admission round in one program."""
    if not copies:
      return
    per_shard = [[c for c in copies if c[0] == d] for d in range(self.shards)]
    n = _bucket(max(len(c) for c in per_shard), 1)
    src = np.zeros((self.shards, n), np.int32)  # padding copies 0 -> 0
    dst = np.zeros((self.shards, n), np.int32)
    for d, group in enumerate(per_shard):
      for i, (_, a, b) in enumerate(group):
        src[d, i], dst[d, i] = a, b
    if self._copier is None:
      self._copier = jax.jit(
        _copy_pages,
        donate_argnums=(0, 1),
        out_shardings=(self._pool_sharding(),) * 2,
      )
    self._pool = self._copier(*self._pool, src, dst)

  def _prefill(self, graphdef, state, seqs) -> set:
    """Write every token but the last (pending) one of `seqs` into their
    pages, chunk by chunk; returns the sequences now ready to decode."""
    ready = {s for s in seqs if not _needs_prefill(s)}
    placed = self._place([s for s in seqs if _needs_prefill(s)], spare=seqs)
    extend = self._program(
      "extend",
      graphdef,
      lambda: _extend_program(graphdef),
    )
    while True:
      rows = [s for s in placed if _needs_prefill(s)]
      if not rows:
        break
      grid, cached, tokens, mask = _prefill_chunk(rows, self.shards)
      self._pool = extend(
        state, *self._pool, self._table(grid), cached, tokens, mask
      )
      for i, s in enumerate(grid):
        if s is not None:
          s.cached += int(mask[i].sum())
    return ready | set(placed)

  def _place(self, seqs, spare) -> list[Sequence]:
    """Those of `seqs` that got pages for the tokens they prefill (after
    preempting another sequence, not one of `spare`, where the pool was
    short)."""
    placed = []
    for seq in seqs:
      if self._grow(seq, len(seq.tokens) - 1):
        placed.append(seq)
      elif not self._preempt_for(seq, spare):
        continue
      elif self._grow(seq, len(seq.tokens) - 1):
        placed.append(seq)
    return placed

  def _preempt_for(self, seq: Sequence, spare=()) -> bool:
    """Free pages for `seq`: first those of the most recently stopped
    idle kept sequence of its shard (one waiting to be extended or forked;
    it is re-prefilled from its tokens when it continues), then those of
    the last queued one that holds pages (extended, not admitted yet; not
    one of `spare`), else those of the latest admitted running one
    (re-queued)."""

    def holds(s):  # pages it alone can give up, without losing tokens
      return (
        s.shard == seq.shard
        and s.pages
        and s is not seq
        and s is not seq.parent
        and not s.pending_children
      )

    idle = [s for s in self._kept if holds(s) and s.done and not s.released]
    queued = [
      s for s in self._waiting if holds(s) and all(s is not t for t in spare)
    ]
    if idle or queued:
      victim = (idle or queued)[-1]
      self._decref(victim.shard, victim.pages)
      victim.pages, victim.cached = [], 0
      if idle:
        self._kept.remove(victim)
      self.stats["evicted"] += 1
      return True
    running = [
      (s.admitted, i)
      for i, s in enumerate(self._slots)
      if s is not None and s.shard == seq.shard and s is not seq
    ]
    if not running:
      return False
    _, i = max(running)
    victim = self._slots[i]
    self._slots[i] = None
    self._decref(victim.shard, victim.pages)
    victim.pages, victim.cached = [], 0
    self._waiting.insert(0, victim)
    self.stats["preempted"] += 1
    return True

  def _reserve(self) -> None:
    """Pages for the next segment's writes of every running sequence."""
    n = self.settings.segment
    for i in sorted(
      (i for i, s in enumerate(self._slots) if s is not None),
      key=lambda i: self._slots[i].admitted,
    ):
      seq = self._slots[i]
      if seq is None:  # preempted meanwhile
        continue
      room = min(n, seq.limit - seq.steps, self.max_length - seq.cached)
      while not self._grow(seq, seq.cached + room):
        if not self._preempt_for(seq):
          raise RuntimeError(
            "the page pool cannot hold one sequence; raise num_pages."
          )

  def _rows(self) -> list[Optional[Sequence]]:
    """The slots a segment decodes. While sequences wait, all of them (the
    free ones refill); otherwise only the running ones, packed per shard
    into the narrowest of half, a quarter, ... of its slots that holds
    them, so a long tail of a few sequences does not pay for every slot
    (on a compute-bound CPU a step's cost falls with its rows)."""
    if self._waiting:
      return self._slots
    per = self.settings.slots // self.shards
    shards = [
      [s for s in self._slots[d * per : (d + 1) * per] if s is not None]
      for d in range(self.shards)
    ]
    width = _narrowest(per, max(len(x) for x in shards))
    return [
      group[i] if i < len(group) else None
      for group in shards
      for i in range(width)
    ]

  def _shrink_at(self, rows: list[Optional[Sequence]]) -> int:
    """With none waiting: the freed rows that end a segment early, because
    the running ones then fit a narrower packing (`_rows`)."""
    width = len(rows) // self.shards
    running = sum(s is not None for s in rows)
    if width % 2 or not running:
      return len(rows) + 1  # never: no narrower packing
    return max(1, running - self.shards * (width // 2))

  def _segment(self, graphdef, state) -> list[Sequence]:
    """Decode one segment; returns the sequences that stopped in it."""
    slots = self._rows()
    s = self.settings._replace(slots=len(slots))
    b = s.slots
    rows, keys = _segment_rows(slots, self.max_length)
    waiting = bool(self._waiting)
    program = self._program(
      "segment", graphdef, lambda: _segment_program(graphdef, s), b
    )
    k, v, out = program(
      state,
      *self._pool,
      self._table(slots),
      rows,
      keys,
      self._stop_ids,
      self._top_p,
      np.int32(self.refill if waiting else self._shrink_at(slots)),
    )
    self._pool = (k, v)
    out = jax.device_get(out)
    steps = int(out["steps"])
    self.stats["segments"] += 1
    self.stats["decode_steps"] += steps
    self.stats["row_steps"] += steps * b
    stopped = []
    for i, seq in enumerate(slots):
      if seq is None:
        continue
      reason = self._record(seq, out, i)
      if reason != RUNNING:
        self._stop(seq, reason)
        stopped.append(seq)
    return stopped

  def _record(self, seq: Sequence, out: dict, i: int) -> int:
    """Append row `i`'s tokens of the segment's output `out` to `seq`;
    returns why it stopped (a stop rule's cut included)."""
    count = int(out["emitted"][i])
    seq.cached += count
    seq.tokens += out["tokens"][i, :count].tolist()
    seq.sampled += [1] * count
    seq.logp += out["logp"][i, :count].tolist()
    seq.full_logp += out["full_logp"][i, :count].tolist()
    seq.temperature += out["temperature"][i, :count].tolist()
    seq.version += [self.version] * count
    reason = int(out["reason"][i])
    if self.stop_rule is not None and count:
      cut = self.stop_rule(seq)
      if cut is not None:
        self._truncate(seq, int(cut))
        reason = STOP_RULE
    return reason

  def _stop(self, seq: Sequence, reason: int) -> None:
    """Free `seq`'s slot; keep its pages if it is kept, else release it."""
    seq.stop_reason = reason
    self._slots[self._slots.index(seq)] = None
    if not seq.keep:
      seq.released = True
    else:
      self._kept.append(seq)
    self._maybe_free(seq)

  def _truncate(self, seq: Sequence, keep: int) -> None:
    """Keep the first `keep` tokens of this turn (a stop rule's cut)."""
    end = seq.turn_start + min(max(int(keep), 1), len(seq.turn))
    for field in ("sampled", "logp", "full_logp", "temperature", "version"):
      setattr(seq, field, getattr(seq, field)[: end - seq.prompt_length])
    seq.tokens = seq.tokens[:end]
    seq.cached = min(seq.cached, len(seq.tokens) - 1)


def _narrowest(width: int, rows: int) -> int:
  """The narrowest of width, width / 2, width / 4, ... that holds `rows`
  (at least one)."""
  while width % 2 == 0 and width // 2 >= max(rows, 1):
    width //= 2
  return width


def _bucket(n: int, least: int) -> int:
  """The next power of two >= max(n, least) (fewer compiled shapes)."""
  return max(least, 1 << max(n - 1, 0).bit_length())


def _needs_prefill(seq: Sequence) -> bool:
  """Whether tokens before the pending last one are not yet cached."""
  return seq.cached < len(seq.tokens) - 1


def _prefill_chunk(rows: list[Sequence], shards: int, chunk: int = 256):
  """The next chunk of the rows' uncached tokens, right-padded: each
  shard's rows in a bucketed block of the grid (None: padding), the rows'
  cached lengths, tokens and mask."""
  by_shard = [[s for s in rows if s.shard == d] for d in range(shards)]
  r = _bucket(max(len(b) for b in by_shard), 1)
  width = _bucket(
    min(chunk, max(len(s.tokens) - 1 - s.cached for s in rows)), 16
  )
  grid = [None] * (r * shards)
  for d, group in enumerate(by_shard):
    for i, s in enumerate(group[:r]):
      grid[d * r + i] = s
  tokens = np.zeros((len(grid), width), np.int32)
  mask = np.zeros((len(grid), width), np.int32)
  cached = np.zeros((len(grid),), np.int32)
  for i, s in enumerate(grid):
    if s is None:
      continue
    new = s.tokens[s.cached : len(s.tokens) - 1][:width]
    tokens[i, : len(new)] = new
    mask[i, : len(new)] = 1
    cached[i] = s.cached
  return grid, cached, tokens, mask


def _segment_rows(slots: list[Optional[Sequence]], max_length: int):
  """A segment's per-row inputs (free rows inactive) and key data."""
  b = len(slots)
  rows = {
    "cached": np.zeros(b, np.int32),
    "last": np.zeros(b, np.int32),
    "steps": np.zeros(b, np.int32),
    "active": np.zeros(b, bool),
    "limit": np.zeros(b, np.int32),
    "capacity": np.full(b, max_length, np.int32),
    "temperature": np.ones(b, np.float32),
  }
  keys = np.zeros((b, 2), np.uint32)
  for i, seq in enumerate(slots):
    if seq is None:
      continue
    rows["cached"][i] = seq.cached
    rows["last"][i] = seq.tokens[-1]
    rows["steps"][i] = seq.steps
    rows["active"][i] = True
    rows["limit"][i] = seq.limit
    rows["temperature"][i] = seq.base_temperature
    keys[i] = seq.key
  return rows, keys
