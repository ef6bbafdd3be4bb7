"""token_logprobs against a numpy reference built from full-forward logits."""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import testing
from rljax.models import ModelConfig
from rljax.models import token_logprobs

_CONFIG = ModelConfig(
  vocab_size=8,
  hidden_size=16,
  intermediate_size=24,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
  tie_embeddings=False,
  qkv_bias=True,
  rms_norm_eps=1e-5,
)


def _batch(seed=0):
  # Row 0 unpadded, row 1 left-padded by 2, row 2 left-padded by 4 and
  # right-padded by 1 (a finished completion).
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, _CONFIG.vocab_size, (3, 7))
  mask = np.ones((3, 7), np.int32)
  mask[1, :2] = 0
  mask[2, :4] = 0
  mask[2, 6] = 0
  return jnp.asarray(tokens * mask, jnp.int32), jnp.asarray(mask)


_jit = testing.jit_model_fn


def _model(config=_CONFIG, **kw):
  return testing.random_model(config, **kw)


_forward = _jit(lambda m, t, am: m(t, am)[0])


@functools.cache
def _logprobs_at(temperature, schedule):
  return _jit(
    functools.partial(
      token_logprobs, temperature=temperature, schedule=schedule
    )
  )


def _logprobs(model, tokens, mask, temperature, schedule="auto"):
  return _logprobs_at(temperature, schedule)(model, tokens, mask)


def _reference(logits, tokens, mask, temperature):
  """Loops in float64: token s is scored by the logits at s - 1."""
  logits = np.asarray(logits, np.float64) / temperature
  logp = np.zeros(tokens.shape)
  entropy = np.zeros(tokens.shape)
  for b in range(tokens.shape[0]):
    for s in range(1, tokens.shape[1]):
      if mask[b, s] and mask[b, s - 1]:
        z = logits[b, s - 1] - logits[b, s - 1].max()
        log_probs = z - np.log(np.exp(z).sum())
        logp[b, s] = log_probs[tokens[b, s]]
        entropy[b, s] = -(np.exp(log_probs) * log_probs).sum()
  return logp, entropy


@pytest.mark.parametrize("schedule", ["auto", "dense", "chunked"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_numpy_reference(temperature, schedule):
  model = _model()
  tokens, mask = _batch()
  logp, entropy = _logprobs(model, tokens, mask, temperature, schedule)
  assert logp.dtype == jnp.float32 and entropy.dtype == jnp.float32
  ref_logp, ref_entropy = _reference(
    _forward(model, tokens, mask),
    np.asarray(tokens),
    np.asarray(mask),
    temperature,
  )
  np.testing.assert_allclose(logp, ref_logp, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
  # Zeros: position 0, padding, and the first real token after left padding.
  for b, s in [(0, 0), (1, 0), (1, 1), (1, 2), (2, 4), (2, 6)]:
    assert logp[b, s] == 0 and entropy[b, s] == 0
  assert (np.asarray(logp)[ref_logp != 0] < 0).all()


def test_uniform_model_by_hand():
  # All weights zero (norm scales 1): hidden states and logits are 0, so the
  # next-token distribution is uniform over V = 8 tokens at any temperature:
  # log p = -log 8 = -2.0794415, entropy = log 8 = 2.0794415.
  model = _model(scale=0.0)
  tokens, mask = _batch()
  logp, entropy = _logprobs(model, tokens, mask, temperature=0.7)
  predicted = np.zeros((3, 7), bool)
  predicted[0, 1:] = True
  predicted[1, 3:] = True
  predicted[2, 5] = True
  np.testing.assert_allclose(
    logp, np.where(predicted, -2.0794415, 0.0), atol=1e-6
  )
  np.testing.assert_allclose(
    entropy, np.where(predicted, 2.0794415, 0.0), atol=1e-6
  )


def test_gradient_is_finite_and_matches_finite_differences():
  model = _model(seed=1)
  tokens, mask = _batch(seed=1)
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(2)
  direction = jax.tree.map(
    lambda x: np.asarray(rng.standard_normal(x.shape), x.dtype), state
  )
  eps = 1e-3

  def loss(state):
    logp, entropy = token_logprobs(nnx.merge(graphdef, state), tokens, mask)
    return jnp.sum(logp) + 0.1 * jnp.sum(entropy)

  @functools.partial(
    jax.jit, compiler_options={"xla_backend_optimization_level": 0}
  )
  def grad_and_central_difference(state, direction):
    step = lambda sign: jax.tree.map(
      lambda x, d: x + sign * eps * d, state, direction
    )
    return jax.grad(loss)(state), (loss(step(1)) - loss(step(-1))) / (2 * eps)

  grads, numeric = grad_and_central_difference(state, direction)
  leaves = [np.asarray(g, np.float64) for g in jax.tree.leaves(grads)]
  assert all(np.isfinite(g).all() for g in leaves)
  assert all(np.abs(g).max() > 0 for g in leaves)
  analytic = sum(
    np.vdot(g, d) for g, d in zip(leaves, jax.tree.leaves(direction))
  )
  np.testing.assert_allclose(numeric, analytic, rtol=1e-2)


def test_bfloat16_model_gives_float32():
  config = ModelConfig(**(vars(_CONFIG) | {"dtype": "bfloat16"}))
  tokens, mask = _batch()
  logp16, entropy16 = _logprobs(_model(config), tokens, mask, temperature=1.0)
  logp32, _ = _logprobs(_model(), tokens, mask, temperature=1.0)
  assert logp16.dtype == jnp.float32 and entropy16.dtype == jnp.float32
  assert np.isfinite(np.asarray(logp16)).all()
  assert np.isfinite(np.asarray(entropy16)).all()
  np.testing.assert_allclose(logp16, logp32, atol=0.1)


def test_fused_and_dense_gradients_agree():
  # The default (chunked on CPU, custom_vjp) against plain autodiff of the
  # materialised logits, for every parameter.
  model = _model(seed=3)
  tokens, mask = _batch(seed=3)
  graphdef, state = nnx.split(model)

  def grads(schedule):
    def loss(state):
      logp, entropy = token_logprobs(
        nnx.merge(graphdef, state), tokens, mask, schedule=schedule
      )
      return jnp.sum(logp) + 0.1 * jnp.sum(entropy)

    return jax.jit(
      jax.grad(loss), compiler_options={"xla_backend_optimization_level": 0}
    )(state)

  for fused, dense in zip(
    jax.tree.leaves(grads("auto")), jax.tree.leaves(grads("dense"))
  ):
    np.testing.assert_allclose(fused, dense, rtol=1e-4, atol=1e-5)


def test_unknown_schedule_lists_the_choices():
  tokens, mask = _batch()
  with pytest.raises(ValueError, match="schedule must be one of.*chunked"):
    token_logprobs(_model(), tokens, mask, schedule="fast")


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_bad_temperature(temperature):
  tokens, mask = _batch()
  with pytest.raises(ValueError, match="temperature must be > 0"):
    token_logprobs(_model(), tokens, mask, temperature=temperature)
