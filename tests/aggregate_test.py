"""Aggregation modes: hand values, gradients, exact micro-batch sums."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import aggregate

# S_i = [1+2, 4] = [3, 4]; n_i = [2, 1]; the third row is empty (E = 2).
LOSS = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], np.float32)
MASK = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], np.float32)

MODES = {
  # 7 / 3 valid tokens
  "token_mean": (aggregate.token_mean, 7.0 / 3.0),
  # plain sum
  "token_sum": (aggregate.token_sum, 7.0),
  # 7 / E
  "seq_mean_token_sum": (aggregate.seq_mean_token_sum, 7.0 / 2.0),
  # (3/2 + 4/1) / 2
  "seq_mean_token_mean": (aggregate.seq_mean_token_mean, 2.75),
  # 7 / (E * T) = 7 / (2 * 3)
  "seq_mean_token_sum_norm": (aggregate.seq_mean_token_sum_norm, 7.0 / 6.0),
}


def _numpy_reference(name, loss, mask):
  seq_sum = (loss * mask).sum(-1)
  seq_len = mask.sum(-1)
  nonempty = seq_len > 0
  if name == "token_mean":
    return seq_sum.sum() / seq_len.sum()
  if name == "token_sum":
    return seq_sum.sum()
  if name == "seq_mean_token_sum":
    return seq_sum[nonempty].sum() / nonempty.sum()
  if name == "seq_mean_token_mean":
    return (seq_sum[nonempty] / seq_len[nonempty]).sum() / nonempty.sum()
  return seq_sum.sum() / (nonempty.sum() * loss.shape[-1])


@pytest.mark.parametrize("name", MODES)
def test_hand_values(name):
  fn, expected = MODES[name]
  got = jax.jit(lambda l, m: fn(l, m).value)(LOSS, MASK)
  np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("name", MODES)
def test_random_values_and_gradients_match_numpy(name):
  fn, _ = MODES[name]
  rng = np.random.default_rng(0)
  loss = rng.normal(size=(2, 3, 5)).astype(np.float32)
  mask = (rng.uniform(size=(2, 3, 5)) < 0.6).astype(np.float32)
  mask[0, 0] = 0.0  # an empty sequence
  got = jax.jit(lambda l: fn(l, mask).value)(loss)
  np.testing.assert_allclose(got, _numpy_reference(name, loss, mask), rtol=1e-5)
  # The loss is linear in the per-token losses: its gradient is the weight
  # each token gets, measured here by unit perturbations in numpy.
  grad = jax.jit(jax.grad(lambda l: fn(l, mask).value))(loss)
  base = _numpy_reference(name, loss, mask)
  numeric = np.zeros_like(loss)
  for idx in np.ndindex(loss.shape):
    bumped = loss.astype(np.float64).copy()
    bumped[idx] += 1.0
    numeric[idx] = _numpy_reference(name, bumped, mask) - base
  np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", MODES)
def test_micro_batches_sum_to_the_global_mean(name):
  fn, _ = MODES[name]
  rng = np.random.default_rng(1)
  loss = rng.normal(size=(6, 4)).astype(np.float32)
  mask = (rng.uniform(size=(6, 4)) < 0.7).astype(np.float32)
  whole = fn(loss, mask)
  parts = [fn(loss[i : i + 2], mask[i : i + 2]) for i in range(0, 6, 2)]
  total = functools.reduce(lambda a, b: jax.tree.map(jnp.add, a, b), parts)
  np.testing.assert_allclose(total.value, whole.value, rtol=1e-5)


def test_constant_normaliser_options():
  # verl's seq-mean-token-sum-norm on one micro-batch: 7 / 10.
  got = aggregate.token_sum(LOSS, MASK, normalizer=10.0).value
  np.testing.assert_allclose(got, 0.7, rtol=1e-6)
  # Dr.GRPO with the generation limit as L_max: 7 / (2 * 8).
  got = aggregate.seq_mean_token_sum_norm(LOSS, MASK, max_length=8).value
  np.testing.assert_allclose(got, 7.0 / 16.0, rtol=1e-6)


def test_bfloat16_inputs_give_float32():
  for fn, expected in MODES.values():
    out = fn(jnp.asarray(LOSS, jnp.bfloat16), jnp.asarray(MASK, jnp.bfloat16))
    assert out.value.dtype == jnp.float32
    np.testing.assert_allclose(out.value, expected, rtol=1e-2)


def test_empty_batch_is_zero_not_nan():
  for fn, _ in MODES.values():
    value = fn(LOSS, np.zeros_like(MASK)).value
    assert float(value) == 0.0


def test_bad_input():
  with pytest.raises(ValueError, match="shapes must match"):
    aggregate.token_mean(LOSS, MASK[:, :2])
  with pytest.raises(ValueError, match="normalizer must be > 0"):
    aggregate.token_sum(LOSS, MASK, normalizer=0.0)
  with pytest.raises(ValueError, match="max_length must be > 0"):
    aggregate.seq_mean_token_sum_norm(LOSS, MASK, max_length=0)
