"""Batch stages: run once per rollout batch, before the gradient.

Rewards -> shaping -> filters -> advantages -> importance weights. Each factory
returns a `rljax.Transform`; compose them with `rljax.chain`.
"""

from rljax.transforms._advantages import gae_advantages
from rljax.transforms._advantages import gdpo_advantages
from rljax.transforms._advantages import group_advantages
from rljax.transforms._advantages import opo_advantages
from rljax.transforms._advantages import reinforce_pp_advantages
from rljax.transforms._advantages import reinforce_pp_baseline_advantages
from rljax.transforms._advantages import remax_advantages
from rljax.transforms._advantages import sequence_rewards
from rljax.transforms._advantages import token_rewards
from rljax.transforms._rewards import adaptive_kl_in_reward
from rljax.transforms._rewards import clip_rewards
from rljax.transforms._rewards import kl_in_reward
from rljax.transforms._rewards import overlong_penalty
from rljax.transforms._rewards import stop_properly_penalty
from rljax.transforms._rewards import weighted_rewards
from rljax.transforms._selection import dynamic_sampling
from rljax.transforms._selection import informative_groups
from rljax.transforms._selection import kept_groups
from rljax.transforms._selection import mask_truncated
from rljax.transforms._selection import reward_range_filter
from rljax.transforms._weights import icepop
from rljax.transforms._weights import sequence_masked_tis
from rljax.transforms._weights import sequence_tis
from rljax.transforms._weights import token_tis

__all__ = [
  "adaptive_kl_in_reward",
  "clip_rewards",
  "dynamic_sampling",
  "gae_advantages",
  "gdpo_advantages",
  "group_advantages",
  "icepop",
  "informative_groups",
  "kept_groups",
  "kl_in_reward",
  "mask_truncated",
  "opo_advantages",
  "overlong_penalty",
  "reinforce_pp_advantages",
  "reinforce_pp_baseline_advantages",
  "remax_advantages",
  "reward_range_filter",
  "sequence_masked_tis",
  "sequence_rewards",
  "sequence_tis",
  "stop_properly_penalty",
  "token_rewards",
  "token_tis",
  "weighted_rewards",
]
