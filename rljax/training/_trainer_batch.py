"""The batch a `Trainer` step prepares, and the jitted programs it runs.

A scored rollout becomes a `Batch` (host arrays); the old policy's, the
reference's, the critic's and a teacher's passes fill the fields the
algorithm reads (one jitted scoring program per temperature), or stand-ins
for the filters' pass; the update is jitted with the train state's
shardings and donated.
"""

import functools
import math
from typing import Optional

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

from rljax import rollouts
from rljax import sharding
from rljax._src.base import Batch
from rljax.models import _lora
from rljax.training import _hosts
from rljax.training import _packing
from rljax.training import _rollout
from rljax.training._packing import Packing
from rljax.training._step import completion_logprobs
from rljax.training._step import completion_values
from rljax.training._step import rescore
from rljax.training._step import update


def raw_batch(scored, annotate) -> Batch:
  """The batch of a scored rollout (this process's rows, host arrays), with
  the side data of `annotate` (None: none), streams and episodes."""
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
    version_PGT=None
    if r.version_PGT is None
    else np.asarray(r.version_PGT, np.int32),
  )
  if annotate is not None:
    batch = batch._replace(extra=_rollout.annotations(annotate, scored))
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
  return batch


def with_stand_ins(batch: Batch, needs, rescores) -> Batch:
  """The filter pass's batch: zeros for the fields the algorithm reads
  (filters read rewards only) and the sampler's log-probs as the old
  policy's."""
  zeros = jnp.zeros_like(batch.mask_PGT, jnp.float32)  # where the batch is
  return batch._replace(
    baseline_rewards_P=zeros[:, 0, 0] if needs["baseline_rewards_P"] else None,
    old_logp_PGT=batch.rollout_logp_PGT,
    old_values_PGT=zeros if needs["old_values_PGT"] else None,
    ref_logp_PGT=zeros if needs["ref_logp_PGT"] else None,
    old_entropy_PGT=zeros if needs["old_entropy_PGT"] else None,
    teacher_logp_PGT=zeros if needs["teacher_logp_PGT"] else None,
  ).with_extra(
    **{
      r.name: {"completion": zeros, "prompt": zeros[:, 0, 0]}.get(
        r.span, zeros[..., 0]
      )
      for r in rescores
    }
  )


class Programs:
  """A run's jitted update and scoring passes, compiled once per
  temperature (the run's, or a stage's) and kept."""

  def __init__(self, config, models, algorithm, needs, teacher, spec, shards):
    self.config = config
    self.models = models
    self.algorithm = algorithm
    self.needs = needs
    self.teacher_graph = None if teacher is None else teacher[0]
    self.spec = spec
    self.shardings = shards
    self._compiled = {}

  def update_at(self, temperature: float, microbatches=None):
    """The jitted update whose log-probs are at `temperature` (in
    `microbatches` per minibatch: default the run's)."""
    micro = self.spec.microbatches if microbatches is None else microbatches
    key = ("update", float(temperature), int(micro))
    if key not in self._compiled:
      spec = self.spec._replace(
        temperature=float(temperature), microbatches=int(micro)
      )
      self._compiled[key] = update_fn(
        self.models, self.algorithm, spec, self.shardings
      )
    return self._compiled[key]

  def score_at(self, temperature: float):
    """Jitted log-probs / values of the sequences under current weights,
    at the sampling `temperature` (`score_fn`)."""
    key = ("score", float(temperature))
    if key not in self._compiled:
      self._compiled[key] = score_fn(
        self.config,
        self.models,
        self.needs,
        self.teacher_graph,
        self.algorithm.rescores,
        temperature,
        _mesh_of(self.shardings),
      )
    return self._compiled[key]


def _mesh_of(shardings):
  return jax.tree.leaves(shardings)[0].mesh


def update_fn(models, algorithm, spec, shardings):
  """The jitted, donated update of `spec` on the sharded train state."""
  return sharding.InMesh(
    _mesh_of(shardings),
    jax.jit(
      functools.partial(update, models, algorithm, spec),
      in_shardings=(shardings, None, None, None, None),
      out_shardings=(shardings, None),
      donate_argnums=0,
    ),
  )


def score_fn(config, models, needs, teacher_graph, rescores, temperature, mesh):
  """Jitted ``(state, teacher, seqs) -> {"fields": ..., **extra}``: the
  log-probs, entropies and values of the sequences under the current
  weights at `temperature`, for the batch fields the algorithm reads, and
  the stages' own passes (`rljax.Rescore`, into ``Batch.extra``)."""
  width = config.sampler.max_new_tokens
  schedule = config.model.logprob_schedule
  grouper = config.model.prefix_grouper
  t = config.train
  # On-policy (one optimizer step per batch) the loss's own detached
  # log-probs are the behaviour policy's; a forward pass computes them
  # only when a batch stage reads them (importance weights against the
  # sampler, KL in the reward).
  old_needed = t.epochs * t.minibatches > 1 or needs["old_logp_PGT"]

  @jax.jit
  def score(state, teacher, seqs, packing=None):
    out = {}
    if packing is not None:
      packing = packing.unit(0)  # the batch's units merged into one
    logp = functools.partial(
      completion_logprobs,
      seqs=seqs,
      width=width,
      temperature=temperature,
      schedule=schedule,
      prefix_grouper=grouper,
      packing=packing,
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
        packing=packing,
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
      out["old_values_PGT"] = completion_values(critic, seqs, width, packing)
    if needs["teacher_logp_PGT"]:
      out["teacher_logp_PGT"] = logp(nnx.merge(teacher_graph, teacher))[0]
    return {"fields": out, **extra}

  return sharding.InMesh(mesh, score)


def packing_for(config, mesh, seqs) -> tuple[Optional[Packing], int, float]:
  """The step's `Packing` (None: padded rows), micro-batches per minibatch
  and padding fraction (of the token slots the update computes over, those
  outside every sample's span), from this process's rows of the sequences
  (their spans are gathered from every process, so all plan alike)."""
  t = config.train
  spans = _hosts.gather_rows(
    _packing.spans(seqs.mask_PGL), mesh, t.prompts_per_step
  )
  length = seqs.mask_PGL.shape[-1]
  real = int(np.sum(spans[..., 1] - spans[..., 0]))
  if not t.max_tokens_per_microbatch:
    return None, t.microbatches, 1.0 - real / (spans[..., 0].size * length)
  shards = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
  micro = _packing.choose_microbatches(
    spans,
    budget=t.max_tokens_per_microbatch,
    minibatches=t.minibatches,
    length=length,
    shards=shards,
    least=t.microbatches,
  )
  packing = _packing.pack_plan(
    spans,
    length=length,
    completion_width=config.sampler.max_new_tokens,
    units=t.minibatches * micro,
    shards=shards,
  )
  return packing, micro, 1.0 - real / packing.computed_tokens()


def replicated(tree, mesh):
  """Host arrays equal on every process, as global arrays on every device
  of `mesh`."""
  whole = NamedSharding(mesh, PartitionSpec())
  return jax.tree.map(
    lambda x: jax.make_array_from_callback(
      np.shape(x), whole, lambda index, x=x: np.asarray(x)[index]
    ),
    tree,
  )
