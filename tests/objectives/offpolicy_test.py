"""DisCO (minibatch KL hinge via measure/observe) and MDPO (annealed KL to
pi_old) stages, and the off-policy presets."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import aggregate
from rljax import testing
from rljax.algorithms import _offpolicy as presets
from rljax.losses import _offpolicy as O
from rljax.objectives import _offpolicy as S

HALVES = (slice(0, 2), slice(2, 4))


def _half(batch, s):
  return jax.tree.map(lambda x: x[s], batch)


def _sum(parts):
  return functools.reduce(lambda a, b: jax.tree.map(jnp.add, a, b), parts)


def _batch(seed=0, **changes):
  batch = testing.random_batch(seed)
  sample_mask = np.ones(batch.shape[:2], np.float32)
  sample_mask[1, 2] = 0.0  # a filtered sample
  return batch._replace(sample_mask_PG=sample_mask, **changes)


# --------------------------------------------------------------------------
# DisCO


def _disco_algo(**kw):
  return rljax.Algorithm(S.disco(**kw), aggregate.seq_mean_token_mean)


def _observed(algo, batch, logp):
  state = algo.init()
  return algo.observe(state, algo.measure(logp, batch, state))


def test_disco_measure_of_halves_sums_to_the_whole():
  algo = _disco_algo()
  batch = _batch()
  logp = testing.perturbed_logp(batch)
  whole = algo.measure(logp, batch, algo.init())
  parts = [algo.measure(logp[s], _half(batch, s), algo.init()) for s in HALVES]
  total = _sum(parts)
  for name in ("kl", "tokens_per_sequence"):
    # Halves summed vs the whole: float32 sums in another order.
    np.testing.assert_allclose(
      total[name].value, whole[name].value, rtol=1e-5, atol=1e-7
    )
  # The measured KL is the token mean of r - 1 - log r (float64 numpy).
  mask = np.asarray(batch.loss_mask(), np.float64)
  d = np.asarray(logp, np.float64) - np.asarray(batch.old_logp_PGT, np.float64)
  k3 = np.sum(mask * (np.exp(d) - 1 - d)) / mask.sum()
  np.testing.assert_allclose(whole["kl"].value, k3, rtol=1e-5)


@pytest.mark.parametrize(
  "hinge_gradient,factor", [("paper", 2.0), ("code", 1.0)]
)
def test_disco_hinge_gradient_is_exact_under_micro_batching(
  hinge_gradient, factor
):
  """With one-sided groups only (no policy term), the loss gradient is the
  hinge's: factor * beta * max(0, K - delta) * m (r - 1) / N_tok, K and N_tok
  over the WHOLE minibatch, also when the minibatch is split in halves."""
  beta, delta = 10.0, 1e-3
  batch = _batch(rewards_PG=np.zeros((4, 4), np.float32))
  logp = testing.perturbed_logp(batch)
  algo = _disco_algo(beta=beta, delta=delta, hinge_gradient=hinge_gradient)
  state = _observed(algo, batch, logp)

  mask = np.asarray(batch.loss_mask(), np.float64)
  d = np.asarray(logp, np.float64) - np.asarray(batch.old_logp_PGT, np.float64)
  kl = np.sum(mask * (np.exp(d) - 1 - d)) / mask.sum()
  assert kl > 10 * delta
  expected = factor * beta * (kl - delta) * mask * (np.exp(d) - 1) / mask.sum()

  loss = jax.jit(lambda lp, b: algo.loss(lp, b, state)[0])
  whole = jax.grad(lambda lp: loss(lp, batch).value)(logp)
  np.testing.assert_allclose(whole, expected, rtol=1e-4, atol=1e-8)
  den = _sum([loss(logp[s], _half(batch, s)) for s in HALVES]).den
  parts = [
    jax.grad(lambda lp, s=s: loss(lp, _half(batch, s)).num)(logp[s]) / den
    for s in HALVES
  ]
  # float32 sums in another order: an atol for the entries near zero (the
  # gradient's scale is 1e-3).
  np.testing.assert_allclose(np.concatenate(parts), whole, rtol=1e-5, atol=1e-8)


def test_disco_hinge_is_off_below_delta_and_before_observe():
  batch = _batch(rewards_PG=np.zeros((4, 4), np.float32))
  logp = testing.perturbed_logp(batch)
  for algo, state in [
    (_disco_algo(), _disco_algo().init()),  # never observed: K = 0
    (_disco_algo(delta=10.0), None),
  ]:
    state = _observed(algo, batch, logp) if state is None else state
    grad = jax.grad(
      lambda lp, a=algo, st=state: a.loss(lp, batch, st)[0].value
    )(logp)
    assert np.all(np.asarray(grad) == 0)


def test_disco_policy_term_is_minus_mean_of_j_over_questions():
  """With every sample valid, seq_mean_token_mean of the broadcast -J_q is
  the official code's -sum_q J_q / (number of questions)."""
  batch = testing.random_batch(4)
  batch = batch._replace(
    rewards_PG=np.array(
      [[1, 0, 0, 1], [1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], np.float32
    )
  )
  logp = testing.perturbed_logp(batch)
  algo = _disco_algo(tau=2.0)
  value = algo.loss(logp, batch, algo.init())[0].value
  per_group = O.disco(
    logp, batch.old_logp_PGT, batch.rewards_PG, batch.mask_PGT, tau=2.0
  ).loss[:, 0, 0]
  assert np.all(np.asarray(per_group)[[1, 3]] == 0)
  np.testing.assert_allclose(value, np.mean(per_group), rtol=1e-6)


# --------------------------------------------------------------------------
# MDPO


def _mdpo_ref(logp, batch, coef):
  """token_mean of -A r + coef (r log r - r + 1), float64."""
  mask = np.asarray(batch.loss_mask(), np.float64)
  d = np.asarray(logp, np.float64) - np.asarray(batch.old_logp_PGT, np.float64)
  r = np.exp(d)
  adv = np.asarray(batch.advantages_PGT, np.float64)
  per_token = -adv * r + coef * (r * d - r + 1)
  value = np.sum(mask * per_token) / mask.sum()
  grad = mask * (-adv * r + coef * r * d) / mask.sum()
  return value, grad


def test_mdpo_anneals_over_iterations_by_hand():
  # K = 4: t_k = 1, 3/4, 1/2, 1/4, 1/4 on batches 1..5 -> 1/t_k below.
  algo = presets.mdpo(iterations=4)
  state = algo.init()
  batch = testing.random_batch(5)
  logp = testing.perturbed_logp(batch)
  for expected in (1.0, 4 / 3, 2.0, 4.0, 4.0):
    prepared, state = algo.prepare(batch, state)
    value, metrics = algo.loss(logp, prepared, state)
    coef = rljax.finalize(metrics)["mdpo_kl_coef"]
    np.testing.assert_allclose(coef, expected, rtol=1e-6)
  ref_value, ref_grad = _mdpo_ref(logp, prepared, 4.0)
  grad = jax.jit(jax.grad(lambda lp: algo.loss(lp, prepared, state)[0].value))
  np.testing.assert_allclose(value.value, ref_value, rtol=1e-5)
  np.testing.assert_allclose(grad(logp), ref_grad, rtol=1e-4, atol=1e-7)


def test_mdpo_anneals_over_optimizer_steps_and_resets_each_batch():
  algo = presets.mdpo(iterations=3, anneal="optimizer_steps")
  batch = testing.random_batch(6)
  logp = testing.perturbed_logp(batch)
  state = algo.init()
  for _ in range(2):
    prepared, state = algo.prepare(batch, state)
    coefs = []
    for _ in range(4):
      state = algo.observe(state, algo.measure(logp, prepared, state))
      metrics = algo.loss(logp, prepared, state)[1]
      coefs.append(float(rljax.finalize(metrics)["mdpo_kl_coef"]))
    np.testing.assert_allclose(coefs, [1.0, 1.5, 3.0, 3.0], rtol=1e-6)


def test_mdpo_on_policy_first_step_is_plain_policy_gradient():
  """On-policy (no old_logp), the KL term and its gradient are 0: the
  gradient is the token-mean REINFORCE gradient -A / N_tok."""
  batch = testing.random_batch(7)._replace(old_logp_PGT=None)
  algo = presets.mdpo(iterations=2)
  prepared, state = algo.prepare(batch, algo.init())
  prepared, state = algo.prepare(prepared, state)  # coef 2
  logp = testing.perturbed_logp(testing.random_batch(7))
  grad = jax.grad(lambda lp: algo.loss(lp, prepared, state)[0].value)(logp)
  mask = np.asarray(prepared.loss_mask())
  expected = -np.asarray(prepared.advantages_PGT) * mask / mask.sum()
  np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-8)


def test_mdpo_step_size_schedule():
  np.testing.assert_allclose(
    O.mdpo_step_size(np.arange(-1, 6), 4), [1, 1, 0.75, 0.5, 0.25, 0.25, 0.25]
  )


def test_bad_stage_arguments_are_clear_errors():
  with pytest.raises(ValueError, match="hinge_gradient must be one of"):
    S.disco(hinge_gradient="exact")
  with pytest.raises(ValueError, match="beta must be > 0"):
    S.disco(beta=0.0)
  with pytest.raises(ValueError, match="anneal must be one of"):
    S.mdpo(anneal="steps")
  with pytest.raises(ValueError, match="iterations must be > 0"):
    S.mdpo(iterations=0)
  with pytest.raises(ValueError, match="needs Batch field"):
    algo = _disco_algo()
    batch = testing.random_batch(0)._replace(rewards_PG=None)
    algo.loss(batch.old_logp_PGT, batch, algo.init())


# --------------------------------------------------------------------------
# Presets


NAMES = sorted(presets.PRESETS)


def _prepared(name, seed):
  algo = presets.PRESETS[name]()
  batch = _batch(seed)
  logp = testing.perturbed_logp(batch)
  batch, state = jax.jit(algo.prepare)(batch, algo.init())
  state = algo.observe(state, algo.measure(logp, batch, state))
  return algo, batch, state, logp


@pytest.mark.parametrize("name", NAMES)
def test_preset_jits_with_finite_loss_and_gradient(name):
  algo, batch, state, logp = _prepared(name, 0)

  def loss(lp):
    value, metrics = algo.loss(lp, batch, state)
    return value.value, metrics

  (value, metrics), grad = jax.jit(jax.value_and_grad(loss, has_aux=True))(logp)
  assert value.dtype == jnp.float32 and np.isfinite(value)
  assert np.all(np.isfinite(grad)) and np.any(np.asarray(grad) != 0)
  assert np.all(np.asarray(grad)[np.asarray(batch.loss_mask()) == 0] == 0)
  assert all(np.isfinite(v) for v in rljax.finalize(metrics).values())
  # bfloat16 inputs: finite float32 loss.
  bf16 = lambda x: None if x is None else jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  v16 = algo.loss(bf16(logp), jax.tree.map(bf16, batch), state)[0].value
  assert v16.dtype == jnp.float32 and np.isfinite(v16)


@pytest.mark.parametrize("name", NAMES)
def test_preset_micro_batches_give_the_exact_loss(name):
  algo, batch, state, logp = _prepared(name, 1)
  whole = algo.loss(logp, batch, state)[0]
  parts = [algo.loss(logp[s], _half(batch, s), state)[0] for s in HALVES]
  np.testing.assert_allclose(_sum(parts).value, whole.value, rtol=1e-5)
