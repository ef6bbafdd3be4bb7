"""GRPO on Gemma-3-12B (text; shapes of its config.json, no weights): fsdp
over all the slice's chips, 64 prompts x 8 samples a step in 8
micro-batches.

python -m rljax.training --config configs/pods/gemma3_12b_grpo.py --plan v6e-32
"""

from _pod import pod_grpo


def get_config():
  return pod_grpo("gemma-3-12b", prompts=64, microbatches=8)
