"""Algorithm presets: one-line compositions of advantages, objectives and an
aggregation. `get(name, **kwargs)` looks one up by name; `docs/papers.md`
lists each seed paper's preset or composition."""

from rljax.algorithms import _bounds
from rljax.algorithms import _offpolicy
from rljax.algorithms import _stateful
from rljax.algorithms import _teacher
from rljax.algorithms import _variants
from rljax.algorithms._presets import PRESETS
from rljax.algorithms._presets import bnpo
from rljax.algorithms._presets import cispo
from rljax.algorithms._presets import dapo
from rljax.algorithms._presets import dr_grpo
from rljax.algorithms._presets import get
from rljax.algorithms._presets import gmpo
from rljax.algorithms._presets import gpg
from rljax.algorithms._presets import grpo
from rljax.algorithms._presets import gspo
from rljax.algorithms._presets import ppo
from rljax.algorithms._presets import reinforce_pp
from rljax.algorithms._presets import remax
from rljax.algorithms._presets import rloo
from rljax.algorithms._presets import sapo

# The literature's presets, one module per family, join the registry.
_FAMILIES = (_offpolicy, _stateful, _variants, _bounds, _teacher)
for _family in _FAMILIES:
  PRESETS.update(_family.PRESETS)
globals().update(
  {name: factory for f in _FAMILIES for name, factory in f.PRESETS.items()}
)

__all__ = [
  "PRESETS",
  "bnpo",
  "cispo",
  "dapo",
  "dr_grpo",
  "get",
  "gmpo",
  "gpg",
  "grpo",
  "gspo",
  "ppo",
  "reinforce_pp",
  "remax",
  "rloo",
  "sapo",
]
