"""``ModelConfig.remat``: each layer recomputed in the backward pass, the
same loss and gradients as keeping its activations."""

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import ModelConfig
from rljax.models import Transformer


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
  (value_r, grad_r), rematted = grads(True)
  assert "remat" in rematted and "remat" not in plain
  np.testing.assert_allclose(value_r, value, rtol=1e-6)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
    grad_r,
    grad,
  )
