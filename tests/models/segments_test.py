"""Packed rows: segment ids keep examples apart in attention and log-probs."""

import jax.numpy as jnp
import numpy as np
import pytest

from rljax import testing
from rljax.models import ModelConfig
from rljax.models import init_cache
from rljax.models import token_logprobs
from rljax.models._transformer import positions_from_segments

_CONFIG = ModelConfig(
  vocab_size=16,
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
# One row: example A (4 tokens), example B (3 tokens), 2 padding tokens.
_SEGMENTS = np.array([[1, 1, 1, 1, 2, 2, 2, 0, 0]], np.int32)
_POSITIONS = np.array([[0, 1, 2, 3, 0, 1, 2, 0, 1]], np.int32)

_hidden = testing.jit_model_fn(
  lambda m, t, seg, pos: m.hidden_states(
    t, positions_BS=pos, segment_ids_BS=seg
  )[0]
)
_plain_hidden = testing.jit_model_fn(lambda m, t: m.hidden_states(t)[0])
_logp = testing.jit_model_fn(
  lambda m, t, seg: token_logprobs(m, t, segment_ids_BS=seg)[0]
)
_plain_logp = testing.jit_model_fn(lambda m, t: token_logprobs(m, t)[0])


@pytest.fixture(scope="module")
def model():
  return testing.random_model(_CONFIG)


def _tokens(seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, _CONFIG.vocab_size, _SEGMENTS.shape)
  return (tokens * (_SEGMENTS > 0)).astype(np.int32)


def test_positions_restart_in_each_segment():
  # By hand: A's tokens count 0..3, B's 0..2, the padding run 0..1.
  got = positions_from_segments(jnp.asarray(_SEGMENTS))
  np.testing.assert_array_equal(np.asarray(got), _POSITIONS)


def test_each_segment_computes_what_it_would_alone(model):
  tokens = _tokens()
  packed = np.asarray(_hidden(model, tokens, _SEGMENTS, _POSITIONS), np.float32)
  alone_a = np.asarray(_plain_hidden(model, tokens[:, :4]))
  alone_b = np.asarray(_plain_hidden(model, tokens[:, 4:7]))
  np.testing.assert_allclose(packed[:, :4], alone_a, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(packed[:, 4:7], alone_b, rtol=1e-5, atol=1e-5)


def test_logprobs_match_separate_rows_and_segment_starts_get_zero(model):
  tokens = _tokens(1)
  packed = np.asarray(_logp(model, tokens, _SEGMENTS))
  alone_a = np.asarray(_plain_logp(model, tokens[:, :4]))
  alone_b = np.asarray(_plain_logp(model, tokens[:, 4:7]))
  np.testing.assert_allclose(packed[:, :4], alone_a, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(packed[:, 4:7], alone_b, rtol=1e-5, atol=1e-5)
  # Each segment's first token and the padding have no predecessor.
  assert packed[0, 0] == 0 and packed[0, 4] == 0
  np.testing.assert_array_equal(packed[0, 7:], 0.0)
  assert np.all(packed[0, [1, 2, 3, 5, 6]] < 0)


def test_changing_one_segment_leaves_the_other_unchanged(model):
  tokens = _tokens(2)
  changed = tokens.copy()
  changed[0, :4] = (changed[0, :4] % (_CONFIG.vocab_size - 1)) + 1
  before = np.asarray(_logp(model, tokens, _SEGMENTS))
  after = np.asarray(_logp(model, changed, _SEGMENTS))
  np.testing.assert_array_equal(before[:, 4:], after[:, 4:])
  assert not np.allclose(before[:, 1:4], after[:, 1:4])
  # Without segment ids B would see A: the test can fail.
  plain_before = np.asarray(_plain_logp(model, tokens))
  plain_after = np.asarray(_plain_logp(model, changed))
  assert not np.allclose(plain_before[:, 4:7], plain_after[:, 4:7])


def test_segment_errors_are_clear(model):
  tokens = jnp.asarray(_tokens())
  with pytest.raises(ValueError, match="segment_ids_BS has shape"):
    model.hidden_states(tokens, segment_ids_BS=jnp.ones((1, 4), jnp.int32))
  cache = init_cache(_CONFIG, 1, 16)
  with pytest.raises(ValueError, match="without a cache or prefix"):
    model.hidden_states(
      tokens,
      positions_BS=jnp.asarray(_POSITIONS),
      cache=cache,
      segment_ids_BS=jnp.asarray(_SEGMENTS),
    )
  prefix = init_cache(_CONFIG, 1, 4)
  with pytest.raises(ValueError, match="without a cache or prefix"):
    model.hidden_states(tokens, prefix=prefix, segment_ids_BS=_SEGMENTS)
