"""Prompt selection: which prompts each step samples, and how many samples
each gets.

A `PromptSampler` keeps its own state (per-prompt statistics, a position,
a schedule), chooses a step's prompts with `select` and learns from the
scored rollout with `update`; the trainer checkpoints its state with the
train state and runs it identically on every process. `Shuffled` is the
default: the training set shuffled once and repeated, G samples each;
`Uncertainty` gives more samples to prompts whose success rate is least
certain; `Stages` runs a schedule of stages (prompts, sampler and
generation budget per stage); `SingleStream` draws prompts by the
uncertainty of a per-prompt success tracker (single-stream SPO);
`Knapsack`, `GVM` and `XRPO` split each step's rollout budget by the
papers' rules; `VAS`, `V0` and `VSPO` choose prompts by a learnt score.
Configs name them (``sampler.prompts``, `get`).
"""

from rljax.selection._allocators import GVM
from rljax.selection._allocators import XRPO
from rljax.selection._allocators import Knapsack
from rljax.selection._allocators import gvm_weights
from rljax.selection._allocators import knapsack_allocate
from rljax.selection._allocators import knapsack_value
from rljax.selection._allocators import xrpo_allocate
from rljax.selection._allocators import xrpo_priority
from rljax.selection._base import SAMPLERS
from rljax.selection._base import Feedback
from rljax.selection._base import PromptSampler
from rljax.selection._base import Selection
from rljax.selection._base import Shuffled
from rljax.selection._base import State
from rljax.selection._base import Uncertainty
from rljax.selection._base import allocate
from rljax.selection._base import check_selection
from rljax.selection._base import get
from rljax.selection._scored import V0
from rljax.selection._scored import VAS
from rljax.selection._scored import VSPO
from rljax.selection._scored import beta_mean
from rljax.selection._scored import length_diversity
from rljax.selection._scored import v0_keep
from rljax.selection._scored import vas_scores
from rljax.selection._scored import vspo_value
from rljax.selection._single_stream import SingleStream
from rljax.selection._single_stream import single_stream_prior
from rljax.selection._stages import Stage
from rljax.selection._stages import Stages

__all__ = [
  "SAMPLERS",
  "Feedback",
  "GVM",
  "Knapsack",
  "PromptSampler",
  "Selection",
  "Shuffled",
  "SingleStream",
  "Stage",
  "Stages",
  "State",
  "Uncertainty",
  "V0",
  "VAS",
  "VSPO",
  "XRPO",
  "allocate",
  "beta_mean",
  "check_selection",
  "get",
  "gvm_weights",
  "knapsack_allocate",
  "knapsack_value",
  "length_diversity",
  "single_stream_prior",
  "v0_keep",
  "vas_scores",
  "vspo_value",
  "xrpo_allocate",
  "xrpo_priority",
]
