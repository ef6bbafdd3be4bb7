"""rljax: reinforcement-learning post-training of language models in JAX.

Dimension key (shape suffixes on names):
  P prompts, G samples per prompt (the group), K reward functions,
  T completion tokens, B batch axes (any leading axes; (P, G) in a Batch).
  e.g. rewards_PG, advantages_PGT, logp_BT.
"""

from rljax import aggregate
from rljax._src.base import Algorithm
from rljax._src.base import Batch
from rljax._src.base import LossTerms
from rljax._src.base import Mean
from rljax._src.base import Transform
from rljax._src.base import chain
from rljax._src.base import finalize
from rljax._src.base import mean_metric
from rljax._src.base import stateless_apply
from rljax._src.base import stateless_prepare

__all__ = [
    "Algorithm",
    "Batch",
    "LossTerms",
    "Mean",
    "Transform",
    "aggregate",
    "chain",
    "finalize",
    "mean_metric",
    "stateless_apply",
    "stateless_prepare",
]
