"""`pallas_kernels.grouped_matmul`: the megablox TPU kernel (under the Pallas
interpreter here) against a numpy reference, in values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk


def _reference(x, w, sizes):
  """Each group's rows times its matrix, one group at a time (numpy)."""
  out = np.zeros((x.shape[0], w.shape[2]))
  start = 0
  for e, n in enumerate(sizes):
    out[start : start + n] = x[start : start + n] @ w[e]
    start += n
  return out


def test_a_hand_worked_case():
  # Rows 0-1 are group 0 (w[0] = identity), row 2 group 1 (w[1] = 2 I);
  # group 2 is empty.
  x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
  w = np.stack([np.eye(2), 2 * np.eye(2), 7 * np.ones((2, 2))]).astype(
    np.float32
  )
  sizes = np.array([2, 1, 0], np.int32)
  for interpret in (False, True):
    out = pk.grouped_matmul(x, w, sizes, interpret=interpret)
    np.testing.assert_allclose(out, [[1, 2], [3, 4], [10, 12]])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_kernel_matches_numpy_in_values_and_gradients(dtype):
  # 200 rows (padded to 256 inside), 4 groups, one empty.
  rng = np.random.default_rng(0)
  m, d, f = 200, 128, 256
  sizes = np.array([50, 0, 70, 80], np.int32)
  x = rng.normal(size=(m, d)).astype(np.float32)
  w = rng.normal(size=(4, d, f)).astype(np.float32) / np.sqrt(d)
  c = rng.normal(size=(m, f)).astype(np.float32)  # the output's cotangent
  dt = jnp.dtype(dtype)

  def loss(x, w):
    out = pk.grouped_matmul(x, w, sizes, interpret=True)
    return jnp.sum(out.astype(jnp.float32) * c), out

  (_, out), (dx, dw) = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(
    jnp.asarray(x, dt), jnp.asarray(w, dt)
  )
  xr = np.asarray(jnp.asarray(x, dt), np.float64)
  wr = np.asarray(jnp.asarray(w, dt), np.float64)
  tol = {"float32": 1e-4, "bfloat16": 3e-2}[dtype]
  np.testing.assert_allclose(
    np.asarray(out, np.float64),
    _reference(xr, wr, sizes),
    atol=tol * 4,
    rtol=tol,
  )
  # d/dx: each row's cotangent times its group's matrix transposed;
  # d/dw[e]: the group's rows transposed times their cotangents.
  starts = np.concatenate([[0], np.cumsum(sizes)])
  group = np.searchsorted(starts[1:], np.arange(m), side="right")
  want_dx = np.einsum("mf,mdf->md", c, wr[group])
  want_dw = np.stack(
    [xr[a:b].T @ c[a:b] for a, b in zip(starts[:-1], starts[1:])]
  )
  np.testing.assert_allclose(
    np.asarray(dx, np.float64), want_dx, atol=tol * 20, rtol=tol
  )
  np.testing.assert_allclose(
    np.asarray(dw, np.float64), want_dw, atol=tol * 20, rtol=tol
  )
  assert not np.any(dw[1])  # the empty group has no gradient
