"""The RL loop: data, rollouts, rewards, filters, updates, logs, checkpoints.

`Trainer(config).run()` trains and returns the final metrics. Only this
outer loop is Python; sampling, log-probs, `prepare` and the update are
jitted, and the update runs sharded on the mesh with explicit in/out
shardings. Step ``s`` samples with ``fold_in(key, s)`` and checkpoints carry
the data iterator's position, so a resumed run continues exactly.
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


def _mesh(sizes):
  """The run's mesh; a fully specified one may use fewer than all devices."""
  used = math.prod(sizes)
  if -1 in sizes or used >= jax.device_count():
    return sharding.make_mesh(*sizes)
  logging.getLogger("rljax").warning(
    "train.mesh=%s uses %d of %d devices.", sizes, used, jax.device_count()
  )
  return sharding.make_mesh(*sizes, devices=jax.devices()[:used])


class Trainer:
  """One training run: build everything from a `RunConfig`, then `run()`.

  Resumes from the latest checkpoint in ``output.directory`` when there is
  one (``resume=False`` starts over). ``algorithm`` trains an `Algorithm`
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
    self._iterator = self._dataset(c.task, c.train)
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
        self.directory / "checkpoints",
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

  def _dataset(self, task_spec, train):
    """Prompts for this process: its shard, shuffled, repeated, in batches."""
    data = self.task.train[jax.process_index() :: jax.process_count()]
    per_process = train.prompts_per_step // jax.process_count()
    data = (
      data.shuffle(seed=train.seed).repeat().batch(per_process, batch_fn=list)
    )
    return iter(data.to_iter_dataset())

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
    restored = self.checkpointer.restore(abstract)
    self.state = restored.state
    self._iterator.set_state(restored.data_state)
    self.start_step = restored.step

  def save(self, step: int, *, force: bool = False) -> None:
    """Checkpoint the state and the data position after `step` steps."""
    if self.checkpointer is None:
      return
    self.checkpointer.save(
      step,
      self.state,
      data_state=self._iterator.get_state(),
      metadata={
        "config": json.loads(
          json.dumps(dataclasses.asdict(self.config), default=str)
        )
      },
      force=force,
    )

  # --- one iteration --------------------------------------------------------

  def policy(self):
    """The current policy as an `nnx` module (for sampling, evaluation)."""
    return nnx.merge(self.models.policy, self.state.policy.params)

  def _sample(self, examples, key):
    s = self.config.sampler
    return _rollout.sample_and_score(
      self.policy(),
      self.tokenizer,
      self.task,
      examples,
      key=key,
      prompt_width=self.config.task.max_prompt_tokens,
      chat=self.config.model.chat_template,
      max_new_tokens=s.max_new_tokens,
      num_samples=s.num_samples,
      temperature=s.temperature,
      top_k=s.top_k,
      top_p=s.top_p,
    )

  def _raw_batch(self, scored) -> Batch:
    r = scored.rollout
    p, g, _ = r.tokens_PGT.shape
    return Batch(
      mask_PGT=jnp.asarray(r.mask_PGT, jnp.float32),
      rewards_PG=jnp.asarray(scored.rewards_PG),
      rewards_PGK=jnp.asarray(scored.scores.values_NK).reshape(p, g, -1),
      rollout_logp_PGT=jnp.asarray(r.logp_PGT),
      truncated_PG=jnp.asarray(r.truncated_PG),
    )

  def _fill(self, examples, key):
    """A rollout batch, refilled while the algorithm's filters drop groups.

    Kept groups come first; when ``max_refills`` runs out the batch is
    completed with dropped groups, which the filter masks out again.
    """
    p = self.config.train.prompts_per_step
    pool, kept, dropped = [], [], []
    for attempt in range(self.config.train.max_refills + 1):
      if attempt:
        examples = next(self._iterator)
      scored = self._sample(examples, jax.random.fold_in(key, attempt))
      keep = np.asarray(
        self._keep(
          self._with_old(self._raw_batch(scored)), self.state.policy.algo_state
        )
      )
      offset = sum(len(s.prompts) for s in pool)
      pool.append(scored)
      kept += [offset + i for i in np.flatnonzero(keep)]
      dropped += [offset + i for i in np.flatnonzero(keep == 0)]
      if len(kept) >= p:
        break
    order = np.asarray((kept + dropped)[:p])
    return _rollout.take_groups(pool, order), attempt, len(kept)

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
    seqs = _rollout.sequences(scored.rollout)
    seqs = jax.device_put(seqs, sharding.batch_sharding(self.mesh, 3))
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
    out["tokens"] = float(np.asarray(scored.rollout.mask_PGT).sum())
    out["seconds"] = time.perf_counter() - start
    self._last = scored
    return out

  def _greedy_rewards(self, scored) -> jax.Array:
    """ReMax's baseline: the reward of each prompt's greedy completion."""
    greedy = _rollout.sample_and_score(
      self.policy(),
      self.tokenizer,
      self.task,
      scored.examples,
      key=jax.random.key(0),
      prompt_width=self.config.task.max_prompt_tokens,
      chat=self.config.model.chat_template,
      max_new_tokens=self.config.sampler.max_new_tokens,
      greedy=True,
    )
    return jnp.asarray(greedy.rewards_PG[:, 0])

  def _rollout_metrics(self, scored, refills, num_kept) -> dict[str, float]:
    values = np.asarray(scored.scores.values_NK)
    mask = np.asarray(scored.rollout.mask_PGT)
    out = {
      "reward": float(np.mean(scored.rewards_PG)),
      # A task's first reward is its correctness check.
      "accuracy": float(np.mean(values[:, 0] > 0)),
      "response_length": float(mask.sum(-1).mean()),
      "truncated": float(np.mean(scored.rollout.truncated_PG)),
      "refills": float(refills),
      "kept_groups": float(num_kept),
    }
    for name, value in scored.scores.metrics.items():
      out[name] = float(value)
    return out

  def dry_run(self) -> dict[str, Any]:
    """Compile the update at the run's full shapes, run one step, and report
    the compiled program's memory (XLA's analysis) and the step time."""
    start = time.perf_counter()
    metrics = self.step(self.start_step)
    seqs = _rollout.sequences(self._last.rollout)
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
    """Greedy accuracy on held-out prompts (+ pass@k when eval_samples > 1)."""
    t = self.config.train
    n = min(num_prompts or t.eval_prompts, len(self.task.test))
    examples = [self.task.test[i] for i in range(n)]
    s = self.config.sampler
    common = dict(
      key=jax.random.key(t.seed + 7),
      prompt_width=self.config.task.max_prompt_tokens,
      chat=self.config.model.chat_template,
      max_new_tokens=s.max_new_tokens,
    )
    greedy = _rollout.sample_and_score(
      self.policy(), self.tokenizer, self.task, examples, greedy=True, **common
    )
    out = {"eval_accuracy": float(np.mean(greedy.scores.values_NK[:, 0] > 0))}
    if t.eval_samples > 1:
      sampled = _rollout.sample_and_score(
        self.policy(),
        self.tokenizer,
        self.task,
        examples,
        num_samples=t.eval_samples,
        temperature=s.temperature,
        **common,
      )
      correct = (sampled.scores.values_NK[:, 0] > 0).reshape(n, -1).sum(-1)
      for k in sorted({1, t.eval_samples}):
        out[f"eval_pass@{k}"] = float(
          np.mean(monitoring.pass_at_k(t.eval_samples, correct, k))
        )
    return out

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
