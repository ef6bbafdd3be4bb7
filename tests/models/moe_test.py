"""Mixture-of-experts blocks: the block against a numpy reference (values)
and a dense-dispatch JAX reference (gradients), the load-balancing loss
against numpy and transformers, expert parallelism on 8 CPU devices and
routing replay."""

import contextlib
import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import sampling
from rljax import sharding
from rljax.models import ModelConfig
from rljax.models import Transformer
from rljax.models import load_balancing_loss
from rljax.models import moe_mlp
from rljax.models import token_logprobs

CONFIG = ModelConfig(
  vocab_size=64,
  hidden_size=32,
  intermediate_size=48,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
  num_experts=8,
  experts_per_token=2,
  expert_intermediate_size=24,
  qk_norm=True,
)


def _model(config=CONFIG, seed=0, scale=0.3):
  """A random model with weights large enough for uneven routing."""
  model = Transformer(config, rngs=nnx.Rngs(seed))
  state = nnx.state(model, nnx.Param)
  # Stacked layer matrices (ndim 3+) from std 0.02 to std `scale`.
  state = jax.tree.map(lambda p: p * (scale / 0.02) if p.ndim > 2 else p, state)
  nnx.update(model, state)
  return model


def _layer_weights(config, seed=0):
  rng = np.random.default_rng(seed)
  D, E, F = (
    config.hidden_size,
    config.num_experts,
    config.expert_intermediate_size,
  )
  return {
    "router": rng.normal(0, 0.5, (D, E)).astype(np.float32),
    "expert_gate": rng.normal(0, 0.3, (E, D, F)).astype(np.float32),
    "expert_up": rng.normal(0, 0.3, (E, D, F)).astype(np.float32),
    "expert_down": rng.normal(0, 0.3, (E, F, D)).astype(np.float32),
  }


def _numpy_moe(w, h_TD, k, norm):
  """Token by token: softmax, top k, optional renormalisation, SwiGLU."""
  logits = h_TD.astype(np.float64) @ w["router"]
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = np.zeros_like(h_TD, np.float64)
  for t in range(h_TD.shape[0]):
    top = np.argsort(-probs[t], kind="stable")[:k]
    gates = probs[t, top] / (probs[t, top].sum() if norm else 1.0)
    for e, g in zip(top, gates):
      a = h_TD[t] @ w["expert_gate"][e]
      b = h_TD[t] @ w["expert_up"][e]
      out[t] += g * ((a / (1 + np.exp(-a)) * b) @ w["expert_down"][e])
  return out


@pytest.mark.parametrize("norm", [False, True])
def test_block_matches_numpy(norm):
  config = dataclasses.replace(CONFIG, norm_topk_prob=norm)
  w = _layer_weights(config)
  h = np.random.default_rng(1).normal(size=(3, 5, 32)).astype(np.float32)
  out, routing = jax.jit(lambda w, h: moe_mlp(config, w, h))(w, h)
  expected = _numpy_moe(w, h.reshape(15, 32), 2, norm).reshape(3, 5, 32)
  np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)
  assert routing.logits.shape == (3, 5, 8) and routing.experts.shape == (
    3,
    5,
    2,
  )
  # Every expert gets tokens: the grouped matmul's runs are all exercised.
  assert len(np.unique(np.asarray(routing.experts))) == 8


def _dense_reference(config, w, h_BSD):
  """Every expert on every token ([T, E, D]), weights zero off the top k."""
  logits = jnp.einsum("bsd,de->bse", h_BSD, w["router"])
  probs = jax.nn.softmax(logits, -1)
  top, experts = jax.lax.top_k(probs, config.experts_per_token)
  if config.norm_topk_prob:
    top = top / top.sum(-1, keepdims=True)
  gates = jnp.sum(
    jax.nn.one_hot(experts, config.num_experts) * top[..., None], -2
  )
  a = jnp.einsum("bsd,edf->bsef", h_BSD, w["expert_gate"])
  b = jnp.einsum("bsd,edf->bsef", h_BSD, w["expert_up"])
  y = jnp.einsum("bsef,efd->bsed", jax.nn.silu(a) * b, w["expert_down"])
  return jnp.einsum("bsed,bse->bsd", y, gates)


def test_block_gradients_match_dense_dispatch():
  config = dataclasses.replace(CONFIG, norm_topk_prob=True)
  w = _layer_weights(config, seed=2)
  h = np.random.default_rng(3).normal(size=(2, 6, 32)).astype(np.float32)
  probe = np.random.default_rng(4).normal(size=(2, 6, 32)).astype(np.float32)

  def loss(fn):
    return jax.jit(jax.grad(lambda w, h: jnp.sum(fn(w, h) * probe), (0, 1)))

  got = loss(lambda w, h: moe_mlp(config, w, h)[0])(w, h)
  want = loss(lambda w, h: _dense_reference(config, w, h))(w, h)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4),
    got,
    want,
  )


def _numpy_aux(logits_LBSE, experts_LBSK, mask_BS):
  """E * sum_e f_e P_e over (layer, real token) pairs, by counting."""
  L, B, S, E = logits_LBSE.shape
  counts, probs, n = np.zeros(E), np.zeros(E), 0
  for l in range(L):
    for b in range(B):
      for s in range(S):
        if not mask_BS[b, s]:
          continue
        z = np.exp(logits_LBSE[l, b, s] - logits_LBSE[l, b, s].max())
        probs += z / z.sum()
        for e in experts_LBSK[l, b, s]:
          counts[e] += 1
        n += 1
  return E * np.sum(counts / n * probs / n)


def test_load_balancing_loss_matches_numpy_and_transformers():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 5, 8)).astype(np.float32)
  mask = np.ones((3, 5), np.int32)
  mask[1, :2] = mask[2, :4] = 0
  experts = np.asarray(jax.lax.top_k(jnp.asarray(logits), 2)[1])
  aux = jax.jit(load_balancing_loss)(logits, experts, mask)
  np.testing.assert_allclose(aux, _numpy_aux(logits, experts, mask), 1e-6)
  uniform = load_balancing_loss(np.zeros_like(logits), experts, mask)
  np.testing.assert_allclose(uniform, 2.0, rtol=1e-6)  # K when balanced

  torch = pytest.importorskip("torch")
  hf = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")
  t_logits = torch.tensor(logits, requires_grad=True)
  ref = hf.load_balancing_loss_func(
    tuple(t_logits.reshape(2, 15, 8)), 8, 2, torch.tensor(mask)
  )
  ref.backward()
  np.testing.assert_allclose(aux, ref.item(), rtol=1e-6)
  grad = jax.jit(jax.grad(load_balancing_loss))(logits, experts, mask)
  np.testing.assert_allclose(grad, t_logits.grad.numpy(), atol=1e-7)
  assert np.abs(grad).max() > 1e-3


def test_load_balancing_loss_gradient_by_finite_differences():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(2, 2, 3, 8))
  experts = np.asarray(jax.lax.top_k(jnp.asarray(logits), 2)[1])
  mask = np.array([[1, 1, 1], [0, 1, 1]])
  f = lambda x: _numpy_aux(x, experts, mask)  # noqa: E731
  grad = jax.grad(load_balancing_loss)(
    jnp.asarray(logits, jnp.float32), experts, mask
  )
  eps, numeric = 1e-6, np.zeros_like(logits)
  for i in np.ndindex(logits.shape):
    d = np.zeros_like(logits)
    d[i] = eps
    numeric[i] = (f(logits + d) - f(logits - d)) / (2 * eps)
  np.testing.assert_allclose(grad, numeric, atol=1e-5)


def _forward(model, tokens, mask, mesh=None):
  """(outputs, gradient of their sum of squares, per-device FLOPs, the
  state), jitted inside `mesh` (as the trainer's programs run) if given."""
  graphdef, state = nnx.split(model)
  shardings = None
  if mesh is not None:
    shardings = sharding.param_shardings(state, mesh)
    state = jax.device_put(state, shardings)

  def value(s, t, m):
    return nnx.merge(graphdef, s)(t, m)[0]

  def loss(s, t, m):
    return jnp.sum(jnp.square(value(s, t, m)))

  def both(s, t, m):
    return value(s, t, m), jax.grad(loss)(s, t, m)

  fn = jax.jit(
    both, in_shardings=(shardings, None, None) if mesh is not None else None
  )
  with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
    compiled = fn.lower(state, tokens, mask).compile()
    out, grad = compiled(state, tokens, mask)
  flops = compiled.cost_analysis()["flops"]
  return np.asarray(out), jax.device_get(grad), flops, state


def _tokens(b=8, s=6, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, 64, (b, s)).astype(np.int32)
  mask = np.ones((b, s), np.int32)
  mask[-1, :3] = 0
  return tokens, mask


@pytest.mark.parametrize(
  "shape", [pytest.param((1, 8, 1), marks=pytest.mark.slow), (2, 2, 2)]
)
def test_expert_sharded_forward_and_gradient_equal_one_device(shape):
  model = _model()
  tokens, mask = _tokens()
  one, grad_one, flops_one, _ = _forward(model, tokens, mask)
  mesh = sharding.make_mesh(*shape)
  many, grad_many, flops_many, state = _forward(model, tokens, mask, mesh)
  gate = state["layers"]["expert_gate"][...]
  assert gate.sharding.spec == jax.sharding.PartitionSpec(
    None, "fsdp", None, "tensor"
  )
  # Each device holds E / fsdp experts.
  assert gate.addressable_shards[0].data.shape[1] == 8 // shape[1]
  np.testing.assert_allclose(many, one, atol=1e-5, rtol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4),
    grad_many,
    grad_one,
  )
  # Each device routes only its own tokens through the experts (an eighth
  # of the rows, or a quarter at half the experts' width): about an eighth
  # of one device's FLOPs. Left to XLA, which cannot partition
  # `ragged_dot`, every device ran every token's experts.
  assert flops_many < flops_one / 8 * 1.5, (flops_many, flops_one)


def test_dense_rules_unchanged_for_dense_models():
  dense = dataclasses.replace(CONFIG, num_experts=0)
  state = nnx.state(Transformer(dense, rngs=nnx.Rngs(0)))
  specs = sharding.param_shardings(state, sharding.make_mesh(1, 8, 1))
  assert specs["layers"]["gate_proj"].spec == jax.sharding.PartitionSpec(
    None, "fsdp", "tensor"
  )
  assert "expert_gate" not in state["layers"]


@jax.jit
def _routed(model, tokens, mask, routing=None):
  """Hidden states and routing, jitted (op by op is slow)."""
  hidden, _, out = model.hidden_states(
    tokens, mask, routing_LBSK=routing, return_routing=True
  )
  return hidden, out


def test_returned_routing_replays_to_the_same_logits():
  model = _model()
  tokens, mask = _tokens(4, 6)
  hidden, routing = _routed(model, tokens, mask)
  assert routing.logits.shape == (2, 4, 6, 8)
  assert routing.experts.shape == (2, 4, 6, 2)
  again, replayed = _routed(model, tokens, mask, routing.experts)
  np.testing.assert_array_equal(replayed.experts, routing.experts)
  np.testing.assert_allclose(again, hidden, atol=1e-6)


@jax.jit
def _logp(model, tokens, mask, routing=None):
  hidden, _ = model.hidden_states(tokens, mask, routing_LBSK=routing)
  logp = jax.nn.log_softmax(model.logits(hidden)[:, :-1], -1)
  return jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]


def test_routing_replay_removes_the_router_mismatch():
  # The sampler routes with one router, the update with a slightly different
  # one (a bfloat16 rollout, an optimizer step): tokens near a tie change
  # experts and their log-probs. Top-1 routing with renormalisation gives
  # the chosen expert weight 1 whatever the router, so replaying the
  # sampler's experts must reproduce its log-probs exactly.
  config = dataclasses.replace(CONFIG, experts_per_token=1, norm_topk_prob=True)
  sampler, update = _model(config), _model(config)
  state = nnx.state(update, nnx.Param)
  router = state["layers"]["router"]
  noise = jax.random.normal(jax.random.key(7), router.shape) * 0.05
  router.set_value(router[...] + noise)
  nnx.update(update, state)
  tokens, mask = _tokens(8, 12, seed=3)
  _, routing = _routed(sampler, tokens, mask)
  _, own = _routed(update, tokens, mask)
  real = np.asarray(mask)[None, :, :, None] > 0
  assert np.any((np.asarray(own.experts) != routing.experts) & real)
  predicted = (mask[:, 1:] * mask[:, :-1]) > 0
  want = np.asarray(_logp(sampler, tokens, mask))[predicted]
  free = np.asarray(_logp(update, tokens, mask))[predicted]
  replayed = np.asarray(_logp(update, tokens, mask, routing.experts))
  assert np.abs(free - want).max() > 1e-2
  np.testing.assert_allclose(replayed[predicted], want, atol=1e-6)


def test_token_logprobs_forward_routing_replay():
  model = _model()
  tokens, mask = _tokens(4, 6)
  _, routing = _routed(model, tokens, mask)
  fn = jax.jit(token_logprobs)
  a, _ = fn(model, tokens, mask)
  b, _ = fn(model, tokens, mask, routing_LBSK=routing.experts)
  np.testing.assert_allclose(a, b, atol=1e-6)


def test_routing_errors():
  model = _model()
  tokens, mask = _tokens(2, 4)
  with pytest.raises(ValueError, match=r"\[L, B, S, K\]"):
    model.hidden_states(tokens, mask, routing_LBSK=np.zeros((2, 2, 4, 3)))
  dense = Transformer(
    dataclasses.replace(CONFIG, num_experts=0), rngs=nnx.Rngs(0)
  )
  with pytest.raises(ValueError, match="dense"):
    dense.hidden_states(tokens, mask, return_routing=True)


@pytest.mark.parametrize(
  "fields, match",
  [
    (dict(experts_per_token=0), "experts_per_token"),
    (dict(experts_per_token=9), "at most num_experts"),
    (dict(expert_intermediate_size=0), "expert_intermediate_size"),
    (dict(num_experts=-1), "num_experts"),
  ],
)
def test_config_errors(fields, match):
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(CONFIG, **fields)


def _replay_pair():
  """A sampler model and an update model whose routers differ slightly,
  top-1 renormalised routing (replay then reproduces the sampler)."""
  config = dataclasses.replace(CONFIG, experts_per_token=1, norm_topk_prob=True)
  sampler, update = _model(config), _model(config)
  state = nnx.state(update, nnx.Param)
  router = state["layers"]["router"]
  noise = jax.random.normal(jax.random.key(7), router.shape) * 0.05
  router.set_value(router[...] + noise)
  nnx.update(update, state)
  return sampler, update


@pytest.mark.slow  # about 40 s on 2 busy CPU cores (the sampler compiles)
def test_update_logprobs_replay_the_rollouts_routing():
  # The trainer's path: the sampler records its routing in the Rollout,
  # Sequences carry it, completion_logprobs replays it.
  from rljax import training
  from rljax.training import _rollout

  sampler, update = _replay_pair()
  prompts = np.array([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]], np.int32)
  mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], np.int32)
  out = sampling.generate(
    sampler,
    prompts,
    mask,
    key=jax.random.key(2),
    max_new_tokens=6,
    num_samples=2,
  )
  assert out.routing_PGLWK.shape == (2, 2, 2, 11, 1)  # [P, G, L, S + T, K]
  seqs = _rollout.sequences(out)
  assert seqs.routing_PGYLK is out.routing_PGLWK
  fn = jax.jit(
    training.completion_logprobs, static_argnames=("width", "temperature")
  )
  want = np.asarray(out.full_logp_PGT)
  own, _ = fn(sampler, seqs, width=6, temperature=1.0)
  np.testing.assert_allclose(own, want, atol=1e-5)
  replayed, _ = fn(update, seqs, width=6, temperature=1.0)
  free, _ = fn(
    update, seqs._replace(routing_PGYLK=None), width=6, temperature=1.0
  )
  assert np.abs(np.asarray(free) - want).max() > 1e-2
  np.testing.assert_allclose(replayed, want, atol=1e-5)
  with pytest.raises(ValueError, match="prefix_grouper"):
    training.completion_logprobs(
      update, seqs, 6, temperature=1.0, prefix_grouper=True
    )
