"""The engine's device programs: the jitted decode segment, the prefill
of cached tokens, and the page copy of forks.

A segment decodes its rows until `segment` steps have run, every row has
stopped, or `refill` rows have freed. A row draws its token s with
``fold_in(its key, s)``, so its samples do not depend on the slot or the
segment it runs in.
"""

from collections.abc import Callable
import functools
from typing import NamedTuple, Optional

from flax import nnx
import jax
import jax.numpy as jnp

from rljax.models._transformer import PagedCache
from rljax.sampling._engine_sequence import CAPACITY
from rljax.sampling._engine_sequence import LENGTH
from rljax.sampling._engine_sequence import PAUSE
from rljax.sampling._engine_sequence import RUNNING
from rljax.sampling._engine_sequence import STOP_ID
from rljax.sampling._engine_sequence import StepInfo
from rljax.sampling._logits import _process


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
    c = _first_carry(k, v, rows, s)
    started = jnp.sum(rows["active"])

    def body(c: _Segment) -> _Segment:
      return _decode_step(model, s, c, pages_BM, rows, keys_B, stop_ids, top_p)

    def cond(c: _Segment) -> jax.Array:
      freed = started - jnp.sum(c.active_B)
      return (c.t < s.segment) & jnp.any(c.active_B) & (freed < refill)

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


def _first_carry(k, v, rows, s: _Settings) -> _Segment:
  """The decode loop's carry before its first step."""
  b, n = s.slots, s.segment
  zeros_BN = jnp.zeros((b, n), jnp.int32)
  return _Segment(
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


def _decode_step(
  model, s: _Settings, c: _Segment, pages_BM, rows, keys_B, stop_ids, top_p
) -> _Segment:
  """One decode step of the active rows: sample, record, and stop."""
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
  reason = _stop_reasons(token, steps, cached, rows, stop_ids)
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


def _stop_reasons(token, steps, cached, rows, stop_ids) -> jax.Array:
  """Why each row stops after sampling `token` (RUNNING: it goes on): a
  stop id, then its token budget, then the cache's capacity."""
  reason = jnp.where(
    jnp.any(token[:, None] == stop_ids[None], axis=-1), STOP_ID, RUNNING
  )
  reason = jnp.where(
    (reason == RUNNING) & (steps >= rows["limit"]), LENGTH, reason
  )
  # The pending token needs a cache slot when the sequence continues.
  return jnp.where(
    (reason == RUNNING) & (cached + 1 >= rows["capacity"]),
    CAPACITY,
    reason,
  )


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
