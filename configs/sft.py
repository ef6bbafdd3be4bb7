"""Supervised fine-tuning of a scratch model on 2-digit addition: the public
form of the arithmetic presets' warm start. The trained policy is exported
to runs/sft/model, where configs/sft_grpo.py starts RL from it.

python -m rljax.training --config configs/sft.py [train.steps=400 ...]
"""

import dataclasses

from _arithmetic import base

from rljax.training import AlgorithmSpec
from rljax.training import DataSpec
from rljax.training import OptimSpec
from rljax.training import OutputSpec


def get_config():
  config = base("grpo")
  return dataclasses.replace(
    config,
    kind="sft",
    algorithm=AlgorithmSpec(),
    # Prompt (at most 6 characters) + answer + EOS, several to a row.
    data=DataSpec(source="task", max_length=24, packing=True, rows=64),
    optim=OptimSpec(learning_rate=3e-3, grad_clip=1.0),
    train=dataclasses.replace(
      config.train,
      steps=800,
      prompts_per_step=128,
      warm_start_steps=0,
      eval_every=200,
    ),
    output=OutputSpec(directory="runs/sft", rollouts_every=0),
  )
