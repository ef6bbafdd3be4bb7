"""Conformance suite: every preset jits, differentiates, shards, accumulates.

Modelled on optax's contrib conformance tests: each property is checked for
every entry of `rljax.algorithms.PRESETS`, so a new preset is covered by
adding it to the dict.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import testing

PRESETS = sorted(rljax.algorithms.PRESETS)
KEY = jax.random.key(0)


def _get(name):
  return testing.preset(name)


def _batch(seed, prompts=4):
  return testing.preset_batch(seed, prompts=prompts)


def _rescored(algo, batch):
  """The extra log-prob passes the stages ask for (`rljax.Rescore`), as the
  Trainer fills them: near the old log-probs, a prompt's mean, or positive
  gradient norms."""
  for i, r in enumerate(algo.rescores):
    old = jnp.asarray(batch.old_logp_PGT, jnp.float32)
    value = {
      "completion": old * (1.0 + 0.1 * (i + 1)),
      "prompt": old[:, 0, 0],
      "gradient": jnp.square(old[..., 0]) + 1.0,
    }[r.span]
    batch = batch.with_extra(**{r.name: value.astype(batch.old_logp_PGT.dtype)})
  return batch


def _prepared(algo, batch, logp):
  """prepare, then (for stages that measure the minibatch) observe, as the
  trainer does before each optimizer step."""
  batch = _rescored(algo, batch)
  batch, state = algo.prepare(batch, algo.init(), key=KEY)
  entropy = jnp.ones_like(logp)
  stats = algo.measure(logp, batch, state, entropy_PGT=entropy, key=KEY)
  return batch, algo.observe(state, stats)


def _loss_fn(algo, batch, state):
  def loss(logp):  # the trainer passes the entropies (AEPO reads them)
    value, metrics = algo.loss(
      logp, batch, state, entropy_PGT=jnp.ones_like(logp)
    )
    return value.value, metrics

  return loss


def _run(name, batch, logp):
  algo = _get(name)
  batch, state = jax.jit(functools.partial(_prepared, algo))(batch, logp)
  loss = _loss_fn(algo, batch, state)
  (value, metrics), grad = jax.jit(jax.value_and_grad(loss, has_aux=True))(logp)
  return value, rljax.finalize(metrics), grad


def _as_bf16(x):  # floating-point fields only; ids stay integers
  if x is None or not jnp.issubdtype(jnp.result_type(x), jnp.floating):
    return x
  return jnp.asarray(x, jnp.bfloat16)


@pytest.mark.parametrize("name", PRESETS)
def test_jits_finite_in_bfloat16_and_sharded(name):
  """One batch of 8 prompts (one float32 run shared by three checks): the
  jitted loss and gradients are finite and train only real tokens;
  bfloat16 inputs give a float32 loss near float32's; split over 8 devices
  by prompt, the loss and gradient equal one device's."""
  assert jax.device_count() == 8
  batch = _batch(0, prompts=8)
  logp = testing.perturbed_logp(batch)
  value, metrics, grad = _run(name, batch, logp)
  assert value.dtype == jnp.float32 and np.isfinite(value)
  assert np.all(np.isfinite(grad))
  for key in (
    "loss",
    "clip_frac_low",
    "clip_frac_high",
    "ratio_mean",
    "kl_old",
  ):
    assert np.isfinite(metrics[key]), key
  # Padding tokens never receive gradient.
  assert np.all(grad[np.asarray(batch.mask_PGT) == 0] == 0)
  # Some token must be trained, or the test would pass vacuously.
  assert np.any(grad != 0)

  v16, _, g16 = _run(name, jax.tree.map(_as_bf16, batch), _as_bf16(logp))
  assert v16.dtype == jnp.float32
  assert np.isfinite(v16) and np.all(np.isfinite(g16))
  np.testing.assert_allclose(v16, value, atol=0.1, rtol=0.1)

  # Auto axes, as rljax.sharding.make_mesh builds the trainer's meshes.
  mesh = jax.make_mesh(
    (8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,)
  )
  sharding = jax.sharding.NamedSharding(
    mesh, jax.sharding.PartitionSpec("data")
  )
  put = lambda x: None if x is None else jax.device_put(x, sharding)  # noqa: E731
  sharded, _, sharded_grad = _run(name, jax.tree.map(put, batch), put(logp))
  np.testing.assert_allclose(sharded, value, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(sharded_grad, grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", PRESETS)
def test_init_works_abstractly(name):
  algo = _get(name)
  abstract = jax.eval_shape(algo.init)
  concrete = algo.init()
  assert jax.tree.structure(abstract) == jax.tree.structure(concrete)


@pytest.mark.parametrize("name", PRESETS)
def test_micro_batches_give_the_exact_global_loss_and_gradient(name):
  """Prepare once, then split prompts into two micro-batches: summing
  numerators and denominators reproduces the whole batch exactly."""
  algo = _get(name)
  batch = _batch(2)
  logp = testing.perturbed_logp(batch)
  batch, state = _prepared(algo, batch, logp)

  def num_den(logp, batch):
    return algo.loss(logp, batch, state, entropy_PGT=jnp.ones_like(logp))[0]

  whole = num_den(logp, batch)
  halves = [
    jax.tree.map(lambda x, s=s: x[s], batch) for s in (slice(0, 2), slice(2, 4))
  ]
  parts = [
    num_den(logp[s], b) for s, b in zip((slice(0, 2), slice(2, 4)), halves)
  ]
  total = functools.reduce(lambda a, b: jax.tree.map(jnp.add, a, b), parts)
  np.testing.assert_allclose(total.value, whole.value, rtol=1e-5, atol=1e-7)

  grad_whole = jax.grad(lambda l: num_den(l, batch).value)(logp)
  # The denominator does not depend on the parameters: accumulate gradients
  # of the numerators, divide once by the global denominator.
  den = total.den if float(total.den) != 0 else 1.0
  grad_parts = [
    jax.grad(lambda l, b=b: num_den(l, b).num)(logp[s]) / den
    for s, b in zip((slice(0, 2), slice(2, 4)), halves)
  ]
  np.testing.assert_allclose(
    np.concatenate(grad_parts), grad_whole, rtol=1e-5, atol=1e-7
  )


def test_unknown_preset_name_is_a_clear_error():
  with pytest.raises(ValueError, match="unknown algorithm preset 'grop'.*grpo"):
    rljax.algorithms.get("grop")


def test_dapo_needs_both_overlong_settings():
  with pytest.raises(ValueError, match="max_length and overlong_buffer"):
    rljax.algorithms.dapo(max_length=16)


def test_bad_hyperparameters_fail_when_the_algorithm_is_built():
  with pytest.raises(ValueError, match="eps_high"):
    rljax.algorithms.dapo(eps_high=-0.1)
  with pytest.raises(ValueError, match="tau_pos"):
    rljax.algorithms.sapo(tau_pos=0.0)
