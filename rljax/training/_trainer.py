"""The RL loop: data, rollouts, rewards, filters, updates, logs, checkpoints.

`Trainer(config).run()` trains and returns the final metrics. Only this
outer loop is Python; sampling, log-probs, `prepare` and the update are
jitted, and the update runs sharded on the mesh with explicit in/out
shardings. Step ``s`` samples with ``fold_in(key, s)`` and checkpoints carry
the data iterator's position, so a resumed run continues exactly.

Multi-host runs start the same trainer on every host (after
`jax.distributed.initialize`; the CLI does it). Each process loads,
decodes and scores only the prompts of the rows its devices hold, the
jitted programs see global arrays (`_hosts`), summaries are summed over
processes, and only process 0 writes logs, rollouts and plots.

A run either continues correctly or stops with a message saying what to do
(`rljax._src.errors.UserError`; the CLI prints it in one line):

* the config is checked before any work (`validate`);
* one run at a time holds the output directory (`_run_dir.lock`); a fresh
  start (``resume=False``, ``--fresh``) moves a previous run aside;
* a resumed run restores the newest intact checkpoint, refuses one saved
  with another config (unless `allow_changes` names the fields), skips the
  warm start and drops the log records after the restored step;
* a NaN or infinite loss, gradient or parameter is never applied nor
  checkpointed; ``train.nonfinite`` stops the run or skips the update.
"""

from collections.abc import Callable, Sequence
import dataclasses
import fnmatch
import functools
import json
import logging
import math
import pathlib
import time
from typing import Any, Optional

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from rljax import algorithms
from rljax import checkpointing
from rljax import envs
from rljax import monitoring
from rljax import rollouts
from rljax import sampling
from rljax import selection
from rljax import sharding
from rljax import tasks
from rljax._src.base import Algorithm
from rljax._src.base import Batch
from rljax._src.base import finalize
from rljax._src.errors import NonFiniteError
from rljax._src.errors import UserError
from rljax.models import _lora
from rljax.training import _build
from rljax.training import _groups
from rljax.training import _hosts
from rljax.training import _precision
from rljax.training import _rollout
from rljax.training import _run_dir
from rljax.training import _warm_start
from rljax.training._config import RunConfig
from rljax.training._step import Models
from rljax.training._step import UpdateSpec
from rljax.training._step import all_finite
from rljax.training._step import completion_logprobs
from rljax.training._step import completion_values
from rljax.training._step import rescore
from rljax.training._step import update
from rljax.training._validate import validate
from rljax.transforms import kept_groups

# Progress-bar labels for the metrics people watch.
PROGRESS_KEYS = {
  "reward": "rew",
  "accuracy": "acc",
  "kl": "kl",
  "entropy": "ent",
  "clip_frac": "clip",
  "response_length": "len",
}


# Config fields a resumed run may change without changing what it trains:
# logging, evaluation, checkpoint cadence, the run's length, the mesh
# (checkpoints restore onto any mesh), and the warm start (not re-run).
RESUMABLE_CHANGES = (
  "train.steps",
  "train.eval_*",
  "train.mesh",
  "train.warm_start_*",
  "train.nonfinite",
  "train.max_skipped_updates",
  "output.*",
)

# Update metrics that flag a non-finite step, and what they name.
NONFINITE_CAUSES = {
  "nonfinite_loss": "the policy loss",
  "nonfinite_grads": "the policy gradient",
  "nonfinite_params": "the updated policy parameters",
  "nonfinite_value": "the critic's gradient or parameters",
}


def _episode_metrics(scored) -> dict[str, np.ndarray]:
  """Per-prompt tool calls and turns of agent episodes (first sample)."""
  extra = scored.extra or {}
  if "turns_PG" not in extra:
    return {}
  return {
    "tool_calls": np.asarray(extra["tool_calls_PG"])[:, 0].sum(-1),
    "tool_call_rate": np.asarray(extra["tool_calls_PG"])[:, 0].sum(-1) > 0,
    "turns": np.asarray(extra["turns_PG"])[:, 0],
  }


def _from_config(field: str, build, *args, **kwargs):
  """`build(*args, **kwargs)`, its errors as `UserError`s naming `field`."""
  try:
    return build(*args, **kwargs)
  except UserError:
    raise
  except (ValueError, TypeError, ImportError, FileNotFoundError) as e:
    raise UserError(f"{field}: {e}") from e


def _check_sizes(config: RunConfig, mesh) -> None:
  """The config's own checks, then the global batch against the mesh."""
  validate(config)
  p = config.train.prompts_per_step
  try:
    sharding.check_batch("train.prompts_per_step", p, mesh)
  except ValueError as e:  # the message names the field and the fix
    raise UserError(str(e)) from e
  slots = config.sampler.slots
  shards = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
  if slots is not None and slots % shards:
    raise UserError(
      f"sampler.slots={slots} must be a multiple of the mesh's batch"
      f" shards ({shards}, data x fsdp); use {-(-slots // shards) * shards}."
    )


def _mesh(sizes):
  """The run's mesh; a fully specified one may use fewer than all devices."""
  used = math.prod(sizes)
  if -1 in sizes or used >= jax.device_count():
    return _from_config("train.mesh", sharding.make_mesh, *sizes)
  if jax.process_count() > 1:
    raise UserError(
      f"train.mesh={sizes} uses {used} of {jax.device_count()} devices; a"
      " multi-host run must use every device of every host (set one axis to"
      " -1)."
    )
  logging.getLogger("rljax").warning(
    "train.mesh=%s uses %d of %d devices.", sizes, used, jax.device_count()
  )
  return sharding.make_mesh(*sizes, devices=jax.devices()[:used])


def _config_json(config: RunConfig) -> dict:
  """The config as JSON values (tuples become lists), as checkpoints hold it."""
  return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
  """Nested dicts as {"section.field": value}."""
  if not isinstance(tree, dict):
    return {prefix: tree}
  if not tree and prefix:
    return {prefix: tree}
  out = {}
  for k, v in tree.items():
    out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
  return out


def _check_same_config(saved, current, allowed, *, step, directory) -> None:
  """Refuse to resume a checkpoint of a run with another config.

  Fields matching a pattern of `allowed` (fnmatch) may differ.
  """
  old, new = _flat(saved), _flat(current)
  changed = sorted(
    k
    for k in set(old) | set(new)
    if old.get(k, "<unset>") != new.get(k, "<unset>")
    and not any(fnmatch.fnmatchcase(k, pattern) for pattern in allowed)
  )
  if not changed:
    return
  listed = ", ".join(
    f"{k} {old.get(k, '<unset>')!r} -> {new.get(k, '<unset>')!r}"
    for k in changed
  )
  raise UserError(
    f"the checkpoint at step {step} in {directory} was saved by a run with"
    f" another config ({listed}); resuming would mix two runs. Start over"
    " with --fresh (the old run is moved aside), give this run another"
    " output.directory, or accept the change with --allow_change"
    f" {','.join(changed)}."
  )


def _nonfinite_leaf(tree: Any) -> str:
  """The key path of the first floating leaf of `tree` with a NaN or inf."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if not bool(jax.jit(all_finite)(leaf)):
      return jax.tree_util.keystr(path)
  return "an unknown leaf"


class Trainer:
  """One training run: build everything from a `RunConfig`, then `run()`.

  Resumes from the latest intact checkpoint in the checkpoint directory
  when there is one (``resume=False`` starts over, moving a previous run in
  the output directory aside). ``allow_changes`` lists config fields
  (fnmatch patterns) that may differ from the checkpoint's when resuming,
  besides `RESUMABLE_CHANGES`.

  Parts built in code replace what the config names:

  * ``algorithm``: an `Algorithm` (a new objective chained from transforms)
    instead of the preset ``config.algorithm`` names;
  * ``task``: a `rljax.tasks.Task` instead of ``config.task.name``;
  * ``rewards``: reward functions, ``[(name, fn, weight), ...]`` as for
    `rljax.rewards.score`, instead of the task's own;
  * ``teacher``: instead of the one ``config.teacher`` names, a frozen
    model (same vocabulary as the policy) whose token
    log-probs of every sampled completion, at the sampler's temperature,
    fill ``Batch.teacher_logp_PGT`` when a stage reads them (a teacher to
    distil, a DPO policy, a judge);
  * ``annotate``: ``fn(scored) -> {name: array}`` adds side data to each
    rollout batch (``Batch.extra``; names end in ``_P``, ``_PG`` or
    ``_PGT``), computed on the host from this process's rows of the scored
    rollout (`rljax.training.Scored`: examples, completions, scores), e.g.
    answer-cluster ids for a label-free reward;
  * ``prompts``: a `rljax.selection.PromptSampler` that chooses each
    step's prompts and their number of samples (default: the shuffled
    training set, ``sampler.num_samples`` each); its state is checkpointed.
  """

  # Metrics the progress bar and the learning-curve plot show.
  PROGRESS_KEYS = PROGRESS_KEYS
  PLOT_KEYS = (
    "reward",
    "accuracy",
    "eval_accuracy",
    "kl",
    "entropy",
    "response_length",
  )

  def __init__(
    self,
    config: RunConfig,
    *,
    resume: bool = True,
    algorithm: Optional[Algorithm] = None,
    task: Optional[tasks.Task] = None,
    rewards: Optional[Sequence[tuple]] = None,
    teacher: Optional[nnx.Module] = None,
    annotate: Optional[Callable[[Any], dict]] = None,
    prompts: Optional[selection.PromptSampler] = None,
    groups: Optional[rollouts.GroupStrategy] = None,
    allow_changes: Sequence[str] = (),
  ):
    self.config = c = validate(config)
    if type(self) is Trainer and c.kind != "rl":
      raise UserError(
        f"kind={c.kind!r} is not an RL run: build it with"
        " rljax.posttrain.run_for(config)(config) (the CLI does)."
      )
    self.mesh = _mesh(c.train.mesh)
    _check_sizes(c, self.mesh)
    self.allow_changes = (*RESUMABLE_CHANGES, *allow_changes)
    self.directory = pathlib.Path(c.output.directory)
    self._writer = jax.process_index() == 0  # logs, rollouts, plots
    self.annotate = annotate
    self._engines = {}
    self._compiled = {}  # jitted update / scoring per temperature
    self.prompt_sampler = prompts or _from_config(
      "sampler.prompts",
      selection.get,
      c.sampler.prompts,
      **{"num_samples": c.sampler.num_samples, **c.sampler.prompts_kwargs},
    )
    self.groups = groups
    if groups is None and c.sampler.groups is not None:
      self.groups = _from_config(
        "sampler.groups",
        rollouts.get,
        c.sampler.groups,
        **c.sampler.groups_kwargs,
      )
    with self._locked():
      self._build(resume, algorithm, task, rewards, teacher)

  def _locked(self):
    """The output directory's run lock (see `_run_dir.lock`)."""
    return _run_dir.lock(self.directory, active=self._writer)

  def _build(self, resume, algorithm, task, rewards, teacher) -> None:
    """Everything from the config (or the parts given in code); restores or
    warm-starts the policy."""
    c = self.config
    checkpoints = (
      c.output.checkpoint_directory or self.directory / "checkpoints"
    )
    if not resume:
      self._clear_previous_run(checkpoints)
    # The rows of each global batch of prompts this process handles.
    self.rows = _hosts.own_rows(self.mesh, c.train.prompts_per_step)
    self.task = task or _from_config(
      "task", _build.build_task, c.task, c.sandbox
    )
    if rewards is not None:
      self.task = dataclasses.replace(
        self.task, rewards=_build.check_rewards(rewards)
      )
    if c.task.extra_rewards:
      extra = _from_config(
        "task.extra_rewards", _build.extra_rewards, c.task.extra_rewards
      )
      self.task = dataclasses.replace(
        self.task, rewards=(*self.task.rewards, *extra)
      )
    model, self.tokenizer = _from_config(
      "model", _build.build_policy, c.model, self.task.alphabet, c.train.seed
    )
    self.algorithm = algorithm or self._algorithm_from_config()
    self.needs = self._needs()
    if teacher is None and c.teacher is not None:
      teacher, _ = _from_config(
        "teacher", _build.build_policy, c.teacher, self.task.alphabet, 0
      )
    # A stage's own log-prob passes (`rljax.Rescore`) may need a model too.
    rescored = {r.model for r in self.algorithm.rescores}
    self.teacher = _build.place_teacher(
      teacher,
      model,
      self.needs["teacher_logp_PGT"] or "teacher" in rescored,
      self.mesh,
    )
    critic = (
      _build.value_model_like(model) if self.needs["old_values_PGT"] else None
    )
    if c.optim.master_weights and self.algorithm.transform.step_scale:
      raise UserError(
        f"optim.master_weights=True: algorithm {c.algorithm.name!r} scales"
        " each optimizer step (Transform.step_scale), which would move the"
        " weights off their float32 master copies. Use master_weights=False"
        " (with model.param_dtype='float32') for this algorithm."
      )
    if model.config.num_experts and c.sampler.engine != "static":
      logging.getLogger("rljax").warning(
        "A mixture-of-experts policy with sampler.engine=%r: the rollout"
        " engine does not record routing yet, so the update routes tokens"
        " afresh (no routing replay). sampler.engine='static' records each"
        " token's experts and the update replays them.",
        c.sampler.engine,
      )
    opt = _build.optimizer(c.optim)
    self.models = Models(
      policy=nnx.graphdef(model),
      value=None if critic is None else nnx.graphdef(critic),
      optimizer=opt,
      value_optimizer=None if critic is None else opt,
    )
    self.prompt_sampler = _from_config(
      "sampler.prompts", self.prompt_sampler.prepare, self.task.train
    )
    self.groups_state = None
    if self.groups is None and self.task.environment is not None:
      self.groups = envs.EpisodeRollouts()  # an interactive task
    if self.groups is not None:
      if c.sampler.engine != "continuous":
        raise UserError(
          f"a group strategy ({type(self.groups).__name__}) samples with the"
          " rollout engine: set sampler.engine='continuous'."
        )
      self.groups = _from_config(
        "sampler.groups", self.groups.prepare, self.task
      ).bind(self.tokenizer, chat=c.model.chat_template)
      self.groups_state = self.groups.init()
    self.prompt_state = self.prompt_sampler.init(
      len(self.task.train), c.train.seed
    )
    self._step = 0
    self._temperature = c.sampler.temperature  # the step's (stages)
    self.start_step = 0
    self.skipped_updates = 0  # non-finite updates skipped (train.nonfinite)
    self._skipped_in_a_row = 0
    # Made before the warm start: an unwritable checkpoint directory fails
    # now, and a resumed run restores instead of warm-starting again.
    self.checkpointer = (
      checkpointing.Checkpointer(
        checkpoints,
        keep=c.output.keep_checkpoints,
        save_every=c.output.checkpoint_every,
      )
      if c.output.checkpoint_every
      else None
    )
    resuming = resume and bool(
      self.checkpointer and self.checkpointer.all_steps()
    )
    self.warm_start_losses = []
    if not resuming:
      self._warm(model)
    # LoRA adapters go onto the (warm-started) base; the policy's structure
    # then includes them.
    model = _build.adapt(model, c.model)
    self.models = self.models._replace(policy=nnx.graphdef(model))
    self.state, self.shardings = _build.init_state(
      model,
      reference=self.needs["ref_logp_PGT"] or "reference" in rescored,
      critic=critic,
      models=self.models,
      algorithm=self.algorithm,
      mesh=self.mesh,
    )
    if c.train.reference_resets and self.state.reference is None:
      raise ValueError(
        f"train.reference_resets={c.train.reference_resets}, but algorithm"
        f" {c.algorithm.name!r} keeps no reference policy (it reads no"
        " reference log-probs); drop train.reference_resets or add a KL to"
        " the reference."
      )
    _build.check_prompt_tables(
      self.state.policy.algo_state, len(self.task.train)
    )
    if resuming:
      self._restore()
    self.spec = UpdateSpec(
      completion_width=c.sampler.max_new_tokens,
      epochs=c.train.epochs,
      minibatches=c.train.minibatches,
      microbatches=c.train.microbatches,
      temperature=c.sampler.temperature,
      schedule=c.model.logprob_schedule,
      value_eps=c.algorithm.value_eps,
      prefix_grouper=c.model.prefix_grouper,
      router_aux_coef=c.model.router_aux_coef,
    )
    self._update = self._update_at(c.sampler.temperature)
    self._prepare = jax.jit(
      lambda batch, s, key: self.algorithm.prepare(batch, s, key=key)
    )
    self._keep = jax.jit(
      lambda batch, s, key: kept_groups(
        self.algorithm.prepare(batch, s, key=key)[0]
      )
    )

  def _algorithm_from_config(self) -> Algorithm:
    """The preset ``config.algorithm`` names, with its hyperparameters."""
    c = self.config.algorithm
    return _from_config("algorithm", algorithms.get, c.name, **c.kwargs)

  def _needs(self) -> dict[str, bool]:
    """Which batch fields the algorithm reads (and so which passes run)."""
    return {
      f: _build.needs_field(self.algorithm, f)
      for f in (
        "ref_logp_PGT",
        "old_logp_PGT",
        "old_values_PGT",
        "old_entropy_PGT",
        "baseline_rewards_P",
        "teacher_logp_PGT",
      )
    }

  def _clear_previous_run(self, checkpoints) -> None:
    """``resume=False`` (``--fresh``): move a previous run aside so that the
    two never mix (its checkpoints would block this run's saves, and a later
    resume would restore them)."""
    remote = "://" in str(checkpoints)
    if remote:
      with checkpointing.Checkpointer(checkpoints) as previous:
        steps = previous.all_steps()
      if steps:
        raise UserError(
          f"output.checkpoint_directory={str(checkpoints)!r} holds the"
          f" checkpoints of a previous run (steps {steps}); a fresh start"
          " cannot move them aside on remote storage. Delete them, or give"
          " this run another output.checkpoint_directory."
        )
    if self._writer:
      _run_dir.move_aside(
        self.directory, None if remote else pathlib.Path(checkpoints)
      )
    _hosts.process_sum(np.int32(0))  # every process waits for the move

  # --- data -----------------------------------------------------------------

  def _warm(self, model) -> None:
    """The optional supervised warm start (scratch models)."""
    t = self.config.train
    if not t.warm_start_steps:
      return
    data = self.task.train.shuffle(seed=t.seed + 1).repeat()
    data = data.batch(t.warm_start_batch, batch_fn=list).to_iter_dataset()
    batches = (
      _warm_start.answer_batch(
        self.tokenizer,
        self.task,
        examples,
        self.config.task.max_prompt_tokens,
        self.config.sampler.max_new_tokens,
      )
      for examples in data
    )
    params, losses = _warm_start.warm_start(
      nnx.graphdef(model),
      nnx.state(model),
      batches,
      steps=t.warm_start_steps,
      learning_rate=t.warm_start_lr,
      answer_width=self.config.sampler.max_new_tokens,
    )
    nnx.update(model, params)
    self.warm_start_losses = losses

  # --- checkpoints ----------------------------------------------------------

  def _restore(self) -> None:
    """Resume from the newest intact checkpoint, if its config matches."""
    abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      self.state,
    )
    current = _config_json(self.config)

    def same_config(step, metadata):
      if "config" in metadata:
        _check_same_config(
          metadata["config"],
          current,
          self.allow_changes,
          step=step,
          directory=self.checkpointer.directory,
        )

    restored = self.checkpointer.restore(
      abstract, restore_data=False, check_metadata=same_config
    )
    if restored.skipped:
      logging.getLogger("rljax").warning(
        "Resumed from step %d; skipped damaged checkpoints: %s.",
        restored.step,
        "; ".join(f"step {s}: {why}" for s, why in restored.skipped),
      )
    metadata = restored.metadata or {}
    self.state = restored.state
    if metadata.get("groups_state") is not None:
      self.groups_state = metadata["groups_state"]
    if "prompt_state" in metadata:
      self.prompt_state = metadata["prompt_state"]
    else:  # saved before prompt samplers: grain's batch position
      self.prompt_state["position"] = (
        metadata["data_state"]["next_index"]
        * self.config.train.prompts_per_step
      )
    self.start_step = restored.step
    self.skipped_updates = int(metadata.get("skipped_updates", 0))

  def save(self, step: int, *, force: bool = False) -> None:
    """Checkpoint the state and the data position after `step` steps.

    Raises:
      NonFiniteError: the state holds a NaN or an infinity (an algorithm
        state made non-finite in `prepare`); nothing is written.
    """
    if self.checkpointer is None:
      return
    if not bool(jax.jit(all_finite)(self.state)):
      raise NonFiniteError(
        f"step {step}: the train state holds a NaN or an infinity (in "
        f"{_nonfinite_leaf(self.state)}); it was not checkpointed. The last"
        " checkpoint is intact: resume from it with a lower"
        " optim.learning_rate or check the algorithm's hyperparameters."
      )
    # The prompt sampler's state is the same on every process, so it goes
    # in the metadata: a checkpoint resumes on any number of hosts.
    self.checkpointer.save(
      step,
      self.state,
      metadata={
        "config": _config_json(self.config),
        "prompt_state": self.prompt_state,
        "groups_state": self.groups_state,
        "skipped_updates": self.skipped_updates,
      },
      force=force,
    )

  # --- one iteration --------------------------------------------------------

  def policy(self):
    """The current policy as an `nnx` module (for sampling, evaluation)."""
    return nnx.merge(self.models.policy, self.state.policy.params)

  def _engine(self, greedy=False, top_k=None, top_p=None):
    """The continuous-batching engine for these sampling settings (made
    once; its KV pool is dropped after each rollout)."""
    key = (greedy, top_k, top_p)
    if key not in self._engines:
      s = self.config.sampler
      rows = self.config.train.prompts_per_step * s.num_samples
      self._engines[key] = _from_config(
        "sampler",
        sampling.Engine,
        self.policy().config,
        slots=s.slots or rows,
        page_size=s.page_size,
        segment=s.segment,
        max_length=self.config.task.max_prompt_tokens + s.max_new_tokens,
        top_k=top_k,
        top_p=top_p,
        greedy=greedy,
        stop_ids=self.tokenizer.stop_ids,
        mesh=self.mesh,
      )
    return self._engines[key]

  def _sample(
    self, examples, key, *, global_rows=None, budget=None, **sampler_kwargs
  ):
    """Sample and score this process's `examples` (rows of a global batch
    of `global_rows` prompts, ``train.prompts_per_step`` by default), with
    at most `budget` new tokens (default and width: the config's)."""
    if self.config.sampler.engine == "continuous":
      sampler_kwargs["engine"] = self._engine(
        sampler_kwargs.pop("greedy", False),
        sampler_kwargs.pop("top_k", None),
        sampler_kwargs.pop("top_p", None),
      )
    return _rollout.sample_and_score(
      self.policy(),
      self.tokenizer,
      self.task,
      examples,
      key=key,
      prompt_width=self.config.task.max_prompt_tokens,
      chat=self.config.model.chat_template,
      mesh=self.mesh,
      global_rows=global_rows or self.config.train.prompts_per_step,
      max_new_tokens=budget or self.config.sampler.max_new_tokens,
      width=self.config.sampler.max_new_tokens,
      **sampler_kwargs,
    )

  def _episodes(self, examples, key, *, greedy=False, **sampler_kwargs):
    """Agent episodes of the global `examples` (every process runs them
    all, as the engine samples the global batch), scored; this process's
    rows."""
    return _rollout.sample_episodes(
      self.groups,
      self._engine(greedy),
      self.policy(),
      self.tokenizer,
      self.task,
      examples,
      key=key,
      width=self.config.sampler.max_new_tokens,
      mesh=self.mesh,
      **sampler_kwargs,
    )

  def _next_prompts(self):
    """The prompt sampler's next global batch: (this process's prompt ids,
    their examples, every prompt's number of samples, the step's sampling
    settings)."""
    size = batch = self.config.train.prompts_per_step
    if self.groups is not None:  # it may carry groups over from past steps
      size = int(self.groups.new_prompts(batch, self.groups_state))
    if size == 0:
      chosen = selection.Selection(np.zeros(0, np.int64), np.zeros(0, np.int32))
      self._temperature = self.config.sampler.temperature
      return [], [], chosen.num_samples, {}, chosen
    chosen, self.prompt_state = self.prompt_sampler.select(
      self.prompt_state, self._step, size
    )
    chosen = _from_config(
      "prompts",
      selection.check_selection,
      chosen,
      size,
      len(self.task.train),
      self.prompt_sampler.max_samples,
      type(self.prompt_sampler).__name__,
      self.config.sampler.max_new_tokens,
    )
    counts = chosen.num_samples
    g = self.prompt_sampler.max_samples
    if self.config.sampler.engine == "static" and np.any(counts != g):
      raise UserError(
        f"the prompt sampler gave {counts.min()}..{counts.max()} samples per"
        f" prompt (max_samples {g}); sampler.engine='static' samples the"
        " same number for every prompt: use sampler.engine='continuous'."
      )
    ids = chosen.prompt_ids[self.rows] if size == batch else chosen.prompt_ids
    examples = [self.task.train[int(i)] for i in ids]
    settings = chosen.settings or {}
    # The step's temperature: sampling, scoring and the update use it.
    self._temperature = settings.get(
      "temperature", self.config.sampler.temperature
    )
    return list(ids), examples, counts, settings, chosen

  def _train_sample(self, prompts, key):
    ids, examples, counts, settings, chosen = prompts
    s = self.config.sampler
    g = self.prompt_sampler.max_samples
    if self.groups is not None:
      scored, self.groups_state = _groups.sample_groups(
        self.groups,
        self.groups_state,
        engine=self._engine(False, s.top_k, s.top_p),
        model=self.policy(),
        tokenizer=self.tokenizer,
        task=self.task,
        prompt_ids=chosen.prompt_ids,
        counts=counts,
        key=key,
        step=self._step,
        prompt_width=self.config.task.max_prompt_tokens,
        chat=self.config.model.chat_template,
        max_new_tokens=settings.get("max_new_tokens", s.max_new_tokens),
        width=s.max_new_tokens,
        temperature=self._temperature,
        mesh=self.mesh,
        batch=self.config.train.prompts_per_step,
      )
      return scored
    # Every rollout has G = the sampler's max_samples (one compiled update).
    sizes = {} if s.engine == "static" else {"group_size": g}
    return self._sample(
      examples,
      key,
      prompt_ids=ids,
      num_samples=g if np.all(counts == g) else counts,
      temperature=self._temperature,
      top_k=s.top_k,
      top_p=s.top_p,
      budget=settings.get("max_new_tokens"),
      **sizes,
    )

  def _feedback(self, scored) -> None:
    """Tell the prompt sampler how the rollout scored (every process the
    same global batch)."""
    r = scored.rollout
    p, g, _ = r.tokens_PGT.shape
    local = (
      np.asarray(scored.prompt_ids_P, np.int64),
      np.asarray(scored.rewards_PG, np.float32),
      np.asarray(scored.scores.values_NK)[:, 0].reshape(p, g) > 0,
      np.asarray(r.mask_PGT).sum(-1).astype(np.int32),
      np.asarray(r.sample_mask_PG) > 0,
    )
    ids, rewards, correct, lengths, valid = _hosts.gather_rows(
      local, self.mesh, self.config.train.prompts_per_step
    )
    self.prompt_state = self.prompt_sampler.update(
      self.prompt_state,
      selection.Feedback(
        prompt_ids=ids,
        rewards=np.where(valid, rewards, 0.0),
        correct=correct & valid,
        lengths=np.where(valid, lengths, 0),
        valid=valid,
        step=self._step,
      ),
    )

  def _global(self, tree):
    """Global arrays from this process's rows of a training batch."""
    return _hosts.to_global(tree, self.mesh, self.config.train.prompts_per_step)

  def _step_batch(self, scored, seqs) -> Batch:
    """The batch the algorithm prepares: the rollout's, the old policy's
    fields and, for ReMax, the greedy baseline."""
    batch = self._with_old(self._raw_batch(scored), seqs)
    if self.needs["baseline_rewards_P"]:
      batch = batch._replace(baseline_rewards_P=self._greedy_rewards(scored))
    return batch

  def _raw_batch(self, scored) -> Batch:
    """The global batch of a scored rollout (this process's rows)."""
    r = scored.rollout
    p, g, _ = r.tokens_PGT.shape
    batch = Batch(
      mask_PGT=np.asarray(r.mask_PGT, np.float32),
      rewards_PG=np.asarray(scored.rewards_PG),
      rewards_PGK=np.asarray(scored.scores.values_NK).reshape(p, g, -1),
      rollout_logp_PGT=np.asarray(r.logp_PGT),
      truncated_PG=np.asarray(r.truncated_PG),
      sample_mask_PG=None
      if np.all(r.sample_mask_PG)
      else np.asarray(r.sample_mask_PG, np.float32),
      prompt_ids_P=scored.prompt_ids_P,
      tokens_PGT=np.asarray(r.tokens_PGT, np.int32),
    )
    if self.annotate is not None:
      batch = batch._replace(extra=_rollout.annotations(self.annotate, scored))
    if scored.streams_PG is not None:
      streams = np.asarray(scored.streams_PG)
      batch = batch.with_extra(
        stream_PG=streams,
        from_stream_PG=(streams == rollouts.EXPLORE).astype(np.float32),
      )
    if scored.extra:
      batch = batch.with_extra(**scored.extra)
      if "loss_mask_PGT" in scored.extra:  # agent episodes: actions only
        batch = batch._replace(
          mask_PGT=batch.mask_PGT * np.asarray(scored.extra["loss_mask_PGT"])
        )
    return self._global(batch)

  def _fill(self, prompts, key):
    """A rollout batch, refilled while the algorithm's filters drop groups.

    Kept groups come first; when ``max_refills`` runs out the batch is
    completed with dropped groups, which the filter masks out again. Each
    process fills its own rows; all refill until every process is full
    (sampling is a collective, so they must agree on the count).
    """
    p = len(self.rows)
    pool, kept, dropped = [], [], []
    for attempt in range(self.config.train.max_refills + 1):
      if attempt:
        prompts = self._next_prompts()
      key_attempt = jax.random.fold_in(key, attempt)
      scored = self._train_sample(prompts, key_attempt)
      self._feedback(scored)
      batch = self._with_old(self._raw_batch(scored))
      keep = _hosts.to_local(
        self._keep(batch, self.state.policy.algo_state, key_attempt),
        self.mesh,
      )
      offset = sum(len(s.prompts) for s in pool)
      pool.append(scored)
      kept += [offset + i for i in np.flatnonzero(keep)]
      dropped += [offset + i for i in np.flatnonzero(keep == 0)]
      if not _hosts.process_sum(np.int32(len(kept) < p)):
        break
    order = np.asarray((kept + dropped)[:p])
    return _rollout.take_groups(pool, order), attempt, min(len(kept), p)

  def _with_old(self, batch: Batch, seqs=None) -> Batch:
    """Old, reference and value estimates the algorithm reads."""
    if seqs is None:  # filter pass: stand-ins (filters read rewards only)
      zeros = jnp.zeros(batch.mask_PGT.shape)
      return batch._replace(
        baseline_rewards_P=zeros[:, 0, 0]
        if self.needs["baseline_rewards_P"]
        else None,
        old_logp_PGT=batch.rollout_logp_PGT,
        old_values_PGT=zeros if self.needs["old_values_PGT"] else None,
        ref_logp_PGT=zeros if self.needs["ref_logp_PGT"] else None,
        old_entropy_PGT=zeros if self.needs["old_entropy_PGT"] else None,
        teacher_logp_PGT=zeros if self.needs["teacher_logp_PGT"] else None,
      ).with_extra(
        **{
          r.name: {"completion": zeros, "prompt": zeros[:, 0, 0]}.get(
            r.span, zeros[..., 0]
          )
          for r in self.algorithm.rescores
        }
      )
    teacher = None if self.teacher is None else self.teacher[1]
    scores = dict(self._score(self._temperature)(self.state, teacher, seqs))
    return batch._replace(**scores.pop("fields")).with_extra(**scores)

  def _update_at(self, temperature: float):
    """The jitted update whose log-probs are at `temperature` (the run's,
    or a stage's: one compile per value, kept by this trainer)."""
    key = ("update", float(temperature))
    if key not in self._compiled:
      self._compiled[key] = self._build_update(temperature)
    return self._compiled[key]

  def _score(self, temperature: float):
    """Jitted log-probs / values of the sequences under current weights,
    at the sampling `temperature` (one compile per value)."""
    key = ("score", float(temperature))
    if key not in self._compiled:
      self._compiled[key] = self._build_score(temperature)
    return self._compiled[key]

  def _build_update(self, temperature: float):
    spec = self.spec._replace(temperature=float(temperature))
    return jax.jit(
      functools.partial(update, self.models, self.algorithm, spec),
      in_shardings=(self.shardings, None, None, None),
      out_shardings=(self.shardings, None),
      donate_argnums=0,
    )

  def _build_score(self, temperature: float):
    width = self.config.sampler.max_new_tokens
    schedule = self.config.model.logprob_schedule
    grouper = self.config.model.prefix_grouper
    t = self.config.train
    # On-policy (one optimizer step per batch) the loss's own detached
    # log-probs are the behaviour policy's; a forward pass computes them
    # only when a batch stage reads them (importance weights against the
    # sampler, KL in the reward).
    old_needed = t.epochs * t.minibatches > 1 or self.needs["old_logp_PGT"]
    models, needs = self.models, self.needs
    teacher_graph = None if self.teacher is None else self.teacher[0]
    rescores = self.algorithm.rescores

    @jax.jit
    def score(state, teacher, seqs):
      out = {}
      logp = functools.partial(
        completion_logprobs,
        seqs=seqs,
        width=width,
        temperature=temperature,
        schedule=schedule,
        prefix_grouper=grouper,
      )
      weights = {
        "policy": (models.policy, state.policy.params),
        "reference": (
          models.policy,
          _lora.with_trainable(state.policy.params, state.reference),
        ),
        "teacher": (teacher_graph, teacher),
      }
      # The stages' own passes (`rljax.Rescore`), into Batch.extra.
      extra = {
        r.name: rescore(
          r,
          *weights[r.model],
          seqs,
          width,
          schedule=schedule,
          prefix_grouper=grouper,
        )
        for r in rescores
      }
      if old_needed or needs["old_entropy_PGT"]:
        old, entropy = logp(nnx.merge(models.policy, state.policy.params))
        out["old_entropy_PGT"] = entropy
        if old_needed:
          out["old_logp_PGT"] = old
      if needs["ref_logp_PGT"]:
        ref = _lora.with_trainable(state.policy.params, state.reference)
        out["ref_logp_PGT"] = logp(nnx.merge(models.policy, ref))[0]
      if needs["old_values_PGT"]:
        critic = nnx.merge(models.value, state.value.params)
        out["old_values_PGT"] = completion_values(critic, seqs, width)
      if needs["teacher_logp_PGT"]:
        out["teacher_logp_PGT"] = logp(nnx.merge(teacher_graph, teacher))[0]
      return {"fields": out, **extra}

    return score

  def step(self, step: int) -> dict[str, float]:
    """One RL iteration; returns its metrics as floats."""
    key = jax.random.fold_in(jax.random.key(self.config.train.seed), step)
    start = time.perf_counter()
    self._step = step
    if step in self.config.train.reference_resets:
      self._reset_reference()
    prompts = self._next_prompts()
    scored, refills, num_kept = self._fill(prompts, jax.random.fold_in(key, 0))
    seqs = self._global(_rollout.sequences(scored.rollout))
    batch = self._step_batch(scored, seqs)
    batch, algo_state = self._prepare(
      batch, self.state.policy.algo_state, jax.random.fold_in(key, 2)
    )
    self.state = self.state._replace(
      policy=self.state.policy._replace(algo_state=algo_state)
    )
    batch = jax.tree.map(
      lambda x: jax.device_put(x, sharding.batch_sharding(self.mesh, x.ndim)),
      batch,
    )
    self.state, metrics = self._update_at(self._temperature)(
      self.state, seqs, batch, jax.random.fold_in(key, 1)
    )
    out = {k: float(v) for k, v in jax.device_get(finalize(metrics)).items()}
    self._check_finite(step, out)
    # Summary names the progress bar and plots show.
    out["kl"] = out.get("kl_ref", out.get("kl_old", 0.0))
    out["clip_frac"] = out.get("clip_frac_low", 0.0) + out.get(
      "clip_frac_high", 0.0
    )
    out.update(self._rollout_metrics(scored, refills, num_kept))
    out["seconds"] = time.perf_counter() - start
    self._last = scored
    return out

  def reference_params(self):
    """The reference policy's whole `nnx.State` (with LoRA: the policy's
    frozen base with the reference's adapters, zero unless reset)."""
    return _lora.with_trainable(self.state.policy.params, self.state.reference)

  def _reset_reference(self) -> None:
    """The reference policy becomes a copy of the current one
    (``train.reference_resets``); part of the state, so checkpointed."""
    self.state = self.state._replace(
      reference=jax.tree.map(
        jnp.copy, _lora.trainable(self.state.policy.params)
      )
    )

  def _check_finite(self, step: int, metrics: dict[str, float]) -> None:
    """Stop, or count a skip, when the update met a NaN or an infinity.

    The update itself never applies such a step (`rljax.training.update`);
    here ``train.nonfinite`` decides whether the run goes on.
    """
    if not metrics.get("skipped_updates"):
      self._skipped_in_a_row = 0
      metrics["skipped_updates"] = float(self.skipped_updates)
      return
    t = self.config.train
    cause = " and ".join(
      what for key, what in NONFINITE_CAUSES.items() if metrics.get(key)
    )
    self.skipped_updates += 1
    self._skipped_in_a_row += 1
    metrics["skipped_updates"] = float(self.skipped_updates)
    advice = (
      f"Likely causes: a learning rate too high (optim.learning_rate="
      f"{self.config.optim.learning_rate}), extreme rewards or advantages, or"
      " a custom objective's NaN. The update was not applied and no"
      " checkpoint holds it; resume from the last checkpoint with a lower"
      " optim.learning_rate"
    )
    if t.nonfinite == "stop":
      raise NonFiniteError(
        f"step {step + 1}: {cause} held a NaN or an infinity. {advice}, or"
        " set train.nonfinite=skip to skip such updates."
      )
    logging.getLogger("rljax").warning(
      "step %d: %s held a NaN or an infinity; the update was skipped"
      " (%d in a row, %d in all).",
      step + 1,
      cause,
      self._skipped_in_a_row,
      self.skipped_updates,
    )
    if self._skipped_in_a_row >= t.max_skipped_updates:
      raise NonFiniteError(
        f"step {step + 1}: {self._skipped_in_a_row} updates in a row were"
        f" skipped because {cause} held a NaN or an infinity"
        f" (train.max_skipped_updates={t.max_skipped_updates}). {advice}."
      )

  def _greedy_rewards(self, scored) -> jax.Array:
    """ReMax's baseline: the reward of each prompt's greedy completion."""
    greedy = self._sample(scored.examples, jax.random.key(0), greedy=True)
    return self._global(greedy.rewards_PG[:, 0])

  def _rollout_metrics(self, scored, refills, num_kept) -> dict[str, float]:
    """Means over every process's samples (sums over processes / counts)."""
    values = np.asarray(scored.scores.values_NK)
    mask = np.asarray(scored.rollout.mask_PGT)
    valid = np.asarray(scored.rollout.sample_mask_PG).reshape(-1) > 0
    n = int(valid.sum())  # samples (a prompt may have fewer than G)
    sums = {
      "reward": np.sum(np.asarray(scored.rewards_PG).reshape(-1)[valid]),
      # A task's first reward is its correctness check.
      "accuracy": np.sum(values[valid, 0] > 0),
      "response_length": mask.sum(),
      "truncated": np.sum(scored.rollout.truncated_PG),
      # Fractions and means weighted by n like the sums above, so that one
      # count divides everything; kept_groups becomes a count below.
      "kept_groups": num_kept * n / len(self.rows),
      **{k: v * n for k, v in scored.scores.metrics.items()},
    }
    sums = {k: np.float64(v) for k, v in sums.items()}
    total = _hosts.process_sum({"count": np.float64(n), **sums})
    out = {k: float(total[k] / total["count"]) for k in sums}
    out["kept_groups"] *= self.config.train.prompts_per_step
    out["tokens"] = float(total["response_length"])
    out["samples"] = float(total["count"])
    out["refills"] = float(refills)
    return out

  def dry_run(self) -> dict[str, Any]:
    """Compile the update at the run's full shapes, run one step, and report
    the compiled program's memory (XLA's analysis) and the step time."""
    start = time.perf_counter()
    metrics = self.step(self.start_step)
    seqs = self._global(_rollout.sequences(self._last.rollout))
    batch = self._step_batch(self._last, seqs)
    batch, _ = self._prepare(
      batch, self.state.policy.algo_state, jax.random.key(0)
    )
    compiled = self._update.lower(
      self.state, seqs, batch, jax.random.key(0)
    ).compile()
    return self._dry_run_report(start, compiled, metrics)

  def _dry_run_report(self, start, compiled, metrics) -> dict[str, Any]:
    """The dry run's figures: time since `start`, the compiled update's
    memory (XLA's analysis), the parameter count and the step's metrics."""
    memory = compiled.memory_analysis()
    mib = lambda n: round(n / 2**20, 2)  # noqa: E731
    return {
      "step_seconds_with_compile": round(time.perf_counter() - start, 2),
      "update_temp_mib": mib(memory.temp_size_in_bytes),
      "update_argument_mib": mib(memory.argument_size_in_bytes),
      "update_output_mib": mib(memory.output_size_in_bytes),
      "parameters": int(
        sum(x.size for x in jax.tree.leaves(self.state.policy.params))
      ),
      "train_state_mib": self._state_mib(),
      "metrics": metrics,
    }

  def _state_mib(self) -> dict[str, float]:
    """MiB of each part of the train state (global, not per device)."""
    s = self.state
    parts = {
      "params": s.policy.params,
      "optimizer": s.policy.opt_state,
      "reference": s.reference,
      "value": s.value,
    }
    mib = {k: _precision.tree_bytes(v) / 2**20 for k, v in parts.items()}
    mib["total"] = sum(mib.values())
    return {k: round(v, 3) for k, v in mib.items()}

  # --- evaluation -----------------------------------------------------------

  def evaluate(self, *, num_prompts: Optional[int] = None) -> dict[str, float]:
    """Greedy accuracy on held-out prompts (+ pass@k when eval_samples > 1).

    The prompts are padded (repeating the last) to a multiple of the
    mesh's batch axes and split over processes like a training batch; the
    padding is not counted.
    """
    t = self.config.train
    n = min(num_prompts or t.eval_prompts, len(self.task.test))
    shards = math.prod(self.mesh.shape[a] for a in sharding.BATCH_AXES)
    padded = -(-n // shards) * shards
    rows = _hosts.own_rows(self.mesh, padded)
    examples = [self.task.test[min(int(i), n - 1)] for i in rows]
    real = (rows < n).astype(np.float64)
    key = jax.random.key(t.seed + 7)
    sample = functools.partial(self._sample, examples, key, global_rows=padded)
    if isinstance(self.groups, envs.EpisodeRollouts):  # agent episodes
      every = [self.task.test[min(i, n - 1)] for i in range(padded)]
      sample = functools.partial(self._episodes, every, key)
    greedy = sample(greedy=True)
    correct = greedy.scores.values_NK[:, 0] > 0
    sums = {"count": real.sum(), "eval_accuracy": (correct * real).sum()}
    for name, values in _episode_metrics(greedy).items():
      sums[f"eval_{name}"] = (values * real).sum()
    if t.eval_samples > 1:
      sampled = sample(
        num_samples=t.eval_samples,
        temperature=self.config.sampler.temperature,
      )
      right = (sampled.scores.values_NK[:, 0] > 0).reshape(len(rows), -1)
      for k in sorted({1, t.eval_samples}):
        passed = monitoring.pass_at_k(t.eval_samples, right.sum(-1), k)
        sums[f"eval_pass@{k}"] = (np.asarray(passed) * real).sum()
    total = _hosts.process_sum(sums)
    return {
      k: float(v / total["count"]) for k, v in total.items() if k != "count"
    }

  # --- the loop -------------------------------------------------------------

  def run(self, *, steps: Optional[int] = None) -> dict[str, Any]:
    """Train up to ``train.steps`` (or `steps` more); returns a summary.

    Holds the output directory's run lock throughout. A resumed run first
    drops the log records after its checkpoint's step (``metrics.jsonl``,
    ``rollouts.jsonl``; TensorBoard purges them), so repeated steps appear
    once. Pending checkpoint saves finish even when a step raises.
    """
    with self._locked():
      if self._writer:
        for name in ("metrics.jsonl", "rollouts.jsonl"):
          _run_dir.truncate_jsonl(self.directory / name, self.start_step)
      logger = monitoring.MetricsLogger(
        self.directory,
        tensorboard=self.config.output.tensorboard,
        wandb=self.config.output.wandb,
        purge_step=self.start_step + 1 if self.start_step else None,
      )
      try:
        return self._run(logger, steps)
      finally:
        logger.close()
        if self.checkpointer is not None:
          self.checkpointer.wait()

  def _run(self, logger, steps: Optional[int]) -> dict[str, Any]:
    c = self.config
    end = c.train.steps if steps is None else self.start_step + steps
    rollouts = monitoring.RolloutWriter(
      self.directory / "rollouts.jsonl", every=max(c.output.rollouts_every, 1)
    )
    before = self.evaluate()
    logger.log(self.start_step, before)
    bar = monitoring.ProgressBar(
      total=end, initial=self.start_step, keys=self.PROGRESS_KEYS
    )
    history = []
    for step in range(self.start_step, end):
      metrics = self.step(step)
      if c.train.eval_every and (step + 1) % c.train.eval_every == 0:
        metrics.update(self.evaluate())
      history.append({"step": step + 1, **metrics})
      logger.log(step + 1, metrics)
      bar.update(step + 1, metrics)
      if c.output.rollouts_every:
        self._write_rollouts(rollouts, step + 1)
      if self.checkpointer is not None:
        self.save(step + 1)
    bar.close()
    after = self.evaluate()
    logger.log(end, after)
    if self.checkpointer is not None:
      self.save(end, force=True)
      self.checkpointer.wait()
    plot = None
    if c.output.plot and self._writer:
      plot = monitoring.plot_learning_curves(
        self.directory / "metrics.jsonl",
        self.directory / "learning_curves.png",
        keys=self.PLOT_KEYS,
      )
    self.start_step = end
    return {"before": before, "after": after, "history": history, "plot": plot}

  def _write_rollouts(self, writer, step: int) -> None:
    scored = self._last
    g = scored.rewards_PG.shape[1]
    writer.maybe_write(
      step,
      [p for p in scored.prompts for _ in range(g)],
      scored.completions,
      np.asarray(scored.scores.total_N),
    )
