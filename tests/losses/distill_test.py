"""Distillation losses: GKD's generalized JSD and the token KLs against a
float64 numpy reference (values, finite-difference gradients), the two
endpoints and limits, a hand-worked case, masks, dtypes and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import losses

# --------------------------------------------------------------------------
# numpy reference (float64, probabilities mixed directly, no log-space tricks)


def _np_softmax(logits, temperature=1.0):
  z = np.asarray(logits, np.float64) / temperature
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def _np_kl(p, q):
  terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0) / q), 0.0)
  return terms.sum(-1)


def _np_jsd(student, teacher, beta, temperature=1.0):
  s = _np_softmax(student, temperature)
  t = _np_softmax(teacher, temperature)
  if beta == 0:
    return _np_kl(t, s)
  if beta == 1:
    return _np_kl(s, t)
  m = beta * t + (1 - beta) * s
  return beta * _np_kl(t, m) + (1 - beta) * _np_kl(s, m)


def _np_grad(fn, x, h=1e-6):
  """Central differences of sum(fn(x)) in float64."""
  x = np.asarray(x, np.float64)
  grad = np.zeros_like(x)
  for i in np.ndindex(x.shape):
    up, down = x.copy(), x.copy()
    up[i] += h
    down[i] -= h
    grad[i] = (fn(up).sum() - fn(down).sum()) / (2 * h)
  return grad


def _logits(shape=(2, 3, 5), seed=0, scale=2.0):
  rng = np.random.default_rng(seed)
  student = (scale * rng.standard_normal(shape)).astype(np.float32)
  teacher = (scale * rng.standard_normal(shape)).astype(np.float32)
  return student, teacher


BETAS = [0.0, 0.1, 0.5, 0.9, 1.0]


# --------------------------------------------------------------------------
# values and gradients against numpy


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_jsd_values_match_numpy(beta, temperature):
  student, teacher = _logits()
  fn = jax.jit(
    lambda s, t: losses.generalized_jsd(
      s, t, beta=beta, temperature=temperature
    )
  )
  got = fn(student, teacher)
  assert got.dtype == jnp.float32 and got.shape == (2, 3)
  want = _np_jsd(student, teacher, beta, temperature)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("beta", BETAS)
def test_jsd_gradient_matches_finite_differences(beta):
  student, teacher = _logits(shape=(2, 4), seed=1)
  temperature = 1.5

  def loss(s):
    return jnp.sum(
      losses.generalized_jsd(s, teacher, beta=beta, temperature=temperature)
    )

  got = jax.jit(jax.grad(loss))(student)
  want = _np_grad(lambda s: _np_jsd(s, teacher, beta, temperature), student)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_token_kls_match_numpy_and_the_jsd_endpoints():
  student, teacher = _logits(seed=2)
  s, t = _np_softmax(student), _np_softmax(teacher)
  forward = jax.jit(losses.token_forward_kl)(student, teacher)
  reverse = jax.jit(losses.token_reverse_kl)(student, teacher)
  np.testing.assert_allclose(forward, _np_kl(t, s), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(reverse, _np_kl(s, t), rtol=1e-5, atol=1e-6)
  # GKD's two ends are exactly these KLs (TRL's convention).
  np.testing.assert_array_equal(
    losses.generalized_jsd(student, teacher, beta=0.0), forward
  )
  np.testing.assert_array_equal(
    losses.generalized_jsd(student, teacher, beta=1.0), reverse
  )
  # The two directions differ, so the ends cannot be swapped unnoticed.
  assert np.all(np.abs(forward - reverse) > 1e-3)


def test_forward_kl_gradient_is_student_minus_teacher_over_tau():
  """d KL(T || S) / d z_S = (S - T) / tau, the textbook KD gradient."""
  student, teacher = _logits(shape=(3, 6), seed=3)
  tau = 2.0
  got = jax.grad(
    lambda s: jnp.sum(losses.token_forward_kl(s, teacher, temperature=tau))
  )(student)
  want = (_np_softmax(student, tau) - _np_softmax(teacher, tau)) / tau
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_interior_tends_to_the_kls_when_rescaled():
  """JSD(beta) / beta -> KL(T || S) as beta -> 0, JSD(beta) / (1 - beta) ->
  KL(S || T) as beta -> 1 (Huszar 2015; the paper's interpolation), with
  an O(beta) error that shrinks as beta does."""
  student, teacher = _logits(seed=4, scale=1.0)
  s, t = _np_softmax(student), _np_softmax(teacher)
  forward, reverse = _np_kl(t, s), _np_kl(s, t)
  errors = []
  for b in (1e-1, 1e-2, 1e-3):
    low = losses.generalized_jsd(student, teacher, beta=b) / b
    high = losses.generalized_jsd(student, teacher, beta=1 - b) / b
    errors.append(
      (
        np.max(np.abs(low - forward) / forward),
        np.max(np.abs(high - reverse) / reverse),
      )
    )
  assert errors[-1][0] < 1e-2 and errors[-1][1] < 1e-2
  assert errors[0][0] > errors[1][0] > errors[2][0]
  assert errors[0][1] > errors[1][1] > errors[2][1]
  # Unscaled, the interior vanishes at the ends (the documented jump).
  tiny = losses.generalized_jsd(student, teacher, beta=1e-3)
  assert np.all(tiny < 2e-3 * forward)


def test_hand_worked_two_token_vocabulary():
  # S = softmax([0, 0]) = [1/2, 1/2];  T = softmax([ln 3, 0]) = [3/4, 1/4].
  # forward KL(T||S) = 3/4 ln(3/2) + 1/4 ln(1/2)
  #                  = 0.75 * 0.4054651 - 0.25 * 0.6931472 = 0.1308120
  # reverse KL(S||T) = 1/2 ln(2/3) + 1/2 ln 2
  #                  = -0.5 * 0.4054651 + 0.5 * 0.6931472 = 0.1438410
  # beta = 1/2: M = [5/8, 3/8];
  #   KL(T||M) = 3/4 ln(6/5) + 1/4 ln(2/3)
  #            = 0.75 * 0.1823216 - 0.25 * 0.4054651 = 0.0353749
  #   KL(S||M) = 1/2 ln(4/5) + 1/2 ln(4/3)
  #            = -0.5 * 0.2231436 + 0.5 * 0.2876821 = 0.0322693
  #   JSD = (0.0353749 + 0.0322693) / 2 = 0.0338221
  # d forward / d z_S = S - T = [-1/4, 1/4].
  student = np.array([0.0, 0.0], np.float32)
  teacher = np.array([np.log(3.0), 0.0], np.float32)
  jsd = lambda b: losses.generalized_jsd(student, teacher, beta=b)  # noqa: E731
  np.testing.assert_allclose(jsd(0.0), 0.1308120, atol=1e-6)
  np.testing.assert_allclose(jsd(1.0), 0.1438410, atol=1e-6)
  np.testing.assert_allclose(jsd(0.5), 0.0338221, atol=1e-6)
  grad = jax.grad(lambda s: losses.generalized_jsd(s, teacher, beta=0.0))
  np.testing.assert_allclose(grad(student), [-0.25, 0.25], atol=1e-6)


# --------------------------------------------------------------------------
# properties


@pytest.mark.parametrize("beta", BETAS)
def test_identical_models_give_zero_loss_and_gradient(beta):
  student, _ = _logits(seed=5)
  value, grad = jax.value_and_grad(
    lambda s: jnp.sum(losses.generalized_jsd(s, student, beta=beta))
  )(student)
  np.testing.assert_allclose(value, 0.0, atol=1e-6)
  np.testing.assert_allclose(grad, 0.0, atol=1e-6)


def test_teacher_is_detached():
  student, teacher = _logits(seed=6)
  for fn in (losses.token_forward_kl, losses.token_reverse_kl):
    grad = jax.grad(lambda t, fn=fn: jnp.sum(fn(student, t)))(teacher)
    np.testing.assert_array_equal(grad, 0.0)
  grad = jax.grad(
    lambda t: jnp.sum(losses.generalized_jsd(student, t, beta=0.5))
  )(teacher)
  np.testing.assert_array_equal(grad, 0.0)


def test_mask_zeroes_padding_even_when_it_holds_nan():
  student, teacher = _logits(seed=7)
  mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
  bad_s, bad_t = student.copy(), teacher.copy()
  bad_s[mask == 0] = np.nan
  bad_t[mask == 0] = np.inf

  def loss(s):
    return jnp.sum(losses.generalized_jsd(s, bad_t, mask, beta=0.3))

  value, grad = jax.jit(jax.value_and_grad(loss))(bad_s)
  want = np.where(mask > 0, _np_jsd(student, teacher, 0.3), 0.0).sum()
  np.testing.assert_allclose(value, want, rtol=1e-5)
  assert np.all(np.isfinite(grad))
  np.testing.assert_array_equal(grad[mask == 0], 0.0)
  assert np.any(grad[mask > 0] != 0)


def test_zero_probability_vocabulary_rows_stay_finite():
  """A padded vocabulary (teacher logit -inf) adds nothing to KL(T || .)
  and keeps JSD and the gradients finite."""
  student, teacher = _logits(shape=(3, 5), seed=8)
  teacher[:, -1] = -np.inf
  t = _np_softmax(teacher)
  s = _np_softmax(student)
  for beta in (0.0, 0.5):
    value, grad = jax.value_and_grad(
      lambda z, b=beta: jnp.sum(losses.generalized_jsd(z, teacher, beta=b))
    )(student)
    m = s if beta == 0 else 0.5 * t + 0.5 * s
    want = _np_kl(t, m) if beta == 0 else 0.5 * (_np_kl(t, m) + _np_kl(s, m))
    np.testing.assert_allclose(value, want.sum(), rtol=1e-5)
    assert np.all(np.isfinite(grad))


def test_bfloat16_logits_give_float32_close_to_float32():
  student, teacher = _logits(seed=9)
  f32 = losses.generalized_jsd(student, teacher, beta=0.5)
  bf16 = jax.jit(lambda s, t: losses.generalized_jsd(s, t, beta=0.5))(
    jnp.asarray(student, jnp.bfloat16), jnp.asarray(teacher, jnp.bfloat16)
  )
  assert bf16.dtype == jnp.float32
  np.testing.assert_allclose(bf16, f32, rtol=0.05, atol=0.02)


def test_gkd_loss_is_the_jsd_with_metrics():
  student, teacher = _logits(shape=(2, 4, 6), seed=10)
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
  teacher[0, 0] = student[0, 0]  # one token where the argmaxes agree
  loss, metrics = jax.jit(
    lambda s, t, m: losses.gkd_loss(s, t, m, beta=0.2, temperature=0.7)
  )(student, teacher, mask)
  want = np.where(mask > 0, _np_jsd(student, teacher, 0.2, 0.7), 0.0)
  np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    metrics["gkd_jsd"].value, want.sum() / mask.sum(), rtol=1e-5
  )
  agree = student.argmax(-1) == teacher.argmax(-1)
  np.testing.assert_allclose(
    metrics["gkd_top1_agreement"].value,
    (agree * mask).sum() / mask.sum(),
    rtol=1e-6,
  )
  assert agree[0, 0]


# --------------------------------------------------------------------------
# errors


def test_bad_inputs_are_clear_errors():
  student, teacher = _logits()
  with pytest.raises(ValueError, match="beta must be in"):
    losses.generalized_jsd(student, teacher, beta=1.5)
  with pytest.raises(ValueError, match="temperature must be > 0"):
    losses.generalized_jsd(student, teacher, temperature=0.0)
  with pytest.raises(ValueError, match="same shape.*vocab"):
    losses.generalized_jsd(student, teacher[..., :4])
  with pytest.raises(ValueError, match="mask has shape"):
    losses.token_reverse_kl(student, teacher, np.ones((2, 3, 5)))
  with pytest.raises(ValueError, match="vocabulary axis last"):
    losses.token_forward_kl(np.float32(1.0), np.float32(1.0))
  with pytest.raises(ValueError, match="rank >= 2"):
    losses.gkd_loss(student[0, 0], teacher[0, 0], np.ones(()))
