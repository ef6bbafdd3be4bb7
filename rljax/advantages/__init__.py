"""Advantage estimators: rewards in, (detached) advantages out.

Outcome estimators (`grpo`, `dr_grpo`, `batch_std`, `rloo`, `opo`, `gpg`,
`pass_at_k`, `remax`, `gdpo`) map rewards [..., G] (the group of samples of
one prompt is the last axis) to one advantage per sample; an optional
``sample_mask_PG`` handles groups of different sizes, and groups with fewer
than 2 valid samples get advantage 0. Token estimators (`reinforce_pp`,
`reinforce_pp_baseline`, `gae`) work on [..., T] arrays with a token mask;
`outcome_to_token_rewards`, `discounted_returns` and `whiten` are their
building blocks. Turn estimators (`turn_grpo`, `gigpo`, `hgpo`, `salt`,
`seeupo`, `action_gae`) credit the turns of multi-turn agent episodes
([P, G, N] per-turn arrays; `turns_to_tokens` puts them on the tokens).
"""

from rljax.advantages._entropy import ARES_TABLE
from rljax.advantages._entropy import AresRewardTable
from rljax.advantages._entropy import adv_entropy_token_mask
from rljax.advantages._entropy import ares_bucket_targets
from rljax.advantages._entropy import ares_difficulty
from rljax.advantages._entropy import ares_entropy_reward
from rljax.advantages._entropy import hwe_threshold
from rljax.advantages._entropy import hwe_trigger_count
from rljax.advantages._entropy import max_variance_subset
from rljax.advantages._entropy import window_entropy
from rljax.advantages._group import batch_std
from rljax.advantages._group import dr_grpo
from rljax.advantages._group import gdpo
from rljax.advantages._group import gpg
from rljax.advantages._group import grpo
from rljax.advantages._group import opo
from rljax.advantages._group import pass_at_k
from rljax.advantages._group import remax
from rljax.advantages._group import rloo
from rljax.advantages._returns import discounted_returns
from rljax.advantages._returns import egae
from rljax.advantages._returns import gae
from rljax.advantages._returns import outcome_to_token_rewards
from rljax.advantages._returns import reinforce_pp
from rljax.advantages._returns import reinforce_pp_baseline
from rljax.advantages._returns import whiten
from rljax.advantages._reweight import answer_confidence
from rljax.advantages._reweight import arm
from rljax.advantages._reweight import grpo_s_scale
from rljax.advantages._reweight import rapo_weights
from rljax.advantages._reweight import red_drop
from rljax.advantages._tokens import gtpo_entropy_filter
from rljax.advantages._tokens import gtpo_token_weights
from rljax.advantages._tokens import hicra_amplify
from rljax.advantages._tokens import strategic_gram_mask
from rljax.advantages._tokens import tokens_after_trigger
from rljax.advantages._turns import action_gae
from rljax.advantages._turns import action_hashes
from rljax.advantages._turns import anchor_advantages
from rljax.advantages._turns import gigpo
from rljax.advantages._turns import hgpo
from rljax.advantages._turns import per_turn_sum
from rljax.advantages._turns import salt
from rljax.advantages._turns import seeupo
from rljax.advantages._turns import turn_grpo
from rljax.advantages._turns import turn_returns
from rljax.advantages._turns import turn_rewards_to_tokens
from rljax.advantages._turns import turn_valid
from rljax.advantages._turns import turns_to_tokens
from rljax.advantages._variants import adora
from rljax.advantages._variants import adora_length_classes
from rljax.advantages._variants import aspo
from rljax.advantages._variants import distinctiveness_mask
from rljax.advantages._variants import hdpo
from rljax.advantages._variants import hdpo_channels
from rljax.advantages._variants import pf_ppo_indices
from rljax.advantages._variants import pf_ppo_weights
from rljax.advantages._variants import soft_advantage
from rljax.advantages._variants_answers import answer_entropy
from rljax.advantages._variants_answers import copo_global_advantages
from rljax.advantages._variants_answers import copo_weights
from rljax.advantages._variants_answers import distinct_fraction
from rljax.advantages._variants_answers import polychromic
from rljax.advantages._variants_answers import seed_grpo
from rljax.advantages._variants_length import grpo_lambda_mask
from rljax.advantages._variants_length import kimi_length_reward
from rljax.advantages._variants_length import l_grpo_bonus
from rljax.advantages._variants_length import top_groups

__all__ = [
  "ARES_TABLE",
  "AresRewardTable",
  "action_gae",
  "action_hashes",
  "adora",
  "adora_length_classes",
  "adv_entropy_token_mask",
  "anchor_advantages",
  "answer_confidence",
  "answer_entropy",
  "ares_bucket_targets",
  "ares_difficulty",
  "ares_entropy_reward",
  "arm",
  "aspo",
  "batch_std",
  "copo_global_advantages",
  "copo_weights",
  "discounted_returns",
  "distinct_fraction",
  "distinctiveness_mask",
  "dr_grpo",
  "egae",
  "gae",
  "gdpo",
  "gigpo",
  "gpg",
  "grpo",
  "grpo_lambda_mask",
  "grpo_s_scale",
  "gtpo_entropy_filter",
  "gtpo_token_weights",
  "hdpo",
  "hdpo_channels",
  "hgpo",
  "hicra_amplify",
  "hwe_threshold",
  "hwe_trigger_count",
  "kimi_length_reward",
  "l_grpo_bonus",
  "max_variance_subset",
  "opo",
  "outcome_to_token_rewards",
  "pass_at_k",
  "per_turn_sum",
  "pf_ppo_indices",
  "pf_ppo_weights",
  "polychromic",
  "rapo_weights",
  "red_drop",
  "reinforce_pp",
  "reinforce_pp_baseline",
  "remax",
  "rloo",
  "salt",
  "seed_grpo",
  "seeupo",
  "soft_advantage",
  "strategic_gram_mask",
  "tokens_after_trigger",
  "top_groups",
  "turn_grpo",
  "turn_returns",
  "turn_rewards_to_tokens",
  "turn_valid",
  "turns_to_tokens",
  "whiten",
  "window_entropy",
]
