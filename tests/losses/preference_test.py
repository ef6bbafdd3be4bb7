"""Preference losses: hand values, numpy values and gradients, validation."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.losses import _preference


def _log_sigmoid(z):
  return -math.log1p(math.exp(-z)) if z >= 0 else z - math.log1p(math.exp(z))


def _sigmoid(z):
  return math.exp(_log_sigmoid(z))


def _numpy(tree):
  """Indexing host arrays element by element is much faster than jax's."""
  return jax.tree.map(np.asarray, tree)


def _pairs(shape, seed=0):
  rng = np.random.default_rng(seed)
  return [
    rng.uniform(-30.0, -5.0, size=shape).astype(np.float32) for _ in range(4)
  ]


# ----------------------------------------------------------------- sequence_logp


def test_sequence_logp_hand_values_and_gradient():
  logp = np.array([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0], [-1.0, -1.0, -1.0]])
  mask = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
  # sums: -1-2-3 = -6, -0.5-0.5 = -1, empty = 0; means: -6/3, -1/2, 0.
  total = jax.jit(_preference.sequence_logp)(logp, mask)
  mean = jax.jit(lambda lp, m: _preference.sequence_logp(lp, m, average=True))(
    logp, mask
  )
  assert total.dtype == jnp.float32
  np.testing.assert_allclose(total, [-6.0, -1.0, 0.0])
  np.testing.assert_allclose(mean, [-2.0, -0.5, 0.0])
  grad = jax.grad(
    lambda lp: jnp.sum(_preference.sequence_logp(lp, mask, average=True))
  )(logp)
  # d mean / d logp_t = m_t / n.
  expected = [[1 / 3, 1 / 3, 1 / 3], [0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]
  np.testing.assert_allclose(grad, expected, rtol=1e-6)


def test_sequence_logp_random_matches_numpy():
  rng = np.random.default_rng(0)
  logp = rng.uniform(-5.0, 0.0, size=(2, 3, 7)).astype(np.float32)
  mask = (rng.uniform(size=(2, 3, 7)) < 0.7).astype(np.float32)
  expected_sum = np.zeros((2, 3))
  expected_mean = np.zeros((2, 3))
  for i in range(2):
    for j in range(3):
      valid = [float(x) for x, m in zip(logp[i, j], mask[i, j]) if m > 0]
      expected_sum[i, j] = sum(valid)
      expected_mean[i, j] = sum(valid) / len(valid) if valid else 0.0
  np.testing.assert_allclose(
    _preference.sequence_logp(logp, mask), expected_sum, rtol=1e-5
  )
  np.testing.assert_allclose(
    _preference.sequence_logp(logp, mask, average=True),
    expected_mean,
    rtol=1e-5,
  )


def test_sequence_logp_shape_mismatch_raises():
  with pytest.raises(ValueError, match="mask_BT"):
    _preference.sequence_logp(jnp.zeros((2, 3)), jnp.zeros((2, 4)))


# --------------------------------------------------------------------------- DPO


def test_dpo_hand_values():
  zeros = jnp.zeros(2)
  # h = 0: -log sigma(0) = log 2, with or without label smoothing.
  for eps in (0.0, 0.1):
    out = jax.jit(
      lambda c, r, rc, rr, e=eps: _preference.dpo(
        c, r, rc, rr, label_smoothing=e
      )
    )(zeros, zeros, zeros, zeros)
    np.testing.assert_allclose(out.loss, [math.log(2.0)] * 2, rtol=1e-6)
    np.testing.assert_array_equal(out.accuracy, [0.0, 0.0])
  # chosen -1 (ref -2), rejected -3 (ref -2): h = 1 - (-1) = 2; beta h = 1.
  # eps = 0: log(1 + e^{-1}) = 0.31326169.
  # eps = 0.1: 0.9 * 0.31326169 + 0.1 * log(1 + e) = 0.9 * 0.31326169 +
  #   0.1 * 1.31326169 = 0.41326169.
  args = [jnp.array([v]) for v in (-1.0, -3.0, -2.0, -2.0)]
  out = _preference.dpo(*args, beta=0.5)
  np.testing.assert_allclose(out.loss, [0.31326169], rtol=1e-6)
  np.testing.assert_allclose(out.chosen_reward, [0.5])  # 0.5 * (-1 + 2)
  np.testing.assert_allclose(out.rejected_reward, [-0.5])  # 0.5 * (-3 + 2)
  np.testing.assert_array_equal(out.accuracy, [1.0])
  smoothed = _preference.dpo(*args, beta=0.5, label_smoothing=0.1)
  np.testing.assert_allclose(smoothed.loss, [0.41326169], rtol=1e-6)


@pytest.mark.parametrize("beta, eps", [(0.1, 0.0), (1.0, 0.2)])
def test_dpo_random_values_and_gradients_match_numpy(beta, eps):
  chosen, rejected, ref_c, ref_r = _pairs((2, 5))
  fn = functools.partial(_preference.dpo, beta=beta, label_smoothing=eps)
  out = _numpy(jax.jit(fn)(chosen, rejected, ref_c, ref_r))
  grads = _numpy(
    jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a).loss), argnums=(0, 1, 2, 3)))(
      chosen, rejected, ref_c, ref_r
    )
  )
  for idx in np.ndindex(2, 5):
    h = (float(chosen[idx]) - float(ref_c[idx])) - (
      float(rejected[idx]) - float(ref_r[idx])
    )
    z = beta * h
    loss = -(1 - eps) * _log_sigmoid(z) - eps * _log_sigmoid(-z)
    d_chosen = -beta * (1 - eps) * _sigmoid(-z) + eps * beta * _sigmoid(z)
    np.testing.assert_allclose(out.loss[idx], loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[0][idx], d_chosen, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grads[1][idx], -d_chosen, rtol=1e-4, atol=1e-6)
    reward_c = beta * (float(chosen[idx]) - float(ref_c[idx]))
    reward_r = beta * (float(rejected[idx]) - float(ref_r[idx]))
    np.testing.assert_allclose(out.chosen_reward[idx], reward_c, rtol=1e-5)
    np.testing.assert_allclose(out.rejected_reward[idx], reward_r, rtol=1e-5)
    assert out.accuracy[idx] == float(reward_c > reward_r)
  # The reference log-probs are constants.
  np.testing.assert_array_equal(grads[2], np.zeros((2, 5)))
  np.testing.assert_array_equal(grads[3], np.zeros((2, 5)))


def test_dpo_is_stable_for_large_margins():
  # beta h = +-1000: -log sigma(1000) = 0, -log sigma(-1000) = 1000.
  c = jnp.array([1000.0, -1000.0])
  zero = jnp.zeros(2)
  out = _preference.dpo(c, zero, zero, zero, beta=1.0)
  np.testing.assert_allclose(out.loss, [0.0, 1000.0], atol=1e-6)
  grad = jax.grad(
    lambda x: jnp.sum(_preference.dpo(x, zero, zero, zero, beta=1.0).loss)
  )(c)
  np.testing.assert_allclose(grad, [0.0, -1.0], atol=1e-6)


def test_implicit_rewards_are_detached():
  chosen, rejected, ref_c, ref_r = _pairs((3,))
  lengths = jnp.full((3,), 4.0)
  for fn, args in (
    (_preference.dpo, (ref_c, ref_r)),
    (_preference.ipo, (ref_c, ref_r)),
    (_preference.simpo, (lengths, lengths)),
  ):
    grad = jax.grad(
      lambda c, r, fn=fn, args=args: jnp.sum(
        fn(c, r, *args).chosen_reward + fn(c, r, *args).rejected_reward
      ),
      argnums=(0, 1),
    )(chosen, rejected)
    np.testing.assert_array_equal(grad[0], np.zeros(3))
    np.testing.assert_array_equal(grad[1], np.zeros(3))


# --------------------------------------------------------------------------- IPO


def test_ipo_hand_values_and_minimum():
  args = [jnp.array([v]) for v in (-1.0, -3.0, -2.0, -2.0)]  # h = 2
  # beta = 0.5: (2 - 1/(2 * 0.5))^2 = (2 - 1)^2 = 1.
  np.testing.assert_allclose(_preference.ipo(*args, beta=0.5).loss, [1.0])
  # beta = 0.1: (2 - 5)^2 = 9; rewards 0.1 * (+-1).
  out = _preference.ipo(*args, beta=0.1)
  np.testing.assert_allclose(out.loss, [9.0], rtol=1e-6)
  np.testing.assert_allclose(out.chosen_reward, [0.1], rtol=1e-6)
  np.testing.assert_allclose(out.rejected_reward, [-0.1], rtol=1e-6)
  # Minimum: h = 1/(2 beta) = 2.5 for beta = 0.2 gives loss 0 and gradient 0;
  # a step either side increases the loss.
  zero = jnp.zeros(())

  def loss(c):
    return _preference.ipo(c, zero, zero, zero, beta=0.2).loss

  value, grad = jax.value_and_grad(loss)(jnp.float32(2.5))
  np.testing.assert_allclose(value, 0.0, atol=1e-12)
  np.testing.assert_allclose(grad, 0.0, atol=1e-12)
  assert loss(2.4) > 0 and loss(2.6) > 0
  # d/dh (h - 2.5)^2 at h = 3.5 is 2 (3.5 - 2.5) = 2.
  np.testing.assert_allclose(jax.grad(loss)(jnp.float32(3.5)), 2.0, rtol=1e-6)


def test_ipo_random_values_and_gradients_match_numpy():
  beta = 0.3
  chosen, rejected, ref_c, ref_r = _pairs((4, 3), seed=1)
  fn = functools.partial(_preference.ipo, beta=beta)
  out = _numpy(jax.jit(fn)(chosen, rejected, ref_c, ref_r))
  grads = _numpy(
    jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a).loss), argnums=(0, 1, 2, 3)))(
      chosen, rejected, ref_c, ref_r
    )
  )
  for idx in np.ndindex(4, 3):
    h = (float(chosen[idx]) - float(ref_c[idx])) - (
      float(rejected[idx]) - float(ref_r[idx])
    )
    target = 1.0 / (2.0 * beta)
    np.testing.assert_allclose(out.loss[idx], (h - target) ** 2, rtol=1e-4)
    np.testing.assert_allclose(
      grads[0][idx], 2 * (h - target), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
      grads[1][idx], -2 * (h - target), rtol=1e-4, atol=1e-5
    )
  np.testing.assert_array_equal(grads[2], np.zeros((4, 3)))
  np.testing.assert_array_equal(grads[3], np.zeros((4, 3)))


# ------------------------------------------------------------------------- SimPO


def test_simpo_hand_values():
  # chosen -4 over 2 tokens = -2; rejected -9 over 3 tokens = -3; Delta = 1.
  # beta = 2, gamma = 1: z = 2 * 1 - 1 = 1; -log sigma(1) = 0.31326169.
  # Rewards beta * average log-prob: 2 * -2 = -4, 2 * -3 = -6.
  args = [jnp.array([v]) for v in (-4.0, -9.0, 2.0, 3.0)]
  out = jax.jit(lambda *a: _preference.simpo(*a, beta=2.0, gamma=1.0))(*args)
  np.testing.assert_allclose(out.loss, [0.31326169], rtol=1e-6)
  np.testing.assert_allclose(out.chosen_reward, [-4.0])
  np.testing.assert_allclose(out.rejected_reward, [-6.0])
  np.testing.assert_array_equal(out.accuracy, [1.0])
  # Label smoothing 0.25: 0.75 * 0.31326169 + 0.25 * log(1 + e) =
  #   0.23494627 + 0.32831542 = 0.56326169.
  smoothed = _preference.simpo(*args, beta=2.0, gamma=1.0, label_smoothing=0.25)
  np.testing.assert_allclose(smoothed.loss, [0.56326169], rtol=1e-6)


@pytest.mark.parametrize(
  "beta, gamma, eps", [(0.1, 0.5, 0.0), (2.5, 1.375, 0.0), (2.0, 1.0, 0.3)]
)
def test_simpo_random_values_and_gradients_match_numpy(beta, gamma, eps):
  rng = np.random.default_rng(2)
  chosen, rejected = _pairs((2, 4), seed=2)[:2]
  len_c = rng.integers(3, 20, size=(2, 4)).astype(np.float32)
  len_r = rng.integers(3, 20, size=(2, 4)).astype(np.float32)
  fn = functools.partial(
    _preference.simpo, beta=beta, gamma=gamma, label_smoothing=eps
  )
  out = _numpy(jax.jit(fn)(chosen, rejected, len_c, len_r))
  grads = _numpy(
    jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a).loss), argnums=(0, 1, 2, 3)))(
      chosen, rejected, len_c, len_r
    )
  )
  for idx in np.ndindex(2, 4):
    avg_c = float(chosen[idx]) / float(len_c[idx])
    avg_r = float(rejected[idx]) / float(len_r[idx])
    z = beta * (avg_c - avg_r) - gamma
    loss = -(1 - eps) * _log_sigmoid(z) - eps * _log_sigmoid(-z)
    d_z = -(1 - eps) * _sigmoid(-z) + eps * _sigmoid(z)
    np.testing.assert_allclose(out.loss[idx], loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
      grads[0][idx], d_z * beta / float(len_c[idx]), rtol=1e-4, atol=1e-7
    )
    np.testing.assert_allclose(
      grads[1][idx], -d_z * beta / float(len_r[idx]), rtol=1e-4, atol=1e-7
    )
    np.testing.assert_allclose(out.chosen_reward[idx], beta * avg_c, rtol=1e-5)
    assert out.accuracy[idx] == float(avg_c > avg_r)
  # Lengths are counts, not parameters.
  np.testing.assert_array_equal(grads[2], np.zeros((2, 4)))
  np.testing.assert_array_equal(grads[3], np.zeros((2, 4)))


def test_simpo_zero_length_is_finite():
  # An empty chosen response averages to 0: z = 0.1 * (0 - (-2)) - 0.5 = -0.3.
  out = _preference.simpo(
    jnp.array([0.0]), jnp.array([-4.0]), jnp.array([0.0]), jnp.array([2.0])
  )
  np.testing.assert_allclose(out.loss, [-_log_sigmoid(-0.3)], rtol=1e-6)


# ------------------------------------------------------------------- all losses


def _call(name, args, **kw):
  return getattr(_preference, name)(*args, **kw)


@pytest.mark.parametrize("name", ["dpo", "ipo", "simpo"])
def test_bfloat16_inputs_give_finite_float32(name):
  args = [
    jnp.array([-12.0, -300.0], jnp.bfloat16),
    jnp.array([-15.0, -2.0], jnp.bfloat16),
    jnp.array([-11.0, 5.0], jnp.bfloat16),
    jnp.array([-14.0, 8.0], jnp.bfloat16),
  ]
  if name == "simpo":  # the last two are token counts
    args[2:] = [jnp.array([3.0, 40.0], jnp.bfloat16)] * 2
  out = jax.jit(lambda *a: _call(name, a))(*args)
  for field in out:
    assert field.dtype == jnp.float32
    assert np.all(np.isfinite(field))
  grad = jax.grad(lambda c: jnp.sum(_call(name, [c, *args[1:]]).loss))(args[0])
  assert np.all(np.isfinite(np.asarray(grad, np.float32)))


@pytest.mark.parametrize("name", ["dpo", "ipo", "simpo"])
@pytest.mark.parametrize("beta", [0.0, -0.1])
def test_bad_beta_raises(name, beta):
  args = [jnp.ones(2)] * 4
  with pytest.raises(ValueError, match="beta"):
    _call(name, args, beta=beta)


@pytest.mark.parametrize("name", ["dpo", "simpo"])
@pytest.mark.parametrize("eps", [-0.1, 0.5, 0.7])
def test_bad_label_smoothing_raises(name, eps):
  args = [jnp.ones(2)] * 4
  with pytest.raises(ValueError, match="label_smoothing"):
    _call(name, args, label_smoothing=eps)


def test_bad_gamma_and_shapes_raise():
  args = [jnp.ones(2)] * 4
  with pytest.raises(ValueError, match="gamma"):
    _preference.simpo(*args, gamma=-1.0)
  with pytest.raises(ValueError, match="ref_rejected_logp"):
    _preference.dpo(*args[:3], jnp.ones(3))
  with pytest.raises(ValueError, match="rejected_length"):
    _preference.simpo(*args[:3], jnp.ones((2, 1)))
