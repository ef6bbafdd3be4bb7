"""XRPO's novelty-sharpened advantages: the bonus against numpy and a
hand-worked case, and the batch stage after GRPO's advantages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import advantages as A
from rljax import aggregate
from rljax import transforms as T
from rljax.testing import random_batch


def np_bonus(adv, s, correct, valid, lam, kappa):
  """Independent reference of XRPO's bonus (float64)."""
  adv, s = np.asarray(adv, np.float64), np.asarray(s, np.float64)
  valid = np.asarray(valid, np.float64)
  s_bar = (s * valid).sum(-1, keepdims=True) / np.maximum(
    valid.sum(-1, keepdims=True), 1
  )
  eta = np.exp(s - s_bar)
  bonus = np.minimum(np.maximum(lam * (1 - eta), 0), kappa * adv)
  gate = (valid > 0) & (np.asarray(correct) != 0) & (adv > 0)
  return np.where(gate, bonus, 0.0)


def test_bonus_by_hand():
  # s = -1, -2, -1.5: mean -1.5, eta = e^0.5, e^-0.5, 1 = 1.6487, 0.6065,
  # 1; lam (1 - eta) = -0.6487, 0.3935, 0. Only the second, correct and
  # less likely than average, gets a bonus: 0.39347 (capped at kappa A =
  # 1); the third is wrong.
  adv = jnp.array([[1.0, 1.0, -2.0]])
  s = jnp.array([[-1.0, -2.0, -1.5]])
  correct = jnp.array([[1, 1, 0]])
  ones = jnp.ones((1, 3))
  got = T.xrpo_novelty_bonus(adv, s, correct, ones)
  np.testing.assert_allclose(got, [[0, 0.39347, 0]], atol=1e-5)
  # kappa = 0.2 caps it at 0.2 A = 0.2.
  got = T.xrpo_novelty_bonus(adv, s, correct, ones, kappa=0.2)
  np.testing.assert_allclose(got, [[0, 0.2, 0]], atol=1e-6)


@pytest.mark.parametrize(("lam", "kappa"), [(1.0, 1.0), (0.5, 0.3), (2, 0)])
def test_bonus_matches_numpy_jitted(lam, kappa):
  rng = np.random.default_rng(0)
  adv = rng.normal(size=(5, 6))
  s = -rng.gamma(2.0, 0.5, size=(5, 6))
  correct = rng.integers(0, 2, size=(5, 6))
  valid = rng.random((5, 6)) < 0.8
  fn = jax.jit(lambda *a: T.xrpo_novelty_bonus(*a, lam=lam, kappa=kappa))
  got = fn(adv, s, correct, valid)
  want = np_bonus(adv, s, correct, valid, lam, kappa)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(got)[~valid] == 0)


def test_bonus_gradient_matches_finite_differences():
  # Away from the clip kinks the bonus is lam (1 - exp(s_i - s_bar)).
  adv = np.array([[3.0, 3.0, 3.0, -1.0]])
  s = np.array([[-1.0, -1.6, -1.3, -0.7]])
  correct = np.array([[1, 1, 1, 0]])
  valid = np.ones((1, 4))

  def total(s_):
    return T.xrpo_novelty_bonus(adv, s_, correct, valid).sum()

  grad = jax.grad(total)(jnp.asarray(s, jnp.float32))
  eps, fd = 1e-4, np.zeros_like(s)
  for j in range(4):
    up, down = s.copy(), s.copy()
    up[0, j] += eps
    down[0, j] -= eps
    fd[0, j] = (
      np_bonus(adv, up, correct, valid, 1, 1).sum()
      - np_bonus(adv, down, correct, valid, 1, 1).sum()
    ) / (2 * eps)
  np.testing.assert_allclose(grad, fd, atol=2e-3)


def _prepare(stage, batch):
  algo = rljax.Algorithm(stage, aggregate.token_mean)
  out, _ = jax.jit(
    lambda b: algo.prepare(b, algo.init(), key=jax.random.key(0))
  )(batch)
  return out


def test_stage_adds_the_bonus_after_grpo():
  batch = random_batch(3, prompts=4, samples=5, tokens=6)
  base = _prepare(T.group_advantages(A.grpo), batch)
  out = _prepare(
    rljax.chain(T.group_advantages(A.grpo), T.xrpo_novelty_advantages(lam=2.0)),
    batch,
  )
  mask = np.asarray(batch.mask_PGT, np.float64)
  adv = np.asarray(base.advantages_PGT, np.float64)
  a_seq = (adv * mask).sum(-1) / mask.sum(-1)
  s = (np.asarray(batch.old_logp_PGT) * mask).sum(-1) / mask.sum(-1)
  correct = np.asarray(batch.rewards_PGK)[..., 0] > 0
  bonus = np_bonus(a_seq, s, correct, np.ones_like(s), 2.0, 1.0)
  assert bonus.max() > 0  # the case exercises the bonus
  np.testing.assert_allclose(
    out.advantages_PGT, adv + bonus[..., None] * mask, rtol=1e-5, atol=1e-6
  )
  np.testing.assert_allclose(out.extra["novelty_bonus_PG"], bonus, atol=1e-6)


def test_stage_errors():
  with pytest.raises(ValueError, match="lam must be >= 0"):
    T.xrpo_novelty_advantages(lam=-1.0)
  batch = random_batch(0)._replace(old_logp_PGT=None, rollout_logp_PGT=None)
  stage = rljax.chain(T.group_advantages(A.grpo), T.xrpo_novelty_advantages())
  with pytest.raises(ValueError, match="behaviour log-probs"):
    _prepare(stage, batch)
  with pytest.raises(ValueError, match="advantages_PGT"):
    _prepare(T.xrpo_novelty_advantages(), random_batch(0))
