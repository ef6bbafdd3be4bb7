"""Stateful batch stages: RiskPO, HAPO history, length-budget curriculum."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import testing
from rljax import transforms as T

# ---------------------------------------------------------------------------
# RiskPO
# ---------------------------------------------------------------------------


def np_mvar(r, qa, qb, alpha, beta, omega):
  r = np.asarray(r, np.float64)
  rvar = (np.maximum(r - qa, 0) - np.maximum(r - qb, 0) + qa - qb) / (
    beta - alpha
  )
  cvar = -np.maximum(qa - r, 0) / alpha
  return (omega * cvar + rvar) / (omega + 1)


def test_mvar_by_hand():
  # alpha .2, beta .8, omega .5, q_a = 1, q_b = 3:
  # R = 0: rvar = (0 - 0 + 1 - 3)/.6 = -10/3, cvar = -1/.2 = -5,
  #        A = (.5 * -5 - 10/3)/1.5 = -35/9.
  # R = 2: rvar = (1 - 0 - 2)/.6 = -5/3, cvar = 0, A = -10/9.
  # R = 4: rvar = (3 - 1 - 2)/.6 = 0 -> A = 0 (solved bundles are ignored).
  a = jax.jit(T.mvar_advantages)(np.array([0.0, 2.0, 4.0]), 1.0, 3.0)
  np.testing.assert_allclose(a, [-35 / 9, -10 / 9, 0.0], rtol=1e-6)


def test_mvar_reference_value_and_gradient():
  rng = np.random.default_rng(0)
  r = rng.uniform(0, 5, size=(6, 5))
  kw = dict(alpha=0.1, beta=0.9, omega=1.5)
  f = jax.jit(lambda x: T.mvar_advantages(x, 1.3, 3.7, **kw))
  np.testing.assert_allclose(f(r), np_mvar(r, 1.3, 3.7, **kw), rtol=1e-5)
  grad = jax.grad(lambda x: jnp.sum(f(x)))(jnp.asarray(r, jnp.float32))
  h = 1e-6
  fd = (np_mvar(r + h, 1.3, 3.7, **kw) - np_mvar(r - h, 1.3, 3.7, **kw)) / (
    2 * h
  )
  np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-6)


def test_mvar_is_nondecreasing_in_the_score():
  r = np.linspace(-1, 6, 50)
  a = np.asarray(T.mvar_advantages(r, 1.0, 3.0))
  assert np.all(np.diff(a) >= -1e-6)


def np_bundle_scores(r, perm, size):
  p, g = r.shape
  out = []
  for start in range(0, p, size):
    rows = range(start, min(start + size, p))
    out.append([sum(r[q, perm[q, j]] for q in rows) for j in range(g)])
  return np.array(out)


def test_bundle_scores_reference():
  rng = np.random.default_rng(1)
  r = rng.integers(0, 2, size=(7, 4)).astype(np.float64)
  perm = np.argsort(rng.random((7, 4)), axis=-1)
  got = jax.jit(T.bundle_scores, static_argnums=2)(r, perm, 3)
  np.testing.assert_allclose(got, np_bundle_scores(r, perm, 3))


def test_track_quantiles_by_hand_and_convergence():
  # q = [1, 2], levels [.2, .8], scores [0, 1, 2, 3]:
  # F(1) = 1/4, F(2) = 2/4 -> q = [1 - .5(.25 - .2), 2 - .5(.5 - .8)]
  #                             = [0.975, 2.15].
  q = T.track_quantiles(
    jnp.array([1.0, 2.0]), jnp.array([0.2, 0.8]), jnp.arange(4.0), lr=0.5
  )
  np.testing.assert_allclose(q, [0.975, 2.15], rtol=1e-6)
  # Property: on i.i.d. N(0, 1) batches the tracked values approach the
  # true quantiles (-0.8416, 0.8416).
  key = jax.random.key(0)
  levels = jnp.array([0.2, 0.8])
  q = jnp.zeros(2)
  for i in range(400):
    x = jax.random.normal(jax.random.fold_in(key, i), (256,))
    q = T.track_quantiles(q, levels, x, lr=0.05)
  np.testing.assert_allclose(q, [-0.8416, 0.8416], atol=0.1)


def _riskpo_reference(rewards, perm, q, size, alpha, beta, omega, lr):
  scores = np_bundle_scores(rewards, perm, size)
  adv_b = np_mvar(scores, q[0], q[1], alpha, beta, omega)
  p, g = rewards.shape
  adv = np.zeros((p, g))
  for row in range(p):
    for j in range(g):
      adv[row, perm[row, j]] = adv_b[row // size, j]
  below = np.array([(scores.ravel() < v).mean() for v in q])
  new_q = q - lr * (below - np.array([alpha, beta]))
  return adv, new_q


def test_riskpo_transform_matches_reference_over_steps():
  stage = T.riskpo_advantages(bundle_size=2, lr=0.2)
  prepare = jax.jit(stage.prepare)
  state = stage.init()
  rng = np.random.default_rng(2)
  q = None
  for step in range(3):
    rewards = rng.integers(0, 2, size=(5, 4)).astype(np.float32)
    batch = testing.random_batch(step, prompts=5, samples=4)._replace(
      rewards_PG=rewards, key=jax.random.key(step)
    )
    perm = np.asarray(
      jnp.argsort(jax.random.uniform(jax.random.key(step), (5, 4)), axis=-1)
    )
    if q is None:  # the first batch starts from its own quantiles
      scores = np_bundle_scores(rewards, perm, 2).ravel()
      q = np.quantile(scores, [0.2, 0.8])
    want_adv, q = _riskpo_reference(
      rewards.astype(np.float64), perm, q, 2, 0.2, 0.8, 0.5, 0.2
    )
    out, state = prepare(batch, state)
    np.testing.assert_allclose(
      out.advantages_PGT,
      want_adv[..., None] * np.asarray(batch.loss_mask()),
      rtol=1e-5,
      atol=1e-6,
    )
    np.testing.assert_allclose(state.quantiles, q, rtol=1e-5, atol=1e-6)
    assert int(state.initialized) == 1


def test_riskpo_batch_mode_uses_bundle_quantiles():
  stage = T.riskpo_advantages(bundle_size=5, quantiles="batch")
  rewards = np.random.default_rng(3).integers(0, 2, (5, 6)).astype(np.float32)
  batch = testing.random_batch(0, prompts=5, samples=6)._replace(
    rewards_PG=rewards, key=jax.random.key(1)
  )
  out, _ = stage.prepare(batch, stage.init())
  perm = np.asarray(
    jnp.argsort(jax.random.uniform(jax.random.key(1), (5, 6)), axis=-1)
  )
  scores = np_bundle_scores(rewards, perm, 5)
  qa, qb = np.quantile(scores, [0.2, 0.8])
  adv_b = np_mvar(scores, qa, qb, 0.2, 0.8, 0.5)
  want = np.zeros((5, 6))
  for row in range(5):
    want[row, perm[row]] = adv_b[0]
  np.testing.assert_allclose(
    out.advantages_PGT[..., 0] * np.asarray(batch.loss_mask())[..., 0],
    want * np.asarray(batch.loss_mask())[..., 0],
    rtol=1e-5,
    atol=1e-6,
  )


def test_riskpo_errors():
  batch = testing.random_batch(0)
  stage = T.riskpo_advantages()
  with pytest.raises(ValueError, match="PRNG key"):
    stage.prepare(batch, stage.init())
  with pytest.raises(ValueError, match="0 < alpha < beta < 1"):
    T.riskpo_advantages(alpha=0.9, beta=0.5)
  with pytest.raises(ValueError, match="quantiles must be one of"):
    T.riskpo_advantages(quantiles="median")


def test_riskpo_preset_loss_and_gradient_finite():
  from rljax.algorithms import _stateful

  algo = _stateful.riskpo()
  batch = testing.random_batch(3, prompts=6, samples=4)
  prepared, state = jax.jit(algo.prepare)(
    batch, algo.init(), key=jax.random.key(0)
  )
  logp = jnp.asarray(testing.perturbed_logp(batch))
  value, grad = jax.jit(
    jax.value_and_grad(lambda lp: algo.loss(lp, prepared, state)[0].value)
  )(logp)
  assert np.isfinite(value) and np.all(np.isfinite(grad))
  # Micro-batching: the loss of the whole batch is the sum of halves.
  halves = [
    jax.tree.map(lambda x, s=s: None if x is None else x[s], prepared)
    for s in (slice(0, 3), slice(3, 6))
  ]
  parts = [
    algo.loss(logp[s], h, state)[0]
    for s, h in zip((slice(0, 3), slice(3, 6)), halves)
  ]
  whole = algo.loss(logp, prepared, state)[0]
  total = jax.tree.map(jnp.add, *parts)
  # Halves summed vs the whole: float32 sums in another order.
  np.testing.assert_allclose(total.value, whole.value, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------
# HAPO (history)
# ---------------------------------------------------------------------------


def np_hapo_len(length, h, correct, seen, floor=-0.7):
  if not seen or h <= 0:
    return 0.0
  f = math.cos(min(length / h, 2.0) * math.pi / 2)
  return max(floor, f) if correct else min(0.0, f)


def test_history_length_reward_by_hand():
  # h = 100: l = 50 correct -> cos(pi/4) = .7071; l = 100 -> 0;
  # l = 180 correct -> cos(.9 pi) = -.951 -> floor -0.7;
  # l = 50 incorrect -> min(0, .7071) = 0; l = 250 incorrect -> -1;
  # no history -> 0.
  lengths = np.array([50.0, 100.0, 180.0, 50.0, 250.0, 10.0])
  correct = np.array([1, 1, 1, 0, 0, 1])
  seen = np.array([1, 1, 1, 1, 1, 0])
  r = jax.jit(T.history_length_reward)(lengths, 100.0, correct, seen)
  np.testing.assert_allclose(
    r, [math.sqrt(0.5), 0.0, -0.7, 0.0, -1.0, 0.0], atol=1e-6
  )


def test_history_length_reward_gradient():
  lengths = np.array([30.0, 70.0, 130.0])
  h, correct, seen = 100.0, np.array([1, 1, 0]), np.ones(3)
  grad = jax.grad(
    lambda x: jnp.sum(T.history_length_reward(x, h, correct, seen))
  )(jnp.asarray(lengths))
  eps = 1e-4
  fd = [
    (np_hapo_len(v + eps, h, c, 1) - np_hapo_len(v - eps, h, c, 1)) / (2 * eps)
    for v, c in zip(lengths, correct)
  ]
  np.testing.assert_allclose(grad, fd, rtol=1e-3, atol=1e-6)


def _hapo_batch(rng, ids, g=4, t=12):
  lengths = rng.integers(1, t + 1, size=(len(ids), g))
  mask = (np.arange(t) < lengths[..., None]).astype(np.float32)
  rewards = rng.integers(0, 2, size=(len(ids), g)).astype(np.float32)
  return rljax.Batch(
    mask_PGT=mask, rewards_PG=rewards, prompt_ids_P=np.asarray(ids, np.int32)
  )


def test_hapo_over_steps_matches_numpy_and_state_round_trips():
  stage = T.hapo_history_rewards(6, weight=0.5)
  prepare = jax.jit(stage.prepare)
  rng = np.random.default_rng(4)
  id_batches = [[0, 1, 2], [2, 3, 0], [0, 0, 5], [1, 2, 3]]
  batches = [_hapo_batch(rng, ids) for ids in id_batches]
  history = {}
  state = stage.init()
  for step, batch in enumerate(batches):
    if step == 2:  # checkpoint round trip: numpy leaves, rebuilt tree
      leaves, tree = jax.tree.flatten(state)
      state = jax.tree.unflatten(tree, [np.array(x) for x in leaves])
    out, state = prepare(batch, state)
    lengths = np.asarray(batch.mask_PGT).sum(-1)
    rewards = np.asarray(batch.rewards_PG, np.float64)
    want = rewards.copy()
    for p, pid in enumerate(batch.prompt_ids_P):
      for i in range(rewards.shape[1]):
        r_len = np_hapo_len(
          lengths[p, i],
          history.get(pid, 0.0),
          rewards[p, i] >= 1,
          pid in history,
        )
        want[p, i] += 0.5 * r_len
    for p, pid in enumerate(batch.prompt_ids_P):
      good = lengths[p][rewards[p] >= 1]
      if good.size:
        history[pid] = min(history.get(pid, np.inf), good.min())
    np.testing.assert_allclose(out.rewards_PG, want, rtol=1e-6, atol=1e-6)
  values, seen = state.lookup(np.arange(6))
  for pid in range(6):
    assert bool(seen[pid]) == (pid in history)
    if pid in history:
      assert float(values[pid]) == history[pid]


def test_hapo_needs_prompt_ids():
  batch = testing.random_batch(0)._replace(prompt_ids_P=None)
  stage = T.hapo_history_rewards(4)
  with pytest.raises(ValueError, match="prompt_ids_P"):
    stage.prepare(batch, stage.init())


# ---------------------------------------------------------------------------
# Train Long, Think Short
# ---------------------------------------------------------------------------


def test_budget_schedule_by_hand():
  # exponential: 256 * .5^floor(t/2), floored at 64: t = 0..6 ->
  # 256, 256, 128, 128, 64, 64, 64.
  t = np.arange(7)
  b = T.budget_schedule(t, initial=256, final=64, decay=0.5, interval=2)
  np.testing.assert_allclose(b, [256, 256, 128, 128, 64, 64, 64])
  # linear over 4 steps from 200 to 100: 200, 175, 150, 125, 100, 100.
  b = T.budget_schedule(
    np.arange(6), initial=200, final=100, schedule="linear", steps=4
  )
  np.testing.assert_allclose(b, [200, 175, 150, 125, 100, 100])


def test_budget_length_reward_by_hand_and_gradient():
  # B = 100: within: 1 up to 100, 1 - (150 - 100)/100 = .5, 0 from 200.
  # triangular: 1 - |50 - 100|/100 = .5 at 50, 1 at 100, .5 at 150.
  x = np.array([50.0, 100.0, 150.0, 250.0])
  np.testing.assert_allclose(
    T.budget_length_reward(x, 100.0), [1, 1, 0.5, 0], atol=1e-6
  )
  np.testing.assert_allclose(
    T.budget_length_reward(x, 100.0, shape="triangular"),
    [0.5, 1, 0.5, 0],
    atol=1e-6,
  )
  grad = jax.grad(
    lambda v: jnp.sum(T.budget_length_reward(v, 100.0, shape="triangular"))
  )(jnp.array([50.0, 150.0]))
  np.testing.assert_allclose(grad, [0.01, -0.01], rtol=1e-5)


def test_curriculum_counts_steps_and_adds_weighted_reward():
  stage = T.length_budget_curriculum(
    initial=8, final=2, decay=0.5, interval=1, weight=0.5
  )
  prepare = jax.jit(stage.prepare)
  state = stage.init()
  batch = testing.random_batch(5, prompts=3, samples=4, tokens=8)
  lengths = np.asarray(batch.mask_PGT).sum(-1)
  for step, budget in enumerate([8, 4, 2, 2]):
    out, state = prepare(batch, state)
    g = np.clip(1 - np.maximum(lengths - budget, 0) / budget, 0, 1)
    np.testing.assert_allclose(
      out.rewards_PG, np.asarray(batch.rewards_PG) + 0.5 * g, rtol=1e-6
    )
    assert int(state.step) == step + 1


def test_curriculum_rejects_bad_arguments():
  with pytest.raises(ValueError, match="schedule must be one of"):
    T.length_budget_curriculum(schedule="cosine")
  with pytest.raises(ValueError, match="initial must be > 0"):
    T.length_budget_curriculum(initial=0)


def test_bfloat16_inputs_give_float32():
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  outs = [
    T.mvar_advantages(bf([0.0, 2.0]), bf(1.0), bf(3.0)),
    T.history_length_reward(bf([5.0]), bf(10.0), [1], [1]),
    T.budget_length_reward(bf([5.0, 20.0]), bf(10.0)),
    T.track_quantiles(bf([0.0, 1.0]), [0.2, 0.8], bf([0.5, 1.5]), lr=0.1),
  ]
  for o in outs:
    assert o.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(o)))
