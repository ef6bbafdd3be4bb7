"""GVM-GRPO on 2-digit addition (see _arithmetic.py).

GRPO with GVM-RAFT's variance-minimising sample allocation (arXiv
2505.02391, `rljax.selection.GVM`): n_i ∝ G_i / sqrt(p_i + alpha / p_i),
with G_i from the accepted answers' lengths.

python -m rljax.training --config configs/gvm.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "grpo",
    sampler={
      "prompts": "gvm",
      "prompts_kwargs": {
        "max_samples_per_prompt": 32,
        "gradient": "sqrt_length",
      },
    },
  )
