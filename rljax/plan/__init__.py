"""TPU slices to plan runs for: each generation's chip figures (`CHIPS`:
HBM, bandwidth, peak bfloat16 compute, with their sources) and the slice
names of JAX topologies and Cloud TPU accelerator types (`parse_slice`)."""

from rljax.plan._chips import CHIPS
from rljax.plan._chips import Chip
from rljax.plan._chips import Slice
from rljax.plan._chips import parse_slice

__all__ = ["CHIPS", "Chip", "Slice", "parse_slice"]
