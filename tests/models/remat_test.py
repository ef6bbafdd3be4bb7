"""``ModelConfig.remat``: each layer recomputed in the backward pass (all
of it, or what lies between its matmuls), the same loss and gradients as
keeping its activations; ``update_unroll`` unrolls only a forward without a
cache."""

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.models import ModelConfig
from rljax.models import Transformer
from rljax.models import init_cache


def test_remat_gives_the_same_loss_and_gradients():
  config = ModelConfig(
    vocab_size=32,
    hidden_size=32,
    intermediate_size=64,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
  )
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 7)))

  def grads(remat):
    c = dataclasses.replace(config, remat=remat)
    graphdef, params = nnx.split(Transformer(c, rngs=nnx.Rngs(0)))

    def loss(params):
      logits, _ = nnx.merge(graphdef, params)(tokens)
      return jnp.mean(jax.nn.log_softmax(logits)[..., 3])

    jitted = jax.jit(jax.value_and_grad(loss))
    text = str(jax.make_jaxpr(loss)(params))
    return jitted(params), text

  (value, grad), plain = grads(False)
  assert "remat" not in plain
  for remat, policy in ((True, "policy=None"), ("dots", "policy=DotsSaveable")):
    (value_r, grad_r), rematted = grads(remat)
    # The policy is the one asked for: "dots" keeps the matmuls' outputs.
    assert "remat" in rematted and policy in rematted
    np.testing.assert_allclose(value_r, value, rtol=1e-6)
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
      grad_r,
      grad,
    )


def test_update_unroll_unrolls_the_forward_without_a_cache_alone():
  config = ModelConfig(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_layers=4,
    num_heads=2,
    num_kv_heads=2,
    head_dim=8,
    update_unroll=4,
  )
  graphdef, params = nnx.split(Transformer(config, rngs=nnx.Rngs(0)))
  tokens = jnp.zeros((1, 4), jnp.int32)

  def unrolls(fn):
    jaxpr = jax.make_jaxpr(fn)(params)
    return [
      e.params["unroll"] for e in jaxpr.eqns if e.primitive.name == "scan"
    ]

  assert unrolls(lambda p: nnx.merge(graphdef, p)(tokens)[0]) == [4]
  cache = init_cache(config, 1, 8)
  decode = lambda p: nnx.merge(graphdef, p)(  # noqa: E731
    tokens, positions_BS=jnp.arange(4)[None], cache=cache
  )[0]
  assert unrolls(decode) == [1]


def test_bad_remat_and_unroll_settings_are_clear_errors():
  kw = dict(
    vocab_size=8,
    hidden_size=8,
    intermediate_size=8,
    num_layers=1,
    num_heads=1,
    num_kv_heads=1,
    head_dim=8,
  )
  with pytest.raises(ValueError, match="remat must be one of"):
    ModelConfig(**kw, remat="selective")
  with pytest.raises(ValueError, match="update_unroll"):
    ModelConfig(**kw, update_unroll=-1)
