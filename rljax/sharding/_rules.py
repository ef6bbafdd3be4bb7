"""Device meshes and logical-axis rules: where each array dimension lives.

Parameters carry ``logical_axes`` metadata (``("layers", "embed", "heads",
"head_dim")``); rules map each logical name to mesh axes. The mesh has three
named axes: ``data`` (pure data parallelism), ``fsdp`` (data parallelism
with parameters split across it) and ``tensor`` (heads, MLP and vocabulary
split). Batches are split over ``("data", "fsdp")``. Mixture-of-experts
weights split their expert axis over ``fsdp`` (expert parallelism without a
fourth mesh axis: meshes, batch axes and mesh specs stay as they are).

Meshes use `jax.sharding.AxisType.Auto`: jit's in/out shardings fix where
inputs and outputs live and XLA's partitioner places the rest, as MaxText
does. (The model's einsums would each need an explicit ``out_sharding``
under `AxisType.Explicit`.)
"""

from collections.abc import Sequence
import math
from typing import Any, Optional

from flax import nnx
import jax
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

MeshAxes = None | str | tuple[str, ...]
Rules = Sequence[tuple[str, MeshAxes]]

# FSDP over the embedding width, tensor parallelism over heads, MLP width and
# vocabulary (Megatron's split), layers and head_dim whole.
DEFAULT_RULES: Rules = (
  ("batch", BATCH_AXES),
  ("layers", None),
  ("vocab", "tensor"),
  ("embed", "fsdp"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("head_dim", None),
  ("mlp", "tensor"),
  # Mixtures of experts: expert parallelism over the fsdp axis, whose
  # devices already hold different tokens (GShard's layout); the experts'
  # own width stays whole there (one mesh axis per array dimension).
  ("expert", "fsdp"),
  ("expert_embed", None),
)


def make_mesh(
  data: int = -1,
  fsdp: int = 1,
  tensor: int = 1,
  *,
  devices: Optional[Sequence[jax.Device]] = None,
) -> Mesh:
  """A (data, fsdp, tensor) mesh over `devices` (default: all devices).

  One size may be -1: it takes the devices the others leave. The product
  must equal the number of devices.
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
  if list(sizes.values()).count(-1) > 1:
    raise ValueError(f"at most one mesh axis may be -1; got {sizes}.")
  for name, size in sizes.items():
    if size == 0 or size < -1:
      raise ValueError(f"mesh axis {name} must be >= 1 or -1; got {size}.")
  known = math.prod(s for s in sizes.values() if s != -1)
  if -1 in sizes.values():
    if len(devices) % known:
      raise ValueError(
        f"mesh axes {sizes} leave no whole size for the -1 axis with"
        f" {len(devices)} devices; choose sizes whose product divides it."
      )
    sizes = {
      k: len(devices) // known if s == -1 else s for k, s in sizes.items()
    }
  if math.prod(sizes.values()) != len(devices):
    raise ValueError(
      f"mesh data x fsdp x tensor = {sizes} uses"
      f" {math.prod(sizes.values())} devices but {len(devices)} are"
      " available; make the product equal the device count (or set one"
      " axis to -1)."
    )
  return jax.make_mesh(
    tuple(sizes.values()),
    MESH_AXES,
    axis_types=(AxisType.Auto,) * len(MESH_AXES),
    devices=devices,
  )


def logical_to_spec(
  logical_axes: Sequence[Optional[str]], rules: Rules = DEFAULT_RULES
) -> PartitionSpec:
  """The PartitionSpec of an array whose dimensions have these names."""
  table = dict(rules)
  unknown = [a for a in logical_axes if a is not None and a not in table]
  if unknown:
    raise ValueError(
      f"logical axes {unknown} have no sharding rule; add (name, mesh axes)"
      f" pairs for them to the rules (known: {sorted(table)})."
    )
  return PartitionSpec(*(None if a is None else table[a] for a in logical_axes))


def _axis_size(mesh: Mesh, axes: MeshAxes) -> int:
  """Number of devices along one PartitionSpec entry."""
  if axes is None:
    return 1
  names = (axes,) if isinstance(axes, str) else axes
  return math.prod(mesh.shape[n] for n in names)


def _checked_sharding(path, variable, mesh: Mesh, rules: Rules):
  """The NamedSharding of one parameter, after a divisibility check."""
  axes = variable.get_metadata().get("logical_axes")
  if axes is None:
    return NamedSharding(mesh, PartitionSpec())
  spec = logical_to_spec(axes, rules)
  for dim, (size, name, on_mesh) in enumerate(zip(variable.shape, axes, spec)):
    n = _axis_size(mesh, on_mesh)
    if size % n:
      raise ValueError(
        f"parameter {jax.tree_util.keystr(path)} dimension {dim}"
        f" ({name!r}, size {size}) cannot be split over mesh axes"
        f" {on_mesh!r} ({n} devices); use a mesh whose {on_mesh!r} size"
        f" divides {size}, or map {name!r} to None in the rules."
      )
  return NamedSharding(mesh, spec)


def param_shardings(state: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """NamedShardings for an `nnx.State` (or model) from its logical axes.

  Raises a ValueError naming the parameter when a dimension does not divide
  its mesh axes.
  """
  if isinstance(state, nnx.Module):
    state = nnx.state(state)
  return jax.tree_util.tree_map_with_path(
    lambda path, v: _checked_sharding(path, v, mesh, rules),
    state,
    is_leaf=lambda x: isinstance(x, nnx.Variable),
  )


def shard_model(model: nnx.Module, mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """Places every parameter of `model` on `mesh` by the rules (in place)."""
  state = nnx.state(model)
  nnx.update(model, jax.device_put(state, param_shardings(state, mesh, rules)))
  return model


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Leading axis split over the batch axes, the rest whole."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *(None,) * (ndim - 1)))


def check_batch(name: str, size: int, mesh: Mesh) -> None:
  """A clear error when a batch of `size` rows cannot split over the mesh."""
  n = _axis_size(mesh, BATCH_AXES)
  if size % n:
    raise ValueError(
      f"{name} has {size} rows, which does not divide the"
      f" {n} devices of the batch axes (data={mesh.shape['data']} x"
      f" fsdp={mesh.shape['fsdp']}); use a multiple of {n}, or a mesh with"
      " smaller data/fsdp axes."
    )
