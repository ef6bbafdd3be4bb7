"""The rollout engine: continuous batching over a paged KV cache.

A fixed number of decode *slots* run a jitted decode loop in short
segments. Between segments a host-side scheduler frees the slots of
finished sequences and admits waiting ones, so no decode step is spent on
a finished row; within a segment the loop also exits early once enough
slots are free to be worth refilling (``refill``) while sequences wait.

Keys and values live in fixed-size pages (`rljax.models.PagedCache`).
A sequence holds the pages its tokens need, allocated a segment ahead, so
memory follows the tokens actually cached, not P x G x (S_max + T_max).
The G samples of a prompt share the prompt's full pages (prefilled once);
each copies only the prompt's last, partly filled page. When the pool
runs out, the latest admitted sequence is preempted (its pages freed) and
later re-prefilled from its tokens; its samples do not change, because a
sequence's token s is drawn with ``fold_in(sequence key, s)``, whatever
slot or segment it runs in.

Sequences stop at a stop id, a token budget, the cache capacity, a
host-side stop rule (stop strings), or a device-side pause rule (a branch
point). A stopped sequence that is kept can be continued with appended
tokens (`Engine.extend`: its cache is reused, only the new tokens are
prefilled) or forked into children that share its pages (`Engine.fork`).

Layout: D shards (the mesh's batch axes), each with ``slots / D`` slots and
its own pages; a sequence and its forks stay on one shard. Every process
of a multi-host run runs the same scheduler on the same (global) inputs,
and reads the small per-segment outputs as replicated arrays.
"""

from collections import abc
from collections.abc import Callable
import functools
import math
from typing import Optional

from flax import nnx
import jax
import numpy as np

from rljax import sharding as sharding_lib
from rljax._src import checks
from rljax.models._config import ModelConfig
from rljax.models._transformer import init_pages
from rljax.sampling._engine_programs import _extend_program
from rljax.sampling._engine_programs import _fold_keys
from rljax.sampling._engine_programs import _segment_program
from rljax.sampling._engine_programs import _Settings
from rljax.sampling._engine_schedule import _bucket
from rljax.sampling._engine_schedule import _Scheduler
from rljax.sampling._engine_schedule import _segment_rows
from rljax.sampling._engine_sequence import PAUSE
from rljax.sampling._engine_sequence import REASONS
from rljax.sampling._engine_sequence import RUNNING
from rljax.sampling._engine_sequence import Sequence
from rljax.sampling._engine_sequence import StepInfo
from rljax.sampling._sampler import _stop_array


class Engine(_Scheduler):
  """Continuous-batching rollout engine over a paged KV cache.

  Queue sequences with `add` (a prompt and its G samples), `fork` or
  `extend`, then `run(model)` decodes every queued sequence until it stops
  and returns them. The page pool and the compiled programs persist across
  runs (the model's weights may change between them).

  Args:
    config: the policy's `ModelConfig` (pool shapes).
    slots: decode slots (rows decoded together); a multiple of the mesh's
      batch shards.
    page_size: tokens per page.
    num_pages: pages per shard, page 0 (scratch) included. Default: enough
      for every slot to hold ``max_length`` tokens, plus one spare page per
      slot for forks' copies.
    max_length: a sequence's capacity in tokens (prompt and completion);
      default ``config.max_position_embeddings``.
    segment: decode steps between scheduling points.
    refill: a segment ends early once this many slots have freed while
      sequences wait (default: a quarter of a shard's slots, at least 1).
    top_k, top_p, greedy: the sampling distribution (see
      `rljax.sampling.generate`); temperature is per sequence.
    stop_ids: token ids that end a sequence (the stop token is kept).
    stop_rule: host-side ``fn(sequence) -> Optional[int]``, called after
      each segment on sequences that sampled new tokens; a number n stops
      the sequence keeping only the first n (>= 1) tokens of its turn
      (`Sequence.turn`; stop strings: `stop_at_strings`).
    pause: device-side ``fn(StepInfo) -> bool[B]``, a branch rule; a
      sequence pauses (``stop_reason == PAUSE``) after a step where it is
      true, and can then be forked or continued.
    temperature_fn: device-side ``fn(logits_BV, temperature_B, steps_B) ->
      temperature_B``: a per-token temperature (recorded per token).
    mesh: shard slots and pages over the mesh's batch axes.
  """

  def __init__(
    self,
    config: ModelConfig,
    *,
    slots: int = 32,
    page_size: int = 16,
    num_pages: Optional[int] = None,
    max_length: Optional[int] = None,
    segment: int = 16,
    refill: Optional[int] = None,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    greedy: bool = False,
    stop_ids: abc.Sequence[int] = (),
    stop_rule: Optional[Callable[[Sequence], Optional[int]]] = None,
    pause: Optional[Callable[[StepInfo], jax.Array]] = None,
    temperature_fn: Optional[Callable] = None,
    mesh=None,
  ):
    checks.positive(slots=slots, page_size=page_size, segment=segment)
    self.config = config
    self.mesh = mesh
    self.shards = _batch_shards(mesh, slots)
    self.max_length = _max_length(config, max_length)
    self.page_size = int(page_size)
    self.pages_per_row = -(-self.max_length // self.page_size)
    per_shard = slots // self.shards
    self.num_pages = int(num_pages or 1 + per_shard * (self.pages_per_row + 1))
    if self.num_pages < 1 + self.pages_per_row + 1:
      raise ValueError(
        f"num_pages={self.num_pages} cannot hold one sequence of max_length"
        f" {self.max_length} ({self.pages_per_row} pages of {page_size},"
        " plus scratch page 0 and a fork's copy); raise num_pages or lower"
        " max_length."
      )
    _check_sampling(top_k, top_p)
    self.stop_ids = _stop_ids(stop_ids, config.vocab_size)
    self._stop_ids = _stop_array(self.stop_ids)
    self._top_p = np.float32(1.0 if top_p is None else top_p)
    self.stop_rule = stop_rule
    self.settings = _Settings(
      slots=int(slots),
      segment=int(segment),
      top_k=None if greedy or top_k is None else int(top_k),
      use_top_p=not greedy and top_p is not None and top_p < 1,
      greedy=bool(greedy),
      pause=pause,
      temperature_fn=temperature_fn,
    )
    self.refill = int(refill or max(1, per_shard // 4))
    self._init_state(slots)

  def _init_state(self, slots: int) -> None:
    """Empty queues, slots and pages; no pool or programs yet."""
    self._pool = None  # (k, v), made on the first run
    self._maker = self._copier = None  # jitted pool maker and page copier
    self._free = [
      list(range(self.num_pages - 1, 0, -1)) for _ in range(self.shards)
    ]
    self._refs = np.zeros((self.shards, self.num_pages), np.int64)
    self._waiting: list[Sequence] = []
    self._slots: list[Optional[Sequence]] = [None] * slots
    self._uid = 0
    self._admitted = 0
    self._programs = {}
    # row_steps: decode steps times the rows each ran with (the compute).
    self.stats = {
      "segments": 0,
      "decode_steps": 0,
      "row_steps": 0,
      "preempted": 0,
      "evicted": 0,
      "refreshed": 0,  # weights handed over mid-run (`run`'s refresh)
    }
    self._kept: list[Sequence] = []  # stopped and kept, in stop order
    self.version = 0  # the weights' version (`run`'s refresh)

  # --- queueing ---------------------------------------------------------------

  def _new(self, **kwargs) -> Sequence:
    self._uid += 1
    return Sequence(uid=self._uid, **kwargs)

  def add(
    self,
    prompt: abc.Sequence[int],
    *,
    key: jax.Array,
    max_new_tokens: int,
    num_samples: int = 1,
    temperature: float | abc.Sequence[float] = 1.0,
    keep: bool = False,
    shard: Optional[int] = None,
  ) -> list[Sequence]:
    """Queue `num_samples` samples of `prompt` (which share its cache).

    Sample j draws with ``fold_in(key, j)`` (`key` may also be a key's
    uint32 data, `jax.random.key_data`) at `temperature` (one for all, or
    one per sample). Returns the samples; they fill in as `run` decodes
    them.
    """
    prompt = [int(t) for t in prompt]
    checks.positive(max_new_tokens=max_new_tokens, num_samples=num_samples)
    temps = np.asarray(temperature, np.float64).reshape(-1)
    if temps.size not in (1, num_samples):
      raise ValueError(
        f"temperature has {temps.size} values for {num_samples} samples;"
        " give one, or one per sample."
      )
    if not self.settings.greedy and not np.all(temps > 0):
      raise ValueError(
        f"temperature must be > 0 for sampling; got {temps.tolist()}."
      )
    if not prompt:
      raise ValueError("prompt is empty; give at least one token.")
    vocab = self.config.vocab_size
    if not all(0 <= t < vocab for t in prompt):
      raise ValueError(
        f"prompt must hold token ids in [0, {vocab}); got values in"
        f" [{min(prompt)}, {max(prompt)}]."
      )
    if len(prompt) >= self.max_length:
      raise ValueError(
        f"a prompt of {len(prompt)} tokens leaves no room to sample within"
        f" the engine's max_length ({self.max_length}); shorten it or raise"
        " max_length."
      )
    if shard is None:  # balance shards by queued work
      shard = self._uid % self.shards
    data = np.asarray(
      key if isinstance(key, np.ndarray) else jax.random.key_data(key),
      np.uint32,
    )
    parent = self._new(
      prompt_length=len(prompt),
      tokens=prompt,
      sampled=[],
      logp=[],
      full_logp=[],
      temperature=[],
      stop_reason=PAUSE,
      key=data,
      shard=shard,
      keep=True,
      released=True,  # freed once its samples have forked
    )
    temps = np.ones(1) if self.settings.greedy else temps
    return self._children(parent, num_samples, max_new_tokens, temps, keep)

  def _children(
    self, parent, n, max_new_tokens, temperature, keep, tokens=()
  ) -> list:
    """`n` queued forks of `parent` (each starting with the appended
    `tokens`); fork j draws with fold_in(key, j) at temperature j (or the
    one temperature given)."""
    keys = np.asarray(_fold_keys(parent.key, parent.forks, n), np.uint32)
    temps = np.broadcast_to(np.asarray(temperature, np.float64), (n,))
    parent.forks += n
    return [
      self._child(parent, key, max_new_tokens, float(t), keep, tokens)
      for key, t in zip(keys, temps)
    ]

  def _child(self, parent, key, max_new_tokens, temperature, keep, tokens=()):
    tokens = [int(t) for t in tokens]
    child = self._new(
      prompt_length=parent.prompt_length,
      tokens=list(parent.tokens) + tokens,
      sampled=list(parent.sampled) + [0] * len(tokens),
      logp=list(parent.logp) + [0.0] * len(tokens),
      full_logp=list(parent.full_logp) + [0.0] * len(tokens),
      temperature=list(parent.temperature) + [0.0] * len(tokens),
      version=list(parent.version) + [self.version] * len(tokens),
      key=key,
      shard=parent.shard,
      base_temperature=temperature,
      limit=parent.steps + int(max_new_tokens),
      keep=keep,
      parent=parent,
      turn_start=len(parent.tokens) + len(tokens),
    )
    parent.pending_children += 1
    self._waiting.append(child)
    return child

  def fork(
    self,
    seq: Sequence,
    n: int,
    *,
    max_new_tokens: int,
    temperature: Optional[float] = None,
    keep: bool = False,
    tokens: abc.Sequence[int] = (),
  ) -> list[Sequence]:
    """Queue `n` continuations of a stopped, kept sequence sharing its
    cache; its j-th child (counting earlier forks) draws with
    ``fold_in(seq's key, j)``. Each child first appends `tokens` (not
    sampled, as `extend` does: a tool's output before the branches)."""
    self._check_stopped(seq, "fork")
    checks.positive(n=n, max_new_tokens=max_new_tokens)
    if len(seq.tokens) + len(tokens) >= self.max_length:
      raise ValueError(
        f"forking a sequence of {len(seq.tokens)} tokens with"
        f" {len(tokens)} appended leaves no room within max_length"
        f" ({self.max_length})."
      )
    temp = seq.base_temperature if temperature is None else float(temperature)
    return self._children(seq, n, max_new_tokens, temp, keep, tokens)

  def extend(
    self,
    seq: Sequence,
    tokens: abc.Sequence[int],
    *,
    max_new_tokens: int,
    temperature: Optional[float] = None,
  ) -> Sequence:
    """Append `tokens` (not sampled: ``sampled`` 0) to a stopped, kept
    sequence and queue it to sample up to `max_new_tokens` more. Its cache
    is reused; only the new tokens are prefilled."""
    self._check_stopped(seq, "extend")
    checks.positive(max_new_tokens=max_new_tokens)
    tokens = [int(t) for t in tokens]
    if len(seq.tokens) + len(tokens) >= self.max_length:
      raise ValueError(
        f"extending a sequence of {len(seq.tokens)} tokens by"
        f" {len(tokens)} leaves no room within max_length"
        f" ({self.max_length})."
      )
    seq.tokens += tokens
    seq.sampled += [0] * len(tokens)
    seq.logp += [0.0] * len(tokens)
    seq.full_logp += [0.0] * len(tokens)
    seq.temperature += [0.0] * len(tokens)
    seq.version += [self.version] * len(tokens)
    seq.limit = seq.steps + int(max_new_tokens)
    seq.turn_start = len(seq.tokens)
    if temperature is not None:
      seq.base_temperature = float(temperature)
    seq.stop_reason = RUNNING
    if seq in self._kept:
      self._kept.remove(seq)
    self._waiting.append(seq)
    return seq

  def _check_stopped(self, seq: Sequence, what: str) -> None:
    if not seq.done or seq.released or not (seq.keep or seq.pages):
      raise ValueError(
        f"can only {what} a sequence that has stopped and was kept"
        " (add(..., keep=True)) and not released; this one is"
        f" {REASONS[seq.stop_reason]}{', released' if seq.released else ''}."
      )

  def release(self, seq: Sequence) -> None:
    """Free a kept sequence's pages (after its forks have started)."""
    seq.released = True
    if seq in self._kept:
      self._kept.remove(seq)
    self._maybe_free(seq)

  def _maybe_free(self, seq: Sequence) -> None:
    if seq.released and not seq.pending_children and seq.pages:
      self._decref(seq.shard, seq.pages)
      seq.pages = []
      seq.cached = 0

  # --- pages ------------------------------------------------------------------

  def _alloc(self, shard: int, n: int) -> Optional[list]:
    free = self._free[shard]
    if len(free) < n:
      return None
    pages = [free.pop() for _ in range(n)]
    self._refs[shard, pages] += 1
    return pages

  def _decref(self, shard: int, pages) -> None:
    for p in pages:
      self._refs[shard, p] -= 1
      if self._refs[shard, p] == 0:
        self._free[shard].append(p)

  def _grow(self, seq: Sequence, tokens: int) -> bool:
    """Pages for `tokens` cache slots; False when the pool is short."""
    need = -(-tokens // self.page_size) - len(seq.pages)
    if need <= 0:
      return True
    pages = self._alloc(seq.shard, need)
    if pages is None:
      return False
    seq.pages += pages
    return True

  def close(self) -> None:
    """Drop the page pool (its memory) once nothing is queued or kept;
    the next `run` makes a new one. Compiled programs stay."""
    if self._waiting or self.pages_in_use():
      raise ValueError(
        "the engine still holds sequences (queued or kept); release them"
        " before close()."
      )
    self._pool = None

  def pages_in_use(self) -> int:
    """Pages held now, over all shards (scratch pages not counted)."""
    return int(sum(self.num_pages - 1 - len(f) for f in self._free))

  # --- device programs --------------------------------------------------------

  def _program(self, name, graphdef, make, variant=None):
    key = (name, graphdef, variant)
    if key not in self._programs:
      rep = None
      ins = {}
      if self.mesh is not None:
        rep = jax.sharding.NamedSharding(
          self.mesh, jax.sharding.PartitionSpec()
        )
        # Several processes pass the same host arrays, which jit takes only
        # whole (replicated): their rows are not split yet.
        if jax.process_count() == 1:
          ins = {"in_shardings": self._row_shardings(name, rep)}
      pool = self._pool_sharding()
      outs = {"segment": (pool, pool, rep), "extend": (pool, pool)}[name]
      program = jax.jit(
        make(), donate_argnums=(1, 2), out_shardings=outs, **ins
      )
      if self.mesh is not None:
        # Traced in the mesh: the model splits its rows and runs its
        # kernels (a mixture of experts' grouped matmuls) per shard.
        program = sharding_lib.InMesh(self.mesh, program)
      self._programs[key] = program
    return self._programs[key]

  def _row_shardings(self, name, rep):
    """A program's inputs on the mesh: the weights as they are, the pool by
    shard, the rows' inputs split over the batch axes like the pool's
    shards (each shard's rows are a block), the rest replicated; rows
    given as host arrays would otherwise reach every device whole."""
    rows = functools.partial(sharding_lib.batch_sharding, self.mesh)
    pool = self._pool_sharding()
    if name == "extend":  # state, k, v, pages, cached, tokens, mask
      return (None, pool, pool, rows(2), rows(1), rows(2), rows(2))
    # state, k, v, pages, rows, keys, stop ids, top_p, refill
    return (None, pool, pool, rows(2), rows(1), rows(2), rep, rep, rep)

  def _pool_sharding(self):
    if self.mesh is None:
      return None
    spec = jax.sharding.PartitionSpec(
      None, sharding_lib.BATCH_AXES, None, None, "tensor", None
    )
    return jax.sharding.NamedSharding(self.mesh, spec)

  def _ensure_pool(self) -> None:
    if self._pool is None:
      if self._maker is None:
        make = functools.partial(
          init_pages,
          self.config,
          self.num_pages,
          self.page_size,
          self.shards,
        )
        self._maker = jax.jit(make, out_shardings=self._pool_sharding())
      self._pool = self._maker()

  def lower(self, graphdef, state, prompt_length: int) -> dict:
    """{"prefill", "decode_segment"}: the engine's two programs lowered for
    an (abstract) model state with every slot busy, prompts of
    `prompt_length` tokens prefilled in one chunk; nothing is allocated
    (a run plan compiles them for devices that need not be attached)."""
    pool = jax.eval_shape(
      functools.partial(
        init_pages, self.config, self.num_pages, self.page_size, self.shards
      )
    )
    pool_sharding = self._pool_sharding()
    if pool_sharding is not None:
      pool = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
          x.shape, x.dtype, sharding=pool_sharding
        ),
        pool,
      )
    slots = [None] * self.settings.slots
    table = self._table(slots)
    width = _bucket(min(256, max(prompt_length - 1, 1)), 16)
    tokens = np.zeros((len(slots), width), np.int32)
    prefill = self._program(
      "extend", graphdef, lambda: _extend_program(graphdef)
    ).lower(state, *pool, table, tokens[:, 0], tokens, tokens)
    rows, keys = _segment_rows(slots, self.max_length)
    s = self.settings
    decode = self._program(
      "segment", graphdef, lambda: _segment_program(graphdef, s), s.slots
    ).lower(
      state,
      *pool,
      table,
      rows,
      keys,
      self._stop_ids,
      self._top_p,
      np.int32(self.refill),
    )
    return {"prefill": prefill, "decode_segment": decode}

  def _recompute(self, graphdef, state) -> None:
    """New weights: every cached key and value is stale. Sequences keep
    their pages but count nothing cached, so each is prefilled again under
    the new weights before it decodes, forks or continues (the running
    ones now)."""
    held = [*self._kept, *self._waiting]
    held += [s.parent for s in self._waiting if s.parent is not None]
    running = [s for s in self._slots if s is not None]
    for seq in held + running:
      seq.cached = 0
    self._prefill(graphdef, state, running)
    self.stats["refreshed"] += 1

  def _table(self, seqs) -> np.ndarray:
    table = np.zeros((len(seqs), self.pages_per_row), np.int32)
    for i, seq in enumerate(seqs):
      if seq is not None:
        table[i, : len(seq.pages)] = seq.pages
    return table

  # --- scheduling (the steps: `_Scheduler`) -----------------------------------

  def run(
    self,
    model,
    *,
    on_stop: Optional[Callable[[list], None]] = None,
    poll: Optional[Callable[[bool], bool]] = None,
    refresh: Optional[Callable[[], Optional[tuple]]] = None,
    version: Optional[int] = None,
  ) -> list[Sequence]:
    """Decode every queued sequence until it stops; returns them, in the
    order they were queued.

    Two hooks let the caller continue sequences while others decode (an
    agent's environment steps): ``on_stop(seqs)`` gets, after each
    segment, the sequences that stopped in it; ``poll(block) -> bool``
    runs before each segment, queues the continuations that are ready
    (`extend`, `fork`) and returns whether more are still to come; with
    ``block=True`` nothing is left to decode and it should wait until one
    is ready (or none is outstanding). The run ends when nothing is queued,
    running or outstanding.

    ``refresh() -> (version, model) or None``, before each segment, hands
    newer weights (an asynchronous run's update finished): the sequences
    in flight continue under them, from their next token (a partial
    rollout across updates). Every cached key and value is recomputed with
    the new weights, so each token's log-probs are those of the weights
    that sampled it given its whole prefix, and its ``version`` says which;
    ``version`` is `model`'s (default: the last refresh's, 0 at first).
    """
    graphdef, state = nnx.split(model)
    if version is not None:
      self.version = int(version)
    self._ensure_pool()
    queued = [s for s in self._waiting]
    while True:
      fresh = refresh() if refresh is not None else None
      if fresh is not None:
        self.version, model = fresh
        graphdef, state = nnx.split(model)
        self._recompute(graphdef, state)
      busy = self._waiting or any(s is not None for s in self._slots)
      more = poll(not busy) if poll is not None else False
      if not (self._waiting or any(s is not None for s in self._slots)):
        if more:
          continue
        break
      self._admit(graphdef, state)
      self._reserve()
      if not any(s is not None for s in self._slots):
        raise RuntimeError(
          f"the page pool ({self.num_pages - 1} pages of {self.page_size}"
          f" tokens per shard, {self.pages_in_use()} held by kept sequences)"
          " cannot hold the next waiting sequence; release kept sequences or"
          " raise num_pages."
        )
      stopped = self._segment(graphdef, state)
      if on_stop is not None and stopped:
        on_stop(stopped)
    return queued


def _batch_shards(mesh, slots: int) -> int:
  """The mesh's batch shards (1 without a mesh); `slots` must divide."""
  shards = (
    1
    if mesh is None
    else math.prod(mesh.shape[a] for a in sharding_lib.BATCH_AXES)
  )
  if slots % shards:
    raise ValueError(
      f"slots={slots} must be a multiple of the mesh's batch shards"
      f" ({shards}); use {shards * -(-slots // shards)}."
    )
  return shards


def _max_length(config: ModelConfig, max_length: Optional[int]) -> int:
  """A sequence's capacity: `max_length`, at most the model's positions."""
  max_length = int(max_length or config.max_position_embeddings)
  if max_length > config.max_position_embeddings:
    raise ValueError(
      f"max_length={max_length} exceeds the model's"
      f" max_position_embeddings ({config.max_position_embeddings})."
    )
  return max_length


def _check_sampling(top_k: Optional[int], top_p: Optional[float]) -> None:
  if top_p is not None and not 0 < top_p <= 1:
    raise ValueError(f"top_p must be in (0, 1]; got {top_p!r}.")
  if top_k is not None:
    checks.positive(top_k=top_k)


def _stop_ids(stop_ids: abc.Sequence[int], vocab: int) -> tuple:
  """`stop_ids` as a tuple of ints, each a token id of the vocabulary."""
  stop_ids = tuple(int(i) for i in stop_ids)
  if any(not 0 <= i < vocab for i in stop_ids):
    raise ValueError(
      f"stop_ids must be token ids in [0, {vocab}); got {list(stop_ids)}."
    )
  return stop_ids
