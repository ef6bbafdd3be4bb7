"""Train Long, Think Short on 2-digit addition (see _arithmetic.py).

Curriculum learning for efficient reasoning (arXiv 2508.08940): GRPO with
a token budget B_t = max(final, initial * decay^floor(t / interval)) that
shrinks during training, in the reward (r += g(L, B_t), preset `tlts`,
`rljax.transforms.length_budget_curriculum`) and in the sampler: a
`rljax.selection.Stages` prompt sampler whose stage k generates at most
ceil(B_t) tokens for its `INTERVAL` steps (8, 6, 5, then 4 tokens here).

python -m rljax.training --config configs/train_long_think_short.py
"""

import math

from _arithmetic import base

INITIAL, FINAL, DECAY, INTERVAL = 8.0, 4.0, 0.75, 50


def budget_stages(initial, final, decay, interval):
  """`Stages` whose budgets follow the curriculum's exponential B_t: one
  stage per `interval` steps until B_t reaches `final`, then the rest."""
  stages, k = [], 0
  while initial * decay**k > final:
    budget = math.ceil(initial * decay**k)
    stages.append({"steps": interval, "max_new_tokens": budget})
    k += 1
  return stages + [{"max_new_tokens": math.ceil(final)}]


def get_config():
  return base(
    "tlts",
    initial=INITIAL,
    final=FINAL,
    decay=DECAY,
    interval=INTERVAL,
    sampler={
      "max_new_tokens": math.ceil(INITIAL),
      "prompts": "stages",
      "prompts_kwargs": {
        "stages": budget_stages(INITIAL, FINAL, DECAY, INTERVAL)
      },
    },
  )
