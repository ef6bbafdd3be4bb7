"""Check a `RunConfig` before any work: one line per error, naming the fix.

`validate` runs in the CLI right after the overrides and again at the top of
`Trainer.__init__`, before the model, the warm start or the sampler are
built, so a typo costs no compile time. Each rule names the field, the value
it got, the range it needs and, where one helps, what to set instead.
Settings that depend on the devices (the batch over the mesh) are checked
where the mesh is made (`Trainer`).
"""

import math
from typing import Any

from rljax import pipeline
from rljax import selection
from rljax._src.errors import UserError
from rljax.checkpoints import SHAPES
from rljax.models import LORA_TARGETS
from rljax.models import REMAT_POLICIES
from rljax.training._config import KINDS
from rljax.training._config import AlgorithmSpec
from rljax.training._config import RunConfig

_SOURCES = (
  "'scratch', 'smollm2', 'gguf:<path>', 'hf:<directory>' or 'shape:<name>'"
  " (a published model's shapes without weights, for --plan)"
)
_DTYPES = ("float32", "bfloat16", "float16")
_PARAM_DTYPES = ("float32", "bfloat16")
_SCHEDULES = ("auto", "dense", "chunked", "pallas_tpu", "pallas_gpu")
_NONFINITE = ("stop", "skip")
_ENGINES = ("continuous", "static")


def _fail(field: str, value: Any, need: str, fix: str = "") -> None:
  raise UserError(f"{field}={value!r}: {need}." + (f" {fix}" if fix else ""))


def _int(field: str, value: Any, minimum: int, fix: str = "") -> None:
  if isinstance(value, bool) or not isinstance(value, int):
    _fail(field, value, "must be an int", fix)
  if value < minimum:
    _fail(field, value, f"must be >= {minimum}", fix)


def _number(field: str, value: Any) -> float:
  if isinstance(value, bool) or not isinstance(value, int | float):
    _fail(field, value, "must be a number")
  if not math.isfinite(value):
    _fail(field, value, "must be finite")
  return float(value)


def _positive(field: str, value: Any, fix: str = "") -> None:
  if _number(field, value) <= 0:
    _fail(field, value, "must be > 0", fix)


def _in(field: str, value: Any, low: float, high: float, closed: str) -> None:
  """low < value < high, with the ends named in `closed` ("[", "]") included."""
  x = _number(field, value)
  ok_low = x >= low if "[" in closed else x > low
  ok_high = x <= high if "]" in closed else x < high
  if not (ok_low and ok_high):
    left = "[" if "[" in closed else "("
    right = "]" if "]" in closed else ")"
    _fail(field, value, f"must be in {left}{low}, {high}{right}")


def _model(m, section: str = "model") -> None:
  if not isinstance(m.source, str) or not (
    m.source in ("scratch", "smollm2")
    or m.source.startswith(("gguf:", "hf:", "shape:"))
  ):
    _fail(f"{section}.source", m.source, f"must be one of {_SOURCES}")
  if m.source.startswith("shape:") and m.source[6:] not in SHAPES:
    _fail(
      f"{section}.source",
      m.source,
      f"names no published shape; known: {', '.join(sorted(SHAPES))}",
    )
  for name in (
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "intermediate_size",
    "max_position_embeddings",
    "scan_unroll",
  ):
    _int(f"{section}.{name}", getattr(m, name), 1)
  _int(
    f"{section}.update_unroll",
    m.update_unroll,
    0,
    "Use 0 to unroll the update's layer scan as scan_unroll.",
  )
  if m.remat not in REMAT_POLICIES:
    _fail(
      f"{section}.remat",
      m.remat,
      "must be 'none' (False), 'full' (True) or 'dots'",
    )
  if m.hidden_size % m.num_heads:
    _fail(
      f"{section}.hidden_size",
      m.hidden_size,
      f"must be a multiple of {section}.num_heads={m.num_heads}",
    )
  if m.num_heads % m.num_kv_heads:
    _fail(
      f"{section}.num_kv_heads",
      m.num_kv_heads,
      f"must divide {section}.num_heads={m.num_heads} (grouped-query attention)",
    )
  if m.dtype not in _DTYPES:
    _fail(f"{section}.dtype", m.dtype, f"must be one of {_DTYPES}")
  if m.param_dtype not in _PARAM_DTYPES:
    _fail(
      f"{section}.param_dtype", m.param_dtype, f"must be one of {_PARAM_DTYPES}"
    )
  if m.logprob_schedule not in _SCHEDULES:
    _fail(
      f"{section}.logprob_schedule",
      m.logprob_schedule,
      f"must be one of {_SCHEDULES}",
    )
  _lora(m, section)
  if m.keep_layers is not None:
    _int(f"{section}.keep_layers", m.keep_layers, 1, "None keeps every layer.")
    if m.source == "scratch":
      _fail(
        f"{section}.keep_layers",
        m.keep_layers,
        f"truncates a checkpoint, but {section}.source='scratch'",
        f"Set {section}.num_layers for a scratch model.",
      )


def _lora(m, section: str) -> None:
  _int(f"{section}.lora_rank", m.lora_rank, 0, "0 trains every weight.")
  if not m.lora_rank:
    if m.lora_quantize_base:
      _fail(
        f"{section}.lora_quantize_base",
        True,
        "quantizes a frozen base, and only LoRA freezes it",
        f"Set {section}.lora_rank > 0 (QLoRA) or lora_quantize_base=False.",
      )
    return
  _positive(f"{section}.lora_alpha", m.lora_alpha)
  names = LORA_TARGETS
  targets = m.lora_targets
  if (
    not isinstance(targets, (tuple, list))
    or not targets
    or any(t not in names for t in targets)
  ):
    _fail(f"{section}.lora_targets", targets, f"must be a subset of {names}")
  if section == "teacher":
    _fail(
      "teacher.lora_rank",
      m.lora_rank,
      "adapts a trained policy, and the teacher is frozen",
      "Set teacher.lora_rank=0.",
    )


def _task(t) -> None:
  if not isinstance(t.name, str) or not t.name:
    _fail("task.name", t.name, "must be a task name, e.g. 'arithmetic'")
  if not isinstance(t.kwargs, dict):
    _fail("task.kwargs", t.kwargs, "must be a dict")
  _int("task.max_prompt_tokens", t.max_prompt_tokens, 1)


def _sampler(s) -> None:
  if s.mesh != () and (
    not isinstance(s.mesh, tuple)
    or len(s.mesh) != 3
    or any(
      isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in s.mesh
    )
  ):
    _fail(
      "sampler.mesh",
      s.mesh,
      "must be () (sample on train.mesh) or three ints (data, fsdp, tensor),"
      " each >= 1",
      "For example sampler.mesh=(4,1,1) on 4 of the devices.",
    )
  # 1 is the single stream (preset "spo"); group advantages refuse G = 1
  # themselves, naming this field, when the batch is traced.
  _int("sampler.num_samples", s.num_samples, 1)
  _int("sampler.max_new_tokens", s.max_new_tokens, 1)
  _positive(
    "sampler.temperature",
    s.temperature,
    "Sampling needs a positive temperature (greedy decoding is for"
    " evaluation only).",
  )
  if s.top_k is not None:
    _int("sampler.top_k", s.top_k, 1, "Use None to sample from every token.")
  if s.top_p is not None:
    _in("sampler.top_p", s.top_p, 0.0, 1.0, "]")
  if s.engine not in _ENGINES:
    _fail("sampler.engine", s.engine, f"must be one of {_ENGINES}")
  if s.slots is not None:
    _int("sampler.slots", s.slots, 1, "Use None for one slot per sample.")
  _int("sampler.page_size", s.page_size, 1)
  _int("sampler.segment", s.segment, 1)
  if s.prompts not in selection.SAMPLERS:
    _fail(
      "sampler.prompts",
      s.prompts,
      f"must be one of {sorted(selection.SAMPLERS)}",
      "Pass other samplers in code: Trainer(config, prompts=...).",
    )
  if not isinstance(s.prompts_kwargs, dict):
    _fail("sampler.prompts_kwargs", s.prompts_kwargs, "must be a dict")


def _algorithm(a) -> None:
  if not isinstance(a.name, str) or not a.name:
    _fail("algorithm.name", a.name, "must be a preset name, e.g. 'grpo'")
  if not isinstance(a.kwargs, dict):
    _fail("algorithm.kwargs", a.kwargs, "must be a dict")
  if a.value_eps is not None:
    _positive("algorithm.value_eps", a.value_eps, "Use None for plain MSE.")


def _optim(o) -> None:
  _positive(
    "optim.learning_rate",
    o.learning_rate,
    "The demo configs use 2e-4.",
  )
  _int("optim.warmup_steps", o.warmup_steps, 0)
  if _number("optim.weight_decay", o.weight_decay) < 0:
    _fail("optim.weight_decay", o.weight_decay, "must be >= 0")
  _in("optim.b1", o.b1, 0.0, 1.0, "[")
  _in("optim.b2", o.b2, 0.0, 1.0, "[")
  _positive(
    "optim.grad_clip",
    o.grad_clip,
    "It is the global-norm clip; 0 would scale every gradient to NaN. Use"
    " e.g. 1.0, or a large value such as 1e9 to clip almost never.",
  )


def _train(t) -> None:
  _int("train.steps", t.steps, 0)
  _int("train.prompts_per_step", t.prompts_per_step, 1)
  _int("train.epochs", t.epochs, 1)
  _int("train.minibatches", t.minibatches, 1)
  _int("train.microbatches", t.microbatches, 1)
  _int(
    "train.max_tokens_per_microbatch",
    t.max_tokens_per_microbatch,
    0,
    "Use 0 for padded updates.",
  )
  _int("train.max_refills", t.max_refills, 0)
  _int("train.seed", t.seed, 0)
  _int(
    "train.eval_every", t.eval_every, 0, "Use 0 to evaluate only at the ends."
  )
  _int("train.eval_prompts", t.eval_prompts, 1)
  _int("train.eval_samples", t.eval_samples, 1)
  _int("train.warm_start_steps", t.warm_start_steps, 0)
  if t.warm_start_steps:
    _positive("train.warm_start_lr", t.warm_start_lr)
    _int("train.warm_start_batch", t.warm_start_batch, 1)
  if not isinstance(t.warm_start_cache, str):
    _fail(
      "train.warm_start_cache",
      t.warm_start_cache,
      "must be a directory path (a string)",
      "Use '' to train the warm start every run.",
    )
  _int("train.max_skipped_updates", t.max_skipped_updates, 1)
  resets = t.reference_resets
  if not isinstance(resets, (tuple, list)) or any(
    isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in resets
  ):
    _fail(
      "train.reference_resets",
      resets,
      "must be a tuple of trainer steps (ints >= 0)",
      "For example train.reference_resets=(30,).",
    )
  if t.nonfinite not in _NONFINITE:
    _fail("train.nonfinite", t.nonfinite, f"must be one of {_NONFINITE}")
  if t.async_mode not in pipeline.MODES:
    _fail("train.async_mode", t.async_mode, f"must be one of {pipeline.MODES}")
  _int(
    "train.max_staleness",
    t.max_staleness,
    0,
    "It is how many updates old a rollout may be when it trains.",
  )
  if not isinstance(t.partial_rollouts, bool):
    _fail("train.partial_rollouts", t.partial_rollouts, "must be a bool")
  if t.partial_rollouts and t.async_mode != "async":
    _fail(
      "train.partial_rollouts",
      True,
      f"continues rollouts under newer weights; train.async_mode={t.async_mode!r}"
      " hands none mid-rollout",
      "Set train.async_mode='async', or drop train.partial_rollouts.",
    )
  if t.queue_order not in pipeline.ORDERS:
    _fail(
      "train.queue_order", t.queue_order, f"must be one of {pipeline.ORDERS}"
    )
  mesh = t.mesh
  if (
    not isinstance(mesh, tuple)
    or len(mesh) != 3
    or any(isinstance(n, bool) or not isinstance(n, int) for n in mesh)
    or any(n == 0 or n < -1 for n in mesh)
    or sum(n == -1 for n in mesh) > 1
  ):
    _fail(
      "train.mesh",
      mesh,
      "must be three ints (data, fsdp, tensor), each >= 1 or one of them -1"
      " (the remaining devices)",
      "For example train.mesh=(-1,1,1).",
    )
  if t.prompts_per_step % t.minibatches:
    _fail(
      "train.prompts_per_step",
      t.prompts_per_step,
      f"must be a multiple of train.minibatches={t.minibatches}",
    )
  if (t.prompts_per_step // t.minibatches) % t.microbatches:
    _fail(
      "train.microbatches",
      t.microbatches,
      f"must divide a minibatch of {t.prompts_per_step // t.minibatches}"
      " prompts (train.prompts_per_step / train.minibatches); change either",
    )


def _output(o) -> None:
  if not isinstance(o.directory, str) or not o.directory:
    _fail("output.directory", o.directory, "must be a directory path")
  if "://" in o.directory:
    _fail(
      "output.directory",
      o.directory,
      "must be a local path: logs are appended locally by process 0",
      "Put checkpoints on shared storage with"
      " output.checkpoint_directory=gs://... instead.",
    )
  _int("output.checkpoint_every", o.checkpoint_every, 0, "0 turns them off.")
  _int("output.keep_checkpoints", o.keep_checkpoints, 1)
  _int("output.rollouts_every", o.rollouts_every, 0, "0 turns them off.")


def _data(d) -> None:
  source = d.source
  if not isinstance(source, str) or not (
    source in ("task", "online") or source.startswith(("jsonl:", "tfds:"))
  ):
    _fail(
      "data.source",
      source,
      "must be 'task', 'online', 'jsonl:<path>' or 'tfds:<name>'",
    )
  if not isinstance(d.fields, dict):
    _fail("data.fields", d.fields, "must be a dict (record key -> feature)")
  _int("data.max_length", d.max_length, 2)
  _int("data.rows", d.rows, 0, "0 takes train.prompts_per_step.")


def _kind(config) -> None:
  kind = config.kind
  if kind not in KINDS:
    _fail("kind", kind, f"must be one of {KINDS}")
  if kind == "sft" and config.algorithm != AlgorithmSpec():
    _fail(
      "algorithm",
      config.algorithm,
      "a supervised run (kind='sft') has no algorithm",
      "Drop the algorithm section, or set kind='rl' or 'preference'.",
    )
  if kind != "rl" and config.train.warm_start_steps:
    _fail(
      "train.warm_start_steps",
      config.train.warm_start_steps,
      f"is the RL runs' supervised warm start; a {kind} run takes none",
      "Set it to 0 (an SFT run is the supervised training itself).",
    )
  if kind != "rl" and config.train.max_tokens_per_microbatch:
    _fail(
      "train.max_tokens_per_microbatch",
      config.train.max_tokens_per_microbatch,
      f"packs RL updates; a {kind} run takes none",
      "Set it to 0.",
    )
  if config.train.partial_rollouts and (
    config.sampler.engine != "continuous" or config.sampler.groups
  ):
    _fail(
      "train.partial_rollouts",
      True,
      "needs the continuous engine sampling plain groups (sampler.engine="
      f"{config.sampler.engine!r}, sampler.groups={config.sampler.groups!r})",
      "Use sampler.engine='continuous' without sampler.groups, or drop"
      " train.partial_rollouts.",
    )
  if kind != "rl" and config.sampler.mesh != ():
    _fail(
      "sampler.mesh",
      config.sampler.mesh,
      f"is an RL run's rollout mesh; a {kind} run samples on train.mesh",
      "Drop sampler.mesh.",
    )
  if kind != "rl" and config.train.async_mode != "sync":
    _fail(
      "train.async_mode",
      config.train.async_mode,
      f"overlaps RL rollouts with updates; a {kind} run is synchronous",
      "Drop train.async_mode.",
    )
  if kind == "rl" and config.data.source == "online":
    _fail(
      "data.source",
      "online",
      "is for preference and distillation runs",
      "An RL run always samples online; drop data.source.",
    )
  if kind == "sft" and config.data.source == "online":
    _fail(
      "data.source",
      "online",
      "a supervised run trains on given data",
      "Use 'task', 'jsonl:<path>' or 'tfds:<name>'.",
    )


def validate(config: RunConfig) -> RunConfig:
  """Raise `UserError` at the first bad setting of `config`; return it.

  Args:
    config: a run configuration (after overrides).

  Returns:
    `config`, unchanged.

  Raises:
    UserError: names the field, the value and the valid range or the fix.
  """
  if not isinstance(config, RunConfig):
    raise UserError(
      f"expected a RunConfig; got {type(config).__name__}. Config files"
      " define get_config() -> RunConfig."
    )
  _model(config.model)
  _task(config.task)
  _sampler(config.sampler)
  _algorithm(config.algorithm)
  _optim(config.optim)
  if config.optim.master_weights and config.model.param_dtype == "float32":
    _fail(
      "optim.master_weights",
      True,
      "keeps float32 copies of lower-precision weights, but"
      " model.param_dtype='float32'",
      "Set model.param_dtype='bfloat16', or master_weights=False.",
    )
  _train(config.train)
  if config.train.max_tokens_per_microbatch and config.model.prefix_grouper:
    _fail(
      "train.max_tokens_per_microbatch",
      config.train.max_tokens_per_microbatch,
      "packs each sample's real tokens, but model.prefix_grouper=True shares"
      " each group's padded prompt",
      "Set one of them off (max_tokens_per_microbatch=0: padded rows).",
    )
  _output(config.output)
  _data(config.data)
  if config.teacher is not None:
    _model(config.teacher, "teacher")
  if not isinstance(config.sandbox.allow_weaker, bool):
    _fail("sandbox.allow_weaker", config.sandbox.allow_weaker, "must be a bool")
  _kind(config)
  return config
