"""HBPO's budget subgroups: each group split into subgroups whose prompts
carry their own token budget."""

from collections.abc import Sequence
import dataclasses

from rljax.rollouts._base import Group
from rljax.rollouts._base import GroupStrategy
from rljax.rollouts._base import Member
from rljax.rollouts._base import State

#: ``Batch.extra["stream_PG"]`` of subgroup i is ``BUDGET_STREAM + i``
BUDGET_STREAM = 10

#: the paper's budget prompt after the reasoning tag (Section 3.1)
HBPO_TEMPLATE = (
  "{prompt}<think> I will answer the question within {budget} tokens"
)


def subgroup_sizes(num_samples: int, num_budgets: int) -> list[int]:
  """How many of `num_samples` samples each of `num_budgets` subgroups gets:
  equal parts, the first ``num_samples % num_budgets`` subgroups one more
  (fewer samples than budgets: one each for the smallest budgets)."""
  base, extra = divmod(num_samples, num_budgets)
  return [base + (i < extra) for i in range(num_budgets)]


@dataclasses.dataclass(frozen=True)
class BudgetSubgroups(GroupStrategy):
  """HBPO's hierarchical budget exploration.

  The G samples of each group are split into k subgroups (`subgroup_sizes`,
  in the order of `budgets`); subgroup i is drawn from and trained on
  ``template.format(prompt=prompt, budget=budgets[i])`` and tagged
  ``Batch.extra["stream_PG"] = BUDGET_STREAM + i`` (10 + i), the stream
  that `rljax.transforms.hbpo_rewards` and `hbpo_advantages` read the
  subgroup's budget from (give them the same `budgets`).

  With ``cap=True`` a subgroup also generates at most its budget of tokens
  (``Member.max_new_tokens``); the paper and its code do not (every sample
  may run to the rollout's limit, and the reward's over-budget branch
  penalizes the excess, which a cap would make unreachable), so the
  default is False.

  References:
    Lyu et al., "Hierarchical Budget Policy Optimization for Adaptive
    Reasoning", arXiv 2507.15844 (catalog row 1.74), Section 3.1 and
    Algorithm 1: for each budget b_i in B = {b_1 < ... < b_k} generate n/k
    responses with "I will answer the question within b_i tokens" after
    the reasoning tag. Checked against the paper's text (the repository's
    ``paper.txt``) and ZJU-REAL/HBPO (``vllm_rollout_spmd-hierarchical.py``):
    16 samples, 4 subgroups, B = (512, 1024, 2048, 2560) (our defaults);
    the code prefills "<think> I will answer the question with {b}
    tokens" ("with", not the paper's "within") into the reply and samples
    every subgroup with the run's response length.

  Args:
    budgets: the token budgets, strictly increasing, each >= 1.
    template: the prompt of a subgroup, with ``{prompt}`` and ``{budget}``
      (a task whose vocabulary lacks the paper's words, e.g. the character
      vocabulary of the arithmetic task, gives its own, "{budget}*{prompt}").
    cap: also cap each subgroup's generation at its budget.
  """

  budgets: Sequence[int] = (512, 1024, 2048, 2560)
  template: str = HBPO_TEMPLATE
  cap: bool = False

  def __post_init__(self):
    budgets = tuple(self.budgets)
    if not budgets or not all(
      isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in budgets
    ):
      raise ValueError(
        f"budgets={self.budgets!r}; give token budgets as ints >= 1, e.g."
        " (512, 1024, 2048, 2560)."
      )
    if any(a >= b for a, b in zip(budgets, budgets[1:])):
      raise ValueError(
        f"budgets={budgets} must be strictly increasing, e.g."
        " (512, 1024, 2048, 2560)."
      )
    if "{prompt}" not in self.template or "{budget}" not in self.template:
      raise ValueError(
        f"template={self.template!r} must contain both {{prompt}} and"
        " {budget}, e.g. '{prompt} within {budget} tokens'."
      )
    object.__setattr__(self, "budgets", budgets)

  def prompt(self, prompt: str, budget: int) -> str:
    """The prompt of the subgroup with `budget`."""
    return self.template.format(prompt=prompt, budget=budget)

  def plan(self, group: Group, step: int, state: State) -> list[Member]:
    del step, state
    members = []
    sizes = subgroup_sizes(group.num_samples, len(self.budgets))
    for i, (budget, size) in enumerate(zip(self.budgets, sizes)):
      text = self.prompt(group.prompt, budget)
      member = Member(
        prompt=text,
        train_prompt=text,
        stream=BUDGET_STREAM + i,
        max_new_tokens=budget if self.cap else None,
      )
      members += [member] * size
    return members
