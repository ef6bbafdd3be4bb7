"""T-PPO's extended GAE and its transform: a numpy reference, a hand-worked
case, and the window/critic masks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import advantages
from rljax import transforms
from rljax._src.base import Batch


def _np_egae(r, v, m, unfinished, gamma, lam):
  """Per row: GAE over the valid tokens; after the last one the value is
  V(last) for an unfinished response, else 0."""
  adv = np.zeros_like(r)
  for idx in np.ndindex(r.shape[:-1]):
    valid = np.flatnonzero(m[idx] > 0)
    if not len(valid):
      continue
    next_v = v[idx][valid[-1]] if unfinished[idx] else 0.0
    a = 0.0
    for t in valid[::-1]:
      delta = r[idx][t] + gamma * next_v - v[idx][t]
      a = delta + gamma * lam * a
      adv[idx][t] = a
      next_v = v[idx][t]
  return adv, (adv + v) * m


def test_hand_worked():
  # One response of 3 tokens, values (1, 2, 4), no rewards, gamma 1,
  # lam 0.5. Unfinished: delta_2 = 0 + 4 - 4 = 0, delta_1 = 4 - 2 = 2,
  # delta_0 = 2 - 1 = 1; A_2 = 0, A_1 = 2, A_0 = 1 + 0.5 * 2 = 2.
  # Finished (plain GAE, V' = 0 after the end): delta_2 = -4,
  # A_1 = 2 - 2 = 0, A_0 = 1 + 0 = 1.
  r = jnp.zeros((2, 3))
  v = jnp.array([[1.0, 2.0, 4.0]] * 2)
  m = jnp.ones((2, 3))
  adv, ret = advantages.egae(r, v, m, jnp.array([1, 0]), gamma=1.0, lam=0.5)
  np.testing.assert_allclose(adv, [[2, 2, 0], [1, 0, -4]])
  np.testing.assert_allclose(ret, [[3, 4, 4], [2, 2, 0]])


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.9, 0.95), (1.0, 0.0)])
def test_matches_numpy_reference_jitted(gamma, lam):
  rng = np.random.default_rng(0)
  shape = (3, 4, 7)
  r = rng.normal(size=shape).astype(np.float32)
  v = rng.normal(size=shape).astype(np.float32)
  lengths = rng.integers(0, 8, size=shape[:2])
  m = (np.arange(7) < lengths[..., None]).astype(np.float32)
  m[0, 0, 2] = 0  # a masked token inside a response is skipped
  unfinished = rng.integers(0, 2, size=shape[:2])
  got = jax.jit(lambda *a: advantages.egae(*a, gamma=gamma, lam=lam))(
    r, v, m, unfinished
  )
  want = _np_egae(r, v, m, unfinished, gamma, lam)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
  # finished responses are plain GAE
  plain = advantages.gae(r, v, m, gamma=gamma, lam=lam)
  done = unfinished == 0
  np.testing.assert_allclose(got[0][done], plain[0][done], atol=1e-6)


def test_gradient_wrt_values_matches_finite_differences():
  rng = np.random.default_rng(1)
  r = rng.normal(size=(2, 5)).astype(np.float64)
  v = rng.normal(size=(2, 5)).astype(np.float64)
  m = np.ones((2, 5))
  u = np.array([1, 0])
  w = rng.normal(size=(2, 5))

  def f(values):
    return jnp.sum(advantages.egae(r, values, m, u, gamma=0.9, lam=0.8)[0] * w)

  grad = np.asarray(jax.grad(f)(jnp.asarray(v, jnp.float32)))
  eps, num = 1e-4, np.zeros_like(v)
  for idx in np.ndindex(v.shape):
    d = np.zeros_like(v)
    d[idx] = eps
    hi = _np_egae(r, v + d, m, u, 0.9, 0.8)[0]
    lo = _np_egae(r, v - d, m, u, 0.9, 0.8)[0]
    num[idx] = np.sum((hi - lo) * w) / (2 * eps)
  np.testing.assert_allclose(grad, num, rtol=1e-3, atol=1e-3)


def test_bad_shape_is_named():
  with pytest.raises(ValueError, match="unfinished_PG"):
    advantages.egae(
      jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.ones((2, 3)), jnp.zeros(3)
    )


def test_transform_trains_each_window_once_and_the_critic_on_finished():
  p, g, t = 1, 2, 4
  mask = np.ones((p, g, t), np.float32)
  lag = np.array([[[1, 1, 0, 0], [0, 0, 0, 0]]])  # sample 0: 2 older tokens
  unfinished = np.array([[True, False]])
  values = np.array([[[0.5, 1.0, 1.5, 2.0], [0.1, 0.2, 0.3, 0.4]]])
  batch = Batch(
    mask_PGT=mask,
    rewards_PG=np.array([[7.0, 1.0]], np.float32),  # 7: ignored (running)
    old_values_PGT=values.astype(np.float32),
  ).with_extra(lag_PG=lag, unfinished_PG=unfinished)
  t_ = transforms.egae_advantages(gamma=1.0, lam=1.0, whiten=False)
  out, _ = t_.prepare(batch, t_.init())
  r = np.zeros((p, g, t))
  r[0, 1, 3] = 1.0
  adv, ret = _np_egae(r, values, mask, unfinished, 1.0, 1.0)
  window = mask * (lag == 0)
  np.testing.assert_allclose(out.advantages_PGT, adv * window, atol=1e-6)
  np.testing.assert_allclose(out.returns_PGT, ret, atol=1e-6)
  np.testing.assert_allclose(out.policy_weights_PGT, window)
  np.testing.assert_allclose(
    out.extra["value_mask_PGT"], mask * ~unfinished[..., None]
  )
  # without the partial-rollout extras it is gae_advantages
  plain = Batch(
    mask_PGT=mask,
    rewards_PG=np.array([[7.0, 1.0]], np.float32),
    old_values_PGT=values.astype(np.float32),
  )
  a, _ = t_.prepare(plain, t_.init())
  g_ = transforms.gae_advantages(gamma=1.0, lam=1.0, whiten=False)
  b, _ = g_.prepare(plain, g_.init())
  np.testing.assert_allclose(a.advantages_PGT, b.advantages_PGT, atol=1e-6)
