"""Prefix Grouper (arXiv 2506.05433): each group's prompt encoded once.

The grouped forward is checked against a float64 numpy transformer run on
each sample alone (prompt + completion, no padding), its parameter
gradients against the normal [P G, S + T] path and a numpy finite
difference, and two optimizer steps of the train update with the option on
against the same steps with it off.
"""

import dataclasses
import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import rljax
from rljax import algorithms
from rljax import sharding
from rljax import testing
from rljax.models import KVCache
from rljax.models import ModelConfig
from rljax.models import ValueModel
from rljax.models import grouped_completion_logprobs
from rljax.models import init_cache
from rljax.models import token_logprobs
from rljax.models._attention import attention
from rljax.training import Models
from rljax.training import Sequences
from rljax.training import UpdateSpec
from rljax.training import completion_logprobs
from rljax.training import update
from rljax.training._build import init_state

P, G, S, T = 3, 2, 5, 4
_CONFIG = ModelConfig(
  vocab_size=11,
  hidden_size=16,
  intermediate_size=24,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
  tie_embeddings=False,
  qkv_bias=True,
  rms_norm_eps=1e-5,
)


def _groups(seed=0, p=P, g=G, s=S, t=T, vocab=_CONFIG.vocab_size):
  """Prompts of different real lengths (left-padded; row 0 unpadded) and
  right-padded completions of different lengths."""
  rng = np.random.default_rng(seed)
  prompt_mask = (np.arange(s) >= np.arange(p)[:, None] % s).astype(np.int32)
  prompt = rng.integers(1, vocab, (p, s)) * prompt_mask
  lengths = rng.integers(1, t + 1, (p, g, 1))
  lengths[0, 0] = t  # one completion fills the width
  mask = (np.arange(t) < lengths).astype(np.int32)
  tokens = rng.integers(1, vocab, (p, g, t)) * mask
  return prompt, prompt_mask, tokens, mask


def _concatenated(prompt, prompt_mask, tokens, mask):
  """The normal path's [P G, S + T] rows."""
  p, g, t = tokens.shape
  cat = lambda a, b: np.concatenate(  # noqa: E731
    [np.repeat(a[:, None], g, 1), b], -1
  ).reshape(p * g, -1)
  return cat(prompt, tokens), cat(prompt_mask, mask)


_jit = testing.jit_model_fn
# Optimisation level 0: these tiny programs compile several times faster.
_FAST = {"xla_backend_optimization_level": 0}


@functools.cache
def _grouped_fn(schedule="dense", temperature=1.0):
  return _jit(
    functools.partial(
      grouped_completion_logprobs,
      schedule=schedule,
      temperature=temperature,
    )
  )


@functools.cache
def _normal_fn(schedule="dense", temperature=1.0):
  def run(model, tokens, mask):
    logp, entropy = token_logprobs(
      model, tokens, mask, schedule=schedule, temperature=temperature
    )
    return logp[:, -T:].reshape(-1, G, T), entropy[:, -T:].reshape(-1, G, T)

  return _jit(run)


# ---- an independent float64 numpy reference: one sample, no padding ----


def _np_weights(model):
  w = {k: np.asarray(v[...], np.float64) for k, v in vars(model.layers).items()
       if isinstance(v, nnx.Param)}  # fmt: skip
  w["embed"] = np.asarray(model.embed[...], np.float64)
  w["final_norm"] = np.asarray(model.final_norm[...], np.float64)
  w["lm_head"] = np.asarray(model.lm_head[...], np.float64)
  return w


def _np_rms(x, weight, eps):
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * weight


def _np_rope(x_SHK, theta):
  k = x_SHK.shape[-1]
  inv = 1.0 / theta ** (np.arange(0, k, 2) / k)
  angles = np.arange(x_SHK.shape[0])[:, None, None] * inv
  x1, x2 = x_SHK[..., : k // 2], x_SHK[..., k // 2 :]
  cos, sin = np.cos(angles), np.sin(angles)
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _np_forward(w, c, ids, temperature=1.0):
  """(logp, entropy) [n - 1] of tokens 1..n-1 of one unpadded sequence."""
  x, n = w["embed"][ids], len(ids)
  causal = np.tril(np.ones((n, n), bool))
  rep = c.num_heads // c.num_kv_heads
  for i in range(c.num_layers):
    h = _np_rms(x, w["attn_norm"][i], c.rms_norm_eps)
    q = np.einsum("sd,dhk->shk", h, w["q_proj"][i]) + w["q_bias"][i]
    k = np.einsum("sd,dnk->snk", h, w["k_proj"][i]) + w["k_bias"][i]
    v = np.einsum("sd,dnk->snk", h, w["v_proj"][i]) + w["v_bias"][i]
    q, k = _np_rope(q, c.rope_theta), _np_rope(k, c.rope_theta)
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    scores = np.einsum("shk,thk->hst", q, k) / np.sqrt(c.head_dim)
    scores = np.where(causal, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    attn = np.einsum("hst,thk->shk", probs, v)
    x = x + np.einsum("shk,hkd->sd", attn, w["o_proj"][i])
    h = _np_rms(x, w["mlp_norm"][i], c.rms_norm_eps)
    gate, up = h @ w["gate_proj"][i], h @ w["up_proj"][i]
    x = x + (gate / (1 + np.exp(-gate)) * up) @ w["down_proj"][i]
  x = _np_rms(x, w["final_norm"], c.rms_norm_eps)
  logits = x[:-1] @ w["lm_head"] / temperature
  top = logits.max(-1, keepdims=True)
  logz = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[:, 0]
  probs = np.exp(logits - logz[:, None])
  logp = logits[np.arange(n - 1), ids[1:]] - logz
  return logp, logz - np.sum(probs * logits, -1)


def _np_grouped(w, c, prompt, prompt_mask, tokens, mask, temperature=1.0):
  """Reference [P, G, T] log-probs and entropies, every sample alone."""
  logp, entropy = np.zeros(tokens.shape), np.zeros(tokens.shape)
  for p, g in np.ndindex(tokens.shape[:2]):
    real = mask[p, g] > 0
    ids = np.concatenate([prompt[p][prompt_mask[p] > 0], tokens[p, g][real]])
    lp, ent = _np_forward(w, c, ids, temperature)
    n = int(real.sum())
    logp[p, g, :n], entropy[p, g, :n] = lp[-n:], ent[-n:]
  return logp, entropy


def test_shared_part_attention_by_hand():
  # One head, K = 2, one prompt row shared by G = 2 query rows. The prompt
  # has a padding key (masked) and a real key kp = [1, 0], vp = [6, 0];
  # each row also attends to its own key [0, 1].
  # Row 0: q = [sqrt(2) ln 3, 0] -> scores (ln 3, 0) after 1/sqrt(2);
  #   softmax (3/4, 1/4); out = 3/4 [6, 0] + 1/4 [0, 0] = [4.5, 0].
  # Row 1: q = 0 -> scores (0, 0); softmax (1/2, 1/2), own value [3, 3];
  #   out = 1/2 [6, 0] + 1/2 [3, 3] = [4.5, 1.5].
  q = jnp.array([[np.sqrt(2) * np.log(3), 0.0], [0.0, 0.0]])[:, None, None]
  prompt_k = jnp.array([[[9.0, 9.0], [1.0, 0.0]]])[:, :, None]  # [1, 2, 1, 2]
  prompt_v = jnp.array([[[5.0, 5.0], [6.0, 0.0]]])[:, :, None]
  own_k = jnp.array([[0.0, 1.0], [0.0, 1.0]])[:, None, None]  # [2, 1, 1, 2]
  own_v = jnp.array([[0.0, 0.0], [3.0, 3.0]])[:, None, None]
  allowed = jnp.array([[[False, True, True]]] * 2)  # [B, S, 2 + 1]
  out = jax.jit(attention)(q, (prompt_k, own_k), (prompt_v, own_v), allowed)
  np.testing.assert_allclose(
    out[:, 0, 0], [[4.5, 0.0], [4.5, 1.5]], rtol=1e-6, atol=1e-6
  )


@pytest.mark.parametrize(
  "schedule,temperature", [("dense", 1.0), ("auto", 0.7)]
)
def test_logprobs_match_numpy_reference_per_sample(schedule, temperature):
  model = testing.random_model(_CONFIG)
  prompt, prompt_mask, tokens, mask = _groups()
  logp, entropy = _grouped_fn(schedule, temperature)(
    model, prompt, prompt_mask, tokens, mask
  )
  want_logp, want_entropy = _np_grouped(
    _np_weights(model), _CONFIG, prompt, prompt_mask, tokens, mask, temperature
  )
  assert logp.shape == entropy.shape == (P, G, T)
  assert logp.dtype == entropy.dtype == jnp.float32
  np.testing.assert_allclose(logp, want_logp, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(entropy, want_entropy, rtol=1e-4, atol=1e-4)
  assert np.all(np.asarray(logp)[mask == 0] == 0)  # padding gets 0
  # The first completion token is predicted from the prompt's last token:
  # a wrong predecessor (e.g. the completion's own first token) fails.
  assert np.abs(want_logp[..., 0]).min() > 1e-3


def test_logprobs_equal_the_concatenated_rows():
  model = testing.random_model(_CONFIG, seed=3)
  prompt, prompt_mask, tokens, mask = _groups(seed=1)
  got = _grouped_fn("auto")(model, prompt, prompt_mask, tokens, mask)
  want = _normal_fn("auto")(
    model, *_concatenated(prompt, prompt_mask, tokens, mask)
  )
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _loss_grads(config, grouped, seed=0, schedule="auto"):
  """d/dparams of sum(u logp + v entropy): grouped or normal path."""
  model = testing.random_model(config, seed=4)
  prompt, prompt_mask, tokens, mask = _groups(seed=seed)
  rng = np.random.default_rng(seed + 10)
  u, v = rng.normal(size=(2, P, G, T)).astype(np.float32)
  cat_tokens, cat_mask = _concatenated(prompt, prompt_mask, tokens, mask)
  graph, params = nnx.split(model)

  def loss(params):
    m = nnx.merge(graph, params)
    if grouped:
      logp, ent = grouped_completion_logprobs(
        m, prompt, prompt_mask, tokens, mask, schedule=schedule
      )
    else:
      logp, ent = token_logprobs(m, cat_tokens, cat_mask, schedule=schedule)
      logp, ent = (x[:, -T:].reshape(P, G, T) for x in (logp, ent))
    return jnp.sum(u * logp) + jnp.sum(v * ent)

  return jax.jit(jax.value_and_grad(loss), compiler_options=_FAST)(params)


def _assert_trees_close(a, b, rtol, atol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(
      np.asarray(x, np.float32), np.asarray(y, np.float32), rtol, atol
    )


def test_gradients_equal_the_normal_path_float32():
  value, grads = _loss_grads(_CONFIG, grouped=True)
  want_value, want_grads = _loss_grads(_CONFIG, grouped=False)
  np.testing.assert_allclose(value, want_value, rtol=1e-5)
  _assert_trees_close(grads, want_grads, rtol=1e-4, atol=2e-5)
  # Every parameter gets a gradient (the prompt's path included).
  assert all(np.abs(np.asarray(g)).max() > 1e-4 for g in jax.tree.leaves(grads))


@pytest.mark.slow  # default-run time; run with -m slow
def test_gradients_equal_the_normal_path_bfloat16():
  # bfloat16 compute (8-bit mantissa): the two paths round differently
  # (the prompt's gradient is summed over G in another order), so the
  # tolerance is bfloat16's: 3e-2 of the gradient's scale.
  config = dataclasses.replace(_CONFIG, dtype="bfloat16")
  value, grads = _loss_grads(config, grouped=True)
  want_value, want_grads = _loss_grads(config, grouped=False)
  np.testing.assert_allclose(value, want_value, rtol=3e-2)
  for x, y in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    scale = np.abs(np.asarray(y, np.float32)).max()
    np.testing.assert_allclose(x, y, rtol=0, atol=3e-2 * scale)


def test_gradient_matches_numpy_finite_difference():
  # Directional derivative along a random direction d of all parameters:
  # jax.grad . d against (f(w + e d) - f(w - e d)) / 2e in float64 numpy.
  model = testing.random_model(_CONFIG, seed=5)
  prompt, prompt_mask, tokens, mask = _groups(seed=2)
  u = np.random.default_rng(7).normal(size=(P, G, T))
  graph, params = nnx.split(model)

  def f(params):
    m = nnx.merge(graph, params)
    logp, _ = grouped_completion_logprobs(m, prompt, prompt_mask, tokens, mask)
    return jnp.sum(jnp.asarray(u, jnp.float32) * logp)

  grads = jax.jit(jax.grad(f), compiler_options=_FAST)(params)
  rng = np.random.default_rng(8)
  direction = jax.tree.map(lambda x: rng.normal(size=x.shape), params)
  analytic = sum(
    float(np.sum(np.asarray(g, np.float64) * d))
    for g, d in zip(jax.tree.leaves(grads), jax.tree.leaves(direction))
  )

  def np_f(sign, eps=1e-5):
    moved = jax.tree.map(
      lambda x, d: np.asarray(x, np.float64) + sign * eps * d,
      params,
      direction,
    )
    w = _np_weights(nnx.merge(graph, moved))
    logp, _ = _np_grouped(w, _CONFIG, prompt, prompt_mask, tokens, mask)
    return np.sum(u * logp)

  numeric = (np_f(1) - np_f(-1)) / 2e-5
  np.testing.assert_allclose(analytic, numeric, rtol=2e-3)


def test_bad_inputs_raise():
  model = testing.random_model(_CONFIG)
  prompt, prompt_mask, tokens, mask = _groups()
  with pytest.raises(ValueError, match="tokens_PGT has shape"):
    grouped_completion_logprobs(
      model, prompt[:2], prompt_mask[:2], tokens, mask
    )
  with pytest.raises(ValueError, match="shapes must match"):
    grouped_completion_logprobs(
      model, prompt, prompt_mask, tokens, mask[..., 1:]
    )
  prefix = init_cache(_CONFIG, 2, S)
  x = jnp.zeros((3, T), jnp.int32)
  with pytest.raises(ValueError, match="not a multiple of the prefix's 2"):
    model.hidden_states(x, prefix=prefix)
  with pytest.raises(ValueError, match="not both"):
    model.hidden_states(x, cache=init_cache(_CONFIG, 3, T), prefix=prefix)
  with pytest.raises(ValueError, match="must be a KVCache"):
    model.hidden_states(x, prefix=tuple(prefix))
  assert isinstance(prefix, KVCache)


# ---- the train step: Sequences with shared prompts, option on vs off ----


def _sequences(seed=0, p=8):
  prompt, prompt_mask, tokens, mask = _groups(seed, p=p)
  cat_tokens, cat_mask = _concatenated(prompt, prompt_mask, tokens, mask)
  shape = (p, G, S + T)
  seqs = Sequences(
    jnp.asarray(cat_tokens.reshape(shape), jnp.int32),
    jnp.asarray(cat_mask.reshape(shape), jnp.int32),
  )
  return seqs, mask


def test_completion_logprobs_option_and_differing_prompts():
  model = testing.random_model(_CONFIG)
  seqs, _ = _sequences(p=P)
  kw = dict(temperature=1.0, schedule="dense")
  grouped = _jit(
    lambda m, s: completion_logprobs(m, s, T, prefix_grouper=True, **kw)
  )
  normal = _jit(lambda m, s: completion_logprobs(m, s, T, **kw))
  for a, b in zip(grouped(model, seqs), normal(model, seqs)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  # Sample (1, 1) gets another prompt token, or another prompt padding: a
  # ValueError (eager), a runtime error with the same message (jitted).
  tokens, mask = seqs.tokens_PGL, seqs.mask_PGL
  for other in (
    seqs._replace(tokens_PGL=tokens.at[1, 1, S - 1].add(1)),
    seqs._replace(mask_PGL=mask.at[0, 1, 0].set(0)),
  ):
    with pytest.raises(ValueError, match="different prompt tokens"):
      completion_logprobs(model, other, T, prefix_grouper=True, **kw)
    with pytest.raises(Exception, match="different prompt tokens"):
      jax.block_until_ready(grouped(model, other))


# One layer, sizes that split over a (2, 2, 2) mesh.
_STEP_CONFIG = dataclasses.replace(
  _CONFIG, vocab_size=16, num_layers=1, head_dim=4, intermediate_size=32
)


def _run_update(spec, name, mesh=None):
  p = 4
  mesh = mesh or sharding.make_mesh(devices=jax.devices()[:1])
  algorithm = algorithms.get(name)
  if name == "grpo":  # an entropy term in the loss: entropies must match too
    algorithm = rljax.Algorithm(
      rljax.chain(
        algorithm.transform, rljax.objectives.entropy_bonus(coef=0.1)
      ),
      algorithm.aggregate,
    )
  critic = name == "ppo"
  model = testing.random_model(_STEP_CONFIG, seed=1)
  value = testing.random_model(_STEP_CONFIG, seed=2, cls=ValueModel)
  models = Models(
    nnx.graphdef(model),
    nnx.graphdef(value) if critic else None,
    optax.adam(1e-2),
    optax.adam(1e-2) if critic else None,
  )
  state, _ = init_state(
    model,
    reference=False,
    critic=value if critic else None,
    models=models,
    algorithm=algorithm,
    mesh=mesh,
  )
  seqs, mask = _sequences(p=p)
  batch = testing.random_batch(0, prompts=p, samples=G, tokens=T)
  batch = batch._replace(
    mask_PGT=mask.astype(np.float32), old_logp_PGT=None, ref_logp_PGT=None
  )
  batch, _ = algorithm.prepare(batch, state.policy.algo_state)
  put = lambda x: jax.device_put(  # noqa: E731
    jnp.asarray(x), sharding.batch_sharding(mesh, np.ndim(x))
  )
  seqs, batch = jax.tree.map(put, (seqs, batch))
  step = jax.jit(
    functools.partial(update, models, algorithm, spec),
    compiler_options={"xla_backend_optimization_level": 0},
  )
  # Two steps of one compiled update: the second from the moved weights.
  state, first = step(state, seqs, batch, jax.random.key(0))
  state, second = step(state, seqs, batch, jax.random.key(1))
  return state, (first, second)


@pytest.mark.parametrize(
  "name,mesh_sizes",
  [
    # (12 s on 2 cores: the float32 gradient test covers the default run)
    pytest.param("grpo", None, marks=pytest.mark.slow),
    pytest.param("ppo", None, marks=pytest.mark.slow),
    pytest.param("grpo", (2, 2, 2), marks=pytest.mark.slow),
  ],
)
def test_two_update_steps_equal_with_and_without_the_option(name, mesh_sizes):
  # Two Adam steps of the train update (grpo with an entropy bonus, or ppo
  # with its critic), on one device or sharded over (data, fsdp, tensor).
  spec = UpdateSpec(T)
  mesh = sharding.make_mesh(*mesh_sizes) if mesh_sizes else None
  want, want_metrics = _run_update(spec, name, mesh)
  got, got_metrics = _run_update(spec._replace(prefix_grouper=True), name, mesh)
  assert int(got.policy.step) == 2
  for got_m, want_m in zip(got_metrics, want_metrics):
    assert "entropy" in want_m
    for key in ("loss", "entropy"):
      np.testing.assert_allclose(got_m[key].value, want_m[key].value, rtol=1e-5)
  _assert_trees_close(got.policy.params, want.policy.params, 1e-4, 1e-5)
  moved = max(
    float(np.abs(np.asarray(a) - np.asarray(b)).max())
    for a, b in zip(
      jax.tree.leaves(got.policy.params),
      jax.tree.leaves(nnx.state(testing.random_model(_STEP_CONFIG, seed=1))),
    )
  )
  assert moved > 1e-3  # the policy really moved
  if name == "ppo":
    _assert_trees_close(got.value.params, want.value.params, 1e-4, 1e-5)


@pytest.mark.slow  # two short trainer runs
def test_trainer_with_prefix_grouper_equals_without(tmp_path):
  import pathlib

  from rljax.training import Trainer

  config = pathlib.Path(__file__).resolve().parents[2] / "configs" / "grpo.py"
  runs = {}
  for on in (False, True):
    trainer = Trainer(
      testing.tiny_run_config(
        config,
        tmp_path / str(on),
        "train.steps=2",
        f"model.prefix_grouper={on}",
      )
    )
    runs[on] = (trainer.run()["history"], trainer.state.policy.params)
  for a, b in zip(runs[False][0], runs[True][0]):
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-4, atol=1e-6)
  for a, b in zip(
    jax.tree.leaves(runs[False][1]), jax.tree.leaves(runs[True][1])
  ):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
