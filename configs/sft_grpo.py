"""GRPO on 2-digit addition from the policy configs/sft.py trained (run that
first: it exports runs/sft/model). The same RL run as configs/grpo.py, with
the public SFT run in place of the private warm start.

python -m rljax.training --config configs/sft.py
python -m rljax.training --config configs/sft_grpo.py
"""

import dataclasses

from _arithmetic import base

# What this run reads that a fresh clone lacks, and the command (from the
# repository root) that makes it: the CLI names it when the path is missing.
PREREQUISITES = {
  "runs/sft/model": "python -m rljax.training --config configs/sft.py",
}


def get_config():
  config = base("grpo")
  return dataclasses.replace(
    config,
    model=dataclasses.replace(config.model, source="hf:runs/sft/model"),
    train=dataclasses.replace(config.train, warm_start_steps=0),
    output=dataclasses.replace(config.output, directory="runs/sft_grpo"),
  )
