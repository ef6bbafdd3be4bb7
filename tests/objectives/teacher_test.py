"""Loss stages: KEPO gated distillation, CAPO sample rejection, VCPO ESS
(measure / observe) and its optax learning-rate scale."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import rljax
from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import testing
from rljax.objectives import _teacher as O

HALVES = (slice(0, 2), slice(2, 4))


def _half(batch, s):
  return jax.tree.map(lambda x: x[s], batch)


def _sum(parts):
  return functools.reduce(lambda a, b: jax.tree.map(jnp.add, a, b), parts)


def _batch(seed=0):
  batch = testing.random_batch(seed)
  sample_mask = np.ones(batch.shape[:2], np.float32)
  sample_mask[1, 2] = 0.0  # a filtered sample
  return batch._replace(sample_mask_PG=sample_mask)


def _seq_mean_token_mean_np(per_token, mask):
  n = mask.sum(-1)
  seq = np.where(n > 0, (per_token * mask).sum(-1) / np.maximum(n, 1), 0.0)
  return seq.sum() / (n > 0).sum(), n


# --------------------------------------------------------------------------
# KEPO


def _kepo_algo(**kw):
  return rljax.Algorithm(O.kepo_distill(**kw), aggregate.seq_mean_token_mean)


@pytest.mark.parametrize("threshold", [0.5, 1.5, -1.0])
def test_kepo_matches_numpy_values_and_gradients(threshold):
  batch = _batch(1)
  algo = _kepo_algo(coef=0.7, threshold=threshold)
  logp = testing.perturbed_logp(batch, scale=0.5)

  def loss(lp):
    return algo.loss(lp, batch, ())[0].value

  value, grad = jax.jit(jax.value_and_grad(loss))(logp)
  mask = np.asarray(batch.loss_mask(), np.float64)
  gate = (np.asarray(batch.rewards_PG) >= threshold)[..., None]
  d = np.asarray(logp, np.float64) - np.asarray(batch.teacher_logp_PGT)
  want, n = _seq_mean_token_mean_np(0.7 * gate * 0.5 * d * d, mask)
  np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-7)
  # d/dl of 0.7 gate (l - t)^2 / 2 / (n_i E) = 0.7 gate (l - t) / (n_i E)
  e = (n > 0).sum()
  want_grad = 0.7 * gate * d * mask / np.maximum(n, 1)[..., None] / e
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-7)


def test_kepo_by_hand():
  # One token: l = -1, t = -2, gate 1: k2 = (1)^2 / 2 = 0.5; coef 2 -> 1.0.
  out = O.kepo_distill_loss(
    jnp.array([[-1.0, 9.0]]),
    jnp.array([[-2.0, -50.0]]),
    jnp.array([1.0]),
    jnp.array([[1.0, 0.0]]),
  )
  np.testing.assert_allclose(out, [[0.5, 0.0]])
  np.testing.assert_allclose(
    O.kepo_gate(jnp.array([0.2, 0.5, 1.0]), threshold=0.5), [0, 1, 1]
  )


def test_kepo_low_quality_trajectories_get_no_distillation_gradient():
  batch = _batch(2)
  algo = _kepo_algo(threshold=0.5)
  logp = testing.perturbed_logp(batch)
  grad = jax.grad(lambda lp: algo.loss(lp, batch, ())[0].value)(logp)
  bad = np.asarray(batch.rewards_PG) < 0.5
  assert np.all(np.asarray(grad)[bad] == 0)
  good = (~bad) & (np.asarray(batch.sample_mask_PG) > 0)
  assert np.any(np.asarray(grad)[good] != 0)
  # Quality from an extra score instead of the reward.
  q = np.where(bad, 1.0, 0.0).astype(np.float32)
  algo = _kepo_algo(threshold=0.5, quality="score_PG")
  scored = batch.with_extra(score_PG=q)
  grad = jax.grad(lambda lp: algo.loss(lp, scored, ())[0].value)(logp)
  assert np.all(np.asarray(grad)[good] == 0)


def test_k2_is_the_reverse_kl_gradient_on_policy():
  """E_{a ~ pi}[grad k2(a)] = grad KL(pi || q) (exact enumeration)."""
  z = jnp.array([0.3, -1.0, 0.8, 0.1])
  log_q = jax.nn.log_softmax(jnp.array([1.0, 0.2, -0.5, 0.0]))

  def expected_k2(z):
    logp = jax.nn.log_softmax(z)
    k2 = O.kepo_distill_loss(logp, log_q, jnp.ones(()), jnp.ones(4))
    return jnp.sum(jax.lax.stop_gradient(jnp.exp(logp)) * k2)

  def kl(z):
    logp = jax.nn.log_softmax(z)
    return jnp.sum(jnp.exp(logp) * (logp - log_q))

  np.testing.assert_allclose(
    jax.grad(expected_k2)(z), jax.grad(kl)(z), rtol=1e-5, atol=1e-6
  )


def test_kepo_micro_batches_sum_to_the_whole_and_bfloat16():
  batch = _batch(3)
  algo = _kepo_algo()
  logp = testing.perturbed_logp(batch)
  whole = algo.loss(logp, batch, ())[0]
  parts = _sum([algo.loss(logp[s], _half(batch, s), ())[0] for s in HALVES])
  # Halves summed vs the whole: float32 sums in another order.
  np.testing.assert_allclose(parts.value, whole.value, rtol=1e-5, atol=1e-7)
  bf = lambda x: None if x is None else jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  v16 = algo.loss(bf(logp), jax.tree.map(bf, batch), ())[0].value
  assert v16.dtype == jnp.float32 and np.isfinite(v16)


def test_kepo_needs_a_teacher():
  batch = _batch(0)._replace(teacher_logp_PGT=None)
  with pytest.raises(ValueError, match="teacher_logp_PGT"):
    _kepo_algo().loss(batch.old_logp_PGT, batch, ())
  with pytest.raises(ValueError, match="coef must be >= 0"):
    O.kepo_distill(coef=-1.0)


# --------------------------------------------------------------------------
# CAPO


def test_capo_scores_by_hand_and_numpy():
  lp = jnp.array([[-1.0, -2.0, 40.0]])
  old = jnp.array([[-1.2, -1.6, -40.0]])
  m = jnp.array([[1.0, 1.0, 0.0]])
  # d = [0.2, -0.4]: sum 0.5 * (0.04 + 0.16) = 0.1; mean 0.1 / 2 = 0.05.
  np.testing.assert_allclose(O.capo_scores(lp, old, m, reduce="sum"), [0.1])
  np.testing.assert_allclose(O.capo_scores(lp, old, m), [0.05], rtol=1e-6)
  batch = _batch(4)
  logp = testing.perturbed_logp(batch)
  mask = np.asarray(batch.loss_mask(), np.float64)
  d = (np.asarray(logp, np.float64) - batch.old_logp_PGT) * mask
  want = 0.5 * (d * d).sum(-1) / np.maximum(mask.sum(-1), 1)
  got = jax.jit(O.capo_scores)(logp, batch.old_logp_PGT, mask)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8)
  g = jax.grad(lambda x: jnp.sum(O.capo_scores(x, batch.old_logp_PGT, mask)))(
    logp
  )
  assert np.all(np.asarray(g) == 0)  # a selection: no gradient


def _ppo(batch):
  return rljax.chain(
    rljax.transforms.group_advantages(rljax.advantages.grpo),
    objectives.policy(losses.ppo_clip),
  )


def test_capo_mask_zeroes_exactly_the_rejected_samples():
  batch = _batch(5)
  logp = testing.perturbed_logp(batch, scale=0.4)
  threshold = 0.06
  base = rljax.Algorithm(_ppo(batch), aggregate.seq_mean_token_mean)
  algo = rljax.Algorithm(
    rljax.chain(_ppo(batch), O.capo_mask(threshold=threshold)),
    aggregate.seq_mean_token_mean,
  )
  prepared, state = algo.prepare(batch, algo.init())
  prepared_b, state_b = base.prepare(batch, base.init())

  def grad(a, b, s):
    return jax.jit(jax.grad(lambda lp: a.loss(lp, b, s)[0].value))(logp)

  g, g_base = grad(algo, prepared, state), grad(base, prepared_b, state_b)
  mask = np.asarray(batch.loss_mask())
  scores = np.asarray(O.capo_scores(logp, batch.old_logp_PGT, mask))
  keep = (scores <= threshold)[..., None]
  assert 0 < keep.mean() < 1  # the test rejects some samples, keeps others
  np.testing.assert_allclose(g, np.asarray(g_base) * keep, rtol=1e-6, atol=1e-9)
  _, metrics = algo.loss(logp, prepared, state)
  rejected = ((1 - keep) * mask).sum() / mask.sum()
  np.testing.assert_allclose(
    metrics["capo_rejected"].value, rejected, rtol=1e-6
  )
  # Micro-batches: the exact loss.
  whole = algo.loss(logp, prepared, state)[0]
  parts = _sum(
    [algo.loss(logp[s], _half(prepared, s), state)[0] for s in HALVES]
  )
  # Halves summed vs the whole: float32 sums in another order.
  np.testing.assert_allclose(parts.value, whole.value, rtol=1e-5, atol=1e-7)


def test_capo_on_policy_rejects_nothing_and_reads_external_scores():
  batch = _batch(6)._replace(old_logp_PGT=None)
  logp = testing.perturbed_logp(_batch(6))
  algo = rljax.Algorithm(O.capo_mask(threshold=1e-6), aggregate.token_mean)
  _, metrics = algo.loss(logp, batch, ())
  assert float(metrics["capo_rejected"].value) == 0.0
  scores = np.zeros(batch.shape[:2], np.float32)
  scores[0] = 1.0  # the first prompt's samples: rejected
  algo = rljax.Algorithm(
    O.capo_mask(threshold=0.5, score="capo_score_PG"), aggregate.token_mean
  )
  b = batch.with_extra(capo_score_PG=scores)
  terms_weight = algo.loss(logp, b, ())[1]["capo_rejected"].value
  mask = np.asarray(b.loss_mask())
  np.testing.assert_allclose(
    terms_weight, mask[0].sum() / mask.sum(), rtol=1e-6
  )
  with pytest.raises(ValueError, match="threshold must be > 0"):
    O.capo_mask(threshold=0.0)


# --------------------------------------------------------------------------
# VCPO ESS


def _ess_np(batch):
  mask = np.asarray(batch.loss_mask(), np.float64)
  d = np.asarray(batch.old_logp_PGT, np.float64) - batch.rollout_logp_PGT
  w = np.exp((d * mask).sum(-1))
  m = np.asarray(batch.samples())
  return (w * m).sum() ** 2 / (m.sum() * (w * w * m).sum())


def test_vcpo_ess_measure_of_halves_sums_to_the_whole():
  batch = _batch(7)
  algo = rljax.Algorithm(O.vcpo_ess(), aggregate.token_mean)
  logp = testing.perturbed_logp(batch)
  state = algo.init()
  whole = jax.jit(algo.measure)(logp, batch, state)
  parts = _sum([algo.measure(logp[s], _half(batch, s), state) for s in HALVES])
  for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(parts)):
    # Halves summed vs the whole: float32 sums in another order.
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  observed = algo.observe(state, parts)
  ess = _ess_np(batch)
  assert 0.0 < ess < 1.0
  np.testing.assert_allclose(observed.ess_ratio, ess, rtol=1e-5)
  np.testing.assert_allclose(observed.lr_scale, np.sqrt(ess), rtol=1e-5)
  # apply reports the statistic and leaves the loss alone.
  loss, metrics = algo.loss(logp, batch, observed)
  assert float(loss.value) == 0.0
  np.testing.assert_allclose(metrics["vcpo_ess_ratio"].value, ess, rtol=1e-5)


def test_vcpo_ess_is_one_on_policy_and_bfloat16_is_finite():
  batch = _batch(8)
  batch = batch._replace(rollout_logp_PGT=batch.old_logp_PGT)
  algo = rljax.Algorithm(O.vcpo_ess(), aggregate.token_mean)
  logp = testing.perturbed_logp(batch)
  state = algo.observe(algo.init(), algo.measure(logp, batch, algo.init()))
  np.testing.assert_allclose(state.ess_ratio, 1.0, rtol=1e-6)
  bf = lambda x: None if x is None else jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  b16 = jax.tree.map(bf, _batch(8))
  stats = algo.measure(bf(logp), b16, algo.init())
  state = algo.observe(algo.init(), stats)
  assert state.ess_ratio.dtype == jnp.float32 and np.isfinite(state.ess_ratio)


def test_vcpo_scale_by_ess_scales_the_adamw_step():
  params = {"w": jnp.array([1.0, -2.0, 0.5])}
  grads = {"w": jnp.array([0.3, -0.1, 0.2])}
  plain = optax.adamw(1e-2)
  scaled = optax.chain(optax.adamw(1e-2), O.vcpo_scale_by_ess())
  u_plain, _ = plain.update(grads, plain.init(params), params)
  u, _ = scaled.update(grads, scaled.init(params), params, ess_ratio=0.64)
  # sqrt(0.64) = 0.8
  np.testing.assert_allclose(u["w"], 0.8 * u_plain["w"], rtol=1e-6)
  u, _ = scaled.update(grads, scaled.init(params), params, lr_scale=0.5)
  np.testing.assert_allclose(u["w"], 0.5 * u_plain["w"], rtol=1e-6)
  with pytest.raises(ValueError, match="exactly one of ess_ratio"):
    scaled.update(grads, scaled.init(params), params)
  with pytest.raises(ValueError, match="rule must be one of"):
    O.vcpo_scale_by_ess(rule="cube")
