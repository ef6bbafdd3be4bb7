"""Packed RL updates (`rljax.training.Packing`): the plan against a
hand-worked layout, and packed against padded log-probs, values, gradients
and updates (micro-batches, 8 devices, every preset of the conformance
suite, a trainer run).

Tolerance: a packed row holds other samples' keys (masked out) and other
shapes than the padded rows, so softmax and matmul sums run in another
order; float32 rounding then differs by ~1e-7 per operation, ~1e-6 after
two optimizer steps, inside the 1e-5 the update's other equality tests
(micro-batches, sharding) use, relative to the largest weight: DisCO's
steps grow weights to ~200, and its padded update split into two
micro-batches instead of one moves them by 1.1e-4, as packing does.
"""

import dataclasses
import functools
import pathlib

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
from rljax._src.errors import UserError
from rljax.models import ModelConfig
from rljax.models import ValueModel
from rljax.training import Models
from rljax.training import Sequences
from rljax.training import Trainer
from rljax.training import UpdateSpec
from rljax.training import _packing
from rljax.training import pack_plan
from rljax.training import update
from rljax.training import validate
from rljax.training._build import init_state
from rljax.training._step import completion_logprobs
from rljax.training._step import completion_values

_CONFIG = ModelConfig(
  vocab_size=16,
  hidden_size=16,
  intermediate_size=32,
  num_layers=1,
  num_heads=4,
  num_kv_heads=4,
  head_dim=4,
  max_position_embeddings=32,
)
S = 4


def _close(a, b, tol=1e-5):
  """Leaf by leaf within `tol`, relative to the tree's largest magnitude
  (a preset whose steps grow the weights to ~200, DisCO's, moves float32
  rounding up with them)."""
  scale = max(
    [1.0] + [float(np.abs(np.asarray(y)).max()) for y in jax.tree.leaves(b)]
  )
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(
      np.asarray(x), np.asarray(y), rtol=tol, atol=tol * scale
    )


# --- the plan -----------------------------------------------------------------


def test_spans_are_the_first_and_last_attended_columns():
  mask = np.array(
    [[[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]]]
  )
  np.testing.assert_array_equal(
    _packing.spans(mask), [[[1, 5], [0, 0], [0, 6]]]
  )


def test_the_plan_is_the_hand_worked_layout():
  # Two prompts x two samples of L = 6 columns, T = 3: sample spans of 4,
  # 2, 3 and 5 tokens. First fit, longest first, in rows of 6: [5] then
  # [4, 2] then [3]; one shard, so R = 3 rows.
  spans = np.array([[[2, 6], [2, 4]], [[1, 4], [0, 5]]])
  plan = pack_plan(spans, length=6, completion_width=3)
  source, segment, back = (
    plan.source_KRC[0],
    plan.segment_KRC[0],
    plan.back_KNT[0],
  )
  np.testing.assert_array_equal(
    segment, [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 2, 2], [1, 1, 1, 0, 0, 0]]
  )
  # Sample 3 (row 0) is columns 0..4 of flat row 3; sample 0 (row 1) is
  # columns 2..5 of row 0, then sample 1's columns 2, 3; sample 2's 1..3.
  np.testing.assert_array_equal(source[0, :5], 3 * 6 + np.arange(0, 5))
  np.testing.assert_array_equal(source[1], [2, 3, 4, 5, 8, 9])
  np.testing.assert_array_equal(source[2, :3], 2 * 6 + np.arange(1, 4))
  # Columns 2..5 (L - T - 1 ... L - 1) of each sample in the [R * C]
  # packed outputs, 18 outside its span.
  none = 3 * 6
  np.testing.assert_array_equal(
    back,
    [
      [6, 7, 8, 9],  # sample 0: row 1, slots 0..3
      [10, 11, none, none],  # sample 1: row 1, slots 4, 5
      [13, 14, none, none],  # sample 2: row 2, columns 2, 3 -> slots 1, 2
      [2, 3, 4, none],  # sample 3: row 0, columns 2..4
    ],
  )
  mask = (np.arange(6) >= spans[..., :1]) & (np.arange(6) < spans[..., 1:])
  assert _packing.padding_fraction(plan, mask) == pytest.approx(1 - 14 / 18)


def test_units_split_by_prompts_and_shards_pack_apart():
  rng = np.random.default_rng(0)
  first = rng.integers(0, 4, (8, 3))
  spans = np.stack([first, first + rng.integers(1, 9, (8, 3))], -1)
  plan = pack_plan(spans, length=12, completion_width=6, units=2, shards=2)
  k, rows, c = plan.source_KRC.shape
  assert (k, c) == (2, 12) and rows % 2 == 0
  for u in range(2):
    # Each shard's rows hold its own block of the unit's 12 samples.
    for d in range(2):
      block = plan.source_KRC[u, d * rows // 2 : (d + 1) * rows // 2]
      seg = plan.segment_KRC[u, d * rows // 2 : (d + 1) * rows // 2]
      samples = set((block[seg > 0] // 12).tolist())
      assert samples == set(range(d * 6, (d + 1) * 6))
  merged = plan.merged()
  assert merged.source_KRC.shape == (1, 2 * rows, 12)
  tokens = np.arange(8 * 3 * 12).reshape(8 * 3, 12)
  by_unit = np.concatenate(
    [
      np.asarray(
        _packing.gather_rows(tokens[u * 12 : (u + 1) * 12], plan.unit(u))
      )
      for u in range(2)
    ]
  )
  np.testing.assert_array_equal(
    np.asarray(_packing.gather_rows(tokens, merged.unit(0))), by_unit
  )


def test_row_counts_round_to_eight_sizes_per_power_of_two():
  assert [_packing.bucket(n) for n in (1, 7, 16, 17, 19, 33, 100)] == [
    1,
    7,
    16,
    18,
    20,
    36,
    104,
  ]


def test_the_budget_picks_the_fewest_microbatches_that_fit():
  # 4 prompts x 2 samples of 8 tokens in rows of 8: one sample a row.
  spans = np.tile([[0, 8]], (4, 2, 1))
  choose = functools.partial(
    _packing.choose_microbatches, spans, minibatches=1, length=8, shards=1
  )
  assert choose(budget=64) == 1  # 8 rows
  assert choose(budget=32) == 2  # 4 rows each
  assert choose(budget=16) == 4
  assert choose(budget=64, least=2) == 2
  with pytest.raises(ValueError, match=r"max_tokens_per_microbatch=8 .*16"):
    choose(budget=8)


# --- packed against padded ------------------------------------------------------


def _sequences(p=4, g=3, t=8, seed=0):
  """Left-padded prompts and right-padded completions of random lengths,
  one with a hole (an unattended token inside its span), padding holding
  junk token ids."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, _CONFIG.vocab_size, (p, g, S + t)).astype(np.int32)
  mask = np.zeros((p, g, S + t), np.int32)
  pad = rng.integers(0, S - 1, (p, 1))
  mask[..., :S] = np.arange(S) >= pad[..., None]
  lengths = rng.integers(1, t + 1, (p, g))
  lengths[0, 0] = t  # one full row
  mask[..., S:] = np.arange(t) < lengths[..., None]
  mask[1, 0, S + 1] = 0 if lengths[1, 0] > 2 else 1
  return Sequences(tokens, mask)


def test_packed_logprobs_values_and_gradients_equal_padded():
  model = testing.random_model(_CONFIG, seed=1)
  graphdef, params = nnx.split(model)
  seqs = _sequences()
  t = seqs.tokens_PGL.shape[-1] - S
  plan = pack_plan(
    _packing.spans(seqs.mask_PGL), length=S + t, completion_width=t
  )
  assert plan.computed_tokens() < seqs.mask_PGL.size
  weight = np.random.default_rng(1).normal(size=seqs.mask_PGL[..., S:].shape)
  comp = np.asarray(seqs.mask_PGL[..., S:], np.float32)

  @functools.partial(jax.jit, static_argnums=2)
  def run(params, seqs, packed):
    def total(params):
      logp, entropy = completion_logprobs(
        nnx.merge(graphdef, params),
        seqs,
        t,
        temperature=0.7,
        packing=plan.unit(0) if packed else None,
      )
      return jnp.sum((logp + 0.5 * entropy) * weight * comp), (logp, entropy)

    return jax.value_and_grad(total, has_aux=True)(params)

  (v0, (logp0, ent0)), g0 = run(params, seqs, False)
  (v1, (logp1, ent1)), g1 = run(params, seqs, True)
  _close(logp1 * comp, logp0 * comp, 1e-5)
  _close(ent1 * comp, ent0 * comp, 1e-5)
  _close(v1, v0, 1e-5)
  _close(g1, g0, 1e-5)
  assert np.any(np.asarray(logp0) != 0)
  # Outside the completions both give 0.
  assert np.all(np.asarray(logp1)[comp == 0] == 0)

  critic = testing.random_model(_CONFIG, seed=2, cls=ValueModel)
  # The value before each completion token (its predictor is real).
  before = np.asarray(seqs.mask_PGL[..., S - 1 : -1], np.float32) * comp
  _close(
    completion_values(critic, seqs, t, plan.unit(0)) * before,
    completion_values(critic, seqs, t) * before,
  )


def _state(mesh, algorithm, critic):
  model = testing.random_model(_CONFIG, seed=1)
  value = testing.random_model(_CONFIG, seed=2, cls=ValueModel)
  models = Models(
    nnx.graphdef(model),
    nnx.graphdef(value) if critic else None,
    optax.sgd(0.1),
    optax.sgd(0.1) if critic else None,
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


def _update(name, spec, seqs, batch, *, packed, mesh_sizes=None, kwargs=None):
  """Two optimizer steps (spec) of preset `name`, padded or packed."""
  devices = jax.devices()[: np.prod(mesh_sizes) if mesh_sizes else 1]
  mesh = sharding.make_mesh(*(mesh_sizes or (1, 1, 1)), devices=devices)
  algorithm = algorithms.get(name, **(kwargs or {}))
  models, state = _state(mesh, algorithm, critic=name == "ppo")
  batch = _rescored(algorithm, batch)
  batch, algo_state = algorithm.prepare(
    batch, state.policy.algo_state, key=jax.random.key(0)
  )
  state = state._replace(policy=state.policy._replace(algo_state=algo_state))
  packing = None
  if packed:
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    packing = pack_plan(
      _packing.spans(seqs.mask_PGL),
      length=seqs.mask_PGL.shape[-1],
      completion_width=spec.completion_width,
      units=spec.minibatches * spec.microbatches,
      shards=shards,
    )
  put = lambda x: jax.device_put(  # noqa: E731
    jnp.asarray(x), sharding.batch_sharding(mesh, np.ndim(x))
  )
  seqs, batch = jax.tree.map(put, (seqs, batch))
  step = sharding.InMesh(
    mesh,
    jax.jit(
      functools.partial(update, models, algorithm, spec),
      compiler_options={"xla_backend_optimization_level": 0},
    ),
  )
  return step(state, seqs, batch, jax.random.key(0), packing)


def _rescored(algorithm, batch):
  """The stages' own passes (`rljax.Rescore`), as stand-ins near the old
  log-probs (the update reads them as batch side data)."""
  old = np.asarray(batch.old_logp_PGT, np.float32)
  return batch.with_extra(
    **{
      r.name: {
        "completion": old * 1.1,
        "prompt": old[:, 0, 0],
        "gradient": old[..., 0] ** 2 + 1.0,
      }[r.span]
      for r in algorithm.rescores
    }
  )


def _batch_for(seqs, seed=0, extra=None):
  p, g, length = seqs.tokens_PGL.shape
  t = length - S
  batch = testing.random_batch(seed, prompts=p, samples=g, tokens=t)
  batch = batch._replace(
    mask_PGT=np.asarray(seqs.mask_PGL[..., S:], np.float32),
    tokens_PGT=np.asarray(seqs.tokens_PGL[..., S:]),
  )
  return batch.with_extra(**(extra or {}))


def _compare(name, spec, seqs, batch, **kw):
  want, want_metrics = _update(name, spec, seqs, batch, packed=False, **kw)
  got, got_metrics = _update(name, spec, seqs, batch, packed=True, **kw)
  _close(got.policy.params, want.policy.params)
  _close(got.policy.algo_state, want.policy.algo_state)
  if want.value is not None:
    _close(got.value.params, want.value.params)
  for key in want_metrics:
    _close(got_metrics[key].value, want_metrics[key].value)
  initial = testing.random_model(_CONFIG, seed=1)
  moved = max(
    float(np.abs(np.asarray(a) - np.asarray(b)).max())
    for a, b in zip(
      jax.tree.leaves(want.policy.params),
      jax.tree.leaves(nnx.state(initial)),
    )
  )
  assert moved > 1e-4  # the policy really trained


@pytest.mark.parametrize(
  "name,micro,mesh_sizes",
  [
    ("grpo", 2, None),
    # The critic's packed values: slow (the trainer's PPO run checks them).
    pytest.param("ppo", 2, None, marks=pytest.mark.slow),
    ("dr_grpo", 1, (8, 1, 1)),
  ],
)
def test_packed_updates_equal_padded(name, micro, mesh_sizes):
  # Two minibatches (two optimizer steps), micro-batches or 8 devices.
  seqs = _sequences(p=8, g=2)
  spec = UpdateSpec(8, minibatches=2, microbatches=micro)
  _compare(name, spec, seqs, _batch_for(seqs), mesh_sizes=mesh_sizes)


def test_mixture_of_experts_replays_its_routing_packed():
  config = dataclasses.replace(
    _CONFIG, num_experts=4, experts_per_token=2, expert_intermediate_size=8
  )
  model = testing.random_model(config, seed=1)
  graphdef, params = nnx.split(model)
  seqs = _sequences(p=2, g=2, t=6)
  p, g, length = seqs.tokens_PGL.shape
  rng = np.random.default_rng(3)
  routing = np.argsort(rng.random((p, g, 1, length, 4)), -1)[..., :2]
  seqs = seqs._replace(routing_PGYLK=routing.astype(np.int32))
  plan = pack_plan(
    _packing.spans(seqs.mask_PGL), length=length, completion_width=6
  )
  comp = np.asarray(seqs.mask_PGL[..., S:], np.float32)
  flat_mask = np.asarray(seqs.mask_PGL).reshape(p * g, length)

  @functools.partial(jax.jit, static_argnums=1)
  def run(params, packed):
    unit = plan.unit(0) if packed else None

    def total(params):
      logp, _, routed = completion_logprobs(
        nnx.merge(graphdef, params),
        seqs,
        6,
        temperature=1.0,
        return_routing=True,
        packing=unit,
      )
      mask = (
        flat_mask if unit is None else _packing.gather_rows(flat_mask, unit)
      )
      aux = rljax.models.load_balancing_loss(
        routed.logits, routed.experts, mask
      )
      return jnp.sum(logp * comp) + aux, aux

    return jax.value_and_grad(total, has_aux=True)(params)

  (v0, aux0), g0 = run(params, False)
  (v1, aux1), g1 = run(params, True)
  assert float(aux0) > 0
  _close(aux1, aux0)
  _close(v1, v0)
  _close(g1, g0)


@pytest.mark.slow  # every preset: 69 x two compiles
@pytest.mark.parametrize("name", sorted(rljax.algorithms.PRESETS))
def test_every_preset_updates_alike_packed_and_padded(name):
  # The conformance suite's batch (its side data for every preset), two
  # minibatches of two micro-batches: four optimizer steps' worth of loss.
  batch = testing.preset_batch(0, prompts=4)
  p, g, t = batch.shape
  rng = np.random.default_rng(1)
  prompt = rng.integers(1, _CONFIG.vocab_size, (p, g, S)).astype(np.int32)
  prompt_mask = np.broadcast_to(
    np.arange(S) >= rng.integers(0, S - 1, (p, 1, 1)), prompt.shape
  )
  seqs = Sequences(
    np.concatenate([prompt, np.asarray(batch.tokens_PGT, np.int32)], -1),
    np.concatenate([prompt_mask, np.asarray(batch.mask_PGT) > 0], -1).astype(
      np.int32
    ),
  )
  spec = UpdateSpec(t, minibatches=2, microbatches=2)
  _compare(
    name,
    spec,
    seqs,
    batch,
    kwargs=testing.PRESET_KWARGS.get(name),
  )


def test_packing_refuses_prefix_grouper_and_other_run_kinds(tmp_path):
  path = pathlib.Path(__file__).parents[2] / "configs"
  config = testing.tiny_run_config(
    path / "grpo.py",
    tmp_path,
    "train.max_tokens_per_microbatch=256",
    "model.prefix_grouper=True",
  )
  with pytest.raises(UserError, match="shares each group's padded prompt"):
    validate(config)
  config = testing.tiny_run_config(
    path / "sft.py", tmp_path, "train.max_tokens_per_microbatch=256"
  )
  with pytest.raises(UserError, match="packs RL updates; a sft run"):
    validate(config)


@pytest.mark.slow  # two tiny PPO runs: ~35 s
def test_a_packed_run_trains_as_the_padded_one(tmp_path):
  # PPO (a critic, its values read back from packed rows), two epochs of
  # two minibatches, completions of up to 24 tokens with a reward that
  # moves the policy (the repetition penalty): the same metrics and
  # weights, over fewer computed tokens.
  path = pathlib.Path(__file__).parents[2] / "configs" / "ppo.py"
  runs = {}
  for name, extra in (
    ("padded", ()),
    ("packed", ("train.max_tokens_per_microbatch=512",)),
  ):
    config = testing.tiny_run_config(
      path,
      tmp_path / name,
      "train.mesh=(1, 1, 1)",
      "train.steps=2",
      "train.epochs=2",
      "train.minibatches=2",
      "sampler.max_new_tokens=24",
      "sampler.temperature=1.5",
      "task.extra_rewards=({'name': 'rep', 'reward': 'repetition_penalty',"
      " 'weight': 1.0},)",
      *extra,
    )
    trainer = Trainer(config)
    runs[name] = (trainer, trainer.run()["history"])
  (padded, want), (packed, got) = runs["padded"], runs["packed"]
  for a, b in zip(want, got):
    for key in ("loss", "reward", "value_loss", "kl", "entropy"):
      np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6)
    assert b["padding_fraction"] < a["padding_fraction"] - 0.1
  assert any(abs(h["loss"]) > 0 for h in want)
  _close(packed.state.policy.params, padded.state.policy.params)
  _close(packed.state.value.params, padded.state.value.params)
