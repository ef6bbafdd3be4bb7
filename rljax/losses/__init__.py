"""Losses as pure functions of arrays.

Policy surrogates take ``(logp_BT, old_logp_BT, adv_BT, mask_BT, **hyper)`` and
return a `TokenLoss` of per-token values to minimise; KL estimators take
``(logp_BT, ref_logp_BT)``; value, preference and distillation losses (the
latter on logits [..., V]) have their own signatures. Nothing here reduces over tokens: `rljax.aggregate` does.
"""

from rljax.losses._bounds import aepo
from rljax.losses._bounds import bapo_candidates
from rljax.losses._bounds import bapo_contributions
from rljax.losses._bounds import bapo_select
from rljax.losses._bounds import dcpo_bounds
from rljax.losses._bounds import dcpo_clip
from rljax.losses._bounds import dcpo_sas
from rljax.losses._bounds import dispo
from rljax.losses._bounds import etr_eps
from rljax.losses._bounds import etr_macro
from rljax.losses._bounds import etr_micro
from rljax.losses._bounds import hapo_entropy_scores
from rljax.losses._bounds import hapo_het
from rljax.losses._bounds import hapo_token_advantages
from rljax.losses._bounds import llds
from rljax.losses._bounds import ppo_clip_bounds
from rljax.losses._bounds import r2vpo_penalty
from rljax.losses._distill import generalized_jsd
from rljax.losses._distill import gkd_loss
from rljax.losses._distill import token_forward_kl
from rljax.losses._distill import token_reverse_kl
from rljax.losses._kl import kl_abs
from rljax.losses._kl import kl_k1
from rljax.losses._kl import kl_k2
from rljax.losses._kl import kl_k3
from rljax.losses._kl import kl_k3_importance_corrected
from rljax.losses._kl import straight_through
from rljax.losses._offpolicy import disco
from rljax.losses._offpolicy import disco_scores
from rljax.losses._offpolicy import kimi_opmd
from rljax.losses._offpolicy import kl_reverse_old
from rljax.losses._offpolicy import mdpo_step_size
from rljax.losses._offpolicy import p3o
from rljax.losses._offpolicy import ratio_pg
from rljax.losses._offpolicy import rec
from rljax.losses._offpolicy import reg_grpo
from rljax.losses._policy import TokenLoss
from rljax.losses._policy import cispo
from rljax.losses._policy import cispo_capped
from rljax.losses._policy import clip_cov
from rljax.losses._policy import gmpo
from rljax.losses._policy import gppo
from rljax.losses._policy import gspo
from rljax.losses._policy import gspo_token
from rljax.losses._policy import icpo_shaped
from rljax.losses._policy import kl_cov
from rljax.losses._policy import luspo
from rljax.losses._policy import ppo_clip
from rljax.losses._policy import reinforce
from rljax.losses._policy import sapo
from rljax.losses._policy import vespo
from rljax.losses._preference import KTOLoss
from rljax.losses._preference import PreferenceLoss
from rljax.losses._preference import cpo
from rljax.losses._preference import dpo
from rljax.losses._preference import ipo
from rljax.losses._preference import kto
from rljax.losses._preference import kto_reference_point
from rljax.losses._preference import log_odds
from rljax.losses._preference import orpo
from rljax.losses._preference import robust_dpo
from rljax.losses._preference import sequence_logp
from rljax.losses._preference import simpo
from rljax.losses._preference import tgdpo
from rljax.losses._value import ValueLoss
from rljax.losses._value import value_clip
from rljax.losses._value import value_mse

__all__ = [
  "KTOLoss",
  "PreferenceLoss",
  "TokenLoss",
  "ValueLoss",
  "aepo",
  "bapo_candidates",
  "bapo_contributions",
  "bapo_select",
  "cispo",
  "cispo_capped",
  "clip_cov",
  "cpo",
  "dcpo_bounds",
  "dcpo_clip",
  "dcpo_sas",
  "disco",
  "disco_scores",
  "dispo",
  "dpo",
  "etr_eps",
  "etr_macro",
  "etr_micro",
  "generalized_jsd",
  "gkd_loss",
  "gmpo",
  "gppo",
  "gspo",
  "gspo_token",
  "hapo_entropy_scores",
  "hapo_het",
  "hapo_token_advantages",
  "ipo",
  "kimi_opmd",
  "kto",
  "kto_reference_point",
  "kl_abs",
  "kl_cov",
  "kl_k1",
  "kl_k2",
  "kl_k3",
  "kl_k3_importance_corrected",
  "kl_reverse_old",
  "llds",
  "log_odds",
  "luspo",
  "mdpo_step_size",
  "orpo",
  "p3o",
  "ppo_clip",
  "ppo_clip_bounds",
  "r2vpo_penalty",
  "ratio_pg",
  "rec",
  "robust_dpo",
  "reg_grpo",
  "icpo_shaped",
  "reinforce",
  "sapo",
  "sequence_logp",
  "simpo",
  "straight_through",
  "tgdpo",
  "token_forward_kl",
  "token_reverse_kl",
  "value_clip",
  "value_mse",
  "vespo",
]
