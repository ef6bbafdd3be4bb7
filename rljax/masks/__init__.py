"""Per-token weights and masks for the policy term (all detached, float32).

Rollout-mismatch correction (lr = old_logp - rollout_logp): `token_tis`,
`sequence_tis`, `icepop`, `sequence_masked_tis`, `normalize_weights`.
Token selection: `top_entropy_mask`, `off_policy_sequence_mask`,
`truncated_mask`. Every result has the shape of `mask_BT` ([..., T]) and is
already multiplied by it.
"""

from rljax.masks._rollout import icepop
from rljax.masks._rollout import normalize_weights
from rljax.masks._rollout import sequence_masked_tis
from rljax.masks._rollout import sequence_tis
from rljax.masks._rollout import token_tis
from rljax.masks._tokens import off_policy_sequence_mask
from rljax.masks._tokens import top_entropy_mask
from rljax.masks._tokens import truncated_mask

__all__ = [
  "icepop",
  "normalize_weights",
  "off_policy_sequence_mask",
  "sequence_masked_tis",
  "sequence_tis",
  "token_tis",
  "top_entropy_mask",
  "truncated_mask",
]
