"""From a `RunConfig` to the `Trainer`'s parts, checked before any work.

Each part the config names is built here (or taken as given in code), and
what goes wrong becomes a `rljax._src.errors.UserError` that names the
config field and the fix.
"""

import dataclasses
import logging
import math

import jax
import numpy as np

from rljax import algorithms
from rljax import checkpointing
from rljax import rollouts
from rljax import selection
from rljax import sharding
from rljax._src.base import Algorithm
from rljax._src.errors import UserError
from rljax.training import _build
from rljax.training import _hosts
from rljax.training._config import RunConfig
from rljax.training._step import UpdateSpec
from rljax.training._validate import validate

# The batch fields an algorithm may read that the trainer computes (each
# one a pass it runs only when a stage reads it).
NEEDED_FIELDS = (
  "ref_logp_PGT",
  "old_logp_PGT",
  "old_values_PGT",
  "old_entropy_PGT",
  "baseline_rewards_P",
  "teacher_logp_PGT",
)


def from_config(field: str, build, *args, **kwargs):
  """`build(*args, **kwargs)`, its errors as `UserError`s naming `field`."""
  try:
    return build(*args, **kwargs)
  except UserError:
    raise
  except (ValueError, TypeError, ImportError, FileNotFoundError) as e:
    raise UserError(f"{field}: {e}") from e


def check_sizes(config: RunConfig, mesh, rollout_mesh=None) -> None:
  """The config's own checks, then the global batch against the meshes
  (the update's; the rollouts', when it has one of its own)."""
  validate(config)
  p = config.train.prompts_per_step
  try:
    sharding.check_batch("train.prompts_per_step", p, mesh)
    if rollout_mesh is not None:
      sharding.check_batch("train.prompts_per_step", p, rollout_mesh)
  except ValueError as e:  # the message names the field and the fix
    raise UserError(str(e)) from e
  if rollout_mesh is not None and jax.process_count() > 1:
    _check_rows(p, mesh, rollout_mesh)
  mesh = mesh if rollout_mesh is None else rollout_mesh  # where slots run
  slots = config.sampler.slots
  shards = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
  if slots is not None and slots % shards:
    raise UserError(
      f"sampler.slots={slots} must be a multiple of the mesh's batch"
      f" shards ({shards}, data x fsdp); use {-(-slots // shards) * shards}."
    )


def _check_rows(rows: int, mesh, rollout_mesh) -> None:
  """Each process samples the rows of a batch that it updates on."""
  if not np.array_equal(
    _hosts.own_rows(mesh, rows), _hosts.own_rows(rollout_mesh, rows)
  ):
    raise UserError(
      f"train.mesh={tuple(mesh.shape.values())} and sampler.mesh="
      f"{tuple(rollout_mesh.shape.values())}: this process holds other rows"
      " of a batch on the rollout mesh than on the update's; give both the"
      " same data x fsdp split over processes (e.g. both (-1, 1, 1) /"
      " (processes, 1, 1))."
    )


def run_meshes(config: RunConfig):
  """The run's update mesh and rollout mesh: the same one, or with
  ``sampler.mesh`` one on the last devices of each process and the
  update's on the devices before them (a fully specified train.mesh may
  use fewer on one process)."""
  c = config
  devices = jax.devices()
  if jax.process_count() > 1:
    _check_processes(c)
  train, rollout = split_devices(c, devices)
  if rollout is not None:
    rollout = _mesh("sampler.mesh", c.sampler.mesh, rollout)
  return _mesh("train.mesh", c.train.mesh, train), rollout


def _check_processes(config: RunConfig) -> None:
  """What a multi-process run cannot overlap: every process launches each
  mesh's programs in one order, so an asynchronous producer needs devices
  of its own and takes its rollouts in order."""
  t = config.train
  if t.async_mode != "sync" and not config.sampler.mesh:
    raise UserError(
      f"train.async_mode={t.async_mode!r} on {jax.process_count()}"
      " processes samples on the update's devices, where the producer's and"
      " the update's programs would start in a different order on each"
      " process; give the rollouts devices of their own with sampler.mesh"
      f" (e.g. sampler.mesh=({jax.process_count()}, 1, 1), one device per"
      " process), or use train.async_mode='sync'."
    )
  if t.async_mode == "async" and t.queue_order == "freshest":
    raise UserError(
      "train.queue_order='freshest' on several processes: which rollout is"
      " freshest when a step starts differs between processes; use"
      " train.queue_order='oldest' (bounded staleness all the same)."
    )


def split_devices(config: RunConfig, devices):
  """(the update's devices, the rollouts' or None): with ``sampler.mesh``
  every process gives the rollouts an equal share of its devices, its
  last ones, and the update the devices before them."""
  c = config
  if not c.sampler.mesh:
    return list(devices), None
  used = math.prod(c.sampler.mesh)
  if used >= len(devices):
    raise UserError(
      f"sampler.mesh={c.sampler.mesh} takes {used} of the {len(devices)}"
      " devices and leaves none for train.mesh; use fewer, e.g."
      f" sampler.mesh=({len(devices) // 2}, 1, 1)."
    )
  hosts = {}  # process index -> its devices, in order
  for d in devices:
    hosts.setdefault(getattr(d, "process_index", 0), []).append(d)
  if used % len(hosts):
    raise UserError(
      f"sampler.mesh={c.sampler.mesh} takes {used} devices; each of the"
      f" {len(hosts)} processes gives the rollouts an equal share of its"
      f" own: use a multiple of {len(hosts)} devices."
    )
  share = used // len(hosts)
  if len(hosts) > 1 and any((len(d) - share) % share for d in hosts.values()):
    raise UserError(
      f"sampler.mesh={c.sampler.mesh} takes {share} of each process's"
      f" {len(next(iter(hosts.values())))} devices: weights move to each"
      " rollout device from update devices of its own process, so each"
      " process's update devices must be a multiple of its rollout devices"
      " (e.g. 1 + 3 or 2 + 2 of 4)."
    )
  train = [d for ds in hosts.values() for d in ds[: len(ds) - share]]
  rollout = [d for ds in hosts.values() for d in ds[len(ds) - share :]]
  return train, rollout


def _mesh(field: str, sizes, devices):
  """A mesh over `devices`; a fully specified one may use fewer."""
  used = math.prod(sizes)
  if -1 in sizes or used >= len(devices):
    return from_config(field, sharding.make_mesh, *sizes, devices=devices)
  if jax.process_count() > 1:
    raise UserError(
      f"{field}={sizes} uses {used} of {len(devices)} devices; a"
      " multi-host run must use every device of every host (set one axis to"
      " -1)."
    )
  logging.getLogger("rljax").warning(
    "%s=%s uses %d of %d devices.", field, sizes, used, len(devices)
  )
  return sharding.make_mesh(*sizes, devices=devices[:used])


def prompt_sampler(config: RunConfig, given) -> selection.PromptSampler:
  """The prompt sampler given in code, or the one ``sampler.prompts``
  names."""
  s = config.sampler
  return given or from_config(
    "sampler.prompts",
    selection.get,
    s.prompts,
    **{"num_samples": s.num_samples, **s.prompts_kwargs},
  )


def group_strategy(config: RunConfig, given):
  """The group strategy given in code, or the one ``sampler.groups`` names
  (None: plain groups)."""
  s = config.sampler
  if given is None and s.groups is not None:
    return from_config(
      "sampler.groups", rollouts.get, s.groups, **s.groups_kwargs
    )
  return given


def run_task(config: RunConfig, task, rewards):
  """The task given in code or ``config.task`` names, with the reward
  functions given in code and ``task.extra_rewards``."""
  c = config
  task = task or from_config("task", _build.build_task, c.task, c.sandbox)
  if rewards is not None:
    task = dataclasses.replace(task, rewards=_build.check_rewards(rewards))
  if c.task.extra_rewards:
    extra = from_config(
      "task.extra_rewards", _build.extra_rewards, c.task.extra_rewards
    )
    task = dataclasses.replace(task, rewards=(*task.rewards, *extra))
  return task


def algorithm(config: RunConfig) -> Algorithm:
  """The preset ``config.algorithm`` names, with its hyperparameters."""
  c = config.algorithm
  return from_config("algorithm", algorithms.get, c.name, **c.kwargs)


def rescored_models(algorithm: Algorithm) -> set[str]:
  """The models a stage's own log-prob passes (`rljax.Rescore`) read."""
  return {r.model for r in algorithm.rescores}


def check_policy(config: RunConfig, algorithm: Algorithm, model) -> None:
  """Refuse master weights under a scaled step; warn that a mixture of
  experts is not replayed by the rollout engine."""
  c = config
  if c.optim.master_weights and algorithm.transform.step_scale:
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


def bind_groups(config: RunConfig, groups, task, tokenizer):
  """The group strategy prepared for `task` and bound to the tokenizer."""
  if config.sampler.engine != "continuous":
    raise UserError(
      f"a group strategy ({type(groups).__name__}) samples with the"
      " rollout engine: set sampler.engine='continuous'."
    )
  groups = from_config("sampler.groups", groups.prepare, task)
  return groups.bind(tokenizer, chat=config.model.chat_template)


def checkpointer(config: RunConfig, directory):
  """The run's `Checkpointer` (None without ``output.checkpoint_every``)."""
  o = config.output
  if not o.checkpoint_every:
    return None
  return checkpointing.Checkpointer(
    directory, keep=o.keep_checkpoints, save_every=o.checkpoint_every
  )


def check_reference_resets(config: RunConfig, state) -> None:
  """``train.reference_resets`` need a reference policy in the state."""
  c = config
  if c.train.reference_resets and state.reference is None:
    raise ValueError(
      f"train.reference_resets={c.train.reference_resets}, but algorithm"
      f" {c.algorithm.name!r} keeps no reference policy (it reads no"
      " reference log-probs); drop train.reference_resets or add a KL to"
      " the reference."
    )


def update_spec(config: RunConfig) -> UpdateSpec:
  """The update's static settings (at the run's temperature)."""
  c = config
  return UpdateSpec(
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
