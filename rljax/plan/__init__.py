"""Run plans for TPU slices, compiled from any host.

`plan_run` compiles every program of an RL iteration for a slice
(``v5e:4x4``, ``v5p-128``) with abstract inputs and measures it: memory per
device against the chip's HBM, roofline times and an iteration estimate;
`search` finds the nearest configuration that fits. `CHIPS` holds each
generation's chip figures with their sources, `parse_slice` the slice names
of JAX topologies and Cloud TPU accelerator types.
"""

from rljax.plan._chips import CHIPS
from rljax.plan._chips import Chip
from rljax.plan._chips import Slice
from rljax.plan._chips import parse_slice
from rljax.plan._measure import Measured
from rljax.plan._measure import measure
from rljax.plan._plan import Cost
from rljax.plan._plan import Plan
from rljax.plan._plan import over_message
from rljax.plan._plan import plan_run
from rljax.plan._plan import search
from rljax.plan._plan import table
from rljax.plan._plan import topology_devices

__all__ = [
  "CHIPS",
  "Chip",
  "Cost",
  "Measured",
  "Plan",
  "Slice",
  "measure",
  "over_message",
  "parse_slice",
  "plan_run",
  "search",
  "table",
  "topology_devices",
]
