"""KL estimators: hand values, gradients, on-policy expected gradients, clamps."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.losses import _kl

ESTIMATORS = {
  "k1": _kl.kl_k1,
  "k2": _kl.kl_k2,
  "k3": _kl.kl_k3,
  "abs": _kl.kl_abs,
}


def _np_value(name, x):
  """Per-token estimator in float64, one token at a time."""
  if name == "k1":
    return x
  if name == "k2":
    return x * x / 2.0
  if name == "k3":
    return math.exp(-x) - 1.0 + x
  return abs(x)


def _np_grad(name, x):
  """d estimator / d logp at one token."""
  if name == "k1":
    return 1.0
  if name == "k2":
    return x
  if name == "k3":
    return 1.0 - math.exp(-x)
  return math.copysign(1.0, x) if x != 0 else 0.0


def _np_map(fn, name, logp, ref):
  x = np.asarray(logp, np.float64) - np.asarray(ref, np.float64)
  return np.array([fn(name, v) for v in x.ravel()]).reshape(x.shape)


def _random(shape, seed=0):
  rng = np.random.default_rng(seed)
  logp = rng.uniform(-2.0, 0.0, size=shape).astype(np.float32)
  ref = rng.uniform(-2.0, 0.0, size=shape).astype(np.float32)
  return logp, ref


# x = logp - ref = [0.5, -1.0, 0.0]
LOGP = np.array([-1.0, -2.0, -0.5], np.float32)
REF = np.array([-1.5, -1.0, -0.5], np.float32)
HAND = {
  "k1": [0.5, -1.0, 0.0],
  # x^2 / 2
  "k2": [0.125, 0.5, 0.0],
  # e^{-0.5} - 1 + 0.5 = 0.60653066 - 0.5; e^{1} - 1 - 1 = 0.71828183
  "k3": [0.10653066, 0.71828183, 0.0],
  "abs": [0.5, 1.0, 0.0],
}
# gradients w.r.t. logp: 1, x, 1 - e^{-x}, sign(x)
HAND_GRAD = {
  "k1": [1.0, 1.0, 1.0],
  "k2": [0.5, -1.0, 0.0],
  # 1 - e^{-0.5} = 0.39346934; 1 - e^{1} = -1.71828183
  "k3": [0.39346934, -1.71828183, 0.0],
  "abs": [1.0, -1.0, 0.0],
}


@pytest.mark.parametrize("name", ESTIMATORS)
def test_hand_values_and_gradients(name):
  fn = ESTIMATORS[name]
  got = jax.jit(fn)(LOGP, REF)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, HAND[name], rtol=1e-6, atol=1e-7)
  grad = jax.jit(jax.grad(lambda lp: jnp.sum(fn(lp, REF))))(LOGP)
  np.testing.assert_allclose(grad, HAND_GRAD[name], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(7,), (2, 3, 5)])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_random_values_and_gradients_match_numpy(name, shape):
  fn = ESTIMATORS[name]
  logp, ref = _random(shape)
  got = jax.jit(fn)(logp, ref)
  assert got.shape == shape
  np.testing.assert_allclose(
    got, _np_map(_np_value, name, logp, ref), rtol=1e-5, atol=1e-6
  )
  grad_logp, grad_ref = jax.jit(
    jax.grad(lambda lp, r: jnp.sum(fn(lp, r)), argnums=(0, 1))
  )(logp, ref)
  np.testing.assert_allclose(
    grad_logp, _np_map(_np_grad, name, logp, ref), rtol=1e-5, atol=1e-6
  )
  # The reference model is a constant.
  np.testing.assert_array_equal(grad_ref, np.zeros(shape))


@pytest.mark.parametrize("name", ["k1", "k3", "abs"])
def test_straight_through_has_own_value_and_k2_gradient(name):
  wrapped = _kl.straight_through(ESTIMATORS[name])
  assert wrapped.__name__ == f"{ESTIMATORS[name].__name__}_straight_through"
  logp, ref = _random((3, 4), seed=1)
  got = jax.jit(wrapped)(logp, ref)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(
    got, _np_map(_np_value, name, logp, ref), rtol=1e-5, atol=1e-6
  )
  grad = jax.jit(jax.grad(lambda lp: jnp.sum(wrapped(lp, ref))))(logp)
  # k2's gradient, x.
  x = logp.astype(np.float64) - ref.astype(np.float64)
  np.testing.assert_allclose(grad, x, rtol=1e-5, atol=1e-6)


def test_straight_through_hand_value_and_keyword_passthrough():
  k3_plus = _kl.straight_through(_kl.kl_k3)
  # x = 25: verl's clip of -x to -20 gives e^{-20} + 20 - 1 = 19.0 (not 24),
  # below clamp=100; the gradient is still k2's, x = 25.
  value, grad = jax.value_and_grad(
    lambda lp: k3_plus(lp, jnp.zeros(()), clamp=100.0)
  )(jnp.float32(25.0))
  np.testing.assert_allclose(value, 19.0, rtol=1e-6)
  np.testing.assert_allclose(grad, 25.0, rtol=1e-6)


def test_straight_through_names_partials():
  wrapped = _kl.straight_through(functools.partial(_kl.kl_k3, clamp=None))
  assert wrapped.__name__ == "kl_k3_straight_through"


def test_straight_through_rejects_non_callable():
  with pytest.raises(TypeError, match="estimator"):
    _kl.straight_through("k3")


def _expected_gradient(estimator, logits, ref_logp):
  """E_{y ~ pi}[grad_logits estimator(log pi(y), log ref(y))], exact over V.

  Every vocabulary entry is one "token"; weighting by the detached pi(y) and
  summing is the exact on-policy expectation of the per-sample gradient.
  """

  def loss(theta):
    logp = jax.nn.log_softmax(theta)
    weight = jax.lax.stop_gradient(jnp.exp(logp))
    return jnp.sum(weight * estimator(logp, ref_logp))

  return jax.jit(jax.grad(loss))(logits)


def _categorical():
  rng = np.random.default_rng(3)
  # Mild logits keep every k3 below verl's clamp (10), which would zero its
  # gradient; clamps are tested separately.
  logits = rng.normal(0.0, 0.5, size=6).astype(np.float32)
  ref_logits = rng.normal(0.0, 0.5, size=6)
  ref_logp = ref_logits - np.log(np.sum(np.exp(ref_logits)))
  return logits, ref_logp.astype(np.float32)


def test_on_policy_expected_gradients():
  """k1 as a loss has zero expected gradient; k2 and k3 do not.

  With x_y = log pi(y) - log ref(y) and softmax logits theta (numpy, exact):
    E[grad k1] = sum_y pi grad log pi = grad sum_y pi = 0;
    E[grad k2] = pi * (x - E_pi[x]) = grad_theta KL(pi || ref);
    E[grad k3] = pi - ref = grad_theta KL(ref || pi).
  """
  logits, ref_logp = _categorical()
  theta = logits.astype(np.float64)
  pi = np.exp(theta - theta.max())
  pi /= pi.sum()
  ref = np.exp(ref_logp.astype(np.float64))
  x = np.log(pi) - np.log(ref)
  grad_reverse_kl = pi * (x - np.sum(pi * x))
  grad_forward_kl = pi - ref

  k1 = _expected_gradient(_kl.kl_k1, logits, ref_logp)
  np.testing.assert_allclose(k1, np.zeros(6), atol=1e-6)
  k2 = _expected_gradient(_kl.kl_k2, logits, ref_logp)
  np.testing.assert_allclose(k2, grad_reverse_kl, rtol=1e-4, atol=1e-6)
  k3 = _expected_gradient(_kl.kl_k3, logits, ref_logp)
  np.testing.assert_allclose(k3, grad_forward_kl, rtol=1e-4, atol=1e-6)
  # Not zero: these are real training signals.
  assert np.linalg.norm(grad_reverse_kl) > 0.05
  assert np.linalg.norm(grad_forward_kl) > 0.05
  # Straight-through k1 / k3 get k2's (exact reverse-KL) expected gradient.
  for base in (_kl.kl_k1, _kl.kl_k3):
    st = _expected_gradient(_kl.straight_through(base), logits, ref_logp)
    np.testing.assert_allclose(st, grad_reverse_kl, rtol=1e-4, atol=1e-6)


def test_k3_clamps_in_extreme_cases():
  ref = jnp.zeros(2)
  logp = jnp.array([50.0, -30.0])

  def value_and_grad(**kw):
    fn = jax.jit(jax.value_and_grad(lambda lp, i: _kl.kl_k3(lp, ref, **kw)[i]))
    return [fn(logp, i) for i in range(2)]

  # Result clipped to 10 (true k3 is 49 and ~1.07e13): no gradient.
  for value, grad in value_and_grad():
    np.testing.assert_allclose(value, 10.0)
    np.testing.assert_array_equal(grad, np.zeros(2))
  (v_pos, g_pos), (v_neg, g_neg) = value_and_grad(clamp=None)
  # x = 50: e^{-50} - 1 + 50 = 49; gradient 1 - e^{-50} = 1.
  np.testing.assert_allclose(v_pos, 49.0, rtol=1e-6)
  np.testing.assert_allclose(g_pos[0], 1.0, rtol=1e-6)
  # x = -30: e^{30} - 31 = 1.0686475e13; gradient 1 - e^{30}.
  np.testing.assert_allclose(v_neg, math.exp(30.0) - 31.0, rtol=1e-5)
  np.testing.assert_allclose(g_neg[1], 1.0 - math.exp(30.0), rtol=1e-5)


def test_k3_log_ratio_clip_without_result_clip():
  # x = 25, clamp=100: -x is clipped to -20: e^{-20} + 20 - 1 = 19.0 (the
  # unclipped value would be 24) and the clipped log-ratio has no gradient.
  value, grad = jax.value_and_grad(
    lambda lp: _kl.kl_k3(lp, jnp.zeros(()), clamp=100.0)
  )(jnp.float32(25.0))
  np.testing.assert_allclose(value, 19.0, rtol=1e-6)
  np.testing.assert_allclose(grad, 0.0)


def test_importance_corrected_hand_value_and_gradient():
  # logp = 0, ref = 1: x = -1, k3 = e - 2 = 0.71828183.
  # old = -ln 2: r = e^{0 + ln 2} = 2; value = 2 (e - 2) = 1.43656366.
  # gradient = r (1 - e^{-x}) + r k3 = 2 (1 - e) + 2 (e - 2) = -2.
  fn = jax.jit(
    jax.value_and_grad(
      lambda lp, ref, old: _kl.kl_k3_importance_corrected(lp, ref, old),
      argnums=(0, 1, 2),
    )
  )
  value, (g_logp, g_ref, g_old) = fn(
    jnp.float32(0.0), jnp.float32(1.0), jnp.float32(-math.log(2.0))
  )
  np.testing.assert_allclose(value, 1.43656366, rtol=1e-6)
  np.testing.assert_allclose(g_logp, -2.0, rtol=1e-5)
  assert g_ref == 0.0 and g_old == 0.0


def test_importance_corrected_random_matches_numpy():
  logp, ref = _random((2, 3, 4), seed=5)
  old = logp + np.random.default_rng(6).normal(0, 0.3, logp.shape)
  old = old.astype(np.float32)
  got = jax.jit(_kl.kl_k3_importance_corrected)(logp, ref, old)
  grad = jax.jit(
    jax.grad(lambda lp: jnp.sum(_kl.kl_k3_importance_corrected(lp, ref, old)))
  )(logp)
  x = logp.astype(np.float64) - ref
  r = np.exp(logp.astype(np.float64) - old)
  k3 = np.exp(-x) - 1.0 + x
  np.testing.assert_allclose(got, k3 * r, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    grad, r * (1.0 - np.exp(-x)) + r * k3, rtol=1e-5, atol=1e-6
  )


def test_importance_corrected_equals_k3_on_policy():
  logp, ref = _random((4, 3), seed=7)
  np.testing.assert_allclose(
    _kl.kl_k3_importance_corrected(logp, ref, logp),
    _kl.kl_k3(logp, ref),
    rtol=1e-6,
  )


ALL = [
  *ESTIMATORS.values(),
  _kl.straight_through(_kl.kl_k1),
  _kl.straight_through(_kl.kl_k3),
  lambda lp, r: _kl.kl_k3_importance_corrected(lp, r, lp - 0.1),
]


@pytest.mark.parametrize("fn", ALL)
def test_bfloat16_inputs_give_finite_float32(fn):
  logp = jnp.array([[-0.5, -40.0, -1.0, 0.0]], jnp.bfloat16)
  ref = jnp.array([[-1.0, -1.0, -60.0, 0.0]], jnp.bfloat16)
  got = jax.jit(fn)(logp, ref)
  assert got.dtype == jnp.float32
  assert np.all(np.isfinite(got))
  grad = jax.grad(lambda lp: jnp.sum(fn(lp, ref)))(logp)
  assert np.all(np.isfinite(np.asarray(grad, np.float32)))


def test_shape_mismatch_and_bad_clamp_raise():
  with pytest.raises(ValueError, match="ref_logp_BT"):
    _kl.kl_k1(jnp.zeros((2, 3)), jnp.zeros((2, 4)))
  with pytest.raises(ValueError, match="old_logp_BT"):
    _kl.kl_k3_importance_corrected(
      jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros((3,))
    )
  with pytest.raises(ValueError, match="clamp"):
    _kl.kl_k3(jnp.zeros(3), jnp.zeros(3), clamp=-1.0)
