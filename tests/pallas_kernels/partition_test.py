"""The Pallas kernels on a device mesh: one kernel call per shard of the
token rows (`jax.shard_map`), the same values and gradients as one device."""

import jax
import jax.numpy as jnp
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import pallas_kernels as pk

N, D, V = 48, 16, 200


def _mesh(shape):
  return jax.make_mesh(
    shape, ("data", "tensor"), axis_types=(AxisType.Auto,) * 2
  )


def _arrays(dtype):
  rng = np.random.default_rng(0)
  h = jnp.asarray(rng.normal(size=(N, D)), dtype)
  w = jnp.asarray(rng.normal(size=(D, V)) * 0.3, dtype)
  t = jnp.asarray(rng.integers(0, V, N), jnp.int32)
  return h, w, t


def _loss(h, w, t, schedule):
  logp, entropy = pk.token_logprob(
    h, w, t, schedule=schedule, block_n=8, block_v=128
  )
  weights = jnp.linspace(-1.0, 1.0, N)
  return jnp.sum(logp * weights) + 0.5 * jnp.sum(entropy)


@pytest.mark.parametrize("shape", [(4, 2), (8, 1), (2, 4)])
def test_sharded_rows_give_one_devices_values_and_gradients(shape):
  mesh = _mesh(shape)
  h, w, t = _arrays(jnp.float32)
  h = jax.device_put(h, NamedSharding(mesh, P("data", None)))
  grad = jax.jit(jax.value_and_grad(_loss, (0, 1)), static_argnums=3)
  with jax.set_mesh(mesh):
    lowered = grad.lower(h, w, t, "pallas_interpret").as_text()
    value, (dh, dw) = grad(h, w, t, "pallas_interpret")
  assert "sdy.manual_computation" in lowered or "shard_map" in lowered
  ref_value, (ref_dh, ref_dw) = grad(h, w, t, "dense")
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  np.testing.assert_allclose(dh, ref_dh, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(dw, ref_dw, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("rows", [45, 7])
def test_rows_that_do_not_divide_the_devices_are_padded(rows):
  # 45 and 7 rows over 8 devices: zero rows pad them to 48 and 8, and are
  # cut from the outputs; they add nothing to either gradient.
  h, w, t = _arrays(jnp.float32)
  h, t = h[:rows], t[:rows]

  def loss(h, w, schedule):
    logp, entropy = pk.token_logprob(
      h, w, t, schedule=schedule, block_n=8, block_v=128
    )
    return jnp.sum(logp) + 0.5 * jnp.sum(entropy)

  grad = jax.jit(jax.value_and_grad(loss, (0, 1)), static_argnums=2)
  with jax.set_mesh(_mesh((4, 2))):
    value, (dh, dw) = grad(h, w, "pallas_interpret")
  ref_value, (ref_dh, ref_dw) = grad(h, w, "dense")
  assert dh.shape == (rows, D)
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  np.testing.assert_allclose(dh, ref_dh, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(dw, ref_dw, rtol=1e-4, atol=1e-6)
