"""The RL run: prompts, rollouts, rewards, filters, updates.

`Trainer(config).run()` trains and returns the final metrics. What every
run shares (mesh, checkpoints and exact resume, logs, evaluation, progress,
plots, dry run) is the `Runner`'s; this is the RL step. Only the outer loop
is Python; sampling, log-probs, `prepare` and the update are jitted, and
the update runs sharded on the mesh with explicit in/out shardings. Step
``s`` samples with ``fold_in(key, s)`` and checkpoints carry the data
iterator's position, so a resumed run continues exactly.

Each process loads, decodes and scores only the prompts of the rows its
devices hold; the jitted programs see global arrays (`_hosts`).
"""

from collections.abc import Callable, Sequence
import time
from typing import Any, Optional

from flax import nnx
import jax
import numpy as np

from rljax import rollouts
from rljax import selection
from rljax import sharding
from rljax import tasks
from rljax._src.base import Algorithm
from rljax._src.base import Batch
from rljax._src.base import finalize
from rljax.training import _build
from rljax.training import _hosts
from rljax.training import _rollout
from rljax.training import _runner
from rljax.training import _trainer_batch
from rljax.training import _trainer_report
from rljax.training import _trainer_rollouts
from rljax.training import _trainer_setup
from rljax.training._config import RunConfig
from rljax.transforms import kept_groups


class Trainer(_runner.Runner):
  """One RL run: build everything from a `RunConfig`, then `run()` (see
  `Runner` for resuming and ``allow_changes``).

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

  KIND = "rl"

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
    self._given_algorithm = algorithm
    self.annotate = annotate
    super().__init__(
      config,
      resume=resume,
      task=task,
      rewards=rewards,
      teacher=teacher,
      prompts=prompts,
      groups=groups,
      allow_changes=allow_changes,
    )

  # --- what the RL run says ------------------------------------------------

  def _algorithm(self) -> Algorithm:
    return self._given_algorithm or _trainer_setup.algorithm(self.config)

  def _needs(self) -> dict[str, bool]:
    """Which batch fields the algorithm reads (and so which passes run)."""
    return {
      f: _build.needs_field(self.algorithm, f)
      for f in _trainer_setup.NEEDED_FIELDS
    }

  def _rescored(self) -> set[str]:
    return _trainer_setup.rescored_models(self.algorithm)

  def _build_models(self, teacher):
    model, critic = super()._build_models(teacher)
    _trainer_setup.check_policy(self.config, self.algorithm, model)
    return model, critic

  def _build(self, resume, task, rewards, teacher) -> None:
    super()._build(resume, task, rewards, teacher)
    self._build_programs()

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

  def _compiled_step(self):
    """The update, compiled at the last step's full shapes (`dry_run`)."""
    seqs = self._global(_rollout.sequences(self._last.rollout))
    batch = self._step_batch(self._last, seqs)
    batch, _ = self._prepare(
      batch, self.state.policy.algo_state, jax.random.key(0)
    )
    return self._update.lower(
      self.state, seqs, batch, jax.random.key(0)
    ).compile()

  def _write_rollouts(self, writer, step: int) -> None:
    _trainer_report.write_rollouts(writer, step, self._last)
