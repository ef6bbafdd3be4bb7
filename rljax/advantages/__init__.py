"""Advantage estimators: rewards in, (detached) advantages out.

Outcome estimators (`grpo`, `dr_grpo`, `batch_std`, `rloo`, `opo`, `gpg`,
`pass_at_k`, `remax`, `gdpo`) map rewards [..., G] (the group of samples of
one prompt is the last axis) to one advantage per sample; an optional
``sample_mask_PG`` handles groups of different sizes, and groups with fewer
than 2 valid samples get advantage 0. Token estimators (`reinforce_pp`,
`reinforce_pp_baseline`, `gae`) work on [..., T] arrays with a token mask;
`outcome_to_token_rewards`, `discounted_returns` and `whiten` are their
building blocks.
"""

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
from rljax.advantages._returns import gae
from rljax.advantages._returns import outcome_to_token_rewards
from rljax.advantages._returns import reinforce_pp
from rljax.advantages._returns import reinforce_pp_baseline
from rljax.advantages._returns import whiten

__all__ = [
  "batch_std",
  "discounted_returns",
  "dr_grpo",
  "gae",
  "gdpo",
  "gpg",
  "grpo",
  "opo",
  "outcome_to_token_rewards",
  "pass_at_k",
  "reinforce_pp",
  "reinforce_pp_baseline",
  "remax",
  "rloo",
  "whiten",
]
