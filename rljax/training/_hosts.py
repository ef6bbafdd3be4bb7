"""One process per host: `jax.distributed` setup, and batches that live
partly on each process.

A multi-host run starts the same command on every host. Each process then
loads, samples and scores only the rows of a global batch that its own
devices hold (`own_rows`), and the jitted programs see global arrays built
from those rows (`to_global`). Results come back as this process's rows
again (`to_local`), and scalar summaries are summed over processes
(`process_sum`). With one process all of this is the identity, so the
trainer has one code path.

Which rows a process holds follows from the mesh and the batch sharding,
not from the process index alone: on a TPU pod the devices of one host need
not be contiguous along the data axis. Global batch ``k`` is the same set
of prompts for any number of processes, so a run resumes on a different
number of hosts.
"""

import os
from typing import Any, Optional

import jax
from jax.experimental import multihost_utils
import numpy as np

from rljax import sharding
from rljax._src import checks

MODES = ("auto", "on", "off")


def _env_int(name: str) -> Optional[int]:
  value = os.environ.get(name)
  return None if value is None else int(value)


def on_tpu_pod() -> bool:
  """Whether JAX's own cluster detection sees a Cloud TPU VM or GKE TPU job.

  Uses JAX's private cluster classes (there is no public probe); if they
  move, auto-detection turns off and ``--distributed=on`` still works.
  """
  try:
    from jax._src.clusters import cloud_tpu_cluster as tpu

    return bool(
      tpu.GceTpuCluster.is_env_present() or tpu.GkeTpuCluster.is_env_present()
    )
  except (ImportError, AttributeError):
    return False


def initialize(
  mode: str = "auto",
  *,
  coordinator_address: Optional[str] = None,
  num_processes: Optional[int] = None,
  process_id: Optional[int] = None,
) -> bool:
  """Call `jax.distributed.initialize` when this is a multi-process run.

  ``mode="auto"`` initializes when a coordinator address is given (here or
  as ``JAX_COORDINATOR_ADDRESS``, with ``JAX_NUM_PROCESSES`` and
  ``JAX_PROCESS_ID``) or when a Cloud TPU VM / GKE TPU environment is
  detected; ``"on"`` always initializes (JAX then detects TPU, SLURM, Open
  MPI and Kubernetes clusters itself); ``"off"`` never does. Must run
  before anything touches a JAX device. Returns whether it initialized.
  """
  checks.one_of("distributed", mode, MODES)
  address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if num_processes is None:
    num_processes = _env_int("JAX_NUM_PROCESSES")
  if process_id is None:
    process_id = _env_int("JAX_PROCESS_ID")
  if mode == "off" or (mode == "auto" and not address and not on_tpu_pod()):
    return False
  if address and (num_processes is None or process_id is None):
    if not on_tpu_pod():
      raise ValueError(
        f"coordinator address {address!r} given without the process count"
        " and index: pass --num_processes N --process_id I (or set"
        " JAX_NUM_PROCESSES and JAX_PROCESS_ID) on every host."
      )
  jax.distributed.initialize(
    coordinator_address=address,
    num_processes=num_processes,
    process_id=process_id,
  )
  return True


def own_rows(mesh, rows: int) -> np.ndarray:
  """Sorted indices of the rows of a [rows, ...] batch that this process's
  devices hold under `sharding.batch_sharding` (all of them with one
  process)."""
  sharding.check_batch("the batch", rows, mesh)
  spans = sharding.batch_sharding(mesh, 1).addressable_devices_indices_map(
    (rows,)
  )
  held = {i for (span,) in spans.values() for i in range(rows)[span]}
  return np.asarray(sorted(held), np.int64)


def to_global(tree: Any, mesh, rows: int) -> Any:
  """Global [rows, ...] arrays, split over the batch axes, from this
  process's rows (`own_rows` order) of every leaf."""

  def build(local):
    local = np.asarray(local)
    return jax.make_array_from_process_local_data(
      sharding.batch_sharding(mesh, local.ndim),
      local,
      (rows, *local.shape[1:]),
    )

  return jax.tree.map(build, tree)


def to_local(tree: Any, mesh) -> Any:
  """This process's rows (`own_rows` order) of global [rows, ...] arrays,
  as numpy."""

  def read(x):
    if x.is_fully_addressable:
      return np.asarray(x)[own_rows(mesh, x.shape[0])]
    x = jax.device_put(x, sharding.batch_sharding(mesh, x.ndim))
    blocks = {}  # first row -> block (devices along other axes repeat it)
    for shard in x.addressable_shards:
      start = shard.index[0].start or 0
      blocks.setdefault(start, np.asarray(shard.data))
    return np.concatenate([blocks[k] for k in sorted(blocks)])

  return jax.tree.map(read, tree)


def process_sum(values: Any) -> Any:
  """Every leaf summed over processes (host values; a collective: every
  process must call it)."""
  if jax.process_count() == 1:
    return jax.tree.map(np.asarray, values)
  gathered = multihost_utils.process_allgather(jax.tree.map(np.asarray, values))
  return jax.tree.map(lambda x: np.asarray(x).sum(0), gathered)


def gather_rows(tree: Any, mesh, rows: int) -> Any:
  """Global [rows, ...] numpy arrays on every process from each process's
  rows (`own_rows` order) of every leaf (a collective)."""
  mine = own_rows(mesh, rows)
  if jax.process_count() == 1:
    return jax.tree.map(lambda x: np.asarray(x)[np.argsort(mine)], tree)
  gathered = multihost_utils.process_allgather(
    (mine, jax.tree.map(np.asarray, tree))
  )
  index = np.asarray(gathered[0]).reshape(-1)

  def place(x):
    x = np.asarray(x)
    x = x.reshape(-1, *x.shape[2:])
    out = np.zeros((rows, *x.shape[1:]), x.dtype)
    out[index] = x
    return out

  return jax.tree.map(place, gathered[1])
