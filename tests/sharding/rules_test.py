"""rljax.sharding: meshes, logical-axis rules, and sharded model programs."""

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import sampling
from rljax import sharding
from rljax import testing
from rljax.models import ModelConfig
from rljax.models import token_logprobs

P = jax.sharding.PartitionSpec

# Every split dimension divides 4, so all mesh shapes below apply.
_CONFIG = ModelConfig(
  vocab_size=64,
  hidden_size=16,
  intermediate_size=32,
  num_layers=2,
  num_heads=4,
  num_kv_heads=4,
  head_dim=8,
  tie_embeddings=False,
  qkv_bias=True,
  max_position_embeddings=64,
)


def _prompts(rows=8, width=6, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, _CONFIG.vocab_size, (rows, width))
  pads = rng.integers(0, width - 1, rows)
  mask = (np.arange(width)[None] >= pads[:, None]).astype(np.int32)
  return tokens * mask, mask


def test_make_mesh_shapes_and_axis_types():
  mesh = sharding.make_mesh()
  assert dict(mesh.shape) == {"data": 8, "fsdp": 1, "tensor": 1}
  mesh = sharding.make_mesh(1, 2, -1)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 4}
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


@pytest.mark.parametrize(
  "sizes,match",
  [
    ((3, 1, 1), "uses 3 devices but 8 are available"),
    ((-1, 3, 1), "no whole size for the -1 axis"),
    ((-1, -1, 1), "at most one mesh axis may be -1"),
    ((0, 8, 1), "data must be >= 1"),
  ],
)
def test_bad_mesh_shapes_raise(sizes, match):
  with pytest.raises(ValueError, match=match):
    sharding.make_mesh(*sizes)


def test_logical_to_spec_by_hand():
  spec = sharding.logical_to_spec(("layers", "embed", "heads", "head_dim"))
  assert spec == P(None, "fsdp", "tensor", None)
  assert sharding.logical_to_spec(("batch", None)) == P(("data", "fsdp"), None)
  with pytest.raises(ValueError, match=r"\['experts'\] have no sharding rule"):
    sharding.logical_to_spec(("experts", "embed"))


def test_param_shardings_follow_the_rules():
  model = testing.random_model(_CONFIG)
  mesh = sharding.make_mesh(2, 2, 2)
  shardings = sharding.param_shardings(model, mesh)
  assert shardings["embed"].spec == P("tensor", "fsdp")
  assert shardings["lm_head"].spec == P("fsdp", "tensor")
  assert shardings["layers"]["q_proj"].spec == P(None, "fsdp", "tensor", None)
  assert shardings["layers"]["down_proj"].spec == P(None, "tensor", "fsdp")
  assert shardings["final_norm"].spec == P("fsdp")


def test_indivisible_parameter_names_the_parameter_and_the_fix():
  model = testing.random_model(dataclasses.replace(_CONFIG, num_kv_heads=2))
  mesh = sharding.make_mesh(1, 2, 4)
  with pytest.raises(
    ValueError,
    match=r"\['layers'\]\['k_bias'\] dimension 1 \('kv_heads', size 2\)"
    r".*'tensor' \(4 devices\).*map 'kv_heads' to None",
  ):
    sharding.param_shardings(model, mesh)
  rules = dict(sharding.DEFAULT_RULES) | {"kv_heads": None}
  sharding.param_shardings(model, mesh, tuple(rules.items()))  # now fine


def test_check_batch_message():
  mesh = sharding.make_mesh(2, 4, 1)
  sharding.check_batch("prompts", 16, mesh)
  with pytest.raises(
    ValueError, match=r"prompts has 12 rows.*data=2 x fsdp=4.*multiple of 8"
  ):
    sharding.check_batch("prompts", 12, mesh)


def _sharded(mesh_sizes, tokens, mask):
  """A copy of the model and the batch placed on a mesh."""
  mesh = sharding.make_mesh(*mesh_sizes)
  model = sharding.shard_model(testing.random_model(_CONFIG), mesh)
  put = lambda x: jax.device_put(  # noqa: E731
    jnp.asarray(x), sharding.batch_sharding(mesh, 2)
  )
  return mesh, model, put(tokens), put(mask)


@pytest.mark.parametrize(
  "mesh_sizes",
  [
    (2, 2, 2),
    pytest.param((8, 1, 1), marks=pytest.mark.slow),
    pytest.param((1, 2, 4), marks=pytest.mark.slow),
  ],
)
def test_sharded_logprobs_equal_single_device(mesh_sizes):
  tokens, mask = _prompts()
  step = testing.jit_model_fn(token_logprobs)
  want = step(testing.random_model(_CONFIG), tokens, mask)
  mesh, model, tokens, mask = _sharded(mesh_sizes, tokens, mask)
  assert model.layers.q_proj[...].sharding.spec == P(
    None, "fsdp", "tensor", None
  )
  got = step(model, tokens, mask)
  for w, g in zip(want, got):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
  assert got[0].sharding.mesh.shape == mesh.shape


@pytest.mark.slow  # two sampler compiles: about 25 s on 2 cores
def test_sharded_generate_equals_single_device():
  tokens, mask = _prompts(rows=4)
  kwargs = dict(key=jax.random.key(3), max_new_tokens=5, num_samples=2)
  want = sampling.generate(
    testing.random_model(_CONFIG), tokens, mask, **kwargs
  )
  _, model, tokens, mask = _sharded((2, 2, 2), tokens, mask)
  got = sampling.generate(model, tokens, mask, **kwargs)
  np.testing.assert_array_equal(got.tokens_PGT, want.tokens_PGT)
  np.testing.assert_allclose(got.logp_PGT, want.logp_PGT, atol=1e-5)


def test_explicit_mesh_is_a_clear_error():
  mesh = jax.make_mesh((8,), ("data",))  # AxisType.Explicit by default
  tokens = jax.device_put(
    jnp.ones((8, 4), jnp.int32), jax.sharding.NamedSharding(mesh, P("data"))
  )
  model = testing.random_model(_CONFIG)
  with pytest.raises(ValueError, match="AxisType.Explicit.*make_mesh"):
    nnx.jit(lambda m, t: m(t))(model, tokens)
