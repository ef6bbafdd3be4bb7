"""Value losses: hand values, numpy values and gradients, clip fraction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.losses import _value

# eps = 0.2. Per token (v, v_old, R):
#   (1.0, 0.5, 0.0): clip(v) = 0.7; max(1^2, 0.7^2) = 1 -> 0.5; grad v - R = 1
#   (1.0, 0.9, 2.0): v inside [0.7, 1.1], both branches 1 -> 0.5; grad -1
#   (0.0, 0.0, 1.0): v inside, both 1 -> 0.5; grad -1
#   (0.5, 2.0, 0.0): clip(v) = 1.8; max(0.25, 3.24) = 3.24 -> 1.62 (clipped
#                    branch strictly larger, v outside the band: grad 0)
VALUES = np.array([1.0, 1.0, 0.0, 0.5], np.float32)
OLD = np.array([0.5, 0.9, 0.0, 2.0], np.float32)
RETURNS = np.array([0.0, 2.0, 1.0, 0.0], np.float32)


def test_value_clip_hand_values_and_gradient():
  out = jax.jit(_value.value_clip)(VALUES, OLD, RETURNS)
  assert isinstance(out, _value.ValueLoss)
  assert out.loss.dtype == jnp.float32 and out.clipped.dtype == jnp.float32
  np.testing.assert_allclose(out.loss, [0.5, 0.5, 0.5, 1.62], rtol=1e-6)
  np.testing.assert_array_equal(out.clipped, [0.0, 0.0, 0.0, 1.0])
  grad = jax.grad(lambda v: jnp.sum(_value.value_clip(v, OLD, RETURNS).loss))(
    VALUES
  )
  np.testing.assert_allclose(grad, [1.0, -1.0, -1.0, 0.0], rtol=1e-6)


def _np_value_clip(v, v_old, ret, eps):
  """Loss, clipped flag and d loss / d v per token, float64, one at a time."""
  loss, clipped, grad = [], [], []
  for vi, oi, ri in zip(v.ravel(), v_old.ravel(), ret.ravel()):
    vi, oi, ri = float(vi), float(oi), float(ri)
    vc = min(max(vi, oi - eps), oi + eps)
    inside = oi - eps < vi < oi + eps
    if (vc - ri) ** 2 > (vi - ri) ** 2:
      loss.append(0.5 * (vc - ri) ** 2)
      clipped.append(1.0)
      grad.append((vc - ri) if inside else 0.0)
    else:
      loss.append(0.5 * (vi - ri) ** 2)
      clipped.append(0.0)
      grad.append(vi - ri)
  shape = v.shape
  return (np.reshape(a, shape) for a in (loss, clipped, grad))


@pytest.mark.parametrize("eps", [0.2, 0.5])
@pytest.mark.parametrize("shape", [(16,), (2, 3, 6)])
def test_value_clip_random_matches_numpy(shape, eps):
  rng = np.random.default_rng(0)
  old = rng.normal(size=shape).astype(np.float32)
  values = (old + rng.normal(0.0, 1.5, size=shape)).astype(np.float32)
  returns = rng.normal(size=shape).astype(np.float32)
  fn = jax.jit(lambda v, o, r: _value.value_clip(v, o, r, eps=eps))
  out = fn(values, old, returns)
  loss, clipped, grad = _np_value_clip(values, old, returns, eps)
  np.testing.assert_allclose(out.loss, loss, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(out.clipped, clipped)
  assert 0 < clipped.sum() < clipped.size  # both branches are exercised
  grads = jax.jit(
    jax.grad(
      lambda v, o, r: jnp.sum(_value.value_clip(v, o, r, eps=eps).loss),
      argnums=(0, 1, 2),
    )
  )(values, old, returns)
  np.testing.assert_allclose(grads[0], grad, rtol=1e-5, atol=1e-6)
  # Old values and returns are targets: no gradient.
  np.testing.assert_array_equal(grads[1], np.zeros(shape))
  np.testing.assert_array_equal(grads[2], np.zeros(shape))


def test_value_clip_with_wide_band_is_mse():
  rng = np.random.default_rng(1)
  values, old, returns = rng.normal(size=(3, 2, 5)).astype(np.float32)
  wide = _value.value_clip(values, old, returns, eps=1e6)
  mse = _value.value_mse(values, returns)
  np.testing.assert_allclose(wide.loss, mse.loss, rtol=1e-6)
  np.testing.assert_array_equal(wide.clipped, np.zeros((2, 5)))


def test_value_mse_hand_values_and_gradient():
  # 0.5 (v - R)^2 = 0.5 * [1, 1, 1, 0.25]; gradient v - R.
  out = jax.jit(_value.value_mse)(VALUES, RETURNS)
  np.testing.assert_allclose(out.loss, [0.5, 0.5, 0.5, 0.125], rtol=1e-6)
  np.testing.assert_array_equal(out.clipped, np.zeros(4))
  grad_v, grad_r = jax.grad(
    lambda v, r: jnp.sum(_value.value_mse(v, r).loss), argnums=(0, 1)
  )(VALUES, RETURNS)
  np.testing.assert_allclose(grad_v, [1.0, -1.0, -1.0, 0.5], rtol=1e-6)
  np.testing.assert_array_equal(grad_r, np.zeros(4))


def test_bfloat16_inputs_give_finite_float32():
  v, o, r = (jnp.asarray(a, jnp.bfloat16) for a in (VALUES, OLD, RETURNS))
  for out in (_value.value_clip(v, o, r), _value.value_mse(v, r)):
    assert out.loss.dtype == jnp.float32
    assert out.clipped.dtype == jnp.float32
    assert np.all(np.isfinite(out.loss))
  np.testing.assert_allclose(
    _value.value_clip(v, o, r).loss, [0.5, 0.5, 0.5, 1.62], rtol=1e-2
  )


@pytest.mark.parametrize("eps", [0.0, -0.2])
def test_bad_eps_raises(eps):
  with pytest.raises(ValueError, match="eps"):
    _value.value_clip(VALUES, OLD, RETURNS, eps=eps)


def test_shape_mismatch_raises():
  with pytest.raises(ValueError, match="returns_BT"):
    _value.value_clip(VALUES, OLD, RETURNS[:3])
  with pytest.raises(ValueError, match="returns_BT"):
    _value.value_mse(VALUES[None], RETURNS)
