"""What every run shares: the run loop around a run kind's `step`.

A `Runner` builds, from a `RunConfig`, what every kind of run needs: the
mesh, the task, the policy and tokenizer (a frozen teacher when the run
reads one), the sharded train state (restored from the newest intact
checkpoint, or warm-started), the prompt sampler whose state is the data
position, the sampler that evaluates the policy; and it runs the loop: the
run lock, log records, evaluation, the progress bar, checkpoints, the plot,
and a dry run. A run kind is a subclass that says which batch fields it
reads (`_needs`), builds its programs (extending `_build`) and implements
`step`: the RL loop (`rljax.training.Trainer`) and the post-training runs
(`rljax.posttrain`) are such pieces; none is a subclass of another.

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

Multi-host runs start the same runner on every host (after
`jax.distributed.initialize`; the CLI does it). Each process handles the
rows its devices hold (`_hosts`), summaries are summed over processes, and
only process 0 writes logs, rollouts and plots.
"""

import abc
from collections.abc import Sequence
import contextlib
import functools
import pathlib
import time
from typing import Any, Optional

from flax import nnx
import jax
import jax.numpy as jnp

from rljax import envs
from rljax import monitoring
from rljax import selection
from rljax import sharding
from rljax import tasks
from rljax._src.errors import UserError
from rljax.models import _lora
from rljax.training import _build
from rljax.training import _hosts
from rljax.training import _run_dir
from rljax.training import _trainer_report
from rljax.training import _trainer_resume
from rljax.training import _trainer_rollouts
from rljax.training import _trainer_setup
from rljax.training import _warm_start
from rljax.training._config import RunConfig
from rljax.training._step import Models
from rljax.training._trainer_setup import from_config
from rljax.training._validate import validate


class Runner(abc.ABC):
  """One run of some kind: build everything from a `RunConfig`, then
  `run()`.

  Resumes from the latest intact checkpoint in the checkpoint directory
  when there is one (``resume=False`` starts over, moving a previous run in
  the output directory aside). ``allow_changes`` lists config fields
  (fnmatch patterns) that may differ from the checkpoint's when resuming,
  besides `RESUMABLE_CHANGES`.

  Parts built in code replace what the config names: ``task`` (a
  `rljax.tasks.Task`), ``rewards`` (``[(name, fn, weight), ...]``),
  ``teacher`` (a frozen `nnx` model with the policy's vocabulary, read when
  the run needs its log-probs), ``prompts`` (a `rljax.selection.
  PromptSampler`: which records or prompts each step takes; its state is
  checkpointed) and ``groups`` (a `rljax.rollouts.GroupStrategy`).

  Subclasses set `KIND` (the config's ``kind``) and implement `step`,
  `_compiled_step` and `_write_rollouts`.
  """

  KIND = ""
  # Metrics the progress bar and the learning-curve plot show.
  PROGRESS_KEYS = _trainer_report.PROGRESS_KEYS
  PLOT_KEYS = _trainer_report.PLOT_KEYS

  def __init__(
    self,
    config: RunConfig,
    *,
    resume: bool = True,
    task: Optional[tasks.Task] = None,
    rewards: Optional[Sequence[tuple]] = None,
    teacher: Optional[nnx.Module] = None,
    prompts: Optional[selection.PromptSampler] = None,
    groups=None,
    allow_changes: Sequence[str] = (),
  ):
    self.config = c = validate(config)
    if c.kind != self.KIND:
      raise UserError(
        f"kind={c.kind!r}, but {type(self).__name__} runs kind={self.KIND!r};"
        " build the run with rljax.posttrain.run_for(config)(config) (the"
        " CLI does)."
      )
    self.mesh, rollout_mesh = _trainer_setup.run_meshes(c)
    _trainer_setup.check_sizes(c, self.mesh, rollout_mesh)
    # Where the policy samples: its own mesh (``sampler.mesh``) or the
    # update's.
    self.rollout_mesh = rollout_mesh or self.mesh
    self._twin = None  # `to_rollout_mesh`'s staging mesh (several processes)
    self.allow_changes = (*_trainer_resume.RESUMABLE_CHANGES, *allow_changes)
    self.directory = pathlib.Path(c.output.directory)
    self._writer = jax.process_index() == 0  # logs, rollouts, plots
    self.prompt_sampler = _trainer_setup.prompt_sampler(c, prompts)
    self.groups = _trainer_setup.group_strategy(c, groups)
    with self._locked():
      self._build(resume, task, rewards, teacher)

  def _locked(self):
    """The output directory's run lock (see `_run_dir.lock`)."""
    return _run_dir.lock(self.directory, active=self._writer)

  # --- what a run kind says -------------------------------------------------

  @abc.abstractmethod
  def step(self, step: int) -> dict[str, float]:
    """One step of the run; returns its metrics as floats."""

  def _algorithm(self):
    """The RL algorithm whose state the train state carries (None: the
    run's objective is its own)."""
    return None

  def _needs(self) -> dict[str, bool]:
    """Which batch fields the run reads (and so which models it keeps)."""
    return dict.fromkeys(_trainer_setup.NEEDED_FIELDS, False)

  def _rescored(self) -> set[str]:
    """The models a stage's own log-prob passes read (`rljax.Rescore`)."""
    return set()

  def _metadata(self) -> dict[str, Any]:
    """What a checkpoint keeps besides the state (JSON-able)."""
    return {}

  @abc.abstractmethod
  def _write_rollouts(self, writer, step: int) -> None:
    """Write the step's rollouts to `writer` (a `monitoring.RolloutWriter`;
    a run that samples nothing writes none)."""

  def dry_run(self) -> dict[str, Any]:
    """One step at the run's shapes, timed, and the memory of the compiled
    program that dominates it (XLA's analysis)."""
    start = time.perf_counter()
    metrics = self.step(self.start_step)
    compiled = self._compiled_step()
    return _trainer_report.dry_run_report(start, compiled, metrics, self.state)

  @abc.abstractmethod
  def _compiled_step(self):
    """The compiled program of the last step (for `dry_run`)."""

  def _quiet(self):
    """A context in which this thread may launch programs on any device in
    the same order on every process (evaluation, checkpoint barriers): a
    run kind with work of its own beside the steps (an asynchronous
    producer on several processes) holds it there."""
    return contextlib.nullcontext()

  # --- building -------------------------------------------------------------

  def _build(self, resume, task, rewards, teacher) -> None:
    """Everything from the config (or the parts given in code); restores or
    warm-starts the policy. A run kind extends it with its programs."""
    c = self.config
    checkpoints = (
      c.output.checkpoint_directory or self.directory / "checkpoints"
    )
    if not resume:
      _trainer_resume.clear_previous_run(
        self.directory, checkpoints, writer=self._writer
      )
    # The rows of each global batch of prompts this process handles.
    self.rows = _hosts.own_rows(self.mesh, c.train.prompts_per_step)
    self.task = _trainer_setup.run_task(c, task, rewards)
    model, critic = self._build_models(teacher)
    self._build_sampling()
    self._step = 0
    self._temperature = c.sampler.temperature  # the step's (stages)
    self.start_step = 0
    self.skipped_updates = 0  # non-finite updates skipped (train.nonfinite)
    self._skipped_in_a_row = 0
    # Made before the warm start: an unwritable checkpoint directory fails
    # now, and a resumed run restores instead of warm-starting again.
    self.checkpointer = _trainer_setup.checkpointer(c, checkpoints)
    resuming = resume and bool(
      self.checkpointer and self.checkpointer.all_steps()
    )
    self.warm_start_losses = []
    if not resuming:
      self.warm_start_losses = _warm_start.warm_start_model(
        model, self.task, self.tokenizer, c
      )
    self._build_state(model, critic)
    if resuming:
      self._restore()

  def _build_models(self, teacher):
    """The policy and tokenizer, the algorithm and the fields it reads, the
    placed teacher and the models' graphs; returns (policy, critic or
    None)."""
    c = self.config
    model, self.tokenizer = from_config(
      "model", _build.build_policy, c.model, self.task.alphabet, c.train.seed
    )
    self.algorithm = self._algorithm()
    self.needs = self._needs()
    if teacher is None and c.teacher is not None:
      teacher, _ = from_config(
        "teacher", _build.build_policy, c.teacher, self.task.alphabet, 0
      )
    self.teacher = _build.place_teacher(
      teacher,
      model,
      self.needs["teacher_logp_PGT"] or "teacher" in self._rescored(),
      self.mesh,
    )
    critic = (
      _build.value_model_like(model) if self.needs["old_values_PGT"] else None
    )
    opt = _build.optimizer(c.optim)
    self.models = Models(
      policy=nnx.graphdef(model),
      value=None if critic is None else nnx.graphdef(critic),
      optimizer=opt,
      value_optimizer=None if critic is None else opt,
    )
    return model, critic

  def _build_sampling(self) -> None:
    """The prompt sampler and group strategy, prepared for the task, their
    states, and the policy's sampler."""
    c = self.config
    self.prompt_sampler = from_config(
      "sampler.prompts", self.prompt_sampler.prepare, self.task.train
    )
    self.groups_state = None
    if self.groups is None and self.task.environment is not None:
      self.groups = envs.EpisodeRollouts()  # an interactive task
    if self.groups is not None:
      self.groups = _trainer_setup.bind_groups(
        c, self.groups, self.task, self.tokenizer
      )
      self.groups_state = self.groups.init()
    self.prompt_state = self.prompt_sampler.init(
      len(self.task.train), c.train.seed
    )
    self._sampling = _trainer_rollouts.RunSampler(
      c, self.tokenizer, self.task, self.rollout_mesh, self.groups
    )

  def _build_state(self, model, critic) -> None:
    """The sharded train state of the (warm-started) policy."""
    # LoRA adapters go onto the (warm-started) base; the policy's structure
    # then includes them.
    model = _build.adapt(model, self.config.model)
    self.models = self.models._replace(policy=nnx.graphdef(model))
    self.state, self.shardings = _build.init_state(
      model,
      reference=self.needs["ref_logp_PGT"] or "reference" in self._rescored(),
      critic=critic,
      models=self.models,
      algorithm=self.algorithm,
      mesh=self.mesh,
    )
    _trainer_setup.check_reference_resets(self.config, self.state)
    _build.check_prompt_tables(
      self.state.policy.algo_state, len(self.task.train)
    )

  # --- checkpoints ----------------------------------------------------------

  def _restore(self) -> dict[str, Any]:
    """Resume from the newest intact checkpoint, if its config matches;
    returns the checkpoint's metadata (`_metadata` kept a run kind's)."""
    restored = _trainer_resume.restore(
      self.checkpointer, self.state, self.config, self.allow_changes
    )
    metadata = restored.metadata or {}
    self.state = restored.state
    if metadata.get("groups_state") is not None:
      self.groups_state = metadata["groups_state"]
    self.prompt_state = _trainer_resume.restored_prompt_state(
      metadata, self.prompt_state, self.config.train.prompts_per_step
    )
    self.start_step = restored.step
    self.skipped_updates = int(metadata.get("skipped_updates", 0))
    return metadata

  def save(self, step: int, *, force: bool = False) -> None:
    """Checkpoint the state and the data position after `step` steps.

    Raises:
      NonFiniteError: the state holds a NaN or an infinity (an algorithm
        state made non-finite in `prepare`); nothing is written.
    """
    if self.checkpointer is None:
      return
    _trainer_resume.check_savable(self.state, step)
    # The prompt sampler's state is the same on every process, so it goes
    # in the metadata: a checkpoint resumes on any number of hosts.
    metadata = {
      "config": _trainer_resume.config_json(self.config),
      "prompt_state": self.prompt_state,
      "groups_state": self.groups_state,
      "skipped_updates": self.skipped_updates,
      **self._metadata(),
    }
    with self._quiet():  # orbax's barriers run on every device
      self.checkpointer.save(step, self.state, metadata=metadata, force=force)

  # --- the policy -----------------------------------------------------------

  def policy(self):
    """The current policy as an `nnx` module (for sampling, evaluation)."""
    return nnx.merge(self.models.policy, self.state.policy.params)

  def _sampling_policy(self):
    """The current policy, on the mesh it samples on."""
    params = self.to_rollout_mesh(self.state.policy.params)
    return nnx.merge(self.models.policy, params)

  def to_rollout_mesh(self, params, shardings=None):
    """`params` (the policy's) placed on the rollout mesh: themselves when
    the run samples on the update's mesh, else a resharding transfer (to
    `shardings` on it; default: the policy's). With several processes it
    never runs a program on the rollout devices (`_hosts.transfer`)."""
    if self.rollout_mesh is self.mesh:
      return params
    if shardings is None:
      shardings = sharding.param_shardings(params, self.rollout_mesh)
    if jax.process_count() == 1:
      return jax.device_put(params, shardings)
    if self._twin is None:
      self._twin = _hosts.twin_mesh(self.mesh, self.rollout_mesh)
    return _hosts.transfer(params, shardings, self._twin)

  def _sample(self, examples, key, **kwargs):
    """Sample and score this process's `examples` with the current policy
    (`_trainer_rollouts.RunSampler.sample`)."""
    policy = self._sampling_policy()
    return self._sampling.sample(policy, examples, key, **kwargs)

  def _episodes(self, examples, key, **kwargs):
    """Agent episodes of the global `examples` with the current policy
    (`_trainer_rollouts.RunSampler.episodes`); this process's rows."""
    policy = self._sampling_policy()
    return self._sampling.episodes(policy, examples, key, **kwargs)

  def _global(self, tree):
    """Global arrays from this process's rows of a training batch."""
    return _hosts.to_global(tree, self.mesh, self.config.train.prompts_per_step)

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
    self.skipped_updates += 1
    self._skipped_in_a_row += 1
    metrics["skipped_updates"] = float(self.skipped_updates)
    _trainer_report.stop_or_warn(
      self.config, step, metrics, self._skipped_in_a_row, self.skipped_updates
    )

  # --- evaluation -----------------------------------------------------------

  def evaluate(self, *, num_prompts: Optional[int] = None) -> dict[str, float]:
    """Greedy accuracy on held-out prompts (+ pass@k when eval_samples > 1).

    The prompts are padded (repeating the last) to a multiple of the
    mesh's batch axes and split over processes like a training batch; the
    padding is not counted.
    """
    with self._quiet():
      return self._evaluate(num_prompts)

  def _evaluate(self, num_prompts: Optional[int]) -> dict[str, float]:
    t = self.config.train
    n = min(num_prompts or t.eval_prompts, len(self.task.test))
    rows, padded = _trainer_report.eval_rows(self.rollout_mesh, n)
    key = jax.random.key(t.seed + 7)
    if isinstance(self.groups, envs.EpisodeRollouts):  # agent episodes
      every = [self.task.test[min(i, n - 1)] for i in range(padded)]
      sample = functools.partial(self._episodes, every, key)
    else:
      examples = [self.task.test[min(int(i), n - 1)] for i in rows]
      sample = functools.partial(
        self._sample, examples, key, global_rows=padded
      )
    return _trainer_report.eval_metrics(
      sample, rows < n, t.eval_samples, self.config.sampler.temperature
    )

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
          with self._quiet():
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
      with self._quiet():
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
