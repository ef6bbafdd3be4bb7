"""INSPO's instruction population on 2-digit addition (see _arithmetic.py).

Instruction-Policy Co-Evolution (arXiv 2512.01945) with GRPO: each
question is sampled and trained with one of 4 instructions in front of it
(`rljax.rollouts.InstructionPopulation`), drawn by softmax of the
instructions' running mean reward; every 10 steps the weakest leaves and a
recombination of the survivors replaces it. The character vocabulary
knows only "0123456789+-*=", so the instructions are arithmetic prefixes:
"0+" and "1*" leave the answer unchanged, "0*" and "9-" change it (a
population in which selection has something to find); the paper's are
natural-language system instructions proposed by an LLM.

python -m rljax.training --config configs/inspo.py [train.steps=100 ...]
"""

from _arithmetic import base

INSTRUCTIONS = ["0+", "1*", "0*", "9-"]


def get_config():
  return base(
    "grpo",
    task={"max_prompt_tokens": 9},
    sampler={
      "groups": "instructions",
      "groups_kwargs": {
        "instructions": INSTRUCTIONS,
        "template": "{instruction}{prompt}",
        "prune_every": 10,
        "prune_k": 1,
      },
    },
  )
