"""policy_loss: fused SAPO / PPO clip against rljax.losses on dense logp."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels import _objectives
from pallas_kernels import _reference
from rljax import losses

N, D, V = 37, 16, 300
BLOCKS = dict(block_n=8, block_v=128)
TEMP = 0.7
SCHEDULES = ["dense", "chunked", "pallas_interpret"]
# (fused loss name and hyperparameters, the rljax function and its own).
CASES = {
  "sapo": (
    dict(loss="sapo", tau_pos=1.0, tau_neg=1.05),
    functools.partial(losses.sapo, tau_pos=1.0, tau_neg=1.05),
  ),
  "sapo_trl": (
    dict(loss="sapo", tau_pos=0.8, tau_neg=2.0, log_ratio_clamp=None),
    functools.partial(
      losses.sapo, tau_pos=0.8, tau_neg=2.0, log_ratio_clamp=None
    ),
  ),
  "ppo_clip": (
    dict(loss="ppo_clip", eps_low=0.2, eps_high=0.28),
    functools.partial(losses.ppo_clip, eps_low=0.2, eps_high=0.28),
  ),
  "ppo_dual_clip": (
    dict(loss="ppo_clip", dual_clip=3.0, log_ratio_clamp=1.0),
    functools.partial(losses.ppo_clip, dual_clip=3.0, log_ratio_clamp=1.0),
  ),
}


def _data(seed=0):
  """Inputs, plus old log-probs 1.2 nats around the dense ones."""
  rng = np.random.default_rng(seed)
  hidden = jnp.asarray(rng.normal(size=(N, D)), jnp.float32)
  unembed = jnp.asarray(0.5 * rng.normal(size=(D, V)), jnp.float32)
  targets = rng.integers(0, V, N).astype(np.int32)
  logp, _ = _reference.logprob_entropy(hidden, unembed, targets, 1 / TEMP)
  old = logp - rng.uniform(-1.2, 1.2, N).astype(np.float32)
  old = old.at[0].add(30.0)  # beyond verl's clamp of 20: no gradient
  adv = jnp.asarray(rng.normal(size=N), jnp.float32)
  mask = jnp.asarray(rng.uniform(size=N) > 0.3, jnp.float32)
  return hidden, unembed, targets, old, adv, mask


def _fused(case, schedule, targets, old, adv, mask):
  hyper, _ = CASES[case]
  return lambda h, w: pk.policy_loss(
    h,
    w,
    targets,
    old,
    adv,
    mask,
    temperature=TEMP,
    schedule=schedule,
    **BLOCKS,
    **hyper,
  )


def _separate(case, targets, old, adv, mask):
  """rljax's loss applied to the dense reference's log-probs."""
  _, rljax_loss = CASES[case]

  def f(h, w):
    logp, _ = _reference.logprob_entropy(h, w, targets, 1 / TEMP)
    return rljax_loss(logp, old, adv, mask).loss, logp

  return f


def _values_and_grads(fn, g_loss, g_logp):
  """Jitted ((loss, logp), grads of <g_loss, loss> + <g_logp, logp>)."""

  def run(h, w):
    out, vjp = jax.vjp(fn, h, w)
    return out, vjp((g_loss, g_logp))

  return jax.jit(run)


# The objectives are shared by every schedule: the interpreted kernel (slow
# to trace) runs one case.
@pytest.mark.parametrize(
  "case, schedule",
  [(c, s) for c in CASES for s in SCHEDULES[:2]] + [("sapo", SCHEDULES[2])],
)
def test_values_and_gradients_match_rljax(case, schedule):
  hidden, unembed, targets, old, adv, mask = _data()
  cot = np.random.default_rng(1).normal(size=(2, N)).astype(np.float32)
  fused = _fused(case, schedule, targets, old, adv, mask)
  separate = _separate(case, targets, old, adv, mask)
  got = _values_and_grads(fused, *cot)(hidden, unembed)
  want = _values_and_grads(separate, *cot)(hidden, unembed)
  for g, w in zip(got[0], want[0]):
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
  for g, w in zip(got[1], want[1]):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_masked_tokens_have_zero_loss_and_gradient(schedule):
  hidden, unembed, targets, old, adv, mask = _data(2)
  fused = _fused("sapo", schedule, targets, old, adv, mask)
  ones = jnp.ones(N)
  (loss, _), (d_hidden, _) = _values_and_grads(fused, ones, 0 * ones)(
    hidden, unembed
  )
  masked = np.asarray(mask) == 0
  assert masked.sum() > 3
  # A hidden row only feeds its own token, so masked rows get exactly 0.
  np.testing.assert_array_equal(loss[masked], 0.0)
  np.testing.assert_array_equal(d_hidden[masked], 0.0)
  assert np.all(np.abs(d_hidden[~masked]).sum(-1) > 0)


@pytest.mark.parametrize("case", list(CASES))
def test_coefficient_is_the_rljax_gradient(case):
  _, _, _, old, adv, mask = _data(3)
  hyper, rljax_loss = CASES[case]
  kwargs = {k: v for k, v in hyper.items() if k != "loss"}
  objective = getattr(_objectives, hyper["loss"])(**kwargs)
  rng = np.random.default_rng(4)
  logp = jnp.asarray(old + rng.uniform(-1.2, 1.2, N), jnp.float32)
  want = jax.grad(lambda x: rljax_loss(x, old, adv, mask).loss.sum())(logp)
  np.testing.assert_allclose(
    objective.coef(logp, old, adv, mask), want, rtol=1e-6, atol=1e-7
  )


def test_hand_computed_sapo_on_policy():
  # One token, p(target) = 3/4 (z = [0, ln 3]), old_logp = ln(3/4) so r = 1,
  # A = 2 > 0 -> tau = tau_pos = 1: L = -(4/1) sigmoid(0) 2 = -4, and
  # dL/dlogp = -sech^2(0) r A = -2, so dL/dunembed = -2 [-1/4, 1/4] h / T
  # = [1.0, -1.0] at h = 1, T = 0.5.
  run = lambda w: pk.policy_loss(
    jnp.ones((1, 1)),
    w,
    jnp.array([1]),
    jnp.array([-0.2876821]),
    jnp.array([2.0]),
    jnp.array([1.0]),
    temperature=0.5,
    schedule="chunked",
  )
  unembed = jnp.array([[0.0, 0.5493061]])
  loss, logp = jax.jit(run)(unembed)
  np.testing.assert_allclose(loss, [-4.0], rtol=1e-6)
  np.testing.assert_allclose(logp, [-0.2876821], rtol=1e-6)
  grad = jax.jit(jax.grad(lambda w: run(w)[0].sum()))(unembed)
  np.testing.assert_allclose(grad, [[1.0, -1.0]], rtol=1e-5)


def test_leading_batch_dims_and_bfloat16():
  hidden, unembed, targets, old, adv, mask = _data(5)
  shaped = [
    x.reshape(1, N, *x.shape[1:]) for x in (hidden, targets, old, adv, mask)
  ]
  h16, w16 = shaped[0].astype(jnp.bfloat16), unembed.astype(jnp.bfloat16)
  loss, logp = pk.policy_loss(
    h16, w16, *shaped[1:], temperature=TEMP, schedule="chunked", **BLOCKS
  )
  want, _ = _separate("sapo", targets, old, adv, mask)(h16[0], w16)
  assert loss.shape == logp.shape == (1, N) and loss.dtype == jnp.float32
  np.testing.assert_allclose(loss[0], want, rtol=1e-5, atol=1e-5)
