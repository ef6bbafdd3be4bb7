"""Pallas GPU (Triton) token log-prob kernels under the interpreter on CPU.

`interpret=True` runs the kernels through Pallas's generic interpreter (a jit
of a loop over the grid); it does not model Triton, so a second test lowers
the real kernels to Triton IR for CUDA, which needs no GPU and enforces
Triton's power-of-2 tensor sizes. Every case uses N, V (and in one case D)
that the blocks do not divide and a temperature other than 1; the oracle is a
dense jnp computation with materialized [N, V] logits and jax.grad.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _pallas_gpu as gpu

TEMP = 0.7
BLOCKS = dict(block_n=16, block_v=128)  # Triton: powers of 2, >= 16.


def _problem(n, d, v, dtype=jnp.float32, seed=0):
  """Random hidden [N, D], unembed [D, V], targets [N], cotangents a, b."""
  rng = np.random.default_rng(seed)
  h = jnp.asarray(rng.normal(size=(n, d)), dtype)
  # Logits of order 3 give a softmax that is neither flat nor one-hot.
  u = jnp.asarray(rng.normal(size=(d, v)) * 3 / np.sqrt(d), dtype)
  t = jnp.asarray(rng.integers(0, v, size=n), jnp.int32)
  a, b = (jnp.asarray(rng.normal(size=n), jnp.float32) for _ in range(2))
  return h, u, t, a, b


def _dense_stats(h, u, t, inv_temp):
  """(target_logit, lse, ez) from the full [N, V] logits in float32."""
  h, u = h.astype(jnp.float32), u.astype(jnp.float32)
  z = jnp.dot(h, u, precision="highest") * inv_temp
  lse = jax.nn.logsumexp(z, axis=-1)
  ez = jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
  return jnp.take_along_axis(z, t[:, None], axis=-1)[:, 0], lse, ez


@jax.jit
def _dense(h, u, t, inv_temp, a, b):
  """Dense stats and jax.grad of sum(a * logp + b * entropy)."""

  def objective(h, u):
    tl, lse, ez = _dense_stats(h, u, t, inv_temp)
    return jnp.sum(a * (tl - lse) + b * (lse - ez))

  h, u = h.astype(jnp.float32), u.astype(jnp.float32)
  grads = jax.grad(objective, argnums=(0, 1))(h, u)
  return _dense_stats(h, u, t, inv_temp), grads


def _kernels(h, u, t, inv_temp, a, b, **blocks):
  """Forward then backward of the GPU schedule, traced under one jax.jit."""

  @jax.jit
  def run(h, u, t, inv_temp, a, b):
    st = gpu.forward(h, u, t, inv_temp, **blocks, interpret=True)
    grads = gpu.backward(
      h, u, t, inv_temp, st.lse, st.ez, a, b, **blocks, interpret=True
    )
    return st, grads

  return run(h, u, t, inv_temp, a, b)


def _close(got, want, tol):
  """Relative to the array's scale: entries near 0 come from cancellation."""
  want = np.asarray(want, np.float32)
  scale = max(1.0, float(np.max(np.abs(want))))
  np.testing.assert_allclose(
    np.asarray(got, np.float32), want, rtol=tol, atol=tol * scale
  )


def test_float32_matches_dense_with_ragged_blocks():
  # N=40, V=300 with 16 x 128 blocks: 3 token and 3 vocab blocks, both
  # edges partial; D=24 is rounded up to 32 lanes inside the kernel.
  h, u, t, a, b = _problem(40, 24, 300)
  inv = jnp.float32(1 / TEMP)
  (st, (dh, du)), (ref, (gh, gu)) = (
    _kernels(h, u, t, inv, a, b, **BLOCKS),
    _dense(h, u, t, inv, a, b),
  )
  for got, want in zip(st, ref):
    assert got.shape == (40,) and got.dtype == jnp.float32
    _close(got, want, 1e-5)
  assert dh.shape == (40, 24) and du.shape == (24, 300)
  _close(dh, gh, 1e-5)
  _close(du, gu, 1e-5)


def test_bfloat16_inputs_accumulate_in_float32():
  h, u, t, a, b = _problem(40, 16, 300, jnp.bfloat16, seed=1)
  inv = jnp.float32(1 / TEMP)
  (st, (dh, du)), (ref, (gh, gu)) = (
    _kernels(h, u, t, inv, a, b, **BLOCKS),
    _dense(h, u, t, inv, a, b),
  )
  # Products of bf16 values are exact in f32, so the stats match the f32
  # oracle on the same (rounded) inputs to f32 accumulation error.
  for got, want in zip(st, ref):
    assert got.dtype == jnp.float32
    _close(got, want, 1e-5)
  # dz is rounded to bf16 for the matmul and the gradients are stored in
  # bf16 (8 significant bits, relative step 2^-8 = 0.4%): 2e-2 of the scale.
  assert dh.dtype == jnp.bfloat16 and du.dtype == jnp.bfloat16
  assert np.all(np.isfinite(np.asarray(du, np.float32)))
  _close(dh, gh, 2e-2)
  _close(du, gu, 2e-2)


def test_hand_worked_two_token_vocabulary():
  # h = [[1]], unembed = [[0, 2 ln 3]], temperature 2 (inv_temp 0.5):
  # z = [0, ln 3], softmax p = [1/4, 3/4], target 1. One 16 x 16 block,
  # nearly all of it masked (N=1, D=1, V=2).
  ln3 = np.log(3.0)
  h = jnp.array([[1.0]])
  u = jnp.array([[0.0, 2 * ln3]], jnp.float32)
  t = jnp.array([1])
  a, b = jnp.array([1.0]), jnp.array([0.5])
  st, (dh, du) = _kernels(h, u, t, jnp.float32(0.5), a, b, **BLOCKS)
  # target_logit = ln 3 = 1.0986123; lse = ln(1 + 3) = ln 4 = 1.3862944;
  # ez = 3/4 ln 3 = 0.8239592.
  np.testing.assert_allclose(st.target_logit, [1.0986123], rtol=1e-6)
  np.testing.assert_allclose(st.lse, [1.3862944], rtol=1e-6)
  np.testing.assert_allclose(st.ez, [0.8239592], rtol=1e-6)
  # onehot - p = [-1/4, 1/4]; p (z - ez) = [-3/16 ln 3, 3/16 ln 3];
  # dz = 1 * [-1/4, 1/4] - 0.5 * p (z - ez) = [-0.1470051, 0.1470051]
  # (0.25 - 3/32 ln 3 = 0.25 - 0.1029949).
  # d_hidden = (dz . [0, 2 ln 3]) * 0.5 = 0.1470051 ln 3 = 0.1615016.
  # d_unembed = 1 * dz * 0.5 = [-0.0735025, 0.0735025].
  np.testing.assert_allclose(dh, [[0.1615016]], rtol=1e-5)
  np.testing.assert_allclose(du, [[-0.0735025, 0.0735025]], rtol=1e-5)


def test_vmap_over_sequences():
  h, u, t, a, b = _problem(40, 24, 300, seed=2)
  h2, t2 = h.reshape(2, 20, 24), t.reshape(2, 20)
  inv = jnp.float32(1 / TEMP)
  fwd = lambda h, t: gpu.forward(h, u, t, inv, **BLOCKS, interpret=True)
  st = jax.jit(jax.vmap(fwd))(h2, t2)
  ref = _dense_stats(h, u, t, inv)
  for got, want in zip(st, ref):
    _close(got.reshape(40), want, 1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_default_blocks_lower_to_triton(dtype):
  # Lowering for CUDA needs no GPU: it builds the Triton IR of the real
  # kernels (64 x 128 blocks, D=96 rounded up to 128) and checks that every
  # tensor has a power-of-2 size.
  n, d, v = 1000, 96, 5000
  h, u = (
    jax.ShapeDtypeStruct((n, d), dtype),
    jax.ShapeDtypeStruct((d, v), dtype),
  )
  t = jax.ShapeDtypeStruct((n,), jnp.int32)
  f = jax.ShapeDtypeStruct((n,), jnp.float32)
  s = jax.ShapeDtypeStruct((), jnp.float32)
  fwd = gpu.forward.trace(h, u, t, s).lower(lowering_platforms=("cuda",))
  bwd = gpu.backward.trace(h, u, t, s, f, f, f, f)
  text = fwd.as_text() + bwd.lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 3


def test_bad_arguments_raise():
  # Checks run at trace time, so plain numpy arrays suffice.
  h, u = np.zeros((20, 16), np.float32), np.zeros((16, 300), np.float32)
  t, a, inv = np.zeros(20, np.int32), np.zeros(20, np.float32), np.float32(1)
  with pytest.raises(ValueError, match="block_n"):
    gpu.forward(h, u, t, inv, block_n=24, block_v=128, interpret=True)
  with pytest.raises(ValueError, match="block_v"):
    gpu.forward(h, u, t, inv, block_n=16, block_v=8, interpret=True)
  with pytest.raises(ValueError, match="agree on D"):
    gpu.forward(h, u.T, t, inv, interpret=True)
  with pytest.raises(ValueError, match="targets_N"):
    gpu.backward(h, u, t[:5], inv, a, a, a, a, interpret=True)
