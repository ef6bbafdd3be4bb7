"""Prompt selection: which prompts each step samples, and how many samples
each gets.

A `PromptSampler` keeps its own state (per-prompt statistics, a position,
a schedule), chooses a step's prompts with `select` and learns from the
scored rollout with `update`; the trainer checkpoints its state with the
train state and runs it identically on every process. `Shuffled` is the
default: the training set shuffled once and repeated, G samples each;
`Uncertainty` gives more samples to prompts whose success rate is least
certain; `Stages` runs a schedule of stages (prompts, sampler and
generation budget per stage). Configs name them (``sampler.prompts``,
`get`).
"""

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
from rljax.selection._stages import Stage
from rljax.selection._stages import Stages

__all__ = [
  "SAMPLERS",
  "Feedback",
  "PromptSampler",
  "Selection",
  "Shuffled",
  "Stage",
  "Stages",
  "State",
  "Uncertainty",
  "allocate",
  "check_selection",
  "get",
]
