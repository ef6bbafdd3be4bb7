"""The decoder: KV-cache decoding, padding, bfloat16, scan over layers."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import testing
from rljax.models import ModelConfig
from rljax.models import Transformer
from rljax.models import ValueModel
from rljax.models import init_cache
from rljax.models import positions_from_mask


def _config(**kw):
  base = dict(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=24,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    tie_embeddings=False,
    qkv_bias=True,
    qk_norm=True,
    rms_norm_eps=1e-5,
  )
  return ModelConfig(**(base | kw))


_jit = testing.jit_model_fn


def _model(config=None, **kw):
  return testing.random_model(config or _config(), **kw)


_forward = _jit(lambda model, tokens, mask: model(tokens, mask)[0])


def _left_padded(pads, length, vocab, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (len(pads), length))
  mask = np.ones((len(pads), length), np.int32)
  for row, pad in enumerate(pads):
    mask[row, :pad] = 0
    tokens[row, :pad] = 0
  return jnp.asarray(tokens, jnp.int32), jnp.asarray(mask)


def test_positions_from_mask_by_hand():
  mask = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
  # Row 0: cumsum - 1 = [-1, -1, 0, 1, 2], clipped at 0 on the padding.
  np.testing.assert_array_equal(
    positions_from_mask(mask), [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
  )


def test_logits_shape_dtype_and_param_layout():
  config = _config()
  # The real initialisers, jitted and with an rbg key: threefry's per-shape
  # compiles would take several times longer on CPU.
  key = jax.random.key(0, impl="rbg")
  model = nnx.jit(lambda: Transformer(config, rngs=nnx.Rngs(key)))()
  assert 0.015 < float(jnp.std(model.embed[...])) < 0.025
  np.testing.assert_array_equal(model.layers.attn_norm[...], 1.0)
  np.testing.assert_array_equal(model.layers.q_bias[...], 0.0)
  tokens = jnp.zeros((2, 5), jnp.int32)
  logits, cache = _jit(lambda m, t: m(t))(model, tokens)
  assert logits.shape == (2, 5, 32) and logits.dtype == jnp.float32
  assert cache is None
  assert model.layers.q_proj.shape == (2, 16, 4, 8)
  assert model.layers.q_proj.get_metadata()["logical_axes"] == (
    "layers",
    "embed",
    "heads",
    "head_dim",
  )
  assert model.unembedding().shape == (16, 32)


def test_tied_unembedding_is_the_transposed_embedding():
  model = _model(_config(tie_embeddings=True))
  assert not hasattr(model, "lm_head")
  np.testing.assert_array_equal(model.unembedding(), model.embed[...].T)


def test_left_padded_row_equals_the_row_alone():
  config = _config()
  model = _model(config)
  tokens, mask = _left_padded([0, 3], 8, config.vocab_size, seed=1)
  logits = _forward(model, tokens, mask)
  alone = _forward(model, tokens[1:, 3:], mask[1:, 3:])
  np.testing.assert_allclose(logits[1, 3:], alone[0], atol=1e-5, rtol=0)
  assert np.isfinite(np.asarray(logits)).all()
  # Padding is not a no-op: unmasking the pads changes the real logits.
  unmasked = _forward(model, tokens, jnp.ones_like(mask))
  assert np.abs(np.asarray(unmasked[1, 3:] - alone[0])).max() > 1e-2


@_jit
def _step(model, tokens, mask, positions, cache, index):
  return model(
    tokens, mask, positions_BS=positions, cache=cache, cache_index=index
  )


def test_kv_cache_decoding_matches_full_forward():
  config = _config()
  model = _model(config, seed=2)
  prompt_len, total, max_length = 6, 10, 12
  tokens, mask = _left_padded([0, 2, 5], total, config.vocab_size, seed=3)
  full = np.asarray(_forward(model, tokens, mask))
  positions = positions_from_mask(mask)
  cache = init_cache(config, 3, max_length)
  p = slice(0, prompt_len)
  prefill, cache = _step(
    model, tokens[:, p], mask[:, p], positions[:, p], cache, 0
  )
  real = np.asarray(mask[:, p], bool)
  np.testing.assert_allclose(
    np.asarray(prefill)[real], full[:, p][real], atol=1e-5, rtol=0
  )
  for t in range(prompt_len, total):
    n = slice(t, t + 1)
    logits, cache = _step(
      model, tokens[:, n], mask[:, n], positions[:, n], cache, t
    )
    np.testing.assert_allclose(logits[:, 0], full[:, t], atol=1e-5, rtol=0)
  np.testing.assert_array_equal(cache.mask[:, :total], mask)
  np.testing.assert_array_equal(cache.mask[:, total:], 0)


def test_cache_without_positions_raises():
  config = _config()
  model = _model(config)
  with pytest.raises(ValueError, match="positions_BS"):
    model(jnp.zeros((1, 2), jnp.int32), cache=init_cache(config, 1, 4))


def test_bfloat16_compute_close_to_float32():
  config = _config()
  model32 = _model(config)
  model16 = _model(_config(dtype="bfloat16"))  # same seed: same weights
  tokens, mask = _left_padded([0, 2], 8, config.vocab_size, seed=4)
  logits32 = np.asarray(_forward(model32, tokens, mask))
  logits16 = _forward(model16, tokens, mask)
  assert logits16.dtype == jnp.float32
  real = np.asarray(mask, bool)
  diff = np.abs(np.asarray(logits16) - logits32)[real]
  scale = np.abs(logits32[real]).max()
  assert np.isfinite(diff).all()
  assert diff.max() <= 0.05 * scale, (diff.max(), scale)
  assert diff.max() > 0  # bfloat16 really was used


def test_bfloat16_params_run():
  config = _config(dtype="bfloat16", param_dtype="bfloat16")
  model = _model(config)
  assert model.layers.q_proj[...].dtype == jnp.bfloat16
  logits = _forward(model, jnp.ones((2, 3), jnp.int32), jnp.ones((2, 3)))
  assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()


def _num_eqns(num_layers):
  model = _model(_config(num_layers=num_layers))
  graphdef, state = nnx.split(model)
  forward = lambda s, t: nnx.merge(graphdef, s)(t)[0]
  jaxpr = jax.make_jaxpr(forward)(state, jnp.zeros((1, 4), jnp.int32))
  return len(jaxpr.eqns), [e.primitive.name for e in jaxpr.eqns]


def test_program_size_does_not_grow_with_depth():
  shallow, names = _num_eqns(2)
  deep, _ = _num_eqns(8)
  assert "scan" in names
  assert shallow == deep


@_jit
def _logits_and_grads(model, tokens, mask):
  def loss(m):
    return jnp.sum(jnp.sin(m(tokens, mask)[0]) * mask[..., None])

  return model(tokens, mask)[0], nnx.grad(loss)(model)


@pytest.mark.parametrize("unroll", [2, 3, 8])
def test_unrolled_layers_equal_the_scan(unroll):
  # 3 layers: unroll=2 leaves a remainder iteration, 3 (or 8) unrolls all.
  scanned = _model(_config(num_layers=3), seed=7)
  unrolled = _model(_config(num_layers=3, scan_unroll=unroll), seed=7)
  graphdef, state = nnx.split(unrolled)
  jaxpr = jax.make_jaxpr(lambda s, t: nnx.merge(graphdef, s)(t)[0])(
    state, jnp.zeros((1, 4), jnp.int32)
  )
  (scan,) = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
  assert scan.params["unroll"] == unroll
  tokens, mask = _left_padded([0, 2], 7, 32, seed=8)
  logits_s, grads_s = _logits_and_grads(scanned, tokens, mask)
  logits_u, grads_u = _logits_and_grads(unrolled, tokens, mask)
  np.testing.assert_allclose(logits_u, logits_s, atol=1e-5, rtol=1e-5)
  for (path, g_s), (_, g_u) in zip(
    jax.tree_util.tree_leaves_with_path(nnx.state(grads_s)),
    jax.tree_util.tree_leaves_with_path(nnx.state(grads_u)),
  ):
    assert np.abs(np.asarray(g_s)).max() > 0, path
    np.testing.assert_allclose(g_u, g_s, atol=1e-4, rtol=1e-4, err_msg=path)
  # Decoding through the cache (a scan carry) also unrolls.
  cache = init_cache(unrolled.config, 2, 8)
  positions = positions_from_mask(mask)
  decoded, _ = _step(unrolled, tokens, mask, positions, cache, 0)
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(
    np.asarray(decoded)[real], np.asarray(logits_s)[real], atol=1e-5
  )


@_jit
def _values_and_grad(model, tokens, mask):
  def loss(m):
    return jnp.sum(m(tokens, mask) * mask)

  hidden, _ = model.trunk.hidden_states(tokens, mask)
  return model(tokens, mask), hidden, nnx.grad(loss)(model)


def test_value_model_values_and_gradient():
  config = _config()
  model = _model(config, seed=5, cls=ValueModel)
  tokens, mask = _left_padded([0, 3], 6, config.vocab_size, seed=6)
  values, hidden, grads = _values_and_grad(model, tokens, mask)
  assert values.shape == (2, 6) and values.dtype == jnp.float32
  head = np.asarray(model.head[...], np.float64)
  expected = np.asarray(hidden, np.float64) @ head + float(model.bias[...])
  np.testing.assert_allclose(values, expected, atol=1e-5, rtol=1e-5)
  leaves = jax.tree.leaves(grads)
  assert all(np.isfinite(np.asarray(g)).all() for g in leaves)
  assert np.abs(np.asarray(grads.trunk.layers.q_proj[...])).max() > 0
  # d sum(values * mask) / d bias = number of real tokens = 6 + 3.
  assert float(grads.bias[...]) == pytest.approx(9.0)
