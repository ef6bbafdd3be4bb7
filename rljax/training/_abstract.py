"""The programs of a run, lowered with abstract inputs on any devices.

`abstract_run` builds what `Trainer` builds (policy, reference, critic,
optimizer and algorithm states, batch) as `jax.ShapeDtypeStruct` leaves with
the shardings the run would give them on a mesh of `devices`, without
allocating a weight: devices may be a TPU topology's
(`jax.experimental.topologies`) on a CPU host. `lowered_programs` lowers
each jitted program of an RL iteration with them.
"""

import math
from typing import Any, NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp

from rljax import checkpoints
from rljax import sampling
from rljax import sharding
from rljax._src.base import Batch
from rljax._src.errors import UserError
from rljax.models import Transformer
from rljax.models import ValueModel
from rljax.models import _lora
from rljax.training import _build
from rljax.training import _trainer_batch
from rljax.training import _trainer_rollouts
from rljax.training import _trainer_setup
from rljax.training._packing import Packing
from rljax.training._step import Models
from rljax.training._step import PolicyState
from rljax.training._step import Sequences
from rljax.training._step import TrainState
from rljax.training._step import ValueState

SHAPE_PREFIX = "shape:"


class AbstractRun(NamedTuple):
  """A run's structure and abstract, sharded inputs (no arrays)."""

  config: Any
  mesh: jax.sharding.Mesh
  models: Models
  algorithm: Any
  needs: dict
  state: TrainState
  seqs: Sequences
  batch: Batch
  key: jax.ShapeDtypeStruct
  policy_config: Any
  teacher: Any = None  # (graphdef, abstract params) of a frozen scorer
  rollout_mesh: Any = None  # the rollouts' own mesh (``sampler.mesh``)


def run_task(config):
  """The task `config` names, with its extra rewards (`Trainer`'s)."""
  return _trainer_setup.run_task(config, None, None)


def model_config(spec, alphabet: str):
  """The policy's `ModelConfig` from ``config.model``: scratch sizes or a
  published shape (``shape:<name>``) without weights; a checkpoint's is
  read from the model it loads (once, on the host)."""
  if spec.source.startswith(SHAPE_PREFIX):
    return checkpoints.shape_config(
      spec.source[len(SHAPE_PREFIX) :],
      dtype=spec.dtype,
      param_dtype=spec.param_dtype,
      scan_unroll=spec.scan_unroll,
      update_unroll=spec.update_unroll,
      remat=spec.remat,
    )
  model, _ = _build.build_policy(spec, alphabet, 0)
  return model.config


def _abstract_policy(config, spec):
  """The (LoRA-adapted) policy with abstract weights."""
  return nnx.eval_shape(
    lambda: _build.adapt(Transformer(config, rngs=nnx.Rngs(0)), spec)
  )


def _with_shardings(tree, shardings):
  """`tree`'s leaves as `jax.ShapeDtypeStruct` with the shardings of
  `shardings`, a prefix of `tree` (one per `nnx.Variable`, say)."""
  return jax.tree.map(
    lambda s, sub: jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), sub
    ),
    shardings,
    tree,
  )


def _placed(model, mesh):
  """The abstract state of `model` with its parameter shardings."""
  state = nnx.state(model)
  return _with_shardings(state, sharding.param_shardings(state, mesh))


def _opt_state(optimizer, params):
  """The abstract optimizer state of `params`, placed as `init_state`
  places it."""
  return _with_shardings(
    jax.eval_shape(optimizer.init, params),
    _build.opt_state_shardings(optimizer, params),
  )


def _rows(shape, dtype, mesh):
  """An abstract batch array split over the batch axes."""
  return jax.ShapeDtypeStruct(
    shape, dtype, sharding=sharding.batch_sharding(mesh, len(shape))
  )


def abstract_state(mesh, models, algorithm, needs, policy, critic):
  """The abstract `TrainState` `_build.init_state` would place on `mesh`."""
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  params = _placed(policy, mesh)
  trained = _lora.trainable(params)
  lora = trained is not params
  reference = needs["ref_logp_PGT"] or "reference" in (
    _trainer_setup.rescored_models(algorithm)
  )
  value = None
  if critic is not None:
    v_params = _placed(critic, mesh)
    value = ValueState(
      v_params,
      _opt_state(models.value_optimizer, v_params),
    )
  algo = jax.eval_shape(algorithm.init)
  state = TrainState(
    policy=PolicyState(
      params=params,
      opt_state=_opt_state(models.optimizer, trained),
      algo_state=_with_shardings(
        algo, jax.tree.map(lambda _: replicated, algo)
      ),
      step=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
    ),
    reference=(_lora.trainable(params) if lora else params)
    if reference
    else None,
    value=value,
  )
  return state


def _raw_batch(config, mesh, num_rewards: int) -> Batch:
  """The abstract batch a rollout becomes (`_trainer_batch.raw_batch`)."""
  c = config
  p, g, t = (
    c.train.prompts_per_step,
    c.sampler.num_samples,
    c.sampler.max_new_tokens,
  )
  return Batch(
    mask_PGT=_rows((p, g, t), jnp.float32, mesh),
    rewards_PG=_rows((p, g), jnp.float32, mesh),
    rewards_PGK=_rows((p, g, num_rewards), jnp.float32, mesh),
    rollout_logp_PGT=_rows((p, g, t), jnp.float32, mesh),
    truncated_PG=_rows((p, g), jnp.bool_, mesh),
    prompt_ids_P=_rows((p,), jnp.int32, mesh),
    tokens_PGT=_rows((p, g, t), jnp.int32, mesh),
  )


def _placed_like(tree, mesh):
  """Abstract outputs of a pass, split over the batch axes as the trainer's
  `device_put` places them."""
  return jax.tree.map(lambda x: _rows(x.shape, x.dtype, mesh), tree)


def reads_teacher(algorithm) -> bool:
  """Whether `algorithm` reads a frozen model's log-probs (a teacher)."""
  return _build.needs_field(algorithm, "teacher_logp_PGT") or (
    "teacher" in _trainer_setup.rescored_models(algorithm)
  )


def _abstract_teacher(config, teacher_config, policy_config, mesh):
  """(graphdef, abstract placed params) of the frozen model whose log-probs
  the algorithm reads (`_build.place_teacher`'s checks)."""
  if teacher_config is None:
    raise UserError(
      f"algorithm {config.algorithm.name!r} reads a frozen model's token"
      " log-probs (Batch.teacher_logp_PGT, or a Rescore with"
      " model='teacher'): set the config's teacher"
      " (teacher=ModelSpec(source=...))."
    )
  if teacher_config.vocab_size != policy_config.vocab_size:
    raise UserError(
      f"teacher.source={config.teacher.source!r} has vocabulary size"
      f" {teacher_config.vocab_size}, the policy"
      f" {policy_config.vocab_size}; the teacher scores the policy's tokens,"
      " so it must share its tokenizer."
    )
  teacher = nnx.eval_shape(
    lambda: Transformer(teacher_config, rngs=nnx.Rngs(0))
  )
  try:
    return nnx.graphdef(teacher), _placed(teacher, mesh)
  except ValueError as e:
    raise UserError(f"train.mesh={tuple(config.train.mesh)}: {e}") from e


def abstract_run(
  config, devices, *, task, policy_config, teacher_config=None
) -> AbstractRun:
  """Everything an RL iteration of `config` reads, abstract and sharded over
  a mesh of `devices` (``train.mesh`` sizes), for a policy of
  `policy_config` (`model_config`), a teacher of `teacher_config` (of
  ``config.teacher``, where the algorithm reads one) and `task`
  (`run_task`).

  Raises:
    UserError: ``train.mesh`` does not fit the devices, or does not divide
      the batch or a parameter (heads, KV heads, experts, vocabulary); the
      algorithm reads a teacher and none is given, or its vocabulary is
      not the policy's.
  """
  c = config
  devices, rollout_devices = _trainer_setup.split_devices(c, devices)
  policy = _abstract_policy(policy_config, c.model)
  mesh = _checked_mesh("train.mesh", c, devices, policy)
  rollout_mesh = None
  if rollout_devices is not None:
    rollout_mesh = _checked_mesh("sampler.mesh", c, rollout_devices, policy)
  algorithm = _trainer_setup.algorithm(c)
  needs = {
    f: _build.needs_field(algorithm, f) for f in _trainer_setup.NEEDED_FIELDS
  }
  teacher = None
  if reads_teacher(algorithm):
    teacher = _abstract_teacher(c, teacher_config, policy_config, mesh)
  critic = (
    nnx.eval_shape(lambda: ValueModel(policy_config, rngs=nnx.Rngs(0)))
    if needs["old_values_PGT"]
    else None
  )
  opt = _build.optimizer(c.optim)
  models = Models(
    policy=nnx.graphdef(policy),
    value=None if critic is None else nnx.graphdef(critic),
    optimizer=opt,
    value_optimizer=None if critic is None else opt,
  )
  state = abstract_state(mesh, models, algorithm, needs, policy, critic)
  p, g = c.train.prompts_per_step, c.sampler.num_samples
  width = c.task.max_prompt_tokens + c.sampler.max_new_tokens
  seqs = Sequences(
    tokens_PGL=_rows((p, g, width), jnp.int32, mesh),
    mask_PGL=_rows((p, g, width), jnp.int32, mesh),
  )
  batch = _raw_batch(c, mesh, max(len(task.rewards), 1))
  teacher_graph, teacher_params = teacher or (None, None)
  score = _trainer_batch.score_fn(
    c,
    models,
    needs,
    teacher_graph,
    algorithm.rescores,
    c.sampler.temperature,
    mesh,
  )
  with jax.set_mesh(mesh):
    scores = dict(jax.eval_shape(score, state, teacher_params, seqs))
  batch = batch._replace(**_placed_like(scores.pop("fields"), mesh))
  batch = batch.with_extra(**_placed_like(scores, mesh))
  if needs["baseline_rewards_P"]:
    batch = batch._replace(baseline_rewards_P=_rows((p,), jnp.float32, mesh))
  key = jax.eval_shape(lambda: jax.random.key(0))
  prepared, _ = jax.eval_shape(
    lambda b, s, k: algorithm.prepare(b, s, key=k),
    batch,
    state.policy.algo_state,
    key,
  )
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated)
  return AbstractRun(
    config=c,
    mesh=mesh,
    models=models,
    algorithm=algorithm,
    needs=needs,
    state=state,
    seqs=seqs,
    batch=_placed_like(prepared, mesh),
    key=key,
    policy_config=policy_config,
    teacher=teacher,
    rollout_mesh=rollout_mesh,
  )


def _checked_mesh(field: str, config, devices, policy):
  """The mesh `field` sizes over `devices`, which must split the batch and
  the policy's parameters."""
  sizes = getattr(config, field.split(".")[0]).mesh
  try:
    mesh = sharding.make_mesh(*sizes, devices=devices)
    sharding.check_batch(
      "train.prompts_per_step", config.train.prompts_per_step, mesh
    )
    _placed(policy, mesh)
  except ValueError as e:
    raise UserError(f"{field}={tuple(sizes)}: {e}") from e
  return mesh


def lowered_programs(run: AbstractRun) -> dict[str, Any]:
  """{name: `jax.stages.Lowered`} of the programs an RL iteration runs: the
  scoring pass (old, reference, value, teacher and rescore passes), the
  update and (with the continuous engine) the rollout
  engine's prefill and decode segment, on the rollouts' own mesh when the
  run has one."""
  c = run.config
  out = {}
  teacher_graph, teacher_params = run.teacher or (None, None)
  score = _trainer_batch.score_fn(
    c,
    run.models,
    run.needs,
    teacher_graph,
    run.algorithm.rescores,
    c.sampler.temperature,
    run.mesh,
  )
  (packing, merged), micro = _abstract_packing(c, run.mesh)
  out["score"] = score.lower(run.state, teacher_params, run.seqs, merged)
  spec = _trainer_setup.update_spec(c)._replace(microbatches=micro)
  shardings = jax.tree.map(lambda x: x.sharding, run.state)
  update = _trainer_batch.update_fn(run.models, run.algorithm, spec, shardings)
  out["update"] = update.lower(run.state, run.seqs, run.batch, run.key, packing)
  if c.sampler.engine == "continuous":
    mesh, params = run.mesh, run.state.policy.params
    if run.rollout_mesh is not None:  # the weights, moved across
      mesh = run.rollout_mesh
      params = _with_shardings(params, sharding.param_shardings(params, mesh))
    engine = sampling.Engine(
      run.policy_config,
      **_trainer_rollouts.engine_settings(c),
      top_k=c.sampler.top_k,
      top_p=c.sampler.top_p,
      mesh=mesh,
    )
    out.update(
      engine.lower(run.models.policy, params, c.task.max_prompt_tokens)
    )
  return out


def _abstract_packing(c, mesh):
  """A packed run's (update, scoring) `Packing` shapes at their largest,
  every sample as long as its row: the fewest micro-batches (at least
  ``train.microbatches``, a divisor of a minibatch's prompts) whose samples
  fit the budget's rows; (None, None) for padded updates."""
  t = c.train
  if not t.max_tokens_per_microbatch:
    return (None, None), t.microbatches
  width = c.task.max_prompt_tokens + c.sampler.max_new_tokens
  shards = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
  per_minibatch = t.prompts_per_step // t.minibatches
  fit = max(t.max_tokens_per_microbatch // width, 1)  # rows per device
  g = c.sampler.num_samples
  micro = next(
    m
    for m in range(t.microbatches, per_minibatch + 1)
    if per_minibatch % m == 0
    and (-(-per_minibatch // m * g // shards) <= fit or m == per_minibatch)
  )
  units = t.minibatches * micro
  rows = -(-(per_minibatch // micro) * g // shards) * shards
  samples = t.prompts_per_step * g
  whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def packing(k, r, n):
    spec = lambda *shape: jax.ShapeDtypeStruct(  # noqa: E731
      shape, jnp.int32, sharding=whole
    )
    t1 = c.sampler.max_new_tokens + 1
    return Packing(spec(k, r, width), spec(k, r, width), spec(k, n, t1))

  return (
    packing(units, rows, samples // units),
    packing(1, units * rows, samples),
  ), micro
