"""token_logprob: every schedule against the dense reference.

Shapes are chosen so that no block divides them (N = 37 tokens in blocks of
8, V = 300 vocabulary entries in blocks of 128), temperature 0.7. Gradients
use random cotangents on BOTH outputs (log-prob and entropy).
"""

import jax
import jax.numpy as jnp
from jax.test_util import check_grads
import numpy as np
import pytest

import pallas_kernels as pk

N, D, V = 37, 16, 300
BLOCKS = dict(block_n=8, block_v=128)
TEMP = 0.7
# pallas_interpret: the Mosaic TPU kernel under the Pallas interpreter.
SCHEDULES = ["chunked", "pallas_interpret"]
# The smallest tiles each schedule accepts (Mosaic: multiples of (8, 128)).
TINY_BLOCKS = {
  "chunked": dict(block_n=1, block_v=1),
  "pallas_interpret": dict(block_n=8, block_v=128),
}


def _data(seed=0, dtype=jnp.float32, shape=(N,)):
  rng = np.random.default_rng(seed)
  hidden = rng.normal(size=shape + (D,))
  unembed = 0.5 * rng.normal(size=(D, V))
  targets = rng.integers(0, V, shape).astype(np.int32)
  a, b = rng.normal(size=(2,) + shape).astype(np.float32)
  return jnp.asarray(hidden, dtype), jnp.asarray(unembed, dtype), targets, a, b


def _run(schedule, targets, temperature=TEMP, blocks=BLOCKS):
  """(hidden, unembed) -> (logp, entropy) under `schedule`."""
  return lambda h, w: pk.token_logprob(
    h, w, targets, temperature=temperature, schedule=schedule, **blocks
  )


def _values_and_grads(fn, a, b):
  """Jitted (fn(h, w), its VJP with cotangents (a, b))."""

  def run(h, w):
    out, vjp = jax.vjp(fn, h, w)
    return out, vjp((a, b))

  return jax.jit(run)


def _close(got, want, rtol):
  """Elementwise within rtol, absolute rtol * the reference's largest entry."""
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert g.shape == w.shape and g.dtype == w.dtype
    w = np.asarray(w, np.float32)
    scale = max(float(np.abs(w).max()), 1.0)
    np.testing.assert_allclose(
      np.asarray(g, np.float32), w, atol=rtol * scale, rtol=rtol
    )


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_float32_values_and_gradients_match_dense(schedule):
  hidden, unembed, targets, a, b = _data()
  got = _values_and_grads(_run(schedule, targets), a, b)(hidden, unembed)
  want = _values_and_grads(_run("dense", targets), a, b)(hidden, unembed)
  assert got[0][0].dtype == jnp.float32 and got[0][0].shape == (N,)
  _close(got, want, 1e-5)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_bfloat16_inputs_accumulate_in_float32(schedule):
  # Both schedules multiply the same bf16 numbers (exact in f32) and sum in
  # f32, so values agree to f32 rounding (1e-5); gradients come back in bf16,
  # so they agree to bf16 rounding (2^-8 relative): tolerance 1e-2.
  hidden, unembed, targets, a, b = _data(3, jnp.bfloat16)
  got = _values_and_grads(_run(schedule, targets), a, b)(hidden, unembed)
  want = _values_and_grads(_run("dense", targets), a, b)(hidden, unembed)
  assert all(
    x.dtype == jnp.float32 and jnp.all(jnp.isfinite(x)) for x in got[0]
  )
  assert all(x.dtype == jnp.bfloat16 for x in got[1])
  _close(got[0], want[0], 1e-5)
  _close(got[1], want[1], 1e-2)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_vmap_over_a_leading_batch_matches_dense_batch_dims(schedule):
  hidden, unembed, targets, a, b = _data(5, shape=(3, 11))

  def vmapped(h, w):
    return jax.vmap(lambda hh, t: _run(schedule, t)(hh, w))(h, targets)

  got = _values_and_grads(vmapped, a, b)(hidden, unembed)
  # Dense on the [3, 11, D] batch (leading dims flattened inside).
  want = _values_and_grads(_run("dense", targets), a, b)(hidden, unembed)
  assert got[0][0].shape == (3, 11)
  _close(got, want, 1e-5)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_hand_computed_tiny_case(schedule):
  # z = [0, ln 3] (h = 1, unembed [0, ln(3)/2], temperature 0.5): p = [1/4,
  # 3/4], logp of token 1 = ln(3/4) = -0.2876821, entropy = 0.25 ln 4 +
  # 0.75 ln(4/3) = 0.3465736 + 0.2157616 = 0.5623351. With cotangent 1 on
  # logp, 0 on entropy: d/dunembed = (onehot - p) h / T = [-0.5, 0.5],
  # d/dh = sum_j (onehot - p)_j W_j / T = (1/4)(0.5493061) / 0.5 = 0.2746531.
  fn = _run(schedule, jnp.array([1]), 0.5, TINY_BLOCKS[schedule])
  run = _values_and_grads(fn, jnp.ones(1), jnp.zeros(1))
  (logp, entropy), (d_h, d_w) = run(
    jnp.ones((1, 1)), jnp.array([[0.0, 0.5493061]])
  )
  np.testing.assert_allclose(logp, [-0.2876821], rtol=1e-6)
  np.testing.assert_allclose(entropy, [0.5623351], rtol=1e-6)
  np.testing.assert_allclose(d_w, [[-0.5, 0.5]], rtol=1e-6)
  np.testing.assert_allclose(d_h, [[0.2746531]], rtol=1e-6)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_check_grads_on_the_custom_vjp(schedule):
  hidden, unembed, targets, a, b = _data(7, shape=(10,))
  hidden, unembed, targets = hidden[:, :6], unembed[:6, :140], targets % 140
  fn = _run(schedule, targets)
  f = jax.jit(lambda h, w: jnp.sum(a * fn(h, w)[0]) + jnp.sum(b * fn(h, w)[1]))
  check_grads(f, (hidden, unembed), order=1, modes=["rev"], eps=1e-3, rtol=1e-2)


def test_traced_temperature_with_default_blocks():
  hidden, unembed, targets, _, _ = _data(9)
  # "auto" fused is chunked on CPU; its default blocks exceed N and V here.
  fn = jax.jit(
    lambda t: pk.token_logprob(hidden, unembed, targets, temperature=t)
  )
  want = jax.jit(_run("dense", targets))(hidden, unembed)
  with pk.dense_up_to(0):
    _close(fn(jnp.float32(TEMP)), want, 1e-5)
