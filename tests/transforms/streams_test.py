"""Stages over a group's streams: ICPO's shaped loss, expert bonus and
preset, and per-stream weights, against numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import algorithms
from rljax import losses
from rljax import transforms as T


def np_icpo_shaped(logp, adv, gamma):
  """-A p / (p + gamma) and its derivative in logp, -A gamma p / (p+g)^2."""
  p = np.exp(np.asarray(logp, np.float64))
  a = np.asarray(adv, np.float64)
  return -a * p / (p + gamma), -a * gamma * p / (p + gamma) ** 2


def test_icpo_shaped_by_hand():
  # p = 0.1, gamma = 0.1: f = 1/2, df/dlogp = gamma p / (p + gamma)^2 = 1/4.
  logp = jnp.log(jnp.array([[0.1, 0.1]]))
  out = losses.icpo_shaped(
    logp, None, jnp.array([[2.0, -1.0]]), jnp.ones((1, 2))
  )
  np.testing.assert_allclose(out.loss, [[-1.0, 0.5]], rtol=1e-6)
  grad = jax.grad(
    lambda x: losses.icpo_shaped(
      x, None, jnp.array([[2.0, -1.0]]), 1.0 + 0 * x
    ).loss.sum()
  )(logp)
  np.testing.assert_allclose(grad, [[-0.5, 0.25]], rtol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_icpo_shaped_matches_numpy_in_values_and_gradients(dtype):
  rng = np.random.default_rng(0)
  logp = rng.uniform(-6, 0, (3, 4, 5))
  adv = rng.normal(size=(3, 4, 5))
  mask = (rng.random((3, 4, 5)) > 0.2).astype(np.float32)
  want, want_grad = np_icpo_shaped(logp, adv, 0.1)

  @jax.jit
  def f(x):
    out = losses.icpo_shaped(x, x, adv, mask, gamma=0.1)
    return out.loss, jax.grad(
      lambda y: jnp.sum(
        losses.icpo_shaped(y, y, adv, mask, gamma=0.1).loss * mask
      )
    )(x)

  loss, grad = f(jnp.asarray(logp, dtype))
  tol = 1e-5 if dtype == jnp.float32 else 3e-2
  np.testing.assert_allclose(loss * mask, want * mask, atol=tol, rtol=tol)
  np.testing.assert_allclose(
    np.asarray(grad, np.float64), want_grad * mask, atol=tol, rtol=tol
  )
  with pytest.raises(ValueError, match="gamma"):
    losses.icpo_shaped(logp, None, adv, mask, gamma=0.0)


def test_icpo_bonus_decays_linearly():
  correct = np.array([[1, 1, 0]])
  expert = np.array([[1, 0, 1]])
  # Step 100 of 400: beta (1 - 1/4) = 0.75 for the correct expert sample.
  np.testing.assert_allclose(
    T.icpo_bonus(correct, expert, 100, beta=1.0, horizon=400), [[0.75, 0, 0]]
  )
  np.testing.assert_allclose(
    T.icpo_bonus(correct, expert, 500, horizon=400), [[0, 0, 0]]
  )


def _batch(rewards, streams):
  p, g = np.shape(rewards)
  return rljax.Batch(
    mask_PGT=jnp.ones((p, g, 2)), rewards_PG=jnp.asarray(rewards, jnp.float32)
  ).with_extra(stream_PG=np.asarray(streams))


def test_icpo_expert_bonus_counts_batches_and_marks_expert_samples():
  t = T.icpo_expert_bonus(beta=2.0, horizon=4)
  state = t.init()
  batch = _batch([[1.0, 0.0, 1.0, 1.0]], [[0, 1, 1, 2]])
  prepare = jax.jit(t.prepare)
  got = []
  for _ in range(3):
    out, state = prepare(batch, state)
    got.append(np.asarray(out.rewards_PG))
  # Only sample 2 is expert (stream 1) and correct: +2 (1 - t/4).
  np.testing.assert_allclose(got[0], [[1, 0, 3, 1]])
  np.testing.assert_allclose(got[1], [[1, 0, 2.5, 1]])
  np.testing.assert_allclose(got[2], [[1, 0, 2, 1]])
  assert int(state.step) == 3
  with pytest.raises(ValueError, match="stream_PG"):
    t.prepare(
      rljax.Batch(mask_PGT=jnp.ones((1, 2, 2)), rewards_PG=jnp.ones((1, 2))),
      t.init(),
    )


def test_stream_weights():
  t = T.stream_weights(on_PG=(0, 2), expert_PG=(1,))
  out, _ = t.prepare(_batch(np.zeros((1, 4)), [[0, 1, 2, 3]]), t.init())
  np.testing.assert_array_equal(out.extra["on_PG"], [[1, 0, 1, 0]])
  np.testing.assert_array_equal(out.extra["expert_PG"], [[0, 1, 0, 0]])
  with pytest.raises(ValueError, match="ending in _PG"):
    T.stream_weights(on=(0,))


def test_icpo_preset_gradient_is_clip_on_policy_and_shaped_on_expert():
  # On-policy at ratio 1: d/dlogp of -A r is -A; expert: -A g p / (p+g)^2.
  # Token mean over all 2 x 4 x 3 tokens.
  rng = np.random.default_rng(1)
  p, g, t = 2, 4, 3
  rewards = np.array([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
  streams = np.array([[0, 0, 0, 1], [0, 0, 1, 1]])
  logp = rng.uniform(-3, -0.1, (p, g, t)).astype(np.float32)
  batch = rljax.Batch(
    mask_PGT=jnp.ones((p, g, t)),
    rewards_PG=jnp.asarray(rewards),
    old_logp_PGT=jnp.asarray(logp),
  ).with_extra(stream_PG=streams)
  algo = algorithms.get("icpo", horizon=400)
  prepared, _ = algo.prepare(batch, algo.init())
  # numpy: bonus 1 at step 0 for correct expert samples, then GRPO.
  r = rewards + (streams == 1) * (rewards > 0)
  mean, std = r.mean(1, keepdims=True), r.std(1, ddof=1, keepdims=True)
  adv = (r - mean) / (std + 1e-6)
  np.testing.assert_allclose(
    prepared.advantages_PGT[..., 0], adv, rtol=1e-5, atol=1e-6
  )

  def loss(x):
    total = algo.loss(x, prepared, algo.init())[0]
    return total.num / total.den

  grad = jax.jit(jax.grad(loss))(jnp.asarray(logp))
  pr = np.exp(logp.astype(np.float64))
  a = adv[..., None]
  want = np.where(
    (streams == 1)[..., None], -a * 0.1 * pr / (pr + 0.1) ** 2, -a
  ) / (p * g * t)
  np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)
