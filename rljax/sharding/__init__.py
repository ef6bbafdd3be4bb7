"""Device meshes, logical-axis sharding rules and parameter placement."""

from rljax.sharding._in_mesh import InMesh
from rljax.sharding._rules import BATCH_AXES
from rljax.sharding._rules import DEFAULT_RULES
from rljax.sharding._rules import MESH_AXES
from rljax.sharding._rules import batch_sharding
from rljax.sharding._rules import check_batch
from rljax.sharding._rules import logical_to_spec
from rljax.sharding._rules import make_mesh
from rljax.sharding._rules import param_shardings
from rljax.sharding._rules import shard_model

__all__ = [
  "BATCH_AXES",
  "DEFAULT_RULES",
  "InMesh",
  "MESH_AXES",
  "batch_sharding",
  "check_batch",
  "logical_to_spec",
  "make_mesh",
  "param_shardings",
  "shard_model",
]
