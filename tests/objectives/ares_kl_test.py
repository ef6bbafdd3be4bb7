"""ARES's per-difficulty adaptive KL penalty (measure / observe / apply)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import losses
from rljax import objectives
from rljax.testing import random_batch

DIFFICULTY = np.array([0, 1, 2, 0], np.int32)


def _batch(seed=0, dtype=np.float32):
  return random_batch(seed, dtype=dtype).with_extra(difficulty_P=DIFFICULTY)


def _algo(**kw):
  return rljax.Algorithm(
    objectives.ares_kl_penalty(losses.kl_k3, **kw), rljax.aggregate.token_mean
  )


def np_k3(logp, ref):
  """k3 with verl's clamps, as `losses.kl_k3` (result clipped to 10)."""
  x = np.clip(ref - logp, -20, 20)
  return np.minimum(np.exp(x) - x - 1, 10.0)


def np_bucket_kl(batch, logp):
  mask = np.asarray(batch.loss_mask(), np.float64)
  kl = np_k3(logp, np.asarray(batch.ref_logp_PGT, np.float64))
  seq = (kl * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
  out, n = np.zeros(3), np.zeros(3)
  for p, g in np.ndindex(*seq.shape):
    if mask[p, g].sum() > 0:
      out[DIFFICULTY[p]] += seq[p, g]
      n[DIFFICULTY[p]] += 1
  return out / np.maximum(n, 1), n


class NpController:
  """The official code's `_update_beta_per_bucket`, one call per step."""

  def __init__(self, target=0.01, lr=0.05, clip=0.2, interval=100, dz=0.02):
    self.beta = np.ones(3)
    self.last = [None] * 3
    self.err = np.zeros(3)
    self.count = 0
    self.target, self.lr, self.clip = target, lr, clip
    self.interval, self.dz, self.ema = interval, dz, 0.97

  def update(self, kl, n):
    self.count += 1
    for d in range(3):
      if n[d] == 0:
        continue
      last = kl[d] if self.last[d] is None else self.last[d]
      mean = (1 - self.ema) * kl[d] + self.ema * last
      self.last[d] = mean
      e = mean / self.target - 1
      if abs(e) < self.dz or self.count % self.interval:
        continue
      self.err[d] = (1 - self.ema) * e + self.ema * self.err[d]
      de = np.clip(self.err[d], -self.clip, self.clip)
      logb = np.log(np.clip(self.beta[d], 1e-4, 1e2)) + self.lr * de
      self.beta[d] = np.exp(np.clip(logb, np.log(1e-4), np.log(1e2)))


def test_controller_matches_the_official_update_over_many_steps():
  algo = _algo(interval=3)
  ref = NpController(interval=3)
  state = algo.init()
  observe = jax.jit(algo.observe)
  measure = jax.jit(functools.partial(algo.measure))
  for step in range(10):
    batch = _batch(step)
    logp = np.asarray(batch.old_logp_PGT, np.float64) * (1 + 0.1 * step)
    stats = measure(jnp.asarray(logp, jnp.float32), batch, state)
    kl, n = np_bucket_kl(batch, logp)
    np.testing.assert_allclose(stats["kl_3"].value, kl, rtol=1e-5)
    state = observe(state, stats)
    ref.update(kl, n)
    np.testing.assert_allclose(state.beta_3, ref.beta, rtol=1e-5)
  assert not np.allclose(ref.beta, 1.0)  # the updates did happen


def test_by_hand_first_update():
  # One bucket, KL 0.02 (twice the target): kl_d = 0.02, e = 1, the error
  # EMA 0.03 * 1 = 0.03, beta = exp(0.05 * 0.03).
  state = _algo(interval=1).init()
  values = {
    "kl_3": jnp.array([0.02, 0.0, 0.0]),
    "samples_3": jnp.array([4.0, 0.0, 0.0]),
  }
  algo = _algo(interval=1)
  new = algo.transform.observe(state, values)
  np.testing.assert_allclose(new.beta_3, [np.exp(0.05 * 0.03), 1, 1], rtol=1e-6)
  assert np.isnan(new.kl_3[1]) and new.count == 1


def test_measure_is_exact_under_micro_batching():
  algo = _algo()
  batch = _batch(3)
  logp = jnp.asarray(batch.old_logp_PGT) * 1.2
  state = algo.init()
  whole = algo.measure(logp, batch, state)
  halves = [
    algo.measure(logp[s], jax.tree.map(lambda x, s=s: x[s], batch), state)
    for s in (slice(0, 2), slice(2, 4))
  ]
  summed = jax.tree.map(jnp.add, *halves)
  for k in whole:
    # Halves summed vs the whole: float32 sums in another order.
    np.testing.assert_allclose(
      summed[k].value, whole[k].value, rtol=1e-5, atol=1e-7
    )


def test_loss_value_and_gradient_use_the_bucket_coefficients():
  algo = _algo(coef=0.5)
  state = algo.init()._replace(beta_3=jnp.array([2.0, 1.0, 0.5]))
  batch = _batch(1)
  logp = np.asarray(batch.old_logp_PGT, np.float64) * 1.1
  ref = np.asarray(batch.ref_logp_PGT, np.float64)
  mask = np.asarray(batch.loss_mask(), np.float64)
  beta = np.array([2.0, 1.0, 0.5])[DIFFICULTY][:, None, None]
  want = (0.5 * beta * np_k3(logp, ref) * mask).sum() / mask.sum()
  value, grad = jax.jit(
    jax.value_and_grad(lambda lp: algo.loss(lp, batch, state)[0].value)
  )(jnp.asarray(logp, jnp.float32))
  np.testing.assert_allclose(value, want, rtol=1e-5)
  live = np_k3(logp, ref) < 10.0  # no gradient where the clamp binds
  want_grad = 0.5 * beta * (1 - np.exp(ref - logp)) * mask * live / mask.sum()
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-7)
  v16, _ = algo.loss(
    jnp.asarray(logp, jnp.bfloat16), _batch(1, jnp.bfloat16), state
  )
  assert v16.value.dtype == jnp.float32 and np.isfinite(v16.value)


def test_bad_settings_and_missing_difficulty():
  with pytest.raises(ValueError, match="interval"):
    _algo(interval=0)
  with pytest.raises(ValueError, match="target"):
    _algo(target=(0.01, 0.02))
  algo = _algo()
  with pytest.raises(ValueError, match="difficulty_P"):
    algo.loss(random_batch(0).old_logp_PGT, random_batch(0), algo.init())
