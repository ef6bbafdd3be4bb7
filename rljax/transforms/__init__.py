"""Batch stages: run once per rollout batch, before the gradient.

Rewards -> shaping -> filters -> advantages -> importance weights. Each factory
returns a `rljax.Transform`; compose them with `rljax.chain`.
"""

from rljax.transforms._advantages import egae_advantages
from rljax.transforms._advantages import gae_advantages
from rljax.transforms._advantages import gdpo_advantages
from rljax.transforms._advantages import group_advantages
from rljax.transforms._advantages import opo_advantages
from rljax.transforms._advantages import reinforce_pp_advantages
from rljax.transforms._advantages import reinforce_pp_baseline_advantages
from rljax.transforms._advantages import remax_advantages
from rljax.transforms._advantages import sequence_rewards
from rljax.transforms._advantages import token_rewards
from rljax.transforms._allocation import xrpo_novelty_advantages
from rljax.transforms._allocation import xrpo_novelty_bonus
from rljax.transforms._anytime import brpo_advantages
from rljax.transforms._anytime import brpo_advantages_of
from rljax.transforms._anytime import brpo_chunk_advantages
from rljax.transforms._anytime import budget_prior
from rljax.transforms._bounds import dcpo_sas_advantages
from rljax.transforms._bounds import etr_bounds
from rljax.transforms._bounds import hapo_entropy_scores
from rljax.transforms._bounds import hapo_token_advantages
from rljax.transforms._budgets import hbpo_advantage
from rljax.transforms._budgets import hbpo_advantages
from rljax.transforms._budgets import hbpo_budget_reward
from rljax.transforms._budgets import hbpo_reward
from rljax.transforms._budgets import hbpo_rewards
from rljax.transforms._distill import opd_advantages
from rljax.transforms._distill import opd_token_advantages
from rljax.transforms._entropy import AresState
from rljax.transforms._entropy import D3SState
from rljax.transforms._entropy import ares_entropy_shaping
from rljax.transforms._entropy import d3s_downsampling
from rljax.transforms._entropy import keep_schedule
from rljax.transforms._group_rewards import adaptive_process_rewards
from rljax.transforms._group_rewards import calibrated_rewards
from rljax.transforms._group_rewards import cgpo_calibrated_rewards
from rljax.transforms._group_rewards import cgpo_constraint_mask
from rljax.transforms._group_rewards import cluster_frequency_rewards
from rljax.transforms._group_rewards import empo_rewards
from rljax.transforms._group_rewards import inverse_accuracy
from rljax.transforms._group_rewards import mask_flagged_positives
from rljax.transforms._group_rewards import p_grpo_rewards
from rljax.transforms._group_rewards import spo_win_rates
from rljax.transforms._group_rewards import success_gated_rewards
from rljax.transforms._group_rewards import tp_grpo_rewards
from rljax.transforms._group_rewards import win_rate_rewards
from rljax.transforms._markovian import delethink_advantages
from rljax.transforms._markovian import delethink_advantages_of
from rljax.transforms._markovian import final_chunks
from rljax.transforms._markovian import trace_length_norm
from rljax.transforms._markovian import trace_lengths_of
from rljax.transforms._replay import RemixState
from rljax.transforms._replay import kl_convex
from rljax.transforms._replay import remix
from rljax.transforms._replay import remix_behaviour_logp
from rljax.transforms._replay import remix_loss
from rljax.transforms._rewards import adaptive_kl_in_reward
from rljax.transforms._rewards import clip_rewards
from rljax.transforms._rewards import kl_in_reward
from rljax.transforms._rewards import overlong_penalty
from rljax.transforms._rewards import stop_properly_penalty
from rljax.transforms._rewards import weighted_rewards
from rljax.transforms._reweight import arm_advantages
from rljax.transforms._reweight import grpo_s_rewards
from rljax.transforms._reweight import rapo_weights
from rljax.transforms._reweight import red_drop_advantages
from rljax.transforms._segments import spo_chain_advantages
from rljax.transforms._segments import spo_chain_advantages_of
from rljax.transforms._segments import spo_tree_advantages
from rljax.transforms._segments import spo_tree_advantages_of
from rljax.transforms._segments import spo_tree_values_of
from rljax.transforms._selection import dynamic_sampling
from rljax.transforms._selection import informative_groups
from rljax.transforms._selection import kept_groups
from rljax.transforms._selection import mask_truncated
from rljax.transforms._selection import reward_range_filter
from rljax.transforms._single_stream import single_stream_advantages
from rljax.transforms._single_stream import single_stream_rho
from rljax.transforms._single_stream import single_stream_zscore
from rljax.transforms._stateful import budget_length_reward
from rljax.transforms._stateful import budget_schedule
from rljax.transforms._stateful import bundle_scores
from rljax.transforms._stateful import hapo_history_rewards
from rljax.transforms._stateful import history_length_reward
from rljax.transforms._stateful import length_budget_curriculum
from rljax.transforms._stateful import mvar_advantages
from rljax.transforms._stateful import riskpo_advantages
from rljax.transforms._stateful import track_quantiles
from rljax.transforms._streams import StepState
from rljax.transforms._streams import icpo_bonus
from rljax.transforms._streams import icpo_expert_bonus
from rljax.transforms._streams import stream_weights
from rljax.transforms._teacher import AepoState
from rljax.transforms._teacher import aepo_stream_advantages
from rljax.transforms._teacher import aepo_stream_targets
from rljax.transforms._teacher import dcpo_dist_advantages
from rljax.transforms._teacher import dcpo_dist_alpha
from rljax.transforms._teacher import dcpo_dist_entropy
from rljax.transforms._teacher import dcpo_dist_mix
from rljax.transforms._teacher import dcpo_dist_temperature
from rljax.transforms._teacher import rto_rewards
from rljax.transforms._teacher import rto_token_rewards
from rljax.transforms._teacher import vcpo_advantages
from rljax.transforms._teacher import vcpo_baseline_advantages
from rljax.transforms._teacher import vcpo_ess_ratio
from rljax.transforms._teacher import vcpo_lr_scale
from rljax.transforms._teacher import vcpo_optimal_baseline
from rljax.transforms._teacher import vcpo_sequence_weights
from rljax.transforms._tokens import decision_token_mask
from rljax.transforms._tokens import gtpo_advantages
from rljax.transforms._tokens import hicra
from rljax.transforms._tooluse import otc_rewards
from rljax.transforms._tooluse import otc_rewards_of
from rljax.transforms._tooluse import otc_tool_reward
from rljax.transforms._tooluse import thor_advantages
from rljax.transforms._tooluse import thor_advantages_of
from rljax.transforms._tooluse import thor_step_rewards_of
from rljax.transforms._tooluse import toolpo_action_rewards_of
from rljax.transforms._tooluse import toolpo_advantages
from rljax.transforms._tooluse import toolpo_advantages_of
from rljax.transforms._tooluse_infopo import INFOPO_PLACEHOLDER
from rljax.transforms._tooluse_infopo import InfoPOState
from rljax.transforms._tooluse_infopo import infopo_advantages
from rljax.transforms._tooluse_infopo import infopo_advantages_of
from rljax.transforms._tooluse_infopo import infopo_counterfactual_logprobs
from rljax.transforms._tooluse_infopo import infopo_information_gain
from rljax.transforms._tooluse_portool import portool_advantages
from rljax.transforms._tooluse_portool import portool_advantages_of
from rljax.transforms._tooluse_portool import portool_step_rewards_of
from rljax.transforms._trees import treepo_advantages
from rljax.transforms._trees import treepo_advantages_of
from rljax.transforms._turns import SeeupoState
from rljax.transforms._turns import drop_small_advantages
from rljax.transforms._turns import episode_advantages
from rljax.transforms._turns import episode_returns
from rljax.transforms._turns import gigpo_advantages
from rljax.transforms._turns import hgpo_advantages
from rljax.transforms._turns import poad_advantages
from rljax.transforms._turns import salt_advantages
from rljax.transforms._turns import seeupo_advantages
from rljax.transforms._turns import seeupo_policy
from rljax.transforms._turns import seeupo_turn
from rljax.transforms._turns import turn_advantages
from rljax.transforms._turns import turn_rewards
from rljax.transforms._variants import COPO_MIX
from rljax.transforms._variants import adora_advantages
from rljax.transforms._variants import adora_length_criterion
from rljax.transforms._variants import aspo_shaping
from rljax.transforms._variants import copo_advantages
from rljax.transforms._variants import dagrpo_mask
from rljax.transforms._variants import grpo_lambda_rewards
from rljax.transforms._variants import hdpo_advantages
from rljax.transforms._variants import kimi_length_rewards
from rljax.transforms._variants import l_grpo_rewards
from rljax.transforms._variants import pf_ppo_resample
from rljax.transforms._variants import polychromic_advantages
from rljax.transforms._variants import seed_grpo_advantages
from rljax.transforms._variants import soft_advantages
from rljax.transforms._weights import icepop
from rljax.transforms._weights import sequence_masked_tis
from rljax.transforms._weights import sequence_tis
from rljax.transforms._weights import token_tis

__all__ = [
  "AepoState",
  "AresState",
  "COPO_MIX",
  "D3SState",
  "RemixState",
  "adaptive_kl_in_reward",
  "adaptive_process_rewards",
  "adora_advantages",
  "adora_length_criterion",
  "aepo_stream_advantages",
  "aepo_stream_targets",
  "ares_entropy_shaping",
  "arm_advantages",
  "aspo_shaping",
  "SeeupoState",
  "StepState",
  "brpo_advantages",
  "brpo_advantages_of",
  "brpo_chunk_advantages",
  "budget_length_reward",
  "budget_prior",
  "drop_small_advantages",
  "episode_advantages",
  "episode_returns",
  "gigpo_advantages",
  "hgpo_advantages",
  "icpo_bonus",
  "icpo_expert_bonus",
  "poad_advantages",
  "salt_advantages",
  "seeupo_advantages",
  "seeupo_policy",
  "seeupo_turn",
  "stream_weights",
  "budget_schedule",
  "bundle_scores",
  "calibrated_rewards",
  "cgpo_calibrated_rewards",
  "cgpo_constraint_mask",
  "clip_rewards",
  "cluster_frequency_rewards",
  "copo_advantages",
  "d3s_downsampling",
  "dagrpo_mask",
  "dcpo_dist_advantages",
  "dcpo_dist_alpha",
  "dcpo_dist_entropy",
  "dcpo_dist_mix",
  "dcpo_dist_temperature",
  "dcpo_sas_advantages",
  "decision_token_mask",
  "dynamic_sampling",
  "empo_rewards",
  "etr_bounds",
  "egae_advantages",
  "gae_advantages",
  "gdpo_advantages",
  "group_advantages",
  "grpo_lambda_rewards",
  "grpo_s_rewards",
  "gtpo_advantages",
  "hapo_entropy_scores",
  "hapo_history_rewards",
  "hapo_token_advantages",
  "hbpo_advantage",
  "hbpo_advantages",
  "hbpo_budget_reward",
  "hbpo_reward",
  "hbpo_rewards",
  "delethink_advantages",
  "delethink_advantages_of",
  "final_chunks",
  "trace_length_norm",
  "trace_lengths_of",
  "hdpo_advantages",
  "hicra",
  "history_length_reward",
  "icepop",
  "informative_groups",
  "inverse_accuracy",
  "keep_schedule",
  "kept_groups",
  "kimi_length_rewards",
  "kl_convex",
  "kl_in_reward",
  "l_grpo_rewards",
  "length_budget_curriculum",
  "mask_flagged_positives",
  "mask_truncated",
  "mvar_advantages",
  "opd_advantages",
  "opd_token_advantages",
  "opo_advantages",
  "overlong_penalty",
  "p_grpo_rewards",
  "pf_ppo_resample",
  "polychromic_advantages",
  "rapo_weights",
  "red_drop_advantages",
  "reinforce_pp_advantages",
  "reinforce_pp_baseline_advantages",
  "remax_advantages",
  "remix",
  "remix_behaviour_logp",
  "remix_loss",
  "reward_range_filter",
  "riskpo_advantages",
  "rto_rewards",
  "rto_token_rewards",
  "seed_grpo_advantages",
  "sequence_masked_tis",
  "sequence_rewards",
  "sequence_tis",
  "single_stream_advantages",
  "single_stream_rho",
  "single_stream_zscore",
  "soft_advantages",
  "spo_chain_advantages",
  "spo_chain_advantages_of",
  "spo_tree_advantages",
  "spo_tree_advantages_of",
  "spo_tree_values_of",
  "spo_win_rates",
  "stop_properly_penalty",
  "success_gated_rewards",
  "token_rewards",
  "token_tis",
  "INFOPO_PLACEHOLDER",
  "InfoPOState",
  "infopo_advantages",
  "infopo_advantages_of",
  "infopo_counterfactual_logprobs",
  "infopo_information_gain",
  "otc_rewards",
  "otc_rewards_of",
  "otc_tool_reward",
  "portool_advantages",
  "portool_advantages_of",
  "portool_step_rewards_of",
  "thor_advantages",
  "thor_advantages_of",
  "thor_step_rewards_of",
  "toolpo_action_rewards_of",
  "toolpo_advantages",
  "toolpo_advantages_of",
  "tp_grpo_rewards",
  "track_quantiles",
  "treepo_advantages",
  "treepo_advantages_of",
  "turn_advantages",
  "turn_rewards",
  "vcpo_advantages",
  "vcpo_baseline_advantages",
  "vcpo_ess_ratio",
  "vcpo_lr_scale",
  "vcpo_optimal_baseline",
  "vcpo_sequence_weights",
  "weighted_rewards",
  "win_rate_rewards",
  "xrpo_novelty_advantages",
  "xrpo_novelty_bonus",
]
