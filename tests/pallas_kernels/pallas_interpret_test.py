"""The Pallas token log-prob kernels, TPU (Mosaic) and GPU (Triton), under
the interpreter on CPU.

Every case uses N, V (and for the GPU kernel D) that the blocks do not divide
(the ragged edge is masked in the kernels, not padded) and a temperature
other than 1. The oracle is a dense jnp computation with materialized [N, V]
logits; gradients come from jax.grad of sum(a * logp + b * entropy).

The generic interpreter that runs the GPU kernels does not model Triton, so
the real kernels are also lowered to Triton IR for CUDA (no GPU needed),
which enforces Triton's power-of-2 tensor sizes; the TPU kernels are lowered
to Mosaic the same way and run under the TPU interpreter's race detector.
"""

from typing import Any, NamedTuple

import jax

# The TPU interpreter keeps its race detector in this module (a new
# RaceDetectionState per pallas_call, published as the global `races`).
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as tpu_interp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _pallas_gpu as gpu
from pallas_kernels import _pallas_tpu as tpu

TEMP = 0.7


class Kernel(NamedTuple):
  """A schedule under test: its module, small blocks, a ragged N and D."""

  module: Any
  blocks: dict
  n: int
  d: int
  bad_blocks: tuple  # (block_n, block_v) values the module must refuse


# TPU: 8 x 128 tiles, N=20, V=300: grid 3 x 3, both edges partial.
TPU = Kernel(tpu, dict(block_n=8, block_v=128), 20, 16, (12, 100))
# GPU (Triton: powers of 2, >= 16): 16 x 128 blocks, N=40: 3 token and 3
# vocab blocks, both edges partial; D=24 is rounded up to 32 lanes inside.
GPU = Kernel(gpu, dict(block_n=16, block_v=128), 40, 24, (24, 8))
_BOTH = pytest.mark.parametrize("k", [TPU, GPU], ids=["tpu", "gpu"])


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


def _kernels(k, h, u, t, inv_temp, a, b):
  """Forward then backward of kernel `k`, traced under one jax.jit."""

  @jax.jit
  def run(h, u, t, inv_temp, a, b):
    st = k.module.forward(h, u, t, inv_temp, **k.blocks, interpret=True)
    grads = k.module.backward(
      h, u, t, inv_temp, st.lse, st.ez, a, b, **k.blocks, interpret=True
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


@_BOTH
def test_float32_matches_dense_with_ragged_blocks(k):
  h, u, t, a, b = _problem(k.n, k.d, 300)
  inv = jnp.float32(1 / TEMP)
  (st, (dh, du)), (ref, (gh, gu)) = (
    _kernels(k, h, u, t, inv, a, b),
    _dense(h, u, t, inv, a, b),
  )
  for got, want in zip(st, ref):
    assert got.shape == (k.n,) and got.dtype == jnp.float32
    _close(got, want, 1e-5)
  assert dh.shape == (k.n, k.d) and dh.dtype == jnp.float32
  assert du.shape == (k.d, 300)
  _close(dh, gh, 1e-5)
  _close(du, gu, 1e-5)


@_BOTH
def test_bfloat16_inputs_accumulate_in_float32(k):
  h, u, t, a, b = _problem(k.n, 16, 300, jnp.bfloat16, seed=1)
  inv = jnp.float32(1 / TEMP)
  (st, (dh, du)), (ref, (gh, gu)) = (
    _kernels(k, h, u, t, inv, a, b),
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
  for g in (dh, du):
    assert np.all(np.isfinite(np.asarray(g, np.float32)))
  _close(dh, gh, 2e-2)
  _close(du, gu, 2e-2)


@_BOTH
def test_hand_worked_two_token_vocabulary(k):
  # h = [[1]], unembed = [[0, 2 ln 3]], temperature 2 (inv_temp 0.5):
  # z = [0, ln 3], softmax p = [1/4, 3/4], target 1. One block, nearly
  # all of it masked (N=1, D=1, V=2).
  ln3 = np.log(3.0)
  h = jnp.array([[1.0]])
  u = jnp.array([[0.0, 2 * ln3]], jnp.float32)
  t = jnp.array([1])
  a, b = jnp.array([1.0]), jnp.array([0.5])
  st, (dh, du) = _kernels(k, h, u, t, jnp.float32(0.5), a, b)
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


@_BOTH
def test_vmap_over_sequences(k):
  h, u, t, a, b = _problem(40, k.d, 300, seed=2)
  h2, t2 = h.reshape(2, 20, k.d), t.reshape(2, 20)
  inv = jnp.float32(1 / TEMP)

  def fwd(h, t):
    return k.module.forward(h, u, t, inv, **k.blocks, interpret=True)

  st = jax.jit(jax.vmap(fwd))(h2, t2)
  ref = _dense_stats(h, u, t, inv)
  for got, want in zip(st, ref):
    _close(got.reshape(40), want, 1e-5)


@_BOTH
def test_bad_arguments_raise(k):
  # Checks run at trace time, so plain numpy arrays suffice.
  h, u = np.zeros((20, 16), np.float32), np.zeros((16, 300), np.float32)
  t, a, inv = np.zeros(20, np.int32), np.zeros(20, np.float32), np.float32(1)
  bad_n, bad_v = k.bad_blocks
  fwd, bwd = k.module.forward, k.module.backward
  with pytest.raises(ValueError, match="block_n"):
    fwd(h, u, t, inv, block_n=bad_n, block_v=128, interpret=True)
  with pytest.raises(ValueError, match="block_v"):
    fwd(
      h, u, t, inv, block_n=k.blocks["block_n"], block_v=bad_v, interpret=True
    )
  with pytest.raises(ValueError, match="agree on D"):
    fwd(h, u.T, t, inv, interpret=True)
  with pytest.raises(ValueError, match="targets_N"):
    bwd(h, u, t[:5], inv, a, a, a, a, interpret=True)


_CORES = pltpu.InterpretParams(detect_races=True, num_cores_or_threads=2)


def test_no_races_on_two_simulated_cores(capfd):
  # Two TensorCores take the "parallel" axis; the "arbitrary" reduction axis
  # stays on one core, so accumulators are never shared. Grids are 2 x 2.
  h, u, t, a, b = _problem(12, 8, 200, seed=3)
  inv = jnp.float32(1 / TEMP)
  st = tpu.forward(h, u, t, inv, **TPU.blocks, interpret=_CORES)
  jax.block_until_ready(st)
  assert not tpu_interp.races.races_found
  dh, du = tpu.backward(
    h, u, t, inv, st.lse, st.ez, a, b, **TPU.blocks, interpret=_CORES
  )
  jax.block_until_ready((dh, du))
  # `races` only holds the last pallas_call (d_unembed); the detector prints
  # every race it finds, which covers the d_hidden kernel too.
  assert not tpu_interp.races.races_found
  assert "RACE DETECTED" not in capfd.readouterr().out
  ref, (gh, gu) = _dense(h, u, t, inv, a, b)
  _close(st.lse, ref[1], 1e-5)
  _close(dh, gh, 1e-5)
  _close(du, gu, 1e-5)


def test_race_detector_flags_a_shared_block_on_a_parallel_axis(capfd):
  # Control for the test above: every step of a "parallel" axis writes one
  # output block, which is a race once two cores split that axis.
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  racy = pl.pallas_call(
    kernel,
    grid=(2,),
    in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
    out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
    out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
    compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    interpret=_CORES,
  )
  jax.block_until_ready(jax.jit(racy)(jnp.ones((16, 128))))
  assert tpu_interp.races.races_found
  assert "RACE DETECTED" in capfd.readouterr().out


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tpu_default_blocks_lower_to_mosaic(dtype):
  # Lowering for TPU needs no TPU: it runs the Pallas -> Mosaic lowering and
  # its block-shape checks for the real (non-interpreted) kernels.
  n, d, v = 1000, 256, 5000
  h, u = (
    jax.ShapeDtypeStruct((n, d), dtype),
    jax.ShapeDtypeStruct((d, v), dtype),
  )
  t = jax.ShapeDtypeStruct((n,), jnp.int32)
  f = jax.ShapeDtypeStruct((n,), jnp.float32)
  s = jax.ShapeDtypeStruct((), jnp.float32)
  fwd = tpu.forward.trace(h, u, t, s).lower(lowering_platforms=("tpu",))
  bwd = tpu.backward.trace(h, u, t, s, f, f, f, f)
  text = fwd.as_text() + bwd.lower(lowering_platforms=("tpu",)).as_text()
  assert text.count("tpu_custom_call") == 3


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gpu_default_blocks_lower_to_triton(dtype):
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
