"""Verifiable rewards on decoded completions (host-side Python, not jitted).

A reward function maps `Samples` (N = P*G decoded completions in prompt-major
order, their token counts, truncation flags and each prompt's task metadata)
to a `RewardResult` (float32 values [N], and which samples had a parseable
answer). `score` runs K of them with weights and returns the [N, K] values,
the weighted total [N] and metrics ("reward/<name>", "unparseable/<name>").

Built-ins: `exact_answer` (numeric or string match of an extracted answer),
`math_answer` (math-verify), `answer_format` (regex), `length_penalty`
(DAPO's soft overlong penalty in tokens), `repetition_penalty` (CAMPO's
trailing-loop penalty); `extract_answer` is the extractor
they share; `evaluate_arithmetic` is a safe evaluator of + - * / expressions
(an `ast` walk, never eval) for rewards that need one.

Completions are untrusted: no built-in reward evaluates them as code in this
process, and each one's time is bounded (scorers that need eval run in
`rljax.sandbox`). A reward that returns +-inf is an error; NaN means "does
not apply".
"""

from rljax.rewards._answers import EXTRACT_MODES
from rljax.rewards._answers import exact_answer
from rljax.rewards._answers import extract_answer
from rljax.rewards._answers import math_answer
from rljax.rewards._arithmetic import evaluate_arithmetic
from rljax.rewards._base import RewardFn
from rljax.rewards._base import RewardResult
from rljax.rewards._base import RewardSpec
from rljax.rewards._base import Samples
from rljax.rewards._base import Scores
from rljax.rewards._base import as_specs
from rljax.rewards._base import score
from rljax.rewards._episodes import episode_return
from rljax.rewards._episodes import tool_calls
from rljax.rewards._format import THINK_ANSWER
from rljax.rewards._format import answer_format
from rljax.rewards._format import length_penalty
from rljax.rewards._judges import calibrated_reward
from rljax.rewards._judges import cluster_annotate
from rljax.rewards._judges import cluster_answers
from rljax.rewards._judges import flag_annotate
from rljax.rewards._judges import flawed_positive_reward
from rljax.rewards._judges import judge_flags
from rljax.rewards._judges import judge_reward
from rljax.rewards._judges import preference_annotate
from rljax.rewards._judges import preference_matrix
from rljax.rewards._judges import success_gated_reward
from rljax.rewards._judges import thought_reward
from rljax.rewards._judges import thought_rewards
from rljax.rewards._registry import REWARDS
from rljax.rewards._registry import get
from rljax.rewards._repetition import loop_fraction
from rljax.rewards._repetition import repetition_penalty
from rljax.rewards._tools import budget_note
from rljax.rewards._tools import otc
from rljax.rewards._tools import toolrl
from rljax.rewards._tools import toolrl_correctness
from rljax.rewards._tools import toolrl_format
from rljax.rewards._tools import toolrl_match_score

__all__ = [
  "episode_return",
  "tool_calls",
  "EXTRACT_MODES",
  "REWARDS",
  "RewardFn",
  "RewardResult",
  "RewardSpec",
  "Samples",
  "Scores",
  "THINK_ANSWER",
  "answer_format",
  "as_specs",
  "calibrated_reward",
  "cluster_annotate",
  "cluster_answers",
  "evaluate_arithmetic",
  "exact_answer",
  "get",
  "extract_answer",
  "flag_annotate",
  "flawed_positive_reward",
  "judge_flags",
  "judge_reward",
  "length_penalty",
  "loop_fraction",
  "math_answer",
  "preference_annotate",
  "preference_matrix",
  "repetition_penalty",
  "score",
  "success_gated_reward",
  "thought_reward",
  "thought_rewards",
  "budget_note",
  "otc",
  "toolrl",
  "toolrl_correctness",
  "toolrl_format",
  "toolrl_match_score",
]
