"""HBPO on 2-digit addition (see _arithmetic.py).

Hierarchical Budget Policy Optimization (arXiv 2507.15844): each group of
16 samples is split into 4 subgroups of 4 whose prompts carry a token
budget (`rljax.rollouts.BudgetSubgroups`), scored by the budget-aware
piecewise reward and trained on the intra- plus inter-subgroup advantage
(preset `hbpo`). The paper's budgets (512, 1024, 2048, 2560) in a
4096-token window become (3, 4, 5, 6) in 8 generated tokens; the budget
prompt is "6*12+34=" (the character vocabulary knows only
"0123456789+-*=", not the paper's "I will answer the question within 6
tokens").

python -m rljax.training --config configs/hbpo.py [train.steps=100 ...]
"""

from _arithmetic import base

BUDGETS = [3, 4, 5, 6]
WIDTH = 8  # sampler.max_new_tokens, and the reward's L_max


def get_config():
  return base(
    "hbpo",
    budgets=BUDGETS,
    max_length=WIDTH,
    task={"max_prompt_tokens": 16},
    sampler={
      "max_new_tokens": WIDTH,
      "groups": "budget_subgroups",
      "groups_kwargs": {"budgets": BUDGETS, "template": "{budget}*{prompt}"},
    },
  )
