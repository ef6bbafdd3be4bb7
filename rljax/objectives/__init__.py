"""Loss stages: run inside the loss, where the current log-probs carry the
gradient. Policy surrogates, KL and entropy penalties, token masks, and the
PPO value objective.
"""

from rljax.objectives._masks import off_policy_mask
from rljax.objectives._masks import top_entropy_mask
from rljax.objectives._mixed import mixed_policy
from rljax.objectives._offpolicy import disco
from rljax.objectives._offpolicy import mdpo
from rljax.objectives._penalties import adaptive_entropy_bonus
from rljax.objectives._penalties import adaptive_kl_penalty
from rljax.objectives._penalties import entropy_bonus
from rljax.objectives._penalties import kl_penalty
from rljax.objectives._policy import policy
from rljax.objectives._policy import randomized_policy
from rljax.objectives._value import value_loss

__all__ = [
  "adaptive_entropy_bonus",
  "adaptive_kl_penalty",
  "disco",
  "entropy_bonus",
  "kl_penalty",
  "mdpo",
  "mixed_policy",
  "off_policy_mask",
  "policy",
  "randomized_policy",
  "top_entropy_mask",
  "value_loss",
]
