"""GRPO on Qwen3-30B-A3B (128 experts, 8 active; shapes of its config.json,
no weights): experts and parameters split over all the slice's chips
(fsdp), 64 prompts x 8 samples a step in 8 micro-batches.

python -m rljax.training --config configs/pods/qwen3_30b_a3b_grpo.py --plan v5p-64
"""

from _pod import pod_grpo


def get_config():
  return pod_grpo("qwen3-30b-a3b", prompts=64, microbatches=8)
