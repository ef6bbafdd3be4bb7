"""Loss stages: run inside the loss, where the current log-probs carry the
gradient. Policy surrogates, KL and entropy penalties, token masks, and the
PPO value objective.
"""

from rljax.objectives._bounds import aepo
from rljax.objectives._bounds import bapo
from rljax.objectives._bounds import dcpo_clip
from rljax.objectives._bounds import dispo
from rljax.objectives._bounds import etr
from rljax.objectives._bounds import hapo_het
from rljax.objectives._bounds import llds
from rljax.objectives._bounds import r2vpo
from rljax.objectives._masks import off_policy_mask
from rljax.objectives._masks import top_entropy_mask
from rljax.objectives._mixed import mixed_policy
from rljax.objectives._offpolicy import disco
from rljax.objectives._offpolicy import mdpo
from rljax.objectives._penalties import AresKlState
from rljax.objectives._penalties import adaptive_entropy_bonus
from rljax.objectives._penalties import adaptive_kl_penalty
from rljax.objectives._penalties import ares_kl_penalty
from rljax.objectives._penalties import entropy_bonus
from rljax.objectives._penalties import kl_penalty
from rljax.objectives._policy import policy
from rljax.objectives._policy import randomized_policy
from rljax.objectives._teacher import VcpoState
from rljax.objectives._teacher import capo_mask
from rljax.objectives._teacher import capo_scores
from rljax.objectives._teacher import kepo_distill
from rljax.objectives._teacher import kepo_distill_loss
from rljax.objectives._teacher import kepo_gate
from rljax.objectives._teacher import vcpo_ess
from rljax.objectives._teacher import vcpo_scale_by_ess
from rljax.objectives._value import value_loss

__all__ = [
  "AresKlState",
  "VcpoState",
  "adaptive_entropy_bonus",
  "adaptive_kl_penalty",
  "aepo",
  "ares_kl_penalty",
  "bapo",
  "capo_mask",
  "capo_scores",
  "dcpo_clip",
  "disco",
  "dispo",
  "entropy_bonus",
  "etr",
  "hapo_het",
  "kepo_distill",
  "kepo_distill_loss",
  "kepo_gate",
  "kl_penalty",
  "llds",
  "mdpo",
  "mixed_policy",
  "off_policy_mask",
  "policy",
  "r2vpo",
  "randomized_policy",
  "top_entropy_mask",
  "value_loss",
  "vcpo_ess",
  "vcpo_scale_by_ess",
]
