"""The jitted update: exact gradient accumulation, epochs and minibatches,
and sharded steps equal to the single-device step."""

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
from rljax.models import ModelConfig
from rljax.models import ValueModel
from rljax.training import Models
from rljax.training import Sequences
from rljax.training import UpdateSpec
from rljax.training import update
from rljax.training._build import init_state

P, G, S, T = 8, 2, 3, 4
_CONFIG = ModelConfig(
  vocab_size=16,
  hidden_size=16,
  intermediate_size=32,
  num_layers=1,
  num_heads=4,
  num_kv_heads=4,
  head_dim=4,
  max_position_embeddings=16,
)


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, _CONFIG.vocab_size, (P, G, S + T)).astype(np.int32)
  mask = np.ones((P, G, S + T), np.int32)
  mask[::2, :, 0] = 0  # left padding on some prompts
  mask[..., S:] = (np.arange(T) < rng.integers(1, T + 1, (P, G, 1))).astype(
    np.int32
  )
  batch = testing.random_batch(seed, prompts=P, samples=G, tokens=T)
  batch = batch._replace(
    mask_PGT=mask[..., S:].astype(np.float32),
    old_logp_PGT=None,
    ref_logp_PGT=None,
  )
  return Sequences(tokens * mask, mask), batch


def _state(mesh, algorithm, optimizer, critic=False):
  model = testing.random_model(_CONFIG, seed=1)
  value = testing.random_model(_CONFIG, seed=2, cls=ValueModel)
  models = Models(
    nnx.graphdef(model),
    nnx.graphdef(value) if critic else None,
    optimizer,
    optimizer if critic else None,
  )
  state, _ = init_state(
    model,
    reference=False,
    critic=value if critic else None,
    models=models,
    algorithm=algorithm,
    mesh=mesh,
  )
  return models, state


def _run(spec, mesh=None, name="grpo", algorithm=None):
  mesh = mesh or sharding.make_mesh(devices=jax.devices()[:1])
  algorithm = algorithm or algorithms.get(name)
  critic = name == "ppo"
  models, state = _state(mesh, algorithm, optax.sgd(0.1), critic=critic)
  seqs, batch = _inputs()
  batch, _ = algorithm.prepare(batch, state.policy.algo_state)
  put = lambda x: jax.device_put(  # noqa: E731
    jnp.asarray(x), sharding.batch_sharding(mesh, np.ndim(x))
  )
  seqs, batch = jax.tree.map(put, (seqs, batch))
  # Optimisation level 0: these tiny programs compile several times faster.
  step = jax.jit(
    functools.partial(update, models, algorithm, spec),
    compiler_options={"xla_backend_optimization_level": 0},
  )
  return step(state, seqs, batch, jax.random.key(0))


def _close(a, b, tol=1e-5):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "ppo"])
def test_microbatches_give_the_whole_minibatch_gradient(name):
  # grpo (seq-mean-token-mean) and dr_grpo (constant normaliser) both
  # accumulate exactly: sum of numerator gradients over summed denominators.
  # ppo's critic (token-mean value loss) accumulates the same way.
  whole, metrics = _run(UpdateSpec(T), name=name)
  split, split_metrics = _run(UpdateSpec(T, microbatches=4), name=name)
  _close(whole.policy.params, split.policy.params)
  _close(metrics["loss"].value, split_metrics["loss"].value)
  assert int(split.policy.step) == 1
  if name == "ppo":
    before = _state(
      sharding.make_mesh(devices=jax.devices()[:1]),
      algorithms.get(name),
      optax.sgd(0.1),
      critic=True,
    )[1]
    moved = jax.tree.leaves(
      jax.tree.map(
        lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(),
        before.value.params,
        whole.value.params,
      )
    )
    assert max(moved) > 1e-4  # the critic really trained
    _close(whole.value.params, split.value.params)
    _close(metrics["value_loss"].value, split_metrics["value_loss"].value)


def test_on_policy_ratio_is_exactly_one():
  _, metrics = _run(UpdateSpec(T))
  assert float(metrics["ratio_mean"].value) == 1.0
  assert float(metrics["kl_old"].value) == 0.0


def test_epochs_and_minibatches_count_optimizer_steps():
  state, metrics = _run(UpdateSpec(T, epochs=2, minibatches=2))
  assert int(state.policy.step) == 4
  # The first minibatch step is on-policy (ratio 1); later ones are not,
  # because each minibatch's old log-probs are its own sg(logp) here.
  assert np.isfinite(float(metrics["loss"].value))


@pytest.mark.parametrize("mesh_sizes", [(8, 1, 1), (1, 2, 4)])
def test_sharded_step_equals_single_device(mesh_sizes):
  want, want_metrics = _run(UpdateSpec(T))
  mesh = sharding.make_mesh(*mesh_sizes)
  got, got_metrics = _run(UpdateSpec(T), mesh=mesh)
  q = got.policy.params["layers"]["q_proj"]
  assert q[...].sharding.mesh.shape == mesh.shape
  _close(want.policy.params, got.policy.params)
  _close(want_metrics["loss"].value, got_metrics["loss"].value)


def _entropy_weighted():
  """grpo plus a stage whose loss weight is the minibatch's mean entropy,
  measured before each optimizer step (measure/observe)."""

  def measure(terms, batch, state):
    del state
    return {"h": rljax.mean_metric(terms.entropy_PGT, batch.loss_mask())}

  def observe(state, stats):
    return {"h": stats["h"], "steps": state["steps"] + 1}

  def apply(terms, batch, state):
    return terms._replace(
      penalty_PGT=terms.penalty_PGT + state["h"] * terms.logp_PGT
    )

  stage = rljax.Transform(
    init=lambda: {"h": jnp.zeros(()), "steps": jnp.zeros((), jnp.int32)},
    prepare=lambda batch, state: (batch, state),
    apply=apply,
    measure=measure,
    observe=observe,
  )
  return rljax.Algorithm(
    rljax.chain(algorithms.grpo().transform, stage),
    rljax.aggregate.token_mean,
  )


@pytest.mark.parametrize(
  "micro,mesh_sizes", [(4, None), (1, (8, 1, 1)), (2, (2, 2, 2))]
)
def test_measured_statistics_are_the_whole_minibatch(micro, mesh_sizes):
  algorithm = _entropy_weighted()
  spec = UpdateSpec(T, epochs=2, minibatches=2)
  want, want_metrics = _run(spec, algorithm=algorithm)
  mesh = sharding.make_mesh(*mesh_sizes) if mesh_sizes else None
  got, got_metrics = _run(
    spec._replace(microbatches=micro), mesh=mesh, algorithm=algorithm
  )
  # observe ran once per optimizer step, and the stored entropy (of the
  # last minibatch, at the parameters before the last step) is positive.
  assert int(want.policy.algo_state[1]["steps"]) == 4
  assert float(want.policy.algo_state[1]["h"]) > 0.1
  _close(want.policy.algo_state, got.policy.algo_state)
  _close(want.policy.params, got.policy.params)
  _close(want_metrics["loss"].value, got_metrics["loss"].value)
