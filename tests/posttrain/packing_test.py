"""Packing: first-fit by hand, and a packed batch trains exactly as the same
examples padded one per row (loss and gradients)."""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import testing
from rljax.models import ModelConfig
from rljax.models import token_logprobs
from rljax.posttrain import _packing
from rljax.posttrain._encode import Encoded

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
  rms_norm_eps=1e-5,
)
_LENGTHS = (5, 3, 7, 4, 6, 2)


def _examples(seed=0, lengths=_LENGTHS):
  """Random examples: a prompt (unscored) then a completion (scored)."""
  rng = np.random.default_rng(seed)
  out = []
  for n in lengths:
    mask = np.zeros(n, np.float32)
    mask[rng.integers(1, n) :] = 1.0
    tokens = rng.integers(1, _CONFIG.vocab_size, n).astype(np.int32)
    out.append(Encoded(tokens, mask))
  return out


def _by_hand(*lengths):
  return [
    Encoded(np.arange(1, n + 1, dtype=np.int32), np.ones(n)) for n in lengths
  ]


def test_pack_first_fit_by_hand():
  packed, leftover = _packing.pack(
    _by_hand(5, 3, 7, 4, 6, 2, 9), rows=2, length=16
  )
  # Row 0 takes 5, 3, 7 (15 tokens); 4 does not fit its last slot, so row 1
  # takes 4, 6, 2 (12); 9 fits nowhere and is left over.
  np.testing.assert_array_equal(
    packed.segment_ids_BL,
    [
      [1] * 5 + [2] * 3 + [3] * 7 + [0],
      [1] * 4 + [2] * 6 + [3] * 2 + [0] * 4,
    ],
  )
  np.testing.assert_array_equal(
    packed.positions_BL[1], [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1, 0, 0, 0, 0]
  )
  np.testing.assert_array_equal(packed.tokens_BL[1, 10:], [1, 2, 0, 0, 0, 0])
  np.testing.assert_array_equal(packed.loss_mask_BL[0, 14:], [1, 0])
  assert [len(e.tokens) for e in leftover] == [9]
  # 27 real tokens of 32.
  assert _packing.packing_efficiency(packed) == 27 / 32
  assert packed.tokens_BL.dtype == np.int32
  assert packed.loss_mask_BL.dtype == np.float32


def test_later_small_examples_fill_earlier_rows():
  # The second 6 does not fit after the first; the 2 after it still does.
  packed, leftover = _packing.pack(_by_hand(6, 6, 2), rows=1, length=8)
  assert [len(e.tokens) for e in leftover] == [6]
  np.testing.assert_array_equal(packed.segment_ids_BL, [[1] * 6 + [2] * 2])


def test_pad_one_example_per_row():
  padded = _packing.pad(_by_hand(3, 1), length=4)
  np.testing.assert_array_equal(padded.tokens_BL, [[1, 2, 3, 0], [1, 0, 0, 0]])
  np.testing.assert_array_equal(
    padded.segment_ids_BL, [[1, 1, 1, 0], [1, 0, 0, 0]]
  )
  np.testing.assert_array_equal(padded.positions_BL[0], [0, 1, 2, 0])
  assert _packing.packing_efficiency(padded) == 4 / 8


def test_packing_errors_are_clear():
  with pytest.raises(
    ValueError, match=r"encoded\[1\] has 9 tokens.*max_length"
  ):
    _packing.pack(_by_hand(2, 9), rows=2, length=8)
  with pytest.raises(ValueError, match="max_length <= 4"):
    _packing.pad(_by_hand(5), length=4)
  with pytest.raises(ValueError, match="rows must be a positive int"):
    _packing.pack(_by_hand(2), rows=0, length=8)
  bad = Encoded(np.arange(3, dtype=np.int32), np.ones(2, np.float32))
  with pytest.raises(ValueError, match="one mask entry per token"):
    _packing.pad([bad], length=4)


def _sft_loss(params, graphdef, batch, segments):
  """sum(nll * loss_mask) / sum(loss_mask), as the SFT run computes it."""
  model = nnx.merge(graphdef, params)
  if segments:
    logp, _ = token_logprobs(
      model,
      batch.tokens_BL,
      segment_ids_BS=batch.segment_ids_BL,
      positions_BS=batch.positions_BL,
    )
  else:  # the plain padded path: an attention mask, default positions
    logp, _ = token_logprobs(model, batch.tokens_BL, batch.segment_ids_BL > 0)
  mask = batch.loss_mask_BL
  return -jnp.sum(logp * mask) / jnp.sum(mask)


# XLA optimisation level 0: the tiny programs compile several times faster.
@functools.partial(
  jax.jit,
  static_argnums=(1, 3),
  compiler_options={"xla_backend_optimization_level": 0},
)
def _loss_and_grad(params, graphdef, batch, segments):
  return jax.value_and_grad(_sft_loss)(params, graphdef, batch, segments)


@pytest.fixture(scope="module")
def model_parts():
  return nnx.split(testing.random_model(_CONFIG))


def test_packed_loss_and_gradients_equal_padded(model_parts):
  graphdef, params = model_parts
  examples = _examples()
  packed, leftover = _packing.pack(examples, rows=2, length=16)
  assert not leftover and packed.tokens_BL.shape == (2, 16)
  padded = _packing.pad(examples, length=8)
  assert padded.tokens_BL.shape == (6, 8)
  got, got_grad = _loss_and_grad(params, graphdef, packed, True)
  want, want_grad = _loss_and_grad(params, graphdef, padded, False)
  also, also_grad = _loss_and_grad(params, graphdef, padded, True)
  assert np.isfinite(float(want)) and float(want) > 0
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_allclose(also, want, rtol=1e-5)
  for g, w, a in zip(
    jax.tree.leaves(got_grad),
    jax.tree.leaves(want_grad),
    jax.tree.leaves(also_grad),
  ):
    assert np.abs(np.asarray(w)).max() > 0
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-6)


def test_packing_without_segments_would_differ(model_parts):
  # The same packed rows read as plain rows (examples see each other) give
  # another loss: the equality above depends on the segment ids.
  graphdef, params = model_parts
  packed, _ = _packing.pack(_examples(), rows=2, length=16)
  leaky = packed._replace(segment_ids_BL=(packed.segment_ids_BL > 0) * 1)
  leaky = leaky._replace(
    positions_BL=np.broadcast_to(np.arange(16), (2, 16)).astype(np.int32)
  )
  got, _ = _loss_and_grad(params, graphdef, packed, True)
  mixed, _ = _loss_and_grad(params, graphdef, leaky, True)
  assert not np.allclose(got, mixed, rtol=1e-3)


_logp = testing.jit_model_fn(
  lambda m, t, seg, pos: token_logprobs(
    m, t, segment_ids_BS=seg, positions_BS=pos
  )[0]
)


def test_examples_in_a_row_never_see_each_other(model_parts):
  model = nnx.merge(*model_parts)
  packed, _ = _packing.pack(_examples(), rows=2, length=16)
  changed = packed.tokens_BL.copy()
  first = packed.segment_ids_BL[0] == 1
  changed[0, first] = (changed[0, first] % (_CONFIG.vocab_size - 1)) + 1
  before = np.asarray(
    _logp(model, packed.tokens_BL, packed.segment_ids_BL, packed.positions_BL)
  )
  after = np.asarray(
    _logp(model, changed, packed.segment_ids_BL, packed.positions_BL)
  )
  np.testing.assert_array_equal(before[0, ~first], after[0, ~first])
  np.testing.assert_array_equal(before[1], after[1])
  assert not np.allclose(before[0, first], after[0, first])
