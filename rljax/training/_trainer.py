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
"""

import dataclasses
import functools
import json
import logging
import math
import pathlib
import time
from typing import Any, Optional

from flax import nnx
import grain
import jax
import jax.numpy as jnp
import numpy as np

from rljax import algorithms
from rljax import checkpointing
from rljax import monitoring
from rljax import sharding
from rljax import tasks
from rljax._src.base import Algorithm
from rljax._src.base import Batch
from rljax._src.base import finalize
from rljax.training import _build
from rljax.training import _hosts
from rljax.training import _rollout
from rljax.training import _warm_start
from rljax.training._config import RunConfig
from rljax.training._step import Models
from rljax.training._step import UpdateSpec
from rljax.training._step import completion_logprobs
from rljax.training._step import completion_values
from rljax.training._step import update
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


def _check_sizes(config: RunConfig, mesh) -> None:
  """Batch-shape errors up front, each naming the setting to change."""
  t = config.train
  p = t.prompts_per_step
  if config.sampler.num_samples < 2:
    raise ValueError(
      f"sampler.num_samples={config.sampler.num_samples}: group advantages"
      " need at least 2 samples per prompt."
    )
  if p % t.minibatches:
    raise ValueError(
      f"train.prompts_per_step={p} must be a multiple of"
      f" train.minibatches={t.minibatches}."
    )
  if (p // t.minibatches) % t.microbatches:
    raise ValueError(
      f"a minibatch of {p // t.minibatches} prompts must split into"
      f" train.microbatches={t.microbatches}; change either."
    )
  sharding.check_batch("train.prompts_per_step", p, mesh)
  if "://" in config.output.directory:
    raise ValueError(
      f"output.directory={config.output.directory!r}: logs are appended"
      " locally by process 0, so this must be a local path. Put checkpoints"
      " on shared storage with output.checkpoint_directory=gs://... instead."
    )


def _mesh(sizes):
  """The run's mesh; a fully specified one may use fewer than all devices."""
  used = math.prod(sizes)
  if -1 in sizes or used >= jax.device_count():
    return sharding.make_mesh(*sizes)
  if jax.process_count() > 1:
    raise ValueError(
      f"train.mesh={sizes} uses {used} of {jax.device_count()} devices; a"
      " multi-host run must use every device of every host (set one axis to"
      " -1)."
    )
  logging.getLogger("rljax").warning(
    "train.mesh=%s uses %d of %d devices.", sizes, used, jax.device_count()
  )
  return sharding.make_mesh(*sizes, devices=jax.devices()[:used])


class Trainer:
  """One training run: build everything from a `RunConfig`, then `run()`.

  Resumes from the latest checkpoint in the checkpoint directory when there
  is one (``resume=False`` starts over). ``algorithm`` trains an `Algorithm`
  built in code (a new objective chained from transforms) instead of the
  preset that ``config.algorithm`` names.
  """

  def __init__(
    self,
    config: RunConfig,
    *,
    resume: bool = True,
    algorithm: Optional[Algorithm] = None,
  ):
    self.config = c = config
    self.mesh = _mesh(c.train.mesh)
    _check_sizes(c, self.mesh)
    # The rows of each global batch of prompts this process handles.
    self.rows = _hosts.own_rows(self.mesh, c.train.prompts_per_step)
    self.task = tasks.get(c.task.name, **c.task.kwargs)
    model, self.tokenizer = _build.build_policy(
      c.model, self.task.alphabet, c.train.seed
    )
    self.algorithm = algorithm or algorithms.get(
      c.algorithm.name, **c.algorithm.kwargs
    )
    self.needs = {
      f: _build.needs_field(self.algorithm, f)
      for f in (
        "ref_logp_PGT",
        "old_values_PGT",
        "old_entropy_PGT",
        "baseline_rewards_P",
      )
    }
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
    self.directory = pathlib.Path(c.output.directory)
    self.directory.mkdir(parents=True, exist_ok=True)
    self._iterator = self._dataset(c.train)
    self.start_step = 0
    self._warm(model)
    self.state, self.shardings = _build.init_state(
      model,
      reference=self.needs["ref_logp_PGT"],
      critic=critic,
      models=self.models,
      algorithm=self.algorithm,
      mesh=self.mesh,
    )
    self.checkpointer = (
      checkpointing.Checkpointer(
        c.output.checkpoint_directory or self.directory / "checkpoints",
        keep=c.output.keep_checkpoints,
        save_every=c.output.checkpoint_every,
      )
      if c.output.checkpoint_every
      else None
    )
    if resume and self.checkpointer is not None:
      self._restore()
    self.spec = UpdateSpec(
      completion_width=c.sampler.max_new_tokens,
      epochs=c.train.epochs,
      minibatches=c.train.minibatches,
      microbatches=c.train.microbatches,
      temperature=c.sampler.temperature,
      schedule=c.model.logprob_schedule,
      value_eps=c.algorithm.value_eps,
    )
    self._update = jax.jit(
      functools.partial(update, self.models, self.algorithm, self.spec),
      in_shardings=(self.shardings, None, None, None),
      out_shardings=(self.shardings, None),
      donate_argnums=0,
    )
    self._prepare = jax.jit(self.algorithm.prepare)
    self._keep = jax.jit(
      lambda batch, s: kept_groups(self.algorithm.prepare(batch, s)[0])
    )

  # --- data -----------------------------------------------------------------

  def _dataset(self, train):
    """This process's prompts: its rows of each global batch.

    Global batch ``k`` is items ``[k P, (k + 1) P)`` of the shuffled,
    repeated training set whatever the number of processes, so the
    iterator's position means the same on any number of hosts.
    """
    stream = self.task.train.shuffle(seed=train.seed).repeat()
    size, rows = train.prompts_per_step, self.rows
    batches = grain.MapDataset.range(len(stream) // size).map(
      lambda k: [stream[k * size + int(r)] for r in rows]
    )
    return iter(batches.to_iter_dataset())

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
    if self.checkpointer.latest_step() is None:
      return
    abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      self.state,
    )
    restored = self.checkpointer.restore(abstract, restore_data=False)
    self.state = restored.state
    self._iterator.set_state(restored.metadata["data_state"])
    self.start_step = restored.step

  def save(self, step: int, *, force: bool = False) -> None:
    """Checkpoint the state and the data position after `step` steps."""
    if self.checkpointer is None:
      return
    # The data position is the same on every process (see `_dataset`), so
    # it goes in the metadata: a checkpoint resumes on any number of hosts.
    self.checkpointer.save(
      step,
      self.state,
      metadata={
        "config": json.loads(
          json.dumps(dataclasses.asdict(self.config), default=str)
        ),
        "data_state": self._iterator.get_state(),
      },
      force=force,
    )

  # --- one iteration --------------------------------------------------------

  def policy(self):
    """The current policy as an `nnx` module (for sampling, evaluation)."""
    return nnx.merge(self.models.policy, self.state.policy.params)

  def _sample(self, examples, key, *, global_rows=None, **sampler_kwargs):
    """Sample and score this process's `examples` (rows of a global batch
    of `global_rows` prompts, ``train.prompts_per_step`` by default)."""
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
      max_new_tokens=self.config.sampler.max_new_tokens,
      **sampler_kwargs,
    )

  def _train_sample(self, examples, key):
    s = self.config.sampler
    return self._sample(
      examples,
      key,
      num_samples=s.num_samples,
      temperature=s.temperature,
      top_k=s.top_k,
      top_p=s.top_p,
    )

  def _global(self, tree):
    """Global arrays from this process's rows of a training batch."""
    return _hosts.to_global(tree, self.mesh, self.config.train.prompts_per_step)

  def _raw_batch(self, scored) -> Batch:
    """The global batch of a scored rollout (this process's rows)."""
    r = scored.rollout
    p, g, _ = r.tokens_PGT.shape
    return self._global(
      Batch(
        mask_PGT=np.asarray(r.mask_PGT, np.float32),
        rewards_PG=np.asarray(scored.rewards_PG),
        rewards_PGK=np.asarray(scored.scores.values_NK).reshape(p, g, -1),
        rollout_logp_PGT=np.asarray(r.logp_PGT),
        truncated_PG=np.asarray(r.truncated_PG),
      )
    )

  def _fill(self, examples, key):
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
        examples = next(self._iterator)
      scored = self._train_sample(examples, jax.random.fold_in(key, attempt))
      batch = self._with_old(self._raw_batch(scored))
      keep = _hosts.to_local(
        self._keep(batch, self.state.policy.algo_state), self.mesh
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
      )
    return batch._replace(**self._score(self.state, seqs))

  @functools.cached_property
  def _score(self):
    """Jitted log-probs / values of the sequences under current weights."""
    width = self.config.sampler.max_new_tokens
    temperature = self.config.sampler.temperature
    schedule = self.config.model.logprob_schedule
    t = self.config.train
    off_policy = t.epochs * t.minibatches > 1
    models, needs = self.models, self.needs

    @jax.jit
    def score(state, seqs):
      out = {}
      logp = functools.partial(
        completion_logprobs,
        seqs=seqs,
        width=width,
        temperature=temperature,
        schedule=schedule,
      )
      if off_policy or needs["old_entropy_PGT"]:
        old, entropy = logp(nnx.merge(models.policy, state.policy.params))
        out["old_entropy_PGT"] = entropy
        if off_policy:
          out["old_logp_PGT"] = old
      if needs["ref_logp_PGT"]:
        out["ref_logp_PGT"] = logp(nnx.merge(models.policy, state.reference))[0]
      if needs["old_values_PGT"]:
        critic = nnx.merge(models.value, state.value.params)
        out["old_values_PGT"] = completion_values(critic, seqs, width)
      return out

    return score

  def step(self, step: int) -> dict[str, float]:
    """One RL iteration; returns its metrics as floats."""
    key = jax.random.fold_in(jax.random.key(self.config.train.seed), step)
    start = time.perf_counter()
    examples = next(self._iterator)
    scored, refills, num_kept = self._fill(examples, jax.random.fold_in(key, 0))
    seqs = self._global(_rollout.sequences(scored.rollout))
    batch = self._with_old(self._raw_batch(scored), seqs)
    if self.needs["baseline_rewards_P"]:
      batch = batch._replace(baseline_rewards_P=self._greedy_rewards(scored))
    batch, algo_state = self._prepare(batch, self.state.policy.algo_state)
    self.state = self.state._replace(
      policy=self.state.policy._replace(algo_state=algo_state)
    )
    batch = jax.tree.map(
      lambda x: jax.device_put(x, sharding.batch_sharding(self.mesh, x.ndim)),
      batch,
    )
    self.state, metrics = self._update(
      self.state, seqs, batch, jax.random.fold_in(key, 1)
    )
    out = {k: float(v) for k, v in jax.device_get(finalize(metrics)).items()}
    # Summary names the progress bar and plots show.
    out["kl"] = out.get("kl_ref", out.get("kl_old", 0.0))
    out["clip_frac"] = out.get("clip_frac_low", 0.0) + out.get(
      "clip_frac_high", 0.0
    )
    out.update(self._rollout_metrics(scored, refills, num_kept))
    out["seconds"] = time.perf_counter() - start
    self._last = scored
    return out

  def _greedy_rewards(self, scored) -> jax.Array:
    """ReMax's baseline: the reward of each prompt's greedy completion."""
    greedy = self._sample(scored.examples, jax.random.key(0), greedy=True)
    return self._global(greedy.rewards_PG[:, 0])

  def _rollout_metrics(self, scored, refills, num_kept) -> dict[str, float]:
    """Means over every process's samples (sums over processes / counts)."""
    values = np.asarray(scored.scores.values_NK)
    mask = np.asarray(scored.rollout.mask_PGT)
    n = values.shape[0]
    sums = {
      "reward": np.sum(scored.rewards_PG),
      # A task's first reward is its correctness check.
      "accuracy": np.sum(values[:, 0] > 0),
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
    samples = (
      self.config.train.prompts_per_step * self.config.sampler.num_samples
    )
    out["kept_groups"] *= self.config.train.prompts_per_step
    out["tokens"] = out["response_length"] * samples
    out["refills"] = float(refills)
    return out

  def dry_run(self) -> dict[str, Any]:
    """Compile the update at the run's full shapes, run one step, and report
    the compiled program's memory (XLA's analysis) and the step time."""
    start = time.perf_counter()
    metrics = self.step(self.start_step)
    seqs = self._global(_rollout.sequences(self._last.rollout))
    batch = self._with_old(self._raw_batch(self._last), seqs)
    batch, _ = self._prepare(batch, self.state.policy.algo_state)
    compiled = self._update.lower(
      self.state, seqs, batch, jax.random.key(0)
    ).compile()
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
      "metrics": metrics,
    }

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
    greedy = self._sample(examples, key, global_rows=padded, greedy=True)
    correct = greedy.scores.values_NK[:, 0] > 0
    sums = {"count": real.sum(), "eval_accuracy": (correct * real).sum()}
    if t.eval_samples > 1:
      sampled = self._sample(
        examples,
        key,
        global_rows=padded,
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
    """Train up to ``train.steps`` (or `steps` more); returns a summary."""
    c = self.config
    end = c.train.steps if steps is None else self.start_step + steps
    logger = monitoring.MetricsLogger(
      self.directory, tensorboard=c.output.tensorboard, wandb=c.output.wandb
    )
    rollouts = monitoring.RolloutWriter(
      self.directory / "rollouts.jsonl", every=max(c.output.rollouts_every, 1)
    )
    before = self.evaluate()
    logger.log(self.start_step, before)
    bar = monitoring.ProgressBar(
      total=end, initial=self.start_step, keys=PROGRESS_KEYS
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
    logger.close()
    plot = None
    if c.output.plot and jax.process_index() == 0:
      plot = monitoring.plot_learning_curves(
        self.directory / "metrics.jsonl",
        self.directory / "learning_curves.png",
        keys=(
          "reward",
          "accuracy",
          "eval_accuracy",
          "kl",
          "entropy",
          "response_length",
        ),
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
