"""rljax: reinforcement-learning post-training of language models in JAX.

Dimension key (shape suffixes on names):
  P prompts, G samples per prompt (the group), K reward functions,
  T completion tokens, B batch axes (any leading axes; (P, G) in a Batch).
  e.g. rewards_PG, advantages_PGT, logp_BT.

Layers, from pure maths to named algorithms:
  advantages, losses, masks, shaping, filters, aggregate  (array functions)
  transforms (batch stages), objectives (loss stages)     (rljax.Transform)
  algorithms (presets: grpo, dapo, sapo, ppo, ...)        (rljax.Algorithm)

Around them (import them by name, e.g. ``from rljax import models``):
  models, checkpoints, tokenizers, sampling, sharding      (the policy)
  rewards, tasks, sandbox                                  (what it learns)
  training, checkpointing, monitoring                      (the RL loop)
  posttrain (SFT, preference runs), envs, tools, rollouts  (beside it)
"""

from rljax import advantages
from rljax import aggregate
from rljax import algorithms
from rljax import filters
from rljax import losses
from rljax import masks
from rljax import objectives
from rljax import shaping
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import Batch
from rljax._src.base import LossTerms
from rljax._src.base import Mean
from rljax._src.base import Rescore
from rljax._src.base import Transform
from rljax._src.base import chain
from rljax._src.base import finalize
from rljax._src.base import mean_metric
from rljax._src.base import stateless_apply
from rljax._src.base import stateless_prepare
from rljax._src.tables import PromptTable

__all__ = [
  "Algorithm",
  "Batch",
  "LossTerms",
  "Mean",
  "Rescore",
  "PromptTable",
  "Transform",
  "advantages",
  "aggregate",
  "algorithms",
  "chain",
  "filters",
  "finalize",
  "losses",
  "masks",
  "mean_metric",
  "objectives",
  "shaping",
  "stateless_apply",
  "stateless_prepare",
  "transforms",
]
