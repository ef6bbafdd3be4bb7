"""Group strategies: how the samples of each step's groups are produced.

A `GroupStrategy` gives each sample of a group its recipe before sampling
(`Member`: a prompt with privileged context trained on the plain prompt, a
temperature, a given completion) and asks for replacements after scoring
(hints for groups that all failed, replayed successes). The trainer
samples every round with the rollout engine and records each sample's
recipe in ``Batch.extra["stream_PG"]``. Configs name strategies
(``sampler.groups``, `get`).
"""

from rljax.rollouts._base import Drawn
from rljax.rollouts._base import Group
from rljax.rollouts._base import GroupStrategy
from rljax.rollouts._base import Member
from rljax.rollouts._base import Scores
from rljax.rollouts._base import State
from rljax.rollouts._base import sample_members
from rljax.rollouts._base import splice
from rljax.rollouts._budgets import BUDGET_STREAM
from rljax.rollouts._budgets import HBPO_TEMPLATE
from rljax.rollouts._budgets import BudgetSubgroups
from rljax.rollouts._budgets import subgroup_sizes
from rljax.rollouts._partial import PartialRollouts
from rljax.rollouts._strategies import EXPLORE
from rljax.rollouts._strategies import HINTED
from rljax.rollouts._strategies import INJECTED
from rljax.rollouts._strategies import PLAIN
from rljax.rollouts._strategies import PRIVILEGED
from rljax.rollouts._strategies import STRATEGIES
from rljax.rollouts._strategies import InContextDemos
from rljax.rollouts._strategies import InjectAnswer
from rljax.rollouts._strategies import PrivilegedContext
from rljax.rollouts._strategies import ReplaySuccesses
from rljax.rollouts._strategies import SolutionHints
from rljax.rollouts._strategies import TemperatureStream
from rljax.rollouts._strategies import TieredHints
from rljax.rollouts._strategies import get
from rljax.rollouts._strategies import icpo_demonstrations
from rljax.rollouts._trees import TreeRollouts
from rljax.rollouts._trees import sample_trees

__all__ = [
  "BUDGET_STREAM",
  "EXPLORE",
  "HBPO_TEMPLATE",
  "HINTED",
  "INJECTED",
  "PLAIN",
  "PRIVILEGED",
  "STRATEGIES",
  "BudgetSubgroups",
  "Drawn",
  "Group",
  "GroupStrategy",
  "InContextDemos",
  "InjectAnswer",
  "Member",
  "PartialRollouts",
  "PrivilegedContext",
  "ReplaySuccesses",
  "Scores",
  "SolutionHints",
  "State",
  "TemperatureStream",
  "TieredHints",
  "TreeRollouts",
  "get",
  "icpo_demonstrations",
  "sample_members",
  "sample_trees",
  "splice",
  "subgroup_sizes",
]
