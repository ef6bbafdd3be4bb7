"""Robust DPO, ORPO, CPO, KTO, TGDPO; DPO and IPO limit properties."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.losses import _preference as P


def _log_sigmoid(z):
  return -math.log1p(math.exp(-z)) if z >= 0 else z - math.log1p(math.exp(z))


def _sigmoid(z):
  return math.exp(_log_sigmoid(z))


def _grads(fn, args, n):
  loss = lambda *a: jnp.sum(fn(*a).loss)
  out = jax.jit(jax.grad(loss, argnums=tuple(range(n))))(*args)
  return [np.asarray(g) for g in out]


def _four(shape, seed):
  rng = np.random.default_rng(seed)
  return [rng.uniform(-30, -5, size=shape).astype(np.float32) for _ in range(4)]


# -------------------------------------------------------------- DPO, IPO limits


def test_dpo_small_beta_limit_is_log2_and_half_beta_gradient():
  c, r, rc, rr = _four((6,), 0)
  for beta in (1e-3, 1e-5):
    fn = functools.partial(P.dpo, beta=beta)
    out = fn(c, r, rc, rr)
    np.testing.assert_allclose(out.loss, math.log(2.0), atol=beta * 30)
    g_c, g_r = _grads(fn, (c, r, rc, rr), 2)
    # d/dh -log sigma(beta h) -> -beta / 2 as beta h -> 0: chosen -beta/2.
    np.testing.assert_allclose(g_c, -beta / 2, rtol=beta * 30)
    np.testing.assert_allclose(g_r, beta / 2, rtol=beta * 30)


def test_ipo_gradient_vanishes_only_at_the_target_margin():
  beta = 0.25  # target h = 1 / (2 beta) = 2
  zero = jnp.zeros(())
  grad = jax.jit(jax.grad(lambda c: P.ipo(c, zero, zero, zero, beta=beta).loss))
  np.testing.assert_allclose(grad(jnp.float32(2.0)), 0.0, atol=1e-6)
  for h in (1.0, 1.5, 2.5, 4.0):
    np.testing.assert_allclose(grad(jnp.float32(h)), 2 * (h - 2.0), rtol=1e-6)


# -------------------------------------------------------------------- robust


def test_robust_dpo_hand_values():
  # h = 2, beta = 0.5: z = 1. l(1) = 0.31326169, l(-1) = 1.31326169.
  # eps = 0.1: (0.9 * 0.31326169 - 0.1 * 1.31326169) / 0.8
  #          = (0.28193552 - 0.13132617) / 0.8 = 0.18826169.
  args = [jnp.array([v]) for v in (-1.0, -3.0, -2.0, -2.0)]
  out = jax.jit(lambda *a: P.robust_dpo(*a, beta=0.5, label_smoothing=0.1))(
    *args
  )
  np.testing.assert_allclose(out.loss, [0.18826169], rtol=1e-6)
  np.testing.assert_allclose(out.chosen_reward, [0.5])
  # eps = 0 is DPO.
  np.testing.assert_allclose(
    P.robust_dpo(*args, beta=0.5, label_smoothing=0.0).loss,
    P.dpo(*args, beta=0.5).loss,
  )


@pytest.mark.parametrize("eps", [0.05, 0.3])
def test_robust_dpo_matches_numpy_and_is_unbiased(eps):
  beta = 0.2
  c, r, rc, rr = _four((3, 4), 1)
  fn = functools.partial(P.robust_dpo, beta=beta, label_smoothing=eps)
  out = jax.jit(fn)(c, r, rc, rr)
  g = _grads(fn, (c, r, rc, rr), 4)
  flipped = fn(r, c, rr, rc).loss
  for idx in np.ndindex(3, 4):
    z = beta * ((c[idx] - rc[idx]) - (r[idx] - rr[idx]))
    z = float(z)
    loss = ((1 - eps) * -_log_sigmoid(z) - eps * -_log_sigmoid(-z)) / (
      1 - 2 * eps
    )
    dz = (-(1 - eps) * _sigmoid(-z) - eps * _sigmoid(z)) / (1 - 2 * eps)
    np.testing.assert_allclose(out.loss[idx], loss, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g[0][idx], beta * dz, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(g[1][idx], -beta * dz, rtol=1e-4, atol=1e-6)
    # Unbiased: E over a flip with prob eps equals the clean DPO loss.
    mix = (1 - eps) * out.loss[idx] + eps * flipped[idx]
    np.testing.assert_allclose(mix, -_log_sigmoid(z), rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(g[2], 0.0)
  np.testing.assert_array_equal(g[3], 0.0)


def test_robust_dpo_gradient_floor():
  # z -> inf: dL/dz -> -eps / (1 - 2 eps) = -0.1 / 0.8 = -0.125.
  zero = jnp.zeros(1)
  grad = jax.grad(
    lambda c: jnp.sum(
      P.robust_dpo(c, zero, zero, zero, beta=1.0, label_smoothing=0.1).loss
    )
  )(jnp.array([200.0]))
  np.testing.assert_allclose(grad, [-0.125], rtol=1e-6)


# ---------------------------------------------------------------------- ORPO


def _np_log_odds(x):
  return x - math.log(1.0 - math.exp(x))


def test_orpo_hand_values():
  # x_c = log 0.5, x_r = log 0.2: odds 1 and 0.25, log odds ratio log 4.
  # L_OR = -log sigma(log 4) = -log(4/5) = 0.22314355;
  # L = -log 0.5 + 0.1 * 0.22314355 = 0.69314718 + 0.02231436 = 0.71546154.
  out = jax.jit(lambda a, b: P.orpo(a, b, lam=0.1))(
    jnp.array([math.log(0.5)]), jnp.array([math.log(0.2)])
  )
  np.testing.assert_allclose(out.loss, [0.71546154], rtol=1e-6)
  np.testing.assert_allclose(out.chosen_reward, [0.1 * math.log(0.5)])
  np.testing.assert_array_equal(out.accuracy, [1.0])


def test_orpo_matches_numpy_values_and_gradients():
  rng = np.random.default_rng(3)
  c = rng.uniform(-4, -0.01, size=(2, 5)).astype(np.float32)
  r = rng.uniform(-4, -0.01, size=(2, 5)).astype(np.float32)
  lam = 0.3
  fn = functools.partial(P.orpo, lam=lam)
  out = jax.jit(fn)(c, r)
  g_c, g_r = _grads(fn, (c, r), 2)
  for idx in np.ndindex(2, 5):
    xc, xr = float(c[idx]), float(r[idx])
    u = _np_log_odds(xc) - _np_log_odds(xr)
    np.testing.assert_allclose(
      out.loss[idx], -xc - lam * _log_sigmoid(u), rtol=1e-4
    )
    # d log odds / dx = 1 / (1 - p); the paper's Eq. 10 factor.
    d_c = -1 - lam * _sigmoid(-u) / (1 - math.exp(xc))
    d_r = lam * _sigmoid(-u) / (1 - math.exp(xr))
    np.testing.assert_allclose(g_c[idx], d_c, rtol=1e-3)
    np.testing.assert_allclose(g_r[idx], d_r, rtol=1e-3)


def test_log_odds_is_stable_and_finite():
  x = jnp.array([0.0, -1e-12, -1e-4, -0.7, -30.0, -200.0])
  out = np.asarray(jax.jit(P.log_odds)(x))
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out[2], _np_log_odds(-1e-4), rtol=1e-3)
  np.testing.assert_allclose(out[3], _np_log_odds(-0.7), rtol=1e-5)
  np.testing.assert_allclose(out[4:], [-30.0, -200.0], rtol=1e-6)
  g = jax.grad(lambda v: jnp.sum(P.log_odds(v)))(x)
  assert np.all(np.isfinite(np.asarray(g)))


# ----------------------------------------------------------------------- CPO


def test_cpo_hand_values():
  # chosen -4, rejected -6, beta 0.5: z = 1, -log sigma(1) = 0.31326169.
  # alpha 1, summed NLL 4: 4.31326169; per token (length 2): 2.31326169.
  c, r = jnp.array([-4.0]), jnp.array([-6.0])
  np.testing.assert_allclose(
    P.cpo(c, r, beta=0.5).loss, [4.31326169], rtol=1e-6
  )
  out = jax.jit(lambda a, b, n: P.cpo(a, b, beta=0.5, chosen_length=n))(
    c, r, jnp.array([2.0])
  )
  np.testing.assert_allclose(out.loss, [2.31326169], rtol=1e-6)
  np.testing.assert_allclose(out.chosen_reward, [-2.0])


def test_cpo_matches_numpy_gradients():
  c, r = _four((7,), 4)[:2]
  n = np.arange(3, 10).astype(np.float32)
  beta, alpha, eps = 0.2, 0.7, 0.1
  fn = lambda a, b: P.cpo(
    a, b, beta=beta, alpha=alpha, label_smoothing=eps, chosen_length=n
  )
  out = jax.jit(fn)(c, r)
  g_c, g_r = _grads(fn, (c, r), 2)
  for i in range(7):
    z = beta * float(c[i] - r[i])
    loss = -(1 - eps) * _log_sigmoid(z) - eps * _log_sigmoid(-z)
    loss += alpha * -float(c[i]) / n[i]
    dz = -(1 - eps) * _sigmoid(-z) + eps * _sigmoid(z)
    np.testing.assert_allclose(out.loss[i], loss, rtol=1e-5)
    np.testing.assert_allclose(g_c[i], beta * dz - alpha / n[i], rtol=1e-4)
    np.testing.assert_allclose(g_r[i], -beta * dz, rtol=1e-4, atol=1e-7)


# ----------------------------------------------------------------------- KTO


def test_kto_reference_point_hand_values():
  # mean(-1 - -2, -3 - -1, -2 - -2.5) = mean(1, -2, 0.5) = -1/6 -> 0.
  a, b = jnp.array([-1.0, -3.0, -2.0]), jnp.array([-2.0, -1.0, -2.5])
  assert float(P.kto_reference_point(a, b)) == 0.0
  # masked: mean(1, 0.5) = 0.75.
  z = P.kto_reference_point(a, b, where=jnp.array([1.0, 0.0, 1.0]))
  np.testing.assert_allclose(z, 0.75)
  g = jax.grad(lambda x: P.kto_reference_point(x, b))(a + 5.0)
  np.testing.assert_array_equal(g, 0.0)


def test_kto_hand_values():
  # r = (1, -1), z0 = 0.5, beta = 1: desirable 1 - sigma(0.5) = 0.37754067;
  # undesirable weight 2: 2 (1 - sigma(0.5 - -1)) = 2 (1 - sigma(1.5))
  #   = 2 * 0.18242552 = 0.36485104.
  out = jax.jit(
    lambda *a: P.kto(*a, beta=1.0, desirable_weight=1.0, undesirable_weight=2.0)
  )(jnp.array([0.0, -2.0]), jnp.array([-1.0, -1.0]), jnp.array([1, 0]), 0.5)
  np.testing.assert_allclose(out.loss, [0.37754067, 0.36485104], rtol=1e-6)
  np.testing.assert_allclose(out.reward, [1.0, -1.0])
  np.testing.assert_array_equal(out.accuracy, [1.0, 1.0])


def _np_kto(logp, ref, desirable, kl_logp, kl_ref, beta, w_d, w_u):
  z0 = max(0.0, float(np.mean(kl_logp.astype(np.float64) - kl_ref)))
  loss, grad = [], []
  for lp, rf, d in zip(logp, ref, desirable):
    r = float(lp) - float(rf)
    if d:
      s = _sigmoid(beta * (r - z0))
      loss.append(w_d * (1 - s))
      grad.append(-w_d * beta * s * (1 - s))
    else:
      s = _sigmoid(beta * (z0 - r))
      loss.append(w_u * (1 - s))
      grad.append(w_u * beta * s * (1 - s))
  return np.array(loss), np.array(grad), z0


@pytest.mark.parametrize("w_u", [1.0, 3.0])
def test_kto_unbalanced_3_to_1_matches_numpy(w_u):
  # 3 desirable : 1 undesirable, as in the KTO paper's imbalance study; the
  # advised weights put w_D n_D / (w_U n_U) = 3 / w_U in [1, 4/3].
  rng = np.random.default_rng(5)
  n = 12
  logp = rng.uniform(-20, -5, n).astype(np.float32)
  ref = (logp + rng.normal(0, 1.0, n)).astype(np.float32)
  desirable = np.array([1, 1, 1, 0] * 3)
  # Mismatched completions: prompt i with completion i + 1 (a rotation).
  kl_logp = np.roll(logp, -1) + rng.normal(0, 0.5, n).astype(np.float32)
  kl_ref = np.roll(ref, -1).astype(np.float32)
  beta = 0.5

  def fn(lp, klp):
    z0 = P.kto_reference_point(klp, kl_ref)
    return P.kto(lp, ref, desirable, z0, beta=beta, undesirable_weight=w_u)

  out = jax.jit(fn)(logp, kl_logp)
  g, g_kl = jax.jit(jax.grad(lambda a, b: jnp.sum(fn(a, b).loss), (0, 1)))(
    logp, kl_logp
  )
  loss, grad, z0 = _np_kto(
    logp, ref, desirable, kl_logp, kl_ref, beta, 1.0, w_u
  )
  assert z0 > 0  # the clamp is not active in this draw
  np.testing.assert_allclose(out.loss, loss, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(g, grad, rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(g_kl, 0.0)  # z0 is detached
  # The undesirable share of the total loss scales with w_u.
  share = loss[desirable == 0].sum() / loss.sum()
  np.testing.assert_allclose(
    out.loss[desirable == 0].sum() / out.loss.sum(), share, rtol=1e-4
  )


# --------------------------------------------------------------------- TGDPO


def _tgdpo_np(c, r, rc, rr, mc, mr, kc, kr, beta, alpha):
  s_c = np.sum(mc * beta * (1 + alpha * beta * (kc - rc)) * (c - rc), -1)
  s_r = np.sum(mr * beta * (1 - alpha * beta * (kr - rr)) * (r - rr), -1)
  u = (s_c - s_r).astype(np.float64)
  sig = 1 / (1 + np.exp(u))  # sigma(-u)
  loss = np.log1p(np.exp(-u))
  g_c = -sig[:, None] * mc * beta * (1 + alpha * beta * (kc - rc))
  g_r = sig[:, None] * mr * beta * (1 - alpha * beta * (kr - rr))
  return loss, g_c, g_r


def test_tgdpo_hand_values():
  # One token each, beta 1, alpha 0.5: chosen Delta 1, r 2, weight
  # 1 + 0.5 * 2 = 2 -> s_c = 2; rejected Delta -1, r -2, weight
  # 1 - 0.5 * (-2) = 2 -> s_r = -2. L = -log sigma(4) = 0.01814993.
  one = jnp.ones((1, 1))
  out = jax.jit(lambda *a: P.tgdpo(*a, beta=1.0, alpha=0.5))(
    0 * one, -2 * one, -1 * one, -1 * one, 1 * one, -3 * one, one, one
  )
  np.testing.assert_allclose(out.loss, [0.01814993], rtol=1e-5)
  np.testing.assert_allclose(out.chosen_reward, [2.0])
  np.testing.assert_allclose(out.rejected_reward, [-2.0])


def test_tgdpo_matches_numpy_and_reduces_to_dpo():
  rng = np.random.default_rng(6)
  shape = (3, 5)
  c, r, rc, rr, kc, kr = [
    rng.uniform(-4, -0.1, shape).astype(np.float32) for _ in range(6)
  ]
  mc = (rng.uniform(size=shape) < 0.8).astype(np.float32)
  mr = (rng.uniform(size=shape) < 0.8).astype(np.float32)
  beta, alpha = 0.3, 0.5
  fn = functools.partial(P.tgdpo, beta=beta, alpha=alpha)
  args = (c, r, rc, rr, kc, kr, mc, mr)
  out = jax.jit(fn)(*args)
  g = _grads(fn, args, 6)
  loss, g_c, g_r = _tgdpo_np(c, r, rc, rr, mc, mr, kc, kr, beta, alpha)
  np.testing.assert_allclose(out.loss, loss, rtol=1e-5)
  np.testing.assert_allclose(g[0], g_c, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(g[1], g_r, rtol=1e-4, atol=1e-7)
  for k in range(2, 6):  # reference and reward-model inputs are constants
    np.testing.assert_array_equal(g[k], 0.0)
  # alpha = 0 is DPO on the summed log-probs.
  plain = P.tgdpo(*args, beta=beta, alpha=0.0)
  seq = lambda x, m: P.sequence_logp(x, m)
  dpo = P.dpo(seq(c, mc), seq(r, mr), seq(rc, mc), seq(rr, mr), beta=beta)
  np.testing.assert_allclose(plain.loss, dpo.loss, rtol=1e-5)


# ------------------------------------------------------------- bad arguments


def test_bad_arguments_raise_clear_errors():
  x = jnp.ones(3)
  with pytest.raises(ValueError, match="label_smoothing"):
    P.robust_dpo(x, x, x, x, label_smoothing=0.5)
  with pytest.raises(ValueError, match="lam"):
    P.orpo(x, x, lam=0.0)
  with pytest.raises(ValueError, match="rejected_mean_logp"):
    P.orpo(x, jnp.ones(2))
  with pytest.raises(ValueError, match="alpha"):
    P.cpo(x, x, alpha=-1.0)
  with pytest.raises(ValueError, match="chosen_length"):
    P.cpo(x, x, chosen_length=jnp.ones(2))
  with pytest.raises(ValueError, match="undesirable_weight"):
    P.kto(x, x, x, 0.0, undesirable_weight=0.0)
  with pytest.raises(ValueError, match="reference_point"):
    P.kto(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones(3))
  with pytest.raises(ValueError, match="ref_kl_logp"):
    P.kto_reference_point(x, jnp.ones(2))
  t = jnp.ones((2, 4))
  with pytest.raises(ValueError, match="rejected_mask_BT"):
    P.tgdpo(t, t, t, t, t, t, t, jnp.ones((2, 3)))
  with pytest.raises(ValueError, match="rejected_logp_BT"):
    u = jnp.ones((3, 4))
    P.tgdpo(t, u, t, u, t, u, t, u)
  with pytest.raises(ValueError, match="alpha"):
    P.tgdpo(t, t, t, t, t, t, t, t, alpha=-0.1)
