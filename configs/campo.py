"""CAMPO on 2-digit addition (see _arithmetic.py).

MiroMind-M1's Context-Aware Multi-Stage Policy Optimization (arXiv
2507.14683): DAPO (clip-higher, dynamic sampling, token mean) trained in
stages of growing generation length, 16K then 32K tokens in the paper,
here 4, 6 and then 8 tokens (a `rljax.selection.Stages` prompt sampler
whose stages set ``max_new_tokens``; answers that do not fit a stage's
length score 0), with the repetition penalty r = r_acc - gamma f(o)
(`rljax.rewards.repetition_penalty`, gamma = 1).

The penalty is added to the task's reward by ``task.extra_rewards``.

python -m rljax.training --config configs/campo.py [train.steps=150 ...]
"""

from _arithmetic import base

GAMMA = 1.0  # the paper's weight of f(o) in Eq. 6


def get_config():
  return base(
    "dapo",
    task={
      "extra_rewards": (
        {"name": "repetition", "reward": "repetition_penalty", "weight": GAMMA},
      )
    },
    sampler={
      "max_new_tokens": 8,
      "prompts": "stages",
      "prompts_kwargs": {
        "stages": [
          {"steps": 50, "max_new_tokens": 4},
          {"steps": 50, "max_new_tokens": 6},
          {"max_new_tokens": 8},
        ]
      },
    },
  )
