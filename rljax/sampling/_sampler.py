"""The in-JAX sampler: one prefill into a KV cache, then a jitted decode loop.

Layout: P prompts, G samples per prompt (``num_samples``), S prompt slots, T
new tokens. Prompts are left-padded. Each prompt is prefilled once and its
cache is copied to its G rows, so prefill costs P rows, not P * G. Decoding
runs all P * G rows together in a `lax.while_loop` that exits as soon as
every row has stopped.

A row stops after its first stop id (the stop token is part of the
completion and its mask) or after ``max_new_tokens`` tokens (then
``truncated``). After it stops a row emits the pad token 0 with mask 0.
"""

from collections.abc import Sequence
import functools
from typing import NamedTuple, Optional

from flax import nnx
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax.models._transformer import KVCache
from rljax.models._transformer import Transformer
from rljax.models._transformer import init_cache
from rljax.models._transformer import positions_from_mask
from rljax.sampling._logits import _process

PAD = 0


class Rollout(NamedTuple):
  """Sampled completions in group layout: P prompts x G samples.

  Masks are int32 0/1; log-probs are float32 and 0 where the mask is 0.
  """

  prompt_tokens_PGS: jax.Array  # the left-padded prompt, repeated G times
  prompt_mask_PGS: jax.Array  # 1 on real prompt tokens
  tokens_PGT: jax.Array  # completion; PAD after the row stopped
  mask_PGT: jax.Array  # 1 up to and including the stop token
  logp_PGT: jax.Array  # the sampler's log-prob of each sampled token
  truncated_PG: jax.Array  # bool: no stop id within max_new_tokens
  group_ids_PG: jax.Array  # int32 prompt index p of every sample
  # log-prob under the full distribution at the sampling temperature (no
  # top-k / top-p): what the trainer's log-probs recompute.
  full_logp_PGT: jax.Array
  # int32 1 on samples that exist: a prompt given fewer than G samples
  # leaves the rest empty (mask 0) and invalid.
  sample_mask_PG: jax.Array
  # Mixture-of-experts models: int32 [P, G, L layers, W = S + T, K] the
  # experts that routed each prompt slot and completion token, to replay in
  # the update (`rljax.models.Transformer.hidden_states`'s routing_LBSK).
  # The last completion token is never fed back, so its (unused) entry is
  # 0. None for dense models.
  routing_PGLWK: Optional[jax.Array] = None
  # int32 the version of the weights that sampled each completion token, in
  # a rollout whose weights changed while it ran (a partial rollout across
  # updates: `Engine.run`'s refresh); None when one set of weights sampled
  # it all.
  version_PGT: Optional[jax.Array] = None


class _Settings(NamedTuple):
  """Static (hashable) sampler settings: one compiled program per value."""

  max_new_tokens: int
  num_samples: int
  top_k: Optional[int]
  use_top_p: bool
  greedy: bool


class _Knobs(NamedTuple):
  """Traced settings: changing them does not recompile."""

  temperature: jax.Array  # f32 scalar
  top_p: jax.Array  # f32 scalar
  stop_ids: jax.Array  # int32 [n], padded with -1 (never a token)


class _Decode(NamedTuple):
  """The decode loop's carry: step t is the index of the next new token."""

  t: jax.Array
  cache: KVCache
  last_B: jax.Array  # the token sampled at step t - 1
  done_B: jax.Array
  tokens_BT: jax.Array
  mask_BT: jax.Array
  logp_BT: jax.Array
  full_BT: jax.Array
  experts_LBTK: Optional[jax.Array] = None  # routing of fed tokens (MoE)


def _sample(logits_BV, key, s: _Settings, k: _Knobs):
  """A token per row and its log-prob under the distribution it came from
  and under the full distribution at the temperature."""
  full = jax.nn.log_softmax(
    jnp.asarray(logits_BV, jnp.float32) / k.temperature, axis=-1
  )
  if s.greedy:
    tokens = jnp.argmax(logits_BV, axis=-1)
    logits = logits_BV
  else:
    top_p = k.top_p if s.use_top_p else None
    logits = _process(logits_BV, k.temperature, s.top_k, top_p)
    tokens = jax.random.categorical(key, logits, axis=-1)
  logp = jax.nn.log_softmax(logits, axis=-1)

  def pick(x):
    return jnp.take_along_axis(x, tokens[:, None], -1)[:, 0]

  return tokens.astype(jnp.int32), pick(logp), pick(full)


def _record(c: _Decode, tokens_B, logp_B, full_B, stop_ids) -> _Decode:
  """Write step t's tokens (PAD for stopped rows) and update `done`."""
  alive = ~c.done_B
  tokens = jnp.where(alive, tokens_B, PAD)
  is_stop = jnp.any(tokens[:, None] == stop_ids[None, :], axis=-1)

  def put(buf, col):
    return jax.lax.dynamic_update_slice(buf, col[:, None], (0, c.t))

  return c._replace(
    t=c.t + 1,
    last_B=tokens,
    done_B=c.done_B | (alive & is_stop),
    tokens_BT=put(c.tokens_BT, tokens),
    mask_BT=put(c.mask_BT, alive.astype(jnp.int32)),
    logp_BT=put(c.logp_BT, jnp.where(alive, logp_B, 0.0)),
    full_BT=put(c.full_BT, jnp.where(alive, full_B, 0.0)),
  )


def _repeat(x, g: int, axis: int) -> jax.Array:
  """Repeat every entry of `axis` g times in place (p -> p*g .. p*g+g-1)."""
  x = jnp.expand_dims(x, axis + 1)
  shape = x.shape[: axis + 1] + (g,) + x.shape[axis + 2 :]
  x = jnp.broadcast_to(x, shape)
  return x.reshape(shape[:axis] + (-1,) + shape[axis + 2 :])


def _prefill(model, tokens_PS, mask_PS, g: int, max_length: int):
  """Prefill each prompt once; its cache, last logits and (MoE) routing
  [L, B, S, K] for its g rows."""
  p = tokens_PS.shape[0]
  cache = init_cache(model.config, p, max_length)
  moe = bool(model.config.num_experts)
  hidden, cache, *routing = model.hidden_states(
    tokens_PS,
    mask_PS,
    positions_BS=positions_from_mask(mask_PS),
    cache=cache,
    cache_index=0,
    return_routing=moe,
  )
  # Left padding puts every prompt's last real token in the last slot.
  logits_PV = model.logits(hidden[:, -1:])[:, 0]
  cache = KVCache(
    *(
      None if x is None else _repeat(x, g, 0 if x.ndim == 2 else 1)
      for x in cache
    )
  )
  experts = _repeat(routing[0].experts, g, 1) if moe else None
  return cache, _repeat(logits_PV, g, 0), experts


def _decode(model, cache, logits_BV, lengths_B, key, s, k: _Knobs, width):
  """Sample T tokens for every row; stop early once all rows are done."""
  t_max = s.max_new_tokens
  # Built from lengths_B so that they inherit its sharding on a mesh.
  zeros_B = jnp.zeros_like(lengths_B, jnp.int32)
  zeros_BT = zeros_B[:, None] + jnp.zeros((1, t_max), jnp.int32)
  c = _Decode(
    jnp.int32(0),
    cache,
    zeros_B,
    zeros_B != 0,
    zeros_BT,
    zeros_BT,
    zeros_BT.astype(jnp.float32),
    zeros_BT.astype(jnp.float32),
  )
  c = c._replace(experts_LBTK=_experts_buffer(model.config, zeros_BT))
  first = _sample(logits_BV, jax.random.fold_in(key, 0), s, k)
  c = _record(c, *first, k.stop_ids)

  def body(c: _Decode) -> _Decode:
    # Feed the previous token: slot width + t - 1, position length + t - 1.
    hidden, cache, *routing = model.hidden_states(
      c.last_B[:, None],
      jnp.ones_like(c.last_B)[:, None],
      positions_BS=(lengths_B + c.t - 1)[:, None],
      cache=c.cache,
      cache_index=width + c.t - 1,
      return_routing=c.experts_LBTK is not None,
    )
    if routing:  # the fed token t - 1's experts
      experts = jax.lax.dynamic_update_slice_in_dim(
        c.experts_LBTK, routing[0].experts, c.t - 1, axis=2
      )
      c = c._replace(experts_LBTK=experts)
    logits = model.logits(hidden)[:, 0]
    step = _sample(logits, jax.random.fold_in(key, c.t), s, k)
    return _record(c._replace(cache=cache), *step, k.stop_ids)

  def cond(c: _Decode) -> jax.Array:
    return (c.t < t_max) & ~jnp.all(c.done_B)

  if t_max == 1:  # nothing left to decode: skip compiling the loop
    return c
  return jax.lax.while_loop(cond, body, c)


def _experts_buffer(config, zeros_BT) -> Optional[jax.Array]:
  """int32 zeros [L, B, T, K] for a mixture of experts' routing, else None."""
  if not config.num_experts:
    return None
  shape = (config.num_layers, *zeros_BT.shape, config.experts_per_token)
  return jnp.broadcast_to(zeros_BT[None, :, :, None], shape)


def _routing(prompt_LBSK, completion_LBTK, p: int, g: int):
  """[P, G, L, S + T, K] from the prefill's and the decode's routing."""
  if prompt_LBSK is None:
    return None
  both = jnp.concatenate([prompt_LBSK, completion_LBTK], axis=2)
  both = jnp.moveaxis(both, 0, 1)
  return both.reshape((p, g) + both.shape[1:])


@functools.partial(jax.jit, static_argnames=("graphdef", "s"))
def _generate(graphdef, state, tokens_PS, mask_PS, key, s: _Settings, k):
  """The whole sampler as one compiled program."""
  model = nnx.merge(graphdef, state)
  p, width = tokens_PS.shape
  g = s.num_samples
  cache, logits_BV, prompt_experts = _prefill(
    model, tokens_PS, mask_PS, g, width + s.max_new_tokens
  )
  lengths_B = _repeat(jnp.sum(mask_PS, axis=-1), g, 0)
  c = _decode(model, cache, logits_BV, lengths_B, key, s, k, width)

  def groups(x):
    return x.reshape((p, g) + x.shape[1:])

  return Rollout(
    prompt_tokens_PGS=jnp.broadcast_to(tokens_PS[:, None], (p, g, width)),
    prompt_mask_PGS=jnp.broadcast_to(mask_PS[:, None], (p, g, width)),
    tokens_PGT=groups(c.tokens_BT),
    mask_PGT=groups(c.mask_BT),
    logp_PGT=groups(c.logp_BT),
    full_logp_PGT=groups(c.full_BT),
    truncated_PG=groups(~c.done_B),
    sample_mask_PG=jnp.ones((p, g), jnp.int32),
    group_ids_PG=jnp.broadcast_to(
      jnp.arange(p, dtype=jnp.int32)[:, None], (p, g)
    ),
    routing_PGLWK=_routing(prompt_experts, c.experts_LBTK, p, g),
  )


def _check_settings(
  max_new_tokens, num_samples, temperature, top_k, top_p, greedy
) -> None:
  """Hyperparameter checks, before anything is traced."""
  checks.positive(max_new_tokens=max_new_tokens, num_samples=num_samples)
  named = dict(max_new_tokens=max_new_tokens, num_samples=num_samples)
  for name, value in (*named.items(), ("top_k", top_k)):
    if value is not None and int(value) != value:
      raise ValueError(f"{name} must be an integer; got {value!r}.")
  if not greedy:
    checks.positive(temperature=temperature)
  if top_k is not None:
    checks.positive(top_k=top_k)
  if top_p is not None and not 0 < top_p <= 1:
    raise ValueError(f"top_p must be in (0, 1]; got {top_p!r}.")


def _stop_array(stop_ids: tuple[int, ...]) -> jax.Array:
  """Stop ids padded with -1 to a multiple of 8 (fewer recompiles)."""
  n = -(-max(len(stop_ids), 1) // 8) * 8
  return jnp.asarray(stop_ids + (-1,) * (n - len(stop_ids)), jnp.int32)


def _check_prompts(tokens, mask, config, max_new_tokens: int) -> None:
  """Shape checks, and value checks when the prompts are concrete arrays."""
  checks.rank("prompt_tokens_PS", tokens, 2, "[P prompts, S slots]")
  checks.same_shape(("prompt_tokens_PS", "prompt_mask_PS"), tokens, mask)
  total = np.shape(tokens)[1] + max_new_tokens
  if total > config.max_position_embeddings:
    raise ValueError(
      f"prompt_tokens_PS width {np.shape(tokens)[1]} + max_new_tokens"
      f" {max_new_tokens} = {total} exceeds the model's"
      f" max_position_embeddings ({config.max_position_embeddings}); use"
      " shorter prompts or fewer new tokens."
    )
  if isinstance(tokens, jax.core.Tracer) or isinstance(mask, jax.core.Tracer):
    return
  for block, block_mask in zip(_readable(tokens), _readable(mask)):
    _check_prompt_values(block, block_mask, config)


def _readable(x) -> list[np.ndarray]:
  """The blocks of `x` this process can read: all of it, or its own shards
  of an array that spans several processes (each checks its own)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return [np.asarray(s.data) for s in x.addressable_shards]
  return [np.asarray(x)]


def _check_prompt_values(tokens, mask, config) -> None:
  """Ids inside the vocabulary, masks left-padded."""
  if tokens.size and not 0 <= tokens.min() <= tokens.max() < config.vocab_size:
    raise ValueError(
      f"prompt_tokens_PS must hold ids in [0, {config.vocab_size}); got"
      f" values in [{tokens.min()}, {tokens.max()}]."
    )
  if np.any(np.diff(mask != 0, axis=-1) < 0) or not np.all(mask[:, -1]):
    raise ValueError(
      "prompt_mask_PS must be left-padded (0...0 1...1) with at least one"
      " real token per prompt; pad prompts on the left (rljax.tokenizers"
      " does)."
    )


def generate(
  model: Transformer,
  prompt_tokens_PS: ArrayLike,
  prompt_mask_PS: ArrayLike,
  *,
  key: jax.Array,
  max_new_tokens: int,
  num_samples: int = 1,
  temperature: float = 1.0,
  top_k: Optional[int] = None,
  top_p: Optional[float] = None,
  greedy: bool = False,
  stop_ids: Sequence[int] = (),
) -> Rollout:
  """Sample `num_samples` completions of every left-padded prompt.

  Each step samples y_t ~ softmax(top_p(top_k(logits / temperature))) (the
  transformers order: temperature, then top-k, then top-p), or takes
  argmax(logits) when `greedy`. The returned ``logp_PGT`` is log of that
  processed distribution at y_t (temperature 1 when greedy): the "rollout"
  log-probs that mismatch corrections (`rljax.masks.token_tis`) compare
  with the trainer's. With top-k / top-p off it equals
  `rljax.models.token_logprobs` at the same temperature.

  Compiles once per model structure, prompt shape, `max_new_tokens`,
  `num_samples`, `top_k`, `greedy` and whether top-p is on; `temperature`,
  the `top_p` value and `stop_ids` are traced, so changing them does not
  recompile. Step t draws with ``fold_in(key, t)``, rows independently, so a
  fixed key gives the same rollout.

  Args:
    model: the policy.
    prompt_tokens_PS: [P, S] int prompt ids, left-padded.
    prompt_mask_PS: [P, S] 1 on real tokens, 0 on (left) padding.
    key: PRNG key.
    max_new_tokens: T, the completion length budget.
    num_samples: G, samples per prompt (the group).
    temperature: divides the logits (> 0; ignored when greedy). verl,
      TRL and transformers default to 1.0.
    top_k: keep the k most likely tokens (ties at the k-th value are kept,
      as transformers does); None keeps all.
    top_p: nucleus: keep the smallest most-likely set with total probability
      >= top_p (transformers ``TopPLogitsWarper``); None or 1.0 keeps all.
    greedy: argmax decoding (transformers ``do_sample=False``).
    stop_ids: token ids that end a completion (e.g. the EOS ids); by
      default none, and every row runs to max_new_tokens.

  Returns:
    A `Rollout` with leading axes [P, G] and T = max_new_tokens.

  References:
    transformers ``GenerationMixin._sample`` and its logits warpers.
  """
  _check_settings(
    max_new_tokens, num_samples, temperature, top_k, top_p, greedy
  )
  stop_ids = tuple(int(i) for i in stop_ids)
  vocab = model.config.vocab_size
  if any(not 0 <= i < vocab for i in stop_ids):
    raise ValueError(
      f"stop_ids must be token ids in [0, {vocab}); got {list(stop_ids)}."
    )
  s = _Settings(
    max_new_tokens=int(max_new_tokens),
    num_samples=int(num_samples),
    top_k=None if greedy or top_k is None else int(top_k),
    use_top_p=not greedy and top_p is not None and top_p < 1,
    greedy=bool(greedy),
  )
  _check_prompts(prompt_tokens_PS, prompt_mask_PS, model.config, max_new_tokens)
  knobs = _Knobs(
    temperature=jnp.float32(1.0 if greedy else temperature),
    top_p=jnp.float32(1.0 if top_p is None else top_p),
    stop_ids=_stop_array(stop_ids),
  )
  graphdef, state = nnx.split(model)
  tokens = jnp.asarray(prompt_tokens_PS, jnp.int32)
  mask = jnp.asarray(prompt_mask_PS, jnp.int32)
  return _generate(graphdef, state, tokens, mask, key, s, knobs)
