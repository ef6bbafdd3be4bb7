"""The RL run: prompts, rollouts, rewards, filters, updates.

`Trainer(config).run()` trains and returns the final metrics. What every
run shares (mesh, checkpoints and exact resume, logs, evaluation, progress,
plots, dry run) is the `Runner`'s; this is the RL step. Only the outer loop
is Python; sampling, log-probs, `prepare` and the update are jitted, and
the update runs sharded on the mesh with explicit in/out shardings. Step
``s`` samples with ``fold_in(key, s)`` and checkpoints carry the data
iterator's position, so a resumed run continues exactly.

Each step takes its rollout from a pipeline (`_overlap`, `rljax.pipeline`):
produced when the step asks (``train.async_mode="sync"``), or ahead of it
by a producer thread sampling with weights at most ``train.max_staleness``
updates old (`_produce` makes a rollout from a snapshot of the weights);
the scoring pass and the update always run on the current weights.

Each process loads, decodes and scores only the prompts of the rows its
devices hold; the jitted programs see global arrays (`_hosts`).
"""

from collections.abc import Callable, Sequence
import functools
import time
from typing import Any, Optional

from flax import nnx
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rljax import rollouts
from rljax import selection
from rljax import sharding
from rljax import tasks
from rljax._src.base import Algorithm
from rljax._src.base import Batch
from rljax._src.base import finalize
from rljax.training import _build
from rljax.training import _hosts
from rljax.training import _overlap
from rljax.training import _produce
from rljax.training import _rollout
from rljax.training import _runner
from rljax.training import _trainer_batch
from rljax.training import _trainer_report
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
    disaggregated = self.rollout_mesh is not self.mesh
    agree = None
    if jax.process_count() > 1:  # the producer's and the trainer's
      agree = tuple(
        functools.partial(_hosts.process_max, mesh=m)
        for m in (self.mesh, self.rollout_mesh)
      )
    self._overlap = _overlap.Overlap(
      self.config, self._to_producer if disaggregated else None, agree
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
    self._prepare = jax.jit(
      lambda batch, s, key: self.algorithm.prepare(batch, s, key=key)
    )
    self._keep = jax.jit(
      lambda batch, s, key: kept_groups(
        self.algorithm.prepare(batch, s, key=key)[0]
      )
    )

  # --- one iteration --------------------------------------------------------

  def step(self, step: int) -> dict[str, float]:
    """One RL iteration: take the step's rollout (`_produce`; produced now,
    or ahead of time in an asynchronous run), score it under the current
    weights, prepare and update; returns its metrics as floats."""
    key = jax.random.fold_in(jax.random.key(self.config.train.seed), step)
    start = time.perf_counter()
    self._step = step
    if step in self.config.train.reference_resets:
      self._reset_reference()
    taken = self._take(step)
    r = self._last_rollout = taken.produced.value
    self._temperature = r.temperature
    seqs, packing, micro, padding = self._sequences(r)
    batch = self._step_batch(r, seqs, packing)
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
    update = self._programs.update_at(self._temperature, micro)
    self.state, metrics = update(
      self.state,
      seqs,
      batch,
      jax.random.fold_in(key, 1),
      None if packing is None else packing[0],
    )
    self._publish(step + 1)
    out = {k: float(v) for k, v in jax.device_get(finalize(metrics)).items()}
    self._check_finite(step, out)
    _trainer_report.add_summary_names(out)
    out.update(
      _trainer_report.rollout_metrics(
        r.scored,
        r.refills,
        r.num_kept,
        rows=len(self.rows),
        prompts_per_step=self.config.train.prompts_per_step,
        mesh=self.mesh,
      )
    )
    out.update(padding_fraction=padding, microbatches=micro)
    out["seconds"] = time.perf_counter() - start
    out.update(self._overlap.metrics(taken, out["seconds"]))
    self._last = r.scored
    return out

  def _take(self, step: int):
    """The step's rollout from the run's pipeline (started at the run's
    first step, or anew when steps do not follow on); its prompt sampler's
    and group strategy's states become the run's (checkpointed)."""
    if self._overlap.next_step != step:
      self._overlap.start(self._producer(), step, self._weights())
    taken = self._overlap.take(step)
    r = taken.produced.value
    self.prompt_state, self.groups_state = r.prompt_state, r.groups_state
    return taken

  def _producer(self) -> _produce.Producer:
    """The producer of the run's rollouts, from the run's current state."""
    return _produce.Producer(self)

  def _weights(self):
    """What the producer samples with: the policy's weights and the
    algorithm state (its filters read it)."""
    return (self.state.policy.params, self.state.policy.algo_state)

  def _to_producer(self, weights):
    """The producer's weights, moved to the rollout mesh: the policy's as
    it samples, the algorithm state as it is laid out here."""
    params, algo_state = weights
    leaves, tree = jax.tree.flatten(algo_state)
    moved = self.to_rollout_mesh(
      leaves,
      [
        NamedSharding(self.rollout_mesh, getattr(x.sharding, "spec", P()))
        for x in leaves
      ],
    )
    return self.to_rollout_mesh(params), jax.tree.unflatten(tree, moved)

  def _publish(self, version: int) -> None:
    """The updated weights, to the pipeline's producer."""
    self._overlap.publish(version, self._weights())

  def run(self, *, steps: Optional[int] = None) -> dict[str, Any]:
    """`Runner.run`; an asynchronous run's producer stops at the end."""
    try:
      return super().run(steps=steps)
    finally:
      self.close()

  def dry_run(self) -> dict[str, Any]:
    """`Runner.dry_run`; an asynchronous run's producer stops after it."""
    try:
      return super().dry_run()
    finally:
      self.close()

  def _quiet(self):
    """With several processes, an asynchronous producer holds still."""
    return self._overlap.paused()

  def close(self) -> None:
    """Stop an asynchronous run's producer, after the rollout it is
    producing (`run` does at its end; call it after driving `step`
    yourself). A later `step` starts a new one."""
    self._overlap.close()

  def _raw_batch(self, scored) -> Batch:
    """The global batch of a scored rollout (this process's rows)."""
    return self._global(_trainer_batch.raw_batch(scored, self.annotate))

  def _sequences(self, r: _produce.Rollout):
    """The rollout's global sequences, the update's and the scoring
    passes' packings (on the devices; None: padded rows), the update's
    micro-batches per minibatch and the
    padding fraction it computes over (`_trainer_batch.packing_for`)."""
    local = _rollout.sequences(r.scored.rollout)
    packing, micro, padding = _trainer_batch.packing_for(
      self.config, self.mesh, local
    )
    if packing is not None:  # the update's units, and merged for scoring
      packing = _trainer_batch.replicated(
        (packing, packing.merged()), self.mesh
      )
    return self._global(local), packing, micro, padding

  def _step_batch(self, r: _produce.Rollout, seqs, packing=None) -> Batch:
    """The batch the algorithm prepares: the rollout's, the old policy's
    fields (under the current weights) and, for ReMax, the baseline."""
    batch = self._with_old(self._raw_batch(r.scored), seqs, packing)
    if r.baseline_rewards is not None:
      batch = batch._replace(
        baseline_rewards_P=self._global(r.baseline_rewards)
      )
    return batch

  def _with_old(self, batch: Batch, seqs, packing=None) -> Batch:
    """Old, reference and value estimates the algorithm reads."""
    teacher = None if self.teacher is None else self.teacher[1]
    score = self._programs.score_at(self._temperature)
    whole = None if packing is None else packing[1]
    scores = dict(score(self.state, teacher, seqs, whole))
    return batch._replace(**scores.pop("fields")).with_extra(**scores)

  def _compiled_step(self):
    """The update, compiled at the last step's full shapes (`dry_run`)."""
    seqs, packing, micro, _ = self._sequences(self._last_rollout)
    batch = self._step_batch(self._last_rollout, seqs, packing)
    batch, _ = self._prepare(
      batch, self.state.policy.algo_state, jax.random.key(0)
    )
    update = self._programs.update_at(self.config.sampler.temperature, micro)
    return update.lower(
      self.state,
      seqs,
      batch,
      jax.random.key(0),
      None if packing is None else packing[0],
    ).compile()

  def _write_rollouts(self, writer, step: int) -> None:
    _trainer_report.write_rollouts(writer, step, self._last)
