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
import dataclasses
import functools
import math
from typing import NamedTuple, Optional

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from rljax import sharding as sharding_lib
from rljax._src import checks
from rljax.models._config import ModelConfig
from rljax.models._transformer import PagedCache
from rljax.models._transformer import init_pages
from rljax.sampling._logits import _process
from rljax.sampling._sampler import Rollout
from rljax.sampling._sampler import _check_prompt_values
from rljax.sampling._sampler import _check_prompts
from rljax.sampling._sampler import _stop_array

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
  0). Read these; the engine owns the rest.
  """

  uid: int
  prompt_length: int
  tokens: list
  sampled: list
  logp: list
  full_logp: list
  temperature: list
  stop_reason: int = RUNNING
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


class _Settings(NamedTuple):
  """Static settings: one compiled program per value."""

  slots: int
  segment: int  # decode steps per segment
  top_k: Optional[int]
  use_top_p: bool
  greedy: bool
  pause: Optional[Callable]
  temperature_fn: Optional[Callable]


class _Segment(NamedTuple):
  """The decode loop's carry."""

  t: jax.Array
  k: jax.Array
  v: jax.Array
  cached_B: jax.Array
  last_B: jax.Array
  steps_B: jax.Array
  active_B: jax.Array
  reason_B: jax.Array
  emitted_B: jax.Array  # tokens sampled this segment
  tokens_BN: jax.Array
  logp_BN: jax.Array
  full_BN: jax.Array
  temp_BN: jax.Array


def _sample_rows(logits_BV, keys_B, steps_B, temperature_B, s, top_p):
  """Each row's token, drawn with fold_in(its key, its step), and its
  log-probs under the processed and the full tempered distribution."""
  logits_BV = logits_BV.astype(jnp.float32)
  full = jax.nn.log_softmax(logits_BV / temperature_B[:, None], axis=-1)
  if s.greedy:
    tokens = jnp.argmax(logits_BV, axis=-1)
    processed = jax.nn.log_softmax(logits_BV, axis=-1)
  else:
    z = _process(
      logits_BV,
      temperature_B[:, None],
      s.top_k,
      top_p if s.use_top_p else None,
    )
    keys = jax.vmap(jax.random.fold_in)(
      jax.random.wrap_key_data(keys_B), steps_B
    )
    tokens = jax.vmap(jax.random.categorical)(keys, z)
    processed = jax.nn.log_softmax(z, axis=-1)
  tokens = tokens.astype(jnp.int32)

  def pick(x):
    return jnp.take_along_axis(x, tokens[:, None], -1)[:, 0]

  entropy = -jnp.sum(jnp.exp(full) * full, axis=-1)
  return tokens, pick(processed), pick(full), entropy


def _segment_program(graphdef, s: _Settings):
  """The jitted decode segment for static settings `s`."""

  def run(state, k, v, pages_BM, rows, keys_B, stop_ids, top_p, refill):
    model = nnx.merge(graphdef, state)
    b, n = s.slots, s.segment
    zeros_BN = jnp.zeros((b, n), jnp.int32)
    c = _Segment(
      t=jnp.int32(0),
      k=k,
      v=v,
      cached_B=rows["cached"],
      last_B=rows["last"],
      steps_B=rows["steps"],
      active_B=rows["active"],
      reason_B=jnp.zeros((b,), jnp.int32),
      emitted_B=jnp.zeros((b,), jnp.int32),
      tokens_BN=zeros_BN,
      logp_BN=zeros_BN.astype(jnp.float32),
      full_BN=zeros_BN.astype(jnp.float32),
      temp_BN=zeros_BN.astype(jnp.float32),
    )
    started = jnp.sum(rows["active"])

    def body(c: _Segment) -> _Segment:
      alive = c.active_B
      cache = PagedCache(c.k, c.v, pages_BM, c.cached_B)
      hidden, cache = model.hidden_states(
        c.last_B[:, None], alive[:, None].astype(jnp.int32), cache=cache
      )
      logits = model.logits(hidden)[:, 0]
      temperature = rows["temperature"]
      if s.temperature_fn is not None:
        temperature = s.temperature_fn(logits, temperature, c.steps_B)
      token, logp, full, entropy = _sample_rows(
        logits, keys_B, c.steps_B, temperature, s, top_p
      )
      steps = c.steps_B + alive
      cached = cache.lengths_B
      reason = jnp.where(
        jnp.any(token[:, None] == stop_ids[None], axis=-1), STOP_ID, RUNNING
      )
      reason = jnp.where(
        (reason == RUNNING) & (steps >= rows["limit"]), LENGTH, reason
      )
      # The pending token needs a cache slot when the sequence continues.
      reason = jnp.where(
        (reason == RUNNING) & (cached + 1 >= rows["capacity"]),
        CAPACITY,
        reason,
      )
      if s.pause is not None:
        info = StepInfo(token, logp, full, entropy, steps, cached)
        paused = jnp.asarray(s.pause(info), bool)
        reason = jnp.where((reason == RUNNING) & paused, PAUSE, reason)
      reason = jnp.where(alive, reason, c.reason_B)

      def put(buf, col):
        col = jnp.where(alive, col, 0).astype(buf.dtype)
        return jax.lax.dynamic_update_slice(buf, col[:, None], (0, c.t))

      return _Segment(
        t=c.t + 1,
        k=cache.k,
        v=cache.v,
        cached_B=cached,
        last_B=jnp.where(alive, token, c.last_B),
        steps_B=steps,
        active_B=alive & (reason == RUNNING),
        reason_B=reason,
        emitted_B=c.emitted_B + alive,
        tokens_BN=put(c.tokens_BN, token),
        logp_BN=put(c.logp_BN, logp),
        full_BN=put(c.full_BN, full),
        temp_BN=put(c.temp_BN, temperature * jnp.ones_like(logp)),
      )

    def cond(c: _Segment) -> jax.Array:
      freed = started - jnp.sum(c.active_B)
      return (c.t < n) & jnp.any(c.active_B) & (freed < refill)

    c = jax.lax.while_loop(cond, body, c)
    out = dict(
      steps=c.t,
      last=c.last_B,
      reason=c.reason_B,
      emitted=c.emitted_B,
      tokens=c.tokens_BN,
      logp=c.logp_BN,
      full_logp=c.full_BN,
      temperature=c.temp_BN,
    )
    return c.k, c.v, out

  return run


def _extend_program(graphdef):
  """Write right-padded chunks of tokens into their rows' pages."""

  def run(state, k, v, pages_RM, cached_R, tokens_RC, mask_RC):
    model = nnx.merge(graphdef, state)
    cache = PagedCache(k, v, pages_RM, cached_R)
    _, cache = model.hidden_states(tokens_RC, mask_RC, cache=cache)
    return cache.k, cache.v

  return run


def _copy_pages(k, v, src_DN, dst_DN):
  """Copy pages src[d, i] to dst[d, i] in every shard d (forks' last
  pages; sources are never destinations)."""
  shard = jnp.arange(src_DN.shape[0])[:, None]

  def copy(pool):
    return pool.at[:, shard, dst_DN].set(pool[:, shard, src_DN])

  return copy(k), copy(v)


@functools.partial(jax.jit, static_argnums=2)
def _fold_keys(key_data, start, n: int):
  """Key data of fold_in(key, start + j) for j < n (one dispatch)."""
  key = jax.random.wrap_key_data(key_data)
  folded = jax.vmap(lambda j: jax.random.fold_in(key, j))(start + jnp.arange(n))
  return jax.random.key_data(folded)


def _narrowest(width: int, rows: int) -> int:
  """The narrowest of width, width / 2, width / 4, ... that holds `rows`
  (at least one)."""
  while width % 2 == 0 and width // 2 >= max(rows, 1):
    width //= 2
  return width


def _bucket(n: int, least: int) -> int:
  """The next power of two >= max(n, least) (fewer compiled shapes)."""
  return max(least, 1 << max(n - 1, 0).bit_length())


class Engine:
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
    self.shards = (
      1
      if mesh is None
      else math.prod(mesh.shape[a] for a in sharding_lib.BATCH_AXES)
    )
    if slots % self.shards:
      raise ValueError(
        f"slots={slots} must be a multiple of the mesh's batch shards"
        f" ({self.shards}); use {self.shards * -(-slots // self.shards)}."
      )
    self.max_length = int(max_length or config.max_position_embeddings)
    if self.max_length > config.max_position_embeddings:
      raise ValueError(
        f"max_length={self.max_length} exceeds the model's"
        f" max_position_embeddings ({config.max_position_embeddings})."
      )
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
    if top_p is not None and not 0 < top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1]; got {top_p!r}.")
    if top_k is not None:
      checks.positive(top_k=top_k)
    vocab = config.vocab_size
    stop_ids = tuple(int(i) for i in stop_ids)
    self.stop_ids = stop_ids
    if any(not 0 <= i < vocab for i in stop_ids):
      raise ValueError(
        f"stop_ids must be token ids in [0, {vocab}); got {list(stop_ids)}."
      )
    self._stop_ids = _stop_array(stop_ids)
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
    }
    self._kept: list[Sequence] = []  # stopped and kept, in stop order

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
      if self.mesh is not None:
        rep = jax.sharding.NamedSharding(
          self.mesh, jax.sharding.PartitionSpec()
        )
      pool = self._pool_sharding()
      outs = {"segment": (pool, pool, rep), "extend": (pool, pool)}[name]
      self._programs[key] = jax.jit(
        make(), donate_argnums=(1, 2), out_shardings=outs
      )
    return self._programs[key]

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

  def _table(self, seqs) -> np.ndarray:
    table = np.zeros((len(seqs), self.pages_per_row), np.int32)
    for i, seq in enumerate(seqs):
      if seq is not None:
        table[i, : len(seq.pages)] = seq.pages
    return table

  # --- scheduling -------------------------------------------------------------

  def run(
    self,
    model,
    *,
    on_stop: Optional[Callable[[list], None]] = None,
    poll: Optional[Callable[[bool], bool]] = None,
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
    """
    graphdef, state = nnx.split(model)
    self._ensure_pool()
    queued = [s for s in self._waiting]
    while True:
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
    todo = [s for s in seqs if _needs_prefill(s)]
    ready = {s for s in seqs if not _needs_prefill(s)}
    placed = []
    for seq in todo:
      if self._grow(seq, len(seq.tokens) - 1):
        placed.append(seq)
      elif not self._preempt_for(seq):
        continue
      elif self._grow(seq, len(seq.tokens) - 1):
        placed.append(seq)
    extend = self._program(
      "extend",
      graphdef,
      lambda: _extend_program(graphdef),
    )
    chunk = 256
    while True:
      rows = [s for s in placed if _needs_prefill(s)]
      if not rows:
        break
      by_shard = [[s for s in rows if s.shard == d] for d in range(self.shards)]
      r = _bucket(max(len(b) for b in by_shard), 1)
      width = _bucket(
        min(chunk, max(len(s.tokens) - 1 - s.cached for s in rows)), 16
      )
      grid = [None] * (r * self.shards)
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
      self._pool = extend(
        state, *self._pool, self._table(grid), cached, tokens, mask
      )
      for i, s in enumerate(grid):
        if s is not None:
          s.cached += int(mask[i].sum())
    return ready | set(placed)

  def _preempt_for(self, seq: Sequence) -> bool:
    """Free pages for `seq`: first those of the most recently stopped
    idle kept sequence of its shard (one waiting to be extended or forked;
    it is re-prefilled from its tokens when it continues), else those of
    the latest admitted running one (re-queued)."""
    idle = [
      s
      for s in self._kept
      if s.shard == seq.shard
      and s.pages
      and s is not seq
      and s is not seq.parent
      and not s.pending_children
      and s.done
      and not s.released
    ]
    if idle:
      victim = idle[-1]
      self._decref(victim.shard, victim.pages)
      victim.pages, victim.cached = [], 0
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
    rows_seqs = self._rows()
    s = self.settings._replace(slots=len(rows_seqs))
    slots = rows_seqs
    b = s.slots
    rows = {
      "cached": np.zeros(b, np.int32),
      "last": np.zeros(b, np.int32),
      "steps": np.zeros(b, np.int32),
      "active": np.zeros(b, bool),
      "limit": np.zeros(b, np.int32),
      "capacity": np.full(b, self.max_length, np.int32),
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
      count = int(out["emitted"][i])
      seq.cached += count
      seq.tokens += out["tokens"][i, :count].tolist()
      seq.sampled += [1] * count
      seq.logp += out["logp"][i, :count].tolist()
      seq.full_logp += out["full_logp"][i, :count].tolist()
      seq.temperature += out["temperature"][i, :count].tolist()
      reason = int(out["reason"][i])
      if self.stop_rule is not None and count:
        cut = self.stop_rule(seq)
        if cut is not None:
          self._truncate(seq, int(cut))
          reason = STOP_RULE
      if reason != RUNNING:
        seq.stop_reason = reason
        self._slots[self._slots.index(seq)] = None
        if not seq.keep:
          seq.released = True
        else:
          self._kept.append(seq)
        self._maybe_free(seq)
        stopped.append(seq)
    return stopped

  def _truncate(self, seq: Sequence, keep: int) -> None:
    """Keep the first `keep` tokens of this turn (a stop rule's cut)."""
    end = seq.turn_start + min(max(int(keep), 1), len(seq.turn))
    for field in ("sampled", "logp", "full_logp", "temperature"):
      setattr(seq, field, getattr(seq, field)[: end - seq.prompt_length])
    seq.tokens = seq.tokens[:end]
    seq.cached = min(seq.cached, len(seq.tokens) - 1)


def _needs_prefill(seq: Sequence) -> bool:
  """Whether tokens before the pending last one are not yet cached."""
  return seq.cached < len(seq.tokens) - 1


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


def _host_rows(x) -> np.ndarray:
  """All rows of `x` on this host (replicated first when it spans
  several processes)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    whole = jax.sharding.NamedSharding(
      x.sharding.mesh, jax.sharding.PartitionSpec()
    )
    x = jax.jit(lambda a: a, out_shardings=whole)(x)
  return np.asarray(x)


def rollout(
  engine: Engine,
  model,
  prompt_tokens_PS,
  prompt_mask_PS,
  *,
  key: jax.Array,
  max_new_tokens: int,
  num_samples: int | abc.Sequence[int] = 1,
  temperature: float = 1.0,
  group_size: Optional[int] = None,
  width: Optional[int] = None,
) -> Rollout:
  """`generate`'s `Rollout` from the engine: G samples of P prompts.

  Prompts come left-padded as for `generate`; the engine decodes them
  unpadded. Prompt p's sample g draws with ``fold_in(fold_in(key, p), g)``.
  `num_samples` may differ per prompt (a sequence of P counts >= 1): G is
  their maximum (or `group_size`), and a prompt's samples past its count
  are empty, with ``sample_mask_PG`` 0. Completions have at most
  `max_new_tokens` tokens in a rollout `width` tokens wide (default
  `max_new_tokens`; a wider one keeps the shapes of a run whose budget
  changes). The result is numpy, the whole batch on every process.
  """
  tokens = _host_rows(prompt_tokens_PS).astype(np.int32)
  mask = _host_rows(prompt_mask_PS).astype(np.int32)
  _check_prompts(tokens, mask, model.config, 0)
  _check_prompt_values(tokens, mask, model.config)
  width = int(max_new_tokens if width is None else width)
  if width < max_new_tokens:
    raise ValueError(
      f"width={width} is below max_new_tokens={max_new_tokens}; the rollout"
      " must hold the longest completion."
    )
  if tokens.shape[1] + width > engine.max_length:
    raise ValueError(
      f"prompt_tokens_PS width {tokens.shape[1]} + rollout width {width}"
      f" exceeds the engine's max_length ({engine.max_length})."
    )
  p, s = tokens.shape
  counts = np.broadcast_to(np.asarray(num_samples, np.int64), (p,))
  if counts.min() < 1:
    raise ValueError(f"num_samples must be >= 1 per prompt; got {counts}.")
  g, t = int(group_size or counts.max()), width
  if g < counts.max():
    raise ValueError(
      f"group_size={group_size} is below the largest num_samples"
      f" ({counts.max()})."
    )
  keys = jax.random.wrap_key_data(_fold_keys(jax.random.key_data(key), 0, p))
  groups = [
    engine.add(
      row[m > 0],
      key=keys[i],
      max_new_tokens=int(max_new_tokens),
      num_samples=int(counts[i]),
      temperature=temperature,
      shard=i * engine.shards // p,
    )
    for i, (row, m) in enumerate(zip(tokens, mask))
  ]
  engine.run(model)
  out = RolloutBuilder(p, g, t)
  for i, group in enumerate(groups):
    for j, seq in enumerate(group):
      out.put(i, j, seq)
  return out.rollout(
    np.broadcast_to(tokens[:, None], (p, g, s)),
    np.broadcast_to(mask[:, None], (p, g, s)),
  )


class RolloutBuilder:
  """A [P, G, T] `Rollout` filled sample by sample from engine sequences
  (or given tokens); samples never put are invalid (``sample_mask_PG``
  0)."""

  def __init__(self, p: int, g: int, width: int):
    self.shape = (p, g, width)
    self.tokens = np.zeros(self.shape, np.int32)
    self.mask = np.zeros(self.shape, np.int32)
    self.logp = np.zeros(self.shape, np.float32)
    self.full_logp = np.zeros(self.shape, np.float32)
    self.truncated = np.zeros((p, g), bool)
    self.present = np.zeros((p, g), np.int32)

  def put(self, i: int, j: int, seq: Sequence) -> None:
    """Sample (i, j) is `seq`'s completion, with its log-probs."""
    n = len(seq.completion)
    self.tokens[i, j, :n] = seq.completion
    self.mask[i, j, :n] = 1
    self.logp[i, j, :n] = seq.logp[:n]
    self.full_logp[i, j, :n] = seq.full_logp[:n]
    self.truncated[i, j] = seq.stop_reason not in (STOP_ID, STOP_RULE)
    self.present[i, j] = 1

  def put_tokens(
    self,
    i: int,
    j: int,
    ids,
    logp=None,
    full_logp=None,
    truncated: bool = False,
  ) -> None:
    """Sample (i, j) is the given `ids` with their log-probs (None: 0, not
    sampled)."""
    ids = list(ids)[: self.shape[2]]
    n = len(ids)
    self.tokens[i, j, :n] = ids
    self.mask[i, j, :n] = 1
    if logp is not None:
      self.logp[i, j, :n] = list(logp)[:n]
    if full_logp is not None:
      self.full_logp[i, j, :n] = list(full_logp)[:n]
    self.truncated[i, j] = truncated
    self.present[i, j] = 1

  def put_after(self, i: int, j: int, seq: Sequence, n: int) -> None:
    """Sample (i, j) continues at token `n` (after a prefix put with
    `put_tokens`) with `seq`'s completion and its log-probs."""
    m = max(0, min(len(seq.completion), self.shape[2] - n))
    sl = slice(n, n + m)
    self.tokens[i, j, sl] = seq.completion[:m]
    self.mask[i, j, sl] = 1
    self.logp[i, j, sl] = seq.logp[:m]
    self.full_logp[i, j, sl] = seq.full_logp[:m]
    self.truncated[i, j] = seq.stop_reason not in (STOP_ID, STOP_RULE)
    self.present[i, j] = 1

  def rollout(self, prompt_tokens_PGS, prompt_mask_PGS) -> Rollout:
    p, g, _ = self.shape
    return Rollout(
      prompt_tokens_PGS=prompt_tokens_PGS,
      prompt_mask_PGS=prompt_mask_PGS,
      tokens_PGT=self.tokens,
      mask_PGT=self.mask,
      logp_PGT=self.logp,
      truncated_PG=self.truncated,
      group_ids_PG=np.broadcast_to(
        np.arange(p, dtype=np.int32)[:, None], (p, g)
      ),
      full_logp_PGT=self.full_logp,
      sample_mask_PG=self.present,
    )
