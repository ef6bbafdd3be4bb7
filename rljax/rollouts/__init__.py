"""Group strategies: how the samples of each step's groups are produced.

A `GroupStrategy` gives each sample of a group its recipe before sampling
(`Member`: a prompt with privileged context trained on the plain prompt, a
temperature, a given completion) and asks for replacements after scoring
(hints for groups that all failed, replayed successes). The trainer
samples every round with the rollout engine and records each sample's
recipe in ``Batch.extra["stream_PG"]``. Configs name strategies
(``sampler.groups``, `get`); packages that build on this one add theirs
with `register` (``import rljax.envs`` adds the agent strategies).
"""

from rljax.rollouts._anytime import AnytimeBudgets
from rljax.rollouts._anytime import sample_anytime
from rljax.rollouts._base import EXPLORE
from rljax.rollouts._base import HINTED
from rljax.rollouts._base import INJECTED
from rljax.rollouts._base import PLAIN
from rljax.rollouts._base import PRIVILEGED
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
from rljax.rollouts._instructions import INSTRUCTED
from rljax.rollouts._instructions import InstructionPopulation
from rljax.rollouts._instructions import recombine
from rljax.rollouts._markovian import MarkovianChunks
from rljax.rollouts._markovian import carryover
from rljax.rollouts._markovian import sample_chunks
from rljax.rollouts._partial import PartialRollouts
from rljax.rollouts._replay import REPLAYED
from rljax.rollouts._replay import MixPolicyReplay
from rljax.rollouts._seeding import ICLSeeding
from rljax.rollouts._seeding import ngram_similarity
from rljax.rollouts._segment_tree import SegmentTree
from rljax.rollouts._segment_tree import segment_depths
from rljax.rollouts._segments import SegmentRollouts
from rljax.rollouts._segments import sample_continuations
from rljax.rollouts._segments import segment_cutpoints
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
from rljax.rollouts._strategies import register
from rljax.rollouts._trees import TreeRollouts
from rljax.rollouts._trees import divergence_forks
from rljax.rollouts._trees import sample_trees

__all__ = [
  "BUDGET_STREAM",
  "EXPLORE",
  "HBPO_TEMPLATE",
  "HINTED",
  "INJECTED",
  "INSTRUCTED",
  "PLAIN",
  "PRIVILEGED",
  "REPLAYED",
  "STRATEGIES",
  "AnytimeBudgets",
  "BudgetSubgroups",
  "Drawn",
  "Group",
  "GroupStrategy",
  "ICLSeeding",
  "InContextDemos",
  "InjectAnswer",
  "InstructionPopulation",
  "MarkovianChunks",
  "Member",
  "MixPolicyReplay",
  "PartialRollouts",
  "PrivilegedContext",
  "ReplaySuccesses",
  "Scores",
  "SegmentRollouts",
  "SegmentTree",
  "SolutionHints",
  "State",
  "TemperatureStream",
  "TieredHints",
  "TreeRollouts",
  "carryover",
  "divergence_forks",
  "get",
  "icpo_demonstrations",
  "ngram_similarity",
  "recombine",
  "register",
  "sample_chunks",
  "sample_continuations",
  "sample_anytime",
  "sample_members",
  "sample_trees",
  "segment_cutpoints",
  "segment_depths",
  "splice",
  "subgroup_sizes",
]
