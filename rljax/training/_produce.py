"""What an RL step trains on, produced from a snapshot of the weights.

`Producer(trainer)(index, snapshot)` is the `rljax.pipeline` producer of an
RL run: the step's prompts (the prompt sampler's choice), their rollout
sampled with the snapshot's policy (refilled while the algorithm's filters
drop groups), the prompt sampler's feedback and, for ReMax, the greedy
baseline. It owns the state production advances (the prompt sampler's and
the group strategy's) and returns it with the rollout: the trainer keeps,
for its checkpoints, the state of the rollouts it trained. Everything it
draws comes from ``fold_in(key(seed), index)``, so a rollout depends on
its index and its weights only.
"""

import time
from typing import Any, NamedTuple, Optional

from flax import nnx
import jax
import numpy as np

from rljax.pipeline import Snapshot
from rljax.training import _hosts
from rljax.training import _rollout
from rljax.training import _trainer_batch
from rljax.training import _trainer_rollouts


class Rollout(NamedTuple):
  """A produced step: the scored rollout (this process's rows), the
  refills it took and the groups its filters kept, the step's temperature,
  ReMax's greedy baseline (this process's rows, or None), the prompt
  sampler's and group strategy's states after it, and the seconds the
  producer waited for its weights to arrive (a transfer to the rollout
  mesh still under way)."""

  scored: Any
  refills: int
  num_kept: int
  temperature: float
  baseline_rewards: Optional[jax.Array]
  prompt_state: Any
  groups_state: Any
  weights_wait: float


class Producer:
  """Produces the rollouts of an RL run's steps (see the module doc)."""

  def __init__(self, trainer):
    t = trainer
    self.config = t.config
    self.task = t.task
    self.rows = t.rows
    # Everything the producer launches runs on the rollout mesh: with a
    # mesh of its own, the update's devices never see its programs.
    self.mesh = t.rollout_mesh
    self.prompt_sampler = t.prompt_sampler
    self.groups = t.groups
    self.sampling = t._sampling
    self.graphdef = t.models.policy
    self.needs = t.needs
    self.algorithm = t.algorithm
    self.keep = t._keep
    self.annotate = t.annotate
    self.prompt_state = t.prompt_state
    self.groups_state = t.groups_state
    # The pipeline's newest weights (`pipeline.Pipeline.newest`), when the
    # run continues rollouts under them (``train.partial_rollouts``).
    self.newest = None

  def __call__(self, index: int, snapshot: Snapshot) -> Rollout:
    """The rollout of step `index` with the snapshot's weights
    ``(params, algo_state)``."""
    params, algo_state = snapshot.weights
    start = time.perf_counter()
    jax.block_until_ready(params)
    weights_wait = time.perf_counter() - start
    policy = nnx.merge(self.graphdef, params)
    # What samples now (a partial rollout moves both to newer weights).
    self._policy, self._version = policy, snapshot.version
    key = jax.random.fold_in(jax.random.key(self.config.train.seed), index)
    prompts, temperature = self._next_prompts(index)
    scored, refills, num_kept, temperature = self._fill(
      policy, algo_state, prompts, temperature, index, key
    )
    baseline = None
    if self.needs["baseline_rewards_P"]:  # ReMax: the greedy completion's
      greedy = self.sampling.sample(
        policy, scored.examples, jax.random.key(0), greedy=True
      )
      baseline = np.asarray(greedy.rewards_PG[:, 0])  # this process's rows
    return Rollout(
      scored,
      refills,
      num_kept,
      temperature,
      baseline,
      self.prompt_state,
      self.groups_state,
      weights_wait,
    )

  def _next_prompts(self, index: int):
    """The prompt sampler's next global batch (this process's rows of it),
    and the step's temperature."""
    c = self.config
    size = batch = c.train.prompts_per_step
    if self.groups is not None:  # it may carry groups over from past steps
      size = int(self.groups.new_prompts(batch, self.groups_state))
    if size == 0:
      return _trainer_rollouts.no_prompts(), c.sampler.temperature
    chosen, self.prompt_state = self.prompt_sampler.select(
      self.prompt_state, index, size
    )
    chosen = _trainer_rollouts.checked_selection(
      c, chosen, size, self.prompt_sampler, len(self.task.train)
    )
    ids = chosen.prompt_ids[self.rows] if size == batch else chosen.prompt_ids
    examples = [self.task.train[int(i)] for i in ids]
    settings = chosen.settings or {}
    # The step's temperature: sampling, scoring and the update use it.
    temperature = settings.get("temperature", c.sampler.temperature)
    prompts = _trainer_rollouts.Prompts(
      list(ids), examples, chosen.num_samples, settings, chosen
    )
    return prompts, temperature

  def _sample(self, policy, prompts, temperature, index, key):
    """The scored rollout of the step's `prompts` (by the group strategy,
    when the run has one)."""
    if self.groups is None:
      settings = _trainer_rollouts.sample_settings(
        self.config, prompts, self.prompt_sampler.max_samples
      )
      if self.newest is not None:
        policy = self._policy
        settings.update(refresh=self._refresh, version=self._version)
      return self.sampling.sample(
        policy, prompts.examples, key, temperature=temperature, **settings
      )
    scored, self.groups_state = self.sampling.strategy_groups(
      policy,
      self.groups_state,
      prompts,
      key,
      step=index,
      temperature=temperature,
    )
    return scored

  def _refresh(self):
    """(version, policy) of weights newer than those sampling, or None (the
    engine's ``refresh``: a partial rollout continues under them)."""
    snapshot = self.newest()
    if snapshot is None or snapshot.version <= self._version:
      return None
    self._version = snapshot.version
    self._policy = nnx.merge(self.graphdef, snapshot.weights[0])
    return self._version, self._policy

  def _fill(self, policy, algo_state, prompts, temperature, index, key):
    """A rollout batch, refilled while the algorithm's filters drop groups;
    returns it, the refills, the groups kept and the temperature.

    Kept groups come first; when ``max_refills`` runs out the batch is
    completed with dropped groups, which the filter masks out again. Each
    process fills its own rows; all refill until every process is full
    (sampling is a collective, so they must agree on the count).
    """
    p = len(self.rows)
    pool, kept, dropped = [], [], []
    key = jax.random.fold_in(key, 0)
    for attempt in range(self.config.train.max_refills + 1):
      if attempt:
        prompts, temperature = self._next_prompts(index)
      key_attempt = jax.random.fold_in(key, attempt)
      scored = self._sample(policy, prompts, temperature, index, key_attempt)
      feedback = _trainer_rollouts.feedback(
        scored, self.mesh, self.config.train.prompts_per_step, index
      )
      self.prompt_state = self.prompt_sampler.update(
        self.prompt_state, feedback
      )
      # Filters read rewards only: the log-prob fields are stand-ins.
      raw = _hosts.to_global(
        _trainer_batch.raw_batch(scored, self.annotate),
        self.mesh,
        self.config.train.prompts_per_step,
      )
      batch = _trainer_batch.with_stand_ins(
        raw,
        self.needs,
        self.algorithm.rescores,
      )
      keep = _hosts.to_local(
        self.keep(batch, algo_state, key_attempt), self.mesh
      )
      offset = sum(len(s.prompts) for s in pool)
      pool.append(scored)
      kept += [offset + i for i in np.flatnonzero(keep)]
      dropped += [offset + i for i in np.flatnonzero(keep == 0)]
      if not _hosts.process_sum(np.int32(len(kept) < p), self.mesh):
        break
    order = np.asarray((kept + dropped)[:p])
    scored = _rollout.take_groups(pool, order)
    return scored, attempt, min(len(kept), p), temperature
