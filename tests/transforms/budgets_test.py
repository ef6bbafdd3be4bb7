"""HBPO's budget-aware reward and hierarchical advantage, and the presets
`hbpo` and `tlts`, against numpy references."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import algorithms
from rljax import transforms as T


def np_reward(correct, n, b, *, L, beta, alpha, reward="paper"):
  """Eq. 1-3 of arXiv 2507.15844 (or the code's min(f1, f2))."""
  n, b = np.asarray(n, np.float64), np.asarray(b, np.float64)
  f1 = beta * np.cos(np.pi * n / (2 * L)) - alpha * np.abs(n - b)
  f2 = beta * np.cos(np.pi * b / (2 * L))
  value = np.where(n > b, f1, f2) if reward == "paper" else np.minimum(f1, f2)
  return np.where(np.asarray(correct, bool) & (n <= L), value, 0.0)


def np_reward_grad(correct, n, b, *, L, beta, alpha):
  """d R / d n of the paper's reward: f1' above the budget, else 0."""
  n, b = np.asarray(n, np.float64), np.asarray(b, np.float64)
  df1 = -beta * np.pi / (2 * L) * np.sin(np.pi * n / (2 * L)) - alpha * np.sign(
    n - b
  )
  return np.where(np.asarray(correct, bool) & (n <= L) & (n > b), df1, 0.0)


def np_advantage(r, b, valid, *, L, beta, w=1.0, eps=1e-6):
  """Loops over groups and samples: w (mu_i - f2(b_i)) + z-score."""
  out = np.zeros_like(r, np.float64)
  for p in range(r.shape[0]):
    keep = valid[p] > 0
    rv = r[p][keep]
    mean = rv.mean()
    std = rv.std(ddof=1) if rv.size > 1 else None
    for g in range(r.shape[1]):
      if not keep[g]:
        continue
      mu = r[p][keep & (b[p] == b[p, g])].mean()
      intra = mu - beta * math.cos(math.pi * b[p, g] / (2 * L))
      inter = 0.0 if std is None else (r[p, g] - mean) / (std + eps)
      out[p, g] = w * intra + inter
  return out


def test_reward_by_hand():
  # L = 8, beta = 4, alpha = 1/8, budget 4:
  # n = 2 correct: f2 = 4 cos(pi/4) = 2.828427;
  # n = 6 correct: 4 cos(6 pi / 16) - 2/8 = 1.530734 - 0.25 = 1.280734;
  # n = 2 incorrect: 0; n = 9 > L: 0.
  out = T.hbpo_reward(
    jnp.array([1, 1, 0, 1]),
    jnp.array([2, 6, 2, 9]),
    jnp.array([4, 4, 4, 4]),
    max_length=8,
  )
  np.testing.assert_allclose(out, [2.828427, 1.280734, 0, 0], atol=1e-5)
  # The code's min(f1, f2), alpha = 1: n = 2 -> 4 cos(pi/8) - 2 =
  # 3.695518 - 2 = 1.695518 < f2 (the paper keeps f2 = 2.828427).
  out = T.hbpo_reward(1, 2, 4, max_length=8, alpha=1.0, reward="min")
  np.testing.assert_allclose(out, 1.695518, atol=1e-5)


@pytest.mark.parametrize("reward", ["paper", "min"])
def test_reward_matches_numpy_jitted_with_gradients(reward):
  rng = np.random.default_rng(0)
  correct = rng.random(64) > 0.3
  n = rng.uniform(0, 110, 64)
  b = rng.choice([10.0, 30.0, 60.0, 90.0], 64)
  kw = dict(L=100, beta=2.5, alpha=0.02)
  f = jax.jit(
    lambda n: T.hbpo_reward(
      correct, n, b, max_length=100, beta=2.5, alpha=0.02, reward=reward
    )
  )
  np.testing.assert_allclose(
    f(n), np_reward(correct, n, b, reward=reward, **kw), atol=1e-5
  )
  if reward == "paper":
    grad = jax.jit(jax.grad(lambda n: jnp.sum(f(n))))(jnp.asarray(n))
    np.testing.assert_allclose(
      grad, np_reward_grad(correct, n, b, **kw), atol=1e-6
    )


def test_advantage_by_hand():
  # L = 4, beta = 4: f2(2) = 4 cos(pi/4) = 2.828427, f2(4) = 0.
  # R = (3, 1, 0, 0), budgets (2, 2, 4, 4): mu = (2, 2, 0, 0), intra =
  # (-0.828427, -0.828427, 0, 0); mean 1, unbiased std sqrt(6/3) =
  # 1.414214, z = (1.414214, 0, -0.707107, -0.707107).
  adv = T.hbpo_advantage(
    jnp.array([[3.0, 1.0, 0.0, 0.0]]),
    jnp.array([[2.0, 2.0, 4.0, 4.0]]),
    max_length=4,
  )
  np.testing.assert_allclose(
    adv, [[0.585787, -0.828427, -0.707107, -0.707107]], atol=1e-5
  )


def _batch(rng, p=3, g=8, t=10, budgets=(2.0, 4.0, 6.0, 9.0)):
  lengths = rng.integers(1, t + 1, (p, g))
  mask = (np.arange(t) < lengths[..., None]).astype(np.float32)
  stream = 10 + np.tile(np.repeat(np.arange(len(budgets)), 2), (p, 1))
  valid = (rng.random((p, g)) > 0.15).astype(np.float32)
  task = (rng.random((p, g)) > 0.4).astype(np.float32)
  batch = rljax.Batch(
    mask_PGT=jnp.asarray(mask),
    sample_mask_PG=jnp.asarray(valid),
    rewards_PG=jnp.asarray(task),
  ).with_extra(stream_PG=stream)
  b = np.asarray(budgets)[stream - 10]
  return batch, lengths, b, valid, task


@pytest.mark.parametrize("w", [1.0, 2.0])
def test_transforms_match_numpy_jitted(w):
  rng = np.random.default_rng(1)
  batch, n, b, valid, task = _batch(rng)
  kw = dict(budgets=(2, 4, 6, 9), max_length=10, beta=4.0)
  rewards = T.hbpo_rewards(**kw, alpha=0.1)
  advs = T.hbpo_advantages(**kw, intra_weight=w)

  @jax.jit
  def run(batch):
    out, _ = rewards.prepare(batch, rewards.init())
    return advs.prepare(out, advs.init())[0]

  out = run(batch)
  want_r = np_reward(task > 0, n, b, L=10, beta=4.0, alpha=0.1) * valid
  np.testing.assert_allclose(out.rewards_PG, want_r, atol=1e-5)
  want_a = np_advantage(want_r, b, valid, L=10, beta=4.0, w=w)
  np.testing.assert_allclose(
    out.advantages_PGT, want_a[..., None] * batch.loss_mask(), atol=1e-4
  )


def test_other_streams_count_as_the_full_window():
  # Stream 0 (not a budget subgroup): b = L_max = 8, so a correct sample of
  # 8 tokens gets f2(8) = 4 cos(pi/2) = 0; stream 10 (b = 2): f1.
  batch = rljax.Batch(
    mask_PGT=jnp.ones((1, 2, 8)), rewards_PG=jnp.ones((1, 2))
  ).with_extra(stream_PG=np.array([[0, 10]]))
  t = T.hbpo_rewards(budgets=(2,), max_length=8)
  out, _ = t.prepare(batch, t.init())
  f1 = 4 * math.cos(math.pi / 2) - 6 / 8
  np.testing.assert_allclose(out.rewards_PG, [[0.0, f1]], atol=1e-5)


def test_bad_input_is_named():
  with pytest.raises(ValueError, match="budgets"):
    T.hbpo_rewards(budgets=(512, 5000), max_length=4096)
  with pytest.raises(ValueError, match="budgets"):
    T.hbpo_advantages(budgets=())
  with pytest.raises(ValueError, match="reward"):
    T.hbpo_rewards(reward="cosine")
  with pytest.raises(ValueError, match="max_length"):
    T.hbpo_rewards(max_length=0)
  with pytest.raises(ValueError, match="intra_weight"):
    T.hbpo_advantages(intra_weight=-1.0)
  batch = rljax.Batch(mask_PGT=jnp.ones((1, 2, 3)), rewards_PG=jnp.ones((1, 2)))
  t = T.hbpo_rewards()
  with pytest.raises(ValueError, match="stream_PG"):
    t.prepare(batch, t.init())
  one = rljax.Batch(
    mask_PGT=jnp.ones((2, 1, 3)), rewards_PG=jnp.ones((2, 1))
  ).with_extra(stream_PG=np.full((2, 1), 10))
  t = T.hbpo_advantages()
  with pytest.raises(ValueError, match="num_samples"):
    t.prepare(one, t.init())


def test_hbpo_preset_gradient_is_clip_higher_on_hbpo_advantages():
  # At ratio 1 the clipped loss's gradient is -A per token; token mean.
  rng = np.random.default_rng(2)
  batch, n, b, valid, task = _batch(rng, p=2, g=8, t=6)
  logp = rng.uniform(-3, -0.1, (2, 8, 6)).astype(np.float32)
  batch = batch._replace(old_logp_PGT=jnp.asarray(logp))
  algo = algorithms.get("hbpo", budgets=(2, 4, 6, 9), max_length=10)
  prepared, _ = algo.prepare(batch, algo.init())
  r = np_reward(task > 0, n, b, L=10, beta=4.0, alpha=0.1) * valid
  adv = np_advantage(r, b, valid, L=10, beta=4.0)
  mask = np.asarray(batch.loss_mask())

  def loss(x):
    total = algo.loss(x, prepared, algo.init())[0]
    return total.num / total.den

  grad = jax.jit(jax.grad(loss))(jnp.asarray(logp))
  np.testing.assert_allclose(
    grad, -adv[..., None] * mask / mask.sum(), atol=1e-5
  )


def test_tlts_preset_adds_the_curriculum_length_reward():
  # B_0 = 4 ("within"): lengths 2 and 6 -> g = 1 and 1 - 2/4 = 0.5;
  # rewards (1, 0) + g = (2, 0.5), then GRPO: z = (0.7071, -0.7071).
  algo = algorithms.get("tlts", initial=4.0, final=2.0)
  mask = (np.arange(6) < np.array([[2], [6]])).astype(np.float32)[None]
  batch = rljax.Batch(
    mask_PGT=jnp.asarray(mask),
    rewards_PG=jnp.array([[1.0, 0.0]]),
    old_logp_PGT=jnp.zeros((1, 2, 6)),
  )
  prepared, state = algo.prepare(batch, algo.init())
  np.testing.assert_allclose(prepared.rewards_PG, [[2.0, 0.5]], atol=1e-6)
  np.testing.assert_allclose(
    prepared.advantages_PGT[:, :, 0], [[0.707107, -0.707107]], atol=1e-5
  )
