"""AnytimeReasoner / BRPO on 2-digit addition (see _arithmetic.py).

Budget Relative Policy Optimization (arXiv 2505.13438): each group holds 4
"thinking" traces of at most 4 tokens, cut at the budgets (2, 4); after
each cut the strategy forces "=" and samples 2 summaries
(`rljax.rollouts.AnytimeBudgets`), so a group is 4 x (1 + 2 x 2) = 20
rows. The trainer scores each summary on its own text (the task's exact
answer), the thinking tokens take the budget-relative advantage and the
summaries their prefix-relative one (preset `brpo`, uniform prior).

Why "=": the bare task's prompt already ends with "=" ("23+45="), so the
thinking is a free draft of the answer and the forced "=" reads as "so
the result is", the role of the paper's "</think> **Final Answer**"; the
summary after it must be the answer alone. "=" is token 15 of the
character vocabulary the scratch model builds from the task's alphabet
(`Tokenizer.from_characters`), and the stop id (1) that ends a draft is
replaced by it. The paper's budgets are 2000..8000 tokens of an 8000-token
thinking window with 4 summaries of at most 118 tokens; here the drafts
and answers are at most 4 tokens. The summary rows' prompts hold the
question, the cut draft and "=": up to 6 + 4 + 1 tokens.

python -m rljax.training --config configs/brpo.py [train.steps=100 ...]
"""

from _arithmetic import base

from rljax.tasks._arithmetic import ARITHMETIC_ALPHABET
from rljax.tokenizers import Tokenizer

BUDGETS = [2, 4]
SUMMARIES = 2
TRACES = 4
MARKER = Tokenizer.from_characters(ARITHMETIC_ALPHABET).encode(
  "=", add_bos=False
)


def get_config():
  return base(
    "brpo",
    budgets=BUDGETS,
    num_summaries=SUMMARIES,
    prior="uniform",
    task={"max_prompt_tokens": 12},
    sampler={
      "num_samples": TRACES * (1 + len(BUDGETS) * SUMMARIES),
      "groups": "anytime",
      "groups_kwargs": {
        "budgets": BUDGETS,
        "num_summaries": SUMMARIES,
        "marker": list(MARKER),
        "summary_tokens": 4,
      },
    },
  )
