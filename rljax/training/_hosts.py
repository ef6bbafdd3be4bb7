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

import functools
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


def process_sum(values: Any, mesh=None) -> Any:
  """Every leaf summed over processes (host values; a collective: every
  process must call it). With `mesh`, the collective runs on that mesh's
  devices alone (see `allgather`)."""
  if jax.process_count() == 1:
    return jax.tree.map(np.asarray, values)
  gathered = allgather(jax.tree.map(np.asarray, values), mesh)
  return jax.tree.map(lambda x: np.asarray(x).sum(0), gathered)


def process_max(value: int, mesh=None) -> int:
  """The largest of every process's `value` (a collective, as
  `process_sum`)."""
  if jax.process_count() == 1:
    return int(value)
  return int(np.max(allgather(np.int64(value), mesh)))


def allgather(tree: Any, mesh=None) -> Any:
  """Every process's host values of each leaf, stacked in process order (a
  collective every process calls).

  Without `mesh` it runs on every device (`multihost_utils.
  process_allgather`). With one, on that mesh's devices alone: a thread
  that drives one mesh of a run with two (an asynchronous producer on the
  rollout mesh beside the update's) then never launches a program on the
  other's devices, whose order would differ between processes.
  """
  if mesh is None:
    return multihost_utils.process_allgather(tree)
  devices = list(mesh.devices.reshape(-1))
  line = jax.sharding.Mesh(np.asarray(devices), ("hosts",))
  split = jax.sharding.NamedSharding(line, jax.sharding.PartitionSpec("hosts"))
  mine = [d for d in devices if d.process_index == jax.process_index()]
  # Each process's row, read from the first of its devices.
  first = {}
  for i, d in enumerate(devices):
    first.setdefault(d.process_index, i)
  rows = [first[p] for p in sorted(first)]

  def gather(x):
    x = np.asarray(x)
    arr = jax.make_array_from_single_device_arrays(
      (len(devices), *x.shape),
      split,
      [jax.device_put(x[None], d) for d in mine],
    )
    return np.asarray(_replicator(line)(arr).addressable_data(0))[rows]

  return jax.tree.map(gather, tree)


@functools.lru_cache
def _replicator(mesh):
  """A program placing its input on every device of `mesh` (an
  all-gather); one per mesh, so it compiles once per shape."""
  full = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.jit(lambda a: a, out_shardings=full)


def gather_rows(tree: Any, mesh, rows: int) -> Any:
  """Global [rows, ...] numpy arrays on every process from each process's
  rows (`own_rows` order) of every leaf (a collective on `mesh`'s
  devices)."""
  mine = own_rows(mesh, rows)
  if jax.process_count() == 1:
    return jax.tree.map(lambda x: np.asarray(x)[np.argsort(mine)], tree)
  gathered = allgather((mine, jax.tree.map(np.asarray, tree)), mesh)
  index = np.asarray(gathered[0]).reshape(-1)

  def place(x):
    x = np.asarray(x)
    x = x.reshape(-1, *x.shape[2:])
    out = np.zeros((rows, *x.shape[1:]), x.dtype)
    out[index] = x
    return out

  return jax.tree.map(place, gathered[1])


def twin_mesh(mesh, target):
  """`mesh`'s devices as a mesh shaped as `target` with one more axis,
  each of `target`'s positions on the process of `target`'s device there
  (`transfer`'s staging layout); raises ValueError unless every process
  holds the same multiple of its `target` devices in `mesh`."""
  free = {}  # process index -> its devices of `mesh`, in order
  for d in mesh.devices.reshape(-1):
    free.setdefault(d.process_index, []).append(d)
  k, rest = divmod(mesh.devices.size, target.devices.size)
  twin = []
  for d in target.devices.reshape(-1):
    if rest or len(free.get(d.process_index, ())) < k:
      raise ValueError(
        f"{mesh.devices.size} update devices cannot serve"
        f" {target.devices.size} rollout devices with the same number on"
        " each one's process."
      )
    twin.append(free[d.process_index][:k])
    del free[d.process_index][:k]
  devices = np.asarray(twin, dtype=object).reshape(*target.devices.shape, k)
  return jax.sharding.Mesh(devices, (*target.axis_names, "_copies"))


def transfer(tree: Any, shardings: Any, twin) -> Any:
  """Every leaf of `tree` placed as `shardings` (named shardings, or a
  prefix tree of them as for `jax.device_put`, on another mesh of the same
  processes) without a program on the target's devices: a program on the
  leaf's own devices lays it out on `twin` (`twin_mesh`) as the target
  wants it, then each process copies its shards to the target's devices
  at the same positions, device to device.

  A thread that drives the target mesh (an asynchronous producer) thus
  never sees a program of this thread's on its devices, whose order
  between processes would differ.
  """

  def place(x, target):
    # The first twin device at each position -> the target's there.
    moved = dict(zip(twin.devices[..., 0].flat, target.mesh.devices.flat))
    staged = jax.device_put(x, jax.sharding.NamedSharding(twin, target.spec))
    shards = [
      jax.device_put(s.data, moved[s.device])
      for s in staged.addressable_shards
      if s.device in moved
    ]
    return jax.make_array_from_single_device_arrays(x.shape, target, shards)

  # `shardings` may be a prefix of `tree` (as for `jax.device_put`).
  return jax.tree.map(
    lambda target, x: jax.tree.map(lambda leaf: place(leaf, target), x),
    shardings,
    tree,
  )
