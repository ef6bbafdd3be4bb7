"""Presets over tree-sampled groups (segment trees of one prompt's leaves)."""

from typing import Optional

from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import chain
from rljax.algorithms._common import dapo_shaping


def treepo(
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.28,
  dual_clip: Optional[float] = 10.0,
  weighting: str = "average",
  normalize: str = "batch",
  max_length: Optional[int] = None,
  overlong_buffer: Optional[int] = None,
  overlong_factor: float = 1.0,
  dynamic_sampling: bool = True,
) -> Algorithm:
  """TreePO (arXiv 2508.17445): DAPO's recipe on tree-sampled leaves with
  the tree advantage (`transforms.treepo_advantages`, reading the sampler's
  ``Batch.extra["tree_PG"]``), PPO clip [1 - 0.2, 1 + 0.28] with dual clip
  10, token mean, no KL or entropy term. Defaults of the official script
  (multimodal-art-projection/TreePO recipe/treepo/run_treepo_train.sh:
  clip 0.2/0.28, `clip_ratio_c` 10, `token-mean`, filter_groups on `acc`,
  overlong buffer 512 with factor 1 for 7168-token responses); set both
  ``max_length`` and ``overlong_buffer`` to enable the overlong penalty."""
  stages = dapo_shaping(
    "treepo",
    max_length=max_length,
    overlong_buffer=overlong_buffer,
    overlong_factor=overlong_factor,
    dynamic_sampling=dynamic_sampling,
  )
  return Algorithm(
    chain(
      *stages,
      transforms.treepo_advantages(weighting=weighting, normalize=normalize),
      objectives.policy(
        losses.ppo_clip,
        eps_low=eps_low,
        eps_high=eps_high,
        dual_clip=dual_clip,
      ),
    ),
    aggregate.token_mean,
  )


PRESETS = {"treepo": treepo}
