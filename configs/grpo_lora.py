"""GRPO with LoRA adapters on SmolLM2-135M-Instruct, one-digit addition.

`configs/smollm2_grpo.py` with rank-16 adapters (alpha 32) on every
projection of every layer: only the adapters and their Adam moments train,
the reference policy is the frozen base with zero adapters (no second copy
of the weights), the sampler reads base + adapters without merging them.
LoRA takes a larger learning rate than full fine-tuning (1e-4 vs 2e-5); the
KL to the reference (GRPO's 0.04) costs adapter-sized zeros, not a copy.
`model.lora_quantize_base=True` stores the base int8 (QLoRA). Slow on CPU
(minutes per step on 2 cores):

  python -m rljax.training --config configs/grpo_lora.py
"""

import dataclasses

from smollm2_grpo import get_config as smollm2_grpo

from rljax.training import AlgorithmSpec


def get_config():
  config = smollm2_grpo()
  return dataclasses.replace(
    config,
    model=dataclasses.replace(config.model, lora_rank=16, lora_alpha=32.0),
    algorithm=AlgorithmSpec(name="grpo", kwargs={"kl_coef": 0.04}),
    optim=dataclasses.replace(config.optim, learning_rate=1e-4),
    output=dataclasses.replace(config.output, directory="runs/grpo_lora"),
  )
