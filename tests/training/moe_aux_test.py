"""The router's load-balancing loss as an optional stage of the policy
update (`UpdateSpec.router_aux_coef`)."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import algorithms
from rljax import testing
from rljax.models import ModelConfig
from rljax.models import load_balancing_loss
from rljax.training import Models
from rljax.training import Sequences
from rljax.training import UpdateSpec
from rljax.training._step import _policy_grads

P, G, S, T = 2, 2, 3, 4
_CONFIG = ModelConfig(
  vocab_size=16,
  hidden_size=16,
  intermediate_size=32,
  num_layers=2,
  num_heads=4,
  num_kv_heads=4,
  head_dim=4,
  max_position_embeddings=16,
  num_experts=4,
  experts_per_token=2,
  expert_intermediate_size=8,
)


def _inputs():
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 16, (P, G, S + T)).astype(np.int32)
  mask = np.ones((P, G, S + T), np.int32)
  mask[0, :, 0] = 0
  mask[1, 1, -1] = 0
  batch = testing.random_batch(0, prompts=P, samples=G, tokens=T)
  batch = batch._replace(
    mask_PGT=mask[..., S:].astype(np.float32),
    old_logp_PGT=None,
    ref_logp_PGT=None,
  )
  return Sequences(tokens * mask, mask), batch


@pytest.mark.slow  # 40-95 s on 2 shared CPU cores: three compiles
def test_router_aux_adds_coef_times_its_gradient():
  model = testing.random_model(_CONFIG, seed=1)
  graphdef, params = nnx.split(model)
  models = Models(graphdef, None, None, None)
  algorithm = algorithms.get("grpo")
  seqs, batch = _inputs()
  batch, algo_state = algorithm.prepare(
    batch, algorithm.init(), key=jax.random.key(0)
  )

  def grads(params, coef):
    spec = UpdateSpec(completion_width=T, router_aux_coef=coef)
    return _policy_grads(
      models,
      algorithm,
      spec,
      params,
      algo_state,
      seqs,
      batch,
      jax.random.key(1),
    )

  g0, den, m0 = jax.jit(grads, static_argnums=1)(params, 0.0)
  g1, den1, m1 = jax.jit(grads, static_argnums=1)(params, 0.5)
  assert "router_aux" not in m0

  def aux(params):
    model = nnx.merge(graphdef, params)
    tokens = seqs.tokens_PGL.reshape(P * G, -1)
    mask = seqs.mask_PGL.reshape(P * G, -1)
    _, _, routing = model.hidden_states(tokens, mask, return_routing=True)
    return load_balancing_loss(routing.logits, routing.experts, mask)

  value, g_aux = jax.jit(jax.value_and_grad(aux))(params)
  np.testing.assert_allclose(m1["router_aux"].value, value, rtol=1e-6)
  weight = jnp.where(den == 0, 1.0, den)
  jax.tree.map(
    lambda a, b, c: np.testing.assert_allclose(
      a - b, 0.5 * weight * c, atol=1e-5, rtol=1e-4
    ),
    g1,
    g0,
    g_aux,
  )
  assert np.abs(np.asarray(g_aux["layers"]["router"][...])).max() > 1e-4
