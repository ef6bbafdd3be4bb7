"""Gemma's pieces in rljax alone: the windowed KV cache (ring buffers for
sliding-window layers) against the full cache and the cache-free forward,
its memory, and config checks. Parity with transformers is in
tests/parity/gemma_test.py."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import checkpoints
from rljax import models
from rljax.models import ModelConfig

S, F = "sliding_attention", "full_attention"


def _config(layer_types=(S, S, F), window=3, **kw):
  return ModelConfig(
    vocab_size=50,
    hidden_size=32,
    intermediate_size=48,
    num_layers=len(layer_types),
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    embed_scale=True,
    norm_offset=True,
    activation="gelu_tanh",
    post_norms=True,
    qk_norm=True,
    query_pre_attn_scalar=16,
    final_logit_softcap=5.0,
    attn_logit_softcap=4.0,
    sliding_window=window,
    layer_types=layer_types,
    local_rope_theta=100.0,
    **kw,
  )


def _model(config):
  model = models.Transformer(config, rngs=nnx.Rngs(0))
  key = jax.random.key(1)
  for path, p in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    key, sub = jax.random.split(key)
    std = 0.5 if "norm" in path[-1] else 0.3
    p.set_value(std * jax.random.normal(sub, p.shape))
  return model


# Two rows of 7 prompt slots, one left-padded; 6 tokens decoded one by one.
PROMPT = np.array([[0, 0, 4, 9, 13, 2, 7], [5, 1, 22, 3, 8, 41, 6]])
PROMPT_MASK = (np.arange(7)[None] >= np.array([[2], [0]])).astype(np.int32)
NEXT = np.array(
  [[3, 11, 19, 27, 35, 43, 1, 9, 17], [2, 4, 6, 8, 10, 12, 14, 16, 18]]
)


@nnx.jit
def _step(model, tokens, mask, positions, cache, index):
  return model(
    tokens, mask, positions_BS=positions, cache=cache, cache_index=index
  )


def _cached_logits(model, windowed, chunk):
  """Logits of every token fed through a cache: the prompt in chunks of
  `chunk` slots, then one token per step (jitted steps, host loop)."""
  tokens = np.concatenate([PROMPT, NEXT], 1)
  mask = np.concatenate([PROMPT_MASK, np.ones_like(NEXT)], 1)
  positions = np.asarray(models.positions_from_mask(mask))
  cache = models.init_cache(model.config, 2, tokens.shape[1], windowed=windowed)
  out = []
  width = PROMPT.shape[1]
  starts = list(range(0, width, chunk)) + list(range(width, tokens.shape[1]))
  ends = starts[1:] + [tokens.shape[1]]
  for lo, hi in zip(starts, ends):
    part = slice(lo, hi)
    logits, cache = _step(
      model, tokens[:, part], mask[:, part], positions[:, part], cache, lo
    )
    out.append(np.asarray(logits))
  return np.concatenate(out, 1), cache


@pytest.mark.parametrize(
  "layer_types,window,chunk",
  [((S, S, F), 3, 7), ((S, F), 5, 2), ((S, S), 2, 3)],
)
def test_windowed_cache_equals_full_cache_and_forward(
  layer_types, window, chunk
):
  model = _model(_config(layer_types, window))
  tokens = np.concatenate([PROMPT, NEXT], 1)
  mask = np.concatenate([PROMPT_MASK, np.ones_like(NEXT)], 1)
  want = np.asarray(nnx.jit(lambda m, t, k: m(t, k)[0])(model, tokens, mask))
  ring, cache = _cached_logits(model, True, chunk)
  full, _ = _cached_logits(model, False, chunk)
  real = mask > 0
  np.testing.assert_allclose(np.asarray(ring)[real], want[real], atol=2e-5)
  np.testing.assert_allclose(np.asarray(full)[real], want[real], atol=2e-5)
  assert cache.k_local.shape[2] == window  # the ring, not max_length
  assert cache.k.shape[0] == layer_types.count(F)


def test_window_changes_the_logits():
  """Guards the test above: a window of 3 is not a full attention."""
  model = _model(_config())
  wide = nnx.merge(*nnx.split(model))
  wide.config = _config(window=100)
  tokens = np.concatenate([PROMPT, NEXT], 1)
  a, b = (np.asarray(m(jnp.asarray(tokens))[0]) for m in (model, wide))
  assert np.abs(a - b).max() > 1e-2


def _bytes(config, length, windowed):
  cache = jax.eval_shape(
    lambda: models.init_cache(config, 1, length, windowed=windowed)
  )
  return models.cache_bytes(cache)


def test_cache_bytes_of_gemma_configs():
  """Gemma 2 2B (alternating, window 4096) and Gemma 3 1B (5:1, window
  512) at 8192 tokens per row, bfloat16: the windowed cache's bytes."""
  gemma2 = ModelConfig(
    vocab_size=256000,
    hidden_size=2304,
    intermediate_size=9216,
    num_layers=26,
    num_heads=8,
    num_kv_heads=4,
    head_dim=256,
    dtype="bfloat16",
    sliding_window=4096,
    layer_types=(S, F) * 13,
  )
  gemma3 = ModelConfig(
    vocab_size=262144,
    hidden_size=1152,
    intermediate_size=6912,
    num_layers=26,
    num_heads=4,
    num_kv_heads=1,
    head_dim=256,
    dtype="bfloat16",
    sliding_window=512,
    layer_types=tuple(S if (i + 1) % 6 else F for i in range(26)),
  )
  # Per row and token of a full cache: 2 (k, v) * L * N * K * 2 bytes.
  assert _bytes(gemma2, 8192, False) == 2 * 26 * 4 * 256 * 2 * 8192
  assert _bytes(gemma2, 8192, True) == 2 * 4 * 256 * 2 * (13 * 8192 + 13 * 4096)
  assert _bytes(gemma3, 8192, False) == 2 * 26 * 256 * 2 * 8192
  assert _bytes(gemma3, 8192, True) == 2 * 256 * 2 * (4 * 8192 + 22 * 512)


def test_bad_layer_types_are_named():
  with pytest.raises(ValueError, match="layer_types has 2 entries"):
    _config(layer_types=(S, F)).__class__(
      **{**vars(_config()), "layer_types": (S, F)}
    )
  with pytest.raises(ValueError, match="sliding_window"):
    ModelConfig(**{**vars(_config()), "sliding_window": None})
  with pytest.raises(ValueError, match="activation"):
    ModelConfig(**{**vars(_config()), "activation": "relu"})


def test_windowed_prefix_is_refused():
  model = _model(_config())
  prefix = models.init_cache(model.config, 1, 4)
  with pytest.raises(ValueError, match="windowed=False"):
    model(jnp.ones((1, 2), jnp.int32), prefix=prefix)


def test_grouped_completion_logprobs_equal_token_logprobs():
  """Prefix Grouper's shared-prompt forward respects the window too."""
  model = _model(_config())
  completions = np.stack([NEXT, NEXT[::-1]], 1)  # [P=2, G=2, T]
  comp_mask = np.ones_like(completions)
  comp_mask[0, 1, -2:] = 0
  got, _ = nnx.jit(models.grouped_completion_logprobs)(
    model, PROMPT, PROMPT_MASK, completions, comp_mask
  )
  rows = np.concatenate(
    [np.repeat(PROMPT, 2, 0), completions.reshape(4, -1)], 1
  )
  mask = np.concatenate(
    [np.repeat(PROMPT_MASK, 2, 0), comp_mask.reshape(4, -1)], 1
  )
  want, _ = nnx.jit(models.token_logprobs)(model, rows, mask)
  t = completions.shape[-1]
  np.testing.assert_allclose(
    np.asarray(got).reshape(4, t), np.asarray(want)[:, -t:], atol=2e-5
  )


def test_gemma3_config_in_the_transformers_4_style():
  """Hub Gemma 3 config.json files written before transformers 5: top-level
  rope_theta / rope_scaling, rope_local_base_freq, no layer_types."""
  hf = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "vocab_size": 50,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 7,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "query_pre_attn_scalar": 8,
  }
  c = checkpoints.config_from_hf(hf)
  assert c.sliding_layers == (True,) * 5 + (False, True)
  assert (c.rope_theta, c.local_rope_theta) == (1_000_000.0, 10_000.0)
  assert c.rope_scaling == models.LinearRopeScaling(factor=8.0)
  assert c.final_logit_softcap is None and c.attn_logit_softcap is None
  assert c.qk_norm and c.post_norms and c.tie_embeddings
