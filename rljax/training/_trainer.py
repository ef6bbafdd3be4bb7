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
import functools
import pathlib
import time
from typing import Any, Optional

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from rljax import envs
from rljax import monitoring
from rljax import rollouts
from rljax import selection
from rljax import sharding
from rljax import tasks
from rljax._src.base import Algorithm
from rljax._src.base import Batch
from rljax._src.base import finalize
from rljax._src.errors import UserError
from rljax.models import _lora
from rljax.training import _build
from rljax.training import _hosts
from rljax.training import _rollout
from rljax.training import _run_dir
from rljax.training import _trainer_batch
from rljax.training import _trainer_report
from rljax.training import _trainer_resume
from rljax.training import _trainer_rollouts
from rljax.training import _trainer_setup
from rljax.training import _warm_start
from rljax.training._config import RunConfig
from rljax.training._step import Models
from rljax.training._trainer_setup import from_config
from rljax.training._validate import validate
from rljax.transforms import kept_groups


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
  PROGRESS_KEYS = _trainer_report.PROGRESS_KEYS
  PLOT_KEYS = _trainer_report.PLOT_KEYS

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
    self.mesh = _trainer_setup.run_mesh(c.train.mesh)
    _trainer_setup.check_sizes(c, self.mesh)
    self.allow_changes = (*_trainer_resume.RESUMABLE_CHANGES, *allow_changes)
    self.directory = pathlib.Path(c.output.directory)
    self._writer = jax.process_index() == 0  # logs, rollouts, plots
    self.annotate = annotate
    self.prompt_sampler = _trainer_setup.prompt_sampler(c, prompts)
    self.groups = _trainer_setup.group_strategy(c, groups)
    with self._locked():
      self._build(resume, algorithm, task, rewards, teacher)

  def _locked(self):
    """The output directory's run lock (see `_run_dir.lock`)."""
    return _run_dir.lock(self.directory, active=self._writer)

  # --- building -------------------------------------------------------------

  def _build(self, resume, algorithm, task, rewards, teacher) -> None:
    """Everything from the config (or the parts given in code); restores or
    warm-starts the policy."""
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
    model, critic = self._build_models(algorithm, teacher)
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
    self._build_programs()

  def _build_models(self, algorithm, teacher):
    """The policy and tokenizer, the algorithm and the fields it reads, the
    placed teacher and the models' graphs; returns (policy, critic or
    None)."""
    c = self.config
    model, self.tokenizer = from_config(
      "model", _build.build_policy, c.model, self.task.alphabet, c.train.seed
    )
    self.algorithm = algorithm or _trainer_setup.algorithm(c)
    self.needs = self._needs()
    if teacher is None and c.teacher is not None:
      teacher, _ = from_config(
        "teacher", _build.build_policy, c.teacher, self.task.alphabet, 0
      )
    # A stage's own log-prob passes (`rljax.Rescore`) may need a model too.
    rescored = _trainer_setup.rescored_models(self.algorithm)
    self.teacher = _build.place_teacher(
      teacher,
      model,
      self.needs["teacher_logp_PGT"] or "teacher" in rescored,
      self.mesh,
    )
    critic = (
      _build.value_model_like(model) if self.needs["old_values_PGT"] else None
    )
    _trainer_setup.check_policy(c, self.algorithm, model)
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
      c, self.tokenizer, self.task, self.mesh, self.groups
    )

  def _build_state(self, model, critic) -> None:
    """The sharded train state of the (warm-started) policy."""
    # LoRA adapters go onto the (warm-started) base; the policy's structure
    # then includes them.
    model = _build.adapt(model, self.config.model)
    self.models = self.models._replace(policy=nnx.graphdef(model))
    rescored = _trainer_setup.rescored_models(self.algorithm)
    self.state, self.shardings = _build.init_state(
      model,
      reference=self.needs["ref_logp_PGT"] or "reference" in rescored,
      critic=critic,
      models=self.models,
      algorithm=self.algorithm,
      mesh=self.mesh,
    )
    _trainer_setup.check_reference_resets(self.config, self.state)
    _build.check_prompt_tables(
      self.state.policy.algo_state, len(self.task.train)
    )

  def _build_programs(self) -> None:
    """The jitted update and scoring passes (`_trainer_batch.Programs`),
    `prepare`, and the filters' kept groups."""
    self.spec = _trainer_setup.update_spec(self.config)
    self._programs = _trainer_batch.Programs(
      self.config,
      self.models,
      self.algorithm,
      self.needs,
      self.teacher,
      self.spec,
      self.shardings,
    )
    self._update = self._programs.update_at(self.config.sampler.temperature)
    self._prepare = jax.jit(
      lambda batch, s, key: self.algorithm.prepare(batch, s, key=key)
    )
    self._keep = jax.jit(
      lambda batch, s, key: kept_groups(
        self.algorithm.prepare(batch, s, key=key)[0]
      )
    )

  def _needs(self) -> dict[str, bool]:
    """Which batch fields the algorithm reads (and so which passes run)."""
    return {
      f: _build.needs_field(self.algorithm, f)
      for f in _trainer_setup.NEEDED_FIELDS
    }

  # --- checkpoints ----------------------------------------------------------

  def _restore(self) -> None:
    """Resume from the newest intact checkpoint, if its config matches."""
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
    self.checkpointer.save(
      step,
      self.state,
      metadata={
        "config": _trainer_resume.config_json(self.config),
        "prompt_state": self.prompt_state,
        "groups_state": self.groups_state,
        "skipped_updates": self.skipped_updates,
      },
      force=force,
    )

  # --- sampling -------------------------------------------------------------

  def policy(self):
    """The current policy as an `nnx` module (for sampling, evaluation)."""
    return nnx.merge(self.models.policy, self.state.policy.params)

  def _sample(self, examples, key, **kwargs):
    """Sample and score this process's `examples` with the current policy
    (`_trainer_rollouts.RunSampler.sample`)."""
    return self._sampling.sample(self.policy(), examples, key, **kwargs)

  def _episodes(self, examples, key, **kwargs):
    """Agent episodes of the global `examples` with the current policy
    (`_trainer_rollouts.RunSampler.episodes`); this process's rows."""
    return self._sampling.episodes(self.policy(), examples, key, **kwargs)

  def _next_prompts(self) -> _trainer_rollouts.Prompts:
    """The prompt sampler's next global batch (this process's rows of it),
    and the step's temperature."""
    c = self.config
    size = batch = c.train.prompts_per_step
    if self.groups is not None:  # it may carry groups over from past steps
      size = int(self.groups.new_prompts(batch, self.groups_state))
    if size == 0:
      self._temperature = c.sampler.temperature
      return _trainer_rollouts.no_prompts()
    chosen, self.prompt_state = self.prompt_sampler.select(
      self.prompt_state, self._step, size
    )
    chosen = _trainer_rollouts.checked_selection(
      c, chosen, size, self.prompt_sampler, len(self.task.train)
    )
    ids = chosen.prompt_ids[self.rows] if size == batch else chosen.prompt_ids
    examples = [self.task.train[int(i)] for i in ids]
    settings = chosen.settings or {}
    # The step's temperature: sampling, scoring and the update use it.
    self._temperature = settings.get("temperature", c.sampler.temperature)
    return _trainer_rollouts.Prompts(
      list(ids), examples, chosen.num_samples, settings, chosen
    )

  def _train_sample(self, prompts: _trainer_rollouts.Prompts, key):
    """The scored rollout of the step's `prompts` (by the group strategy,
    when the run has one)."""
    if self.groups is None:
      settings = _trainer_rollouts.sample_settings(
        self.config, prompts, self.prompt_sampler.max_samples
      )
      return self._sample(
        prompts.examples, key, temperature=self._temperature, **settings
      )
    scored, self.groups_state = self._sampling.strategy_groups(
      self.policy(),
      self.groups_state,
      prompts,
      key,
      step=self._step,
      temperature=self._temperature,
    )
    return scored

  def _feedback(self, scored) -> None:
    """Tell the prompt sampler how the rollout scored (every process the
    same global batch)."""
    feedback = _trainer_rollouts.feedback(
      scored, self.mesh, self.config.train.prompts_per_step, self._step
    )
    self.prompt_state = self.prompt_sampler.update(self.prompt_state, feedback)

  # --- one iteration --------------------------------------------------------

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
    update = self._programs.update_at(self._temperature)
    self.state, metrics = update(
      self.state, seqs, batch, jax.random.fold_in(key, 1)
    )
    out = {k: float(v) for k, v in jax.device_get(finalize(metrics)).items()}
    self._check_finite(step, out)
    _trainer_report.add_summary_names(out)
    out.update(
      _trainer_report.rollout_metrics(
        scored,
        refills,
        num_kept,
        rows=len(self.rows),
        prompts_per_step=self.config.train.prompts_per_step,
      )
    )
    out["seconds"] = time.perf_counter() - start
    self._last = scored
    return out

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

  def _global(self, tree):
    """Global arrays from this process's rows of a training batch."""
    return _hosts.to_global(tree, self.mesh, self.config.train.prompts_per_step)

  def _raw_batch(self, scored) -> Batch:
    """The global batch of a scored rollout (this process's rows)."""
    return self._global(_trainer_batch.raw_batch(scored, self.annotate))

  def _step_batch(self, scored, seqs) -> Batch:
    """The batch the algorithm prepares: the rollout's, the old policy's
    fields and, for ReMax, the greedy baseline."""
    batch = self._with_old(self._raw_batch(scored), seqs)
    if self.needs["baseline_rewards_P"]:
      batch = batch._replace(baseline_rewards_P=self._greedy_rewards(scored))
    return batch

  def _greedy_rewards(self, scored) -> jax.Array:
    """ReMax's baseline: the reward of each prompt's greedy completion."""
    greedy = self._sample(scored.examples, jax.random.key(0), greedy=True)
    return self._global(greedy.rewards_PG[:, 0])

  def _with_old(self, batch: Batch, seqs=None) -> Batch:
    """Old, reference and value estimates the algorithm reads."""
    if seqs is None:  # filter pass: stand-ins (filters read rewards only)
      return _trainer_batch.with_stand_ins(
        batch, self.needs, self.algorithm.rescores
      )
    teacher = None if self.teacher is None else self.teacher[1]
    score = self._programs.score_at(self._temperature)
    scores = dict(score(self.state, teacher, seqs))
    return batch._replace(**scores.pop("fields")).with_extra(**scores)

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
    """The dry run's figures (`_trainer_report.dry_run_report`)."""
    return _trainer_report.dry_run_report(start, compiled, metrics, self.state)

  # --- evaluation -----------------------------------------------------------

  def evaluate(self, *, num_prompts: Optional[int] = None) -> dict[str, float]:
    """Greedy accuracy on held-out prompts (+ pass@k when eval_samples > 1).

    The prompts are padded (repeating the last) to a multiple of the
    mesh's batch axes and split over processes like a training batch; the
    padding is not counted.
    """
    t = self.config.train
    n = min(num_prompts or t.eval_prompts, len(self.task.test))
    rows, padded = _trainer_report.eval_rows(self.mesh, n)
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
