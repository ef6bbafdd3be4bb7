"""Reward shaping: hand values, numpy references, gradients, dtypes, errors."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import shaping


def _jit(fn, **kw):
  return jax.jit(functools.partial(fn, **kw))


def _k1(logp, ref_logp):
  return logp - ref_logp


def _k3(logp, ref_logp):
  x = ref_logp - logp
  return jnp.exp(x) - x - 1.0


# ----------------------------------------------------------------------------
# overlong_penalty


def _np_overlong(lengths, max_length, buffer, factor=1.0):
  out = np.zeros(np.shape(lengths))
  for idx in np.ndindex(out.shape):
    start = max_length - buffer
    length = float(lengths[idx])
    if length > start:
      out[idx] = -factor * min(length - start, buffer) / buffer
  return out


def test_overlong_hand_values():
  # max_length 20, buffer 4: the ramp starts at 16 and reaches -1 at 20.
  #   L=10, 16 -> 0; L=17 -> -1/4; L=18 -> -2/4; L=20 -> -1; L=25 -> -1.
  lengths = np.array([10, 16, 17, 18, 20, 25])
  fn = _jit(shaping.overlong_penalty, max_length=20, buffer=4)
  np.testing.assert_allclose(
    fn(lengths), [0.0, 0.0, -0.25, -0.5, -1.0, -1.0], rtol=1e-6
  )
  # factor 0.5 halves it: L=18 -> -0.25.
  fn = _jit(shaping.overlong_penalty, max_length=20, buffer=4, factor=0.5)
  np.testing.assert_allclose(fn(np.array([18])), [-0.25], rtol=1e-6)


def test_overlong_matches_numpy_and_gradient():
  rng = np.random.default_rng(0)
  lengths = rng.uniform(0, 140, (4, 8)).astype(np.float32)
  kw = dict(max_length=128, buffer=32, factor=0.7)
  fn = _jit(shaping.overlong_penalty, **kw)
  np.testing.assert_allclose(
    fn(lengths), _np_overlong(lengths, **kw), rtol=1e-5, atol=1e-6
  )
  grad = jax.jit(jax.grad(lambda x: jnp.sum(fn(x))))(lengths)
  on_ramp = (lengths > 96) & (lengths < 128)
  assert on_ramp.any() and (~on_ramp).any()
  np.testing.assert_allclose(grad, np.where(on_ramp, -0.7 / 32, 0.0), rtol=1e-6)


def test_overlong_bfloat16_and_int():
  fn = _jit(shaping.overlong_penalty, max_length=20, buffer=4)
  got = fn(jnp.array([18.0, 25.0], jnp.bfloat16))
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, [-0.5, -1.0])
  assert fn(np.array([18], np.int32)).dtype == jnp.float32


@pytest.mark.parametrize(
  "kw,name",
  [
    (dict(max_length=20, buffer=0), "buffer"),
    (dict(max_length=20, buffer=21), "buffer"),
    (dict(max_length=0, buffer=4), "max_length"),
    (dict(max_length=20, buffer=4, factor=-1.0), "factor"),
  ],
)
def test_overlong_bad_arguments_raise(kw, name):
  with pytest.raises(ValueError, match=name):
    shaping.overlong_penalty(np.array([1]), **kw)


# ----------------------------------------------------------------------------
# stop_properly_penalty

REWARDS = np.array([1.0, 0.5, -1.0, 2.0], np.float32)
TRUNC = np.array([True, False, True, False])


@pytest.mark.parametrize(
  "coef,expected",
  [
    (0.5, [0.5, 0.5, -0.5, 2.0]),  # truncated rewards scaled by 0.5
    (0.0, [0.0, 0.5, 0.0, 2.0]),  # truncated rewards zeroed
    (1.0, [1.0, 0.5, -1.0, 2.0]),  # no-op
    (-1.0, [-1.0, 0.5, -1.0, 2.0]),  # truncated rewards replaced by -1
  ],
)
def test_stop_properly_hand_values(coef, expected):
  got = _jit(shaping.stop_properly_penalty, coef=coef)(REWARDS, TRUNC)
  np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("coef", [0.3, -2.0])
def test_stop_properly_matches_numpy_and_gradient(coef):
  rng = np.random.default_rng(1)
  rewards = rng.normal(size=(3, 5)).astype(np.float32)
  trunc = (rng.uniform(size=(3, 5)) < 0.4).astype(np.float32)
  expected = np.zeros(rewards.shape)
  expected_grad = np.zeros(rewards.shape)
  for idx in np.ndindex(rewards.shape):
    if trunc[idx] and coef >= 0:
      expected[idx], expected_grad[idx] = coef * rewards[idx], coef
    elif trunc[idx]:
      expected[idx], expected_grad[idx] = coef, 0.0
    else:
      expected[idx], expected_grad[idx] = rewards[idx], 1.0
  fn = _jit(shaping.stop_properly_penalty, coef=coef)
  np.testing.assert_allclose(fn(rewards, trunc), expected, rtol=1e-6)
  grad = jax.jit(jax.grad(lambda r: jnp.sum(fn(r, trunc))))(rewards)
  np.testing.assert_allclose(grad, expected_grad, rtol=1e-6)


def test_stop_properly_bfloat16():
  fn = _jit(shaping.stop_properly_penalty, coef=0.5)
  got = fn(jnp.asarray(REWARDS, jnp.bfloat16), jnp.asarray(TRUNC, jnp.bfloat16))
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, [0.5, 0.5, -0.5, 2.0])


def test_stop_properly_bad_arguments_raise():
  with pytest.raises(ValueError, match="coef"):
    shaping.stop_properly_penalty(REWARDS, TRUNC, coef=1.5)
  with pytest.raises(ValueError, match="truncated_B"):
    shaping.stop_properly_penalty(REWARDS, TRUNC[:2], coef=0.5)


# ----------------------------------------------------------------------------
# weighted_sum


def test_weighted_sum_hand_values():
  rewards = np.array([[1.0, 0.0, 2.0], [0.5, np.nan, 1.0]], np.float32)
  # w = [1, 2, 0.5]: row 0 -> 1 + 0 + 1 = 2; row 1 -> 0.5 + (NaN: 0) + 0.5 = 1.
  got = jax.jit(shaping.weighted_sum)(rewards, np.array([1.0, 2.0, 0.5]))
  np.testing.assert_allclose(got, [2.0, 1.0], rtol=1e-6)
  # Default weights are ones: [3, 1.5].
  np.testing.assert_allclose(
    jax.jit(shaping.weighted_sum)(rewards), [3.0, 1.5], rtol=1e-6
  )


def test_weighted_sum_matches_numpy_and_gradient():
  rng = np.random.default_rng(2)
  rewards = rng.normal(size=(2, 3, 4)).astype(np.float32)
  rewards[0, 1, 2] = np.nan
  weights = rng.uniform(size=4).astype(np.float32)
  expected = np.zeros((2, 3))
  for p, g in np.ndindex(2, 3):
    expected[p, g] = sum(
      float(weights[k]) * float(rewards[p, g, k])
      for k in range(4)
      if not math.isnan(rewards[p, g, k])
    )
  fn = jax.jit(shaping.weighted_sum)
  np.testing.assert_allclose(fn(rewards, weights), expected, rtol=1e-5)
  grad = jax.jit(jax.grad(lambda r: jnp.sum(fn(r, weights))))(rewards)
  expected_grad = np.where(
    np.isnan(rewards), 0.0, np.broadcast_to(weights, rewards.shape)
  )
  np.testing.assert_allclose(grad, expected_grad, rtol=1e-6)


def test_weighted_sum_bfloat16():
  rewards = jnp.array([[1.0, 2.0]], jnp.bfloat16)
  got = jax.jit(shaping.weighted_sum)(
    rewards, jnp.array([0.5, 1.0], jnp.bfloat16)
  )
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, [2.5])


def test_weighted_sum_bad_arguments_raise():
  with pytest.raises(ValueError, match="weights"):
    shaping.weighted_sum(np.ones((2, 3)), np.ones(2))
  with pytest.raises(ValueError, match="rewards_BK"):
    shaping.weighted_sum(np.float32(1.0))


# ----------------------------------------------------------------------------
# kl_in_reward

TOKEN_R = np.array([[0.0, 0.0, 1.0, 5.0]], np.float32)
OLD = np.array([[-1.0, -2.0, -1.0, 9.0]], np.float32)
REF = np.array([[-1.5, -1.0, -1.0, 0.0]], np.float32)
KM = np.array([[1.0, 1.0, 1.0, 0.0]], np.float32)


def test_kl_in_reward_hand_values():
  # k1 = old - ref = [0.5, -1, 0, (9, padding)]; r - 0.1 * k1 * m:
  #   [0 - 0.05, 0 + 0.1, 1 - 0, 5 (padding keeps its reward)].
  fn = _jit(shaping.kl_in_reward, coef=0.1, estimator=_k1)
  np.testing.assert_allclose(
    fn(TOKEN_R, OLD, REF, KM), [[-0.05, 0.1, 1.0, 5.0]], rtol=1e-6
  )


def test_kl_in_reward_k3_matches_numpy_and_is_detached():
  rng = np.random.default_rng(3)
  shape = (2, 3, 6)
  r = rng.normal(size=shape).astype(np.float32)
  old = rng.normal(-1.0, 0.5, shape).astype(np.float32)
  ref = (old + rng.normal(0.0, 0.3, shape)).astype(np.float32)
  mask = (rng.uniform(size=shape) < 0.7).astype(np.float32)
  expected = np.zeros(shape)
  for idx in np.ndindex(shape):
    x = float(ref[idx]) - float(old[idx])
    k3 = math.exp(x) - x - 1.0
    expected[idx] = r[idx] - 0.05 * k3 * mask[idx]
  fn = _jit(shaping.kl_in_reward, coef=0.05, estimator=_k3)
  np.testing.assert_allclose(
    fn(r, old, ref, mask), expected, rtol=1e-5, atol=1e-7
  )
  grads = jax.jit(
    jax.grad(lambda *a: jnp.sum(fn(*a, mask)), argnums=(0, 1, 2))
  )(r, old, ref)
  for g in grads:
    np.testing.assert_array_equal(g, np.zeros(shape))


def test_kl_in_reward_traced_coef():
  # The adaptive controller passes the coefficient as a traced scalar.
  fn = jax.jit(
    lambda c: shaping.kl_in_reward(TOKEN_R, OLD, REF, KM, coef=c, estimator=_k1)
  )
  np.testing.assert_allclose(
    fn(jnp.float32(0.1)), [[-0.05, 0.1, 1.0, 5.0]], rtol=1e-6
  )


def test_kl_in_reward_bfloat16():
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  fn = _jit(shaping.kl_in_reward, coef=0.1, estimator=_k1)
  got = fn(bf(TOKEN_R), bf(OLD), bf(REF), bf(KM))
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, [[-0.05, 0.1, 1.0, 5.0]], rtol=1e-6)


def test_kl_in_reward_bad_arguments_raise():
  with pytest.raises(ValueError, match="coef"):
    shaping.kl_in_reward(TOKEN_R, OLD, REF, KM, coef=-0.1, estimator=_k1)
  with pytest.raises(ValueError, match="ref_logp_BT"):
    shaping.kl_in_reward(TOKEN_R, OLD, REF[:, :2], KM, coef=0.1, estimator=_k1)


# ----------------------------------------------------------------------------
# clip_rewards


def test_clip_rewards_hand_values_and_gradient():
  rewards = np.array([-20.0, -3.0, 0.0, 12.0], np.float32)
  fn = jax.jit(shaping.clip_rewards)
  np.testing.assert_allclose(fn(rewards), [-10.0, -3.0, 0.0, 10.0])
  grad = jax.jit(jax.grad(lambda r: jnp.sum(fn(r))))(rewards)
  np.testing.assert_array_equal(grad, [0.0, 1.0, 1.0, 0.0])
  fn01 = _jit(shaping.clip_rewards, low=0.0, high=1.0)
  np.testing.assert_allclose(
    fn01(np.array([-0.5, 0.25, 3.0])), [0.0, 0.25, 1.0]
  )


def test_clip_rewards_matches_numpy_bfloat16():
  rng = np.random.default_rng(4)
  rewards = rng.normal(0.0, 8.0, (3, 4)).astype(np.float32)
  expected = [[min(max(float(v), -10.0), 10.0) for v in row] for row in rewards]
  got = jax.jit(shaping.clip_rewards)(jnp.asarray(rewards, jnp.bfloat16))
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, expected, rtol=1e-2)  # bfloat16 input


def test_clip_rewards_bad_range_raises():
  with pytest.raises(ValueError, match="high"):
    shaping.clip_rewards(np.ones(2), low=1.0, high=1.0)
