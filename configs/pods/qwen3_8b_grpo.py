"""GRPO on Qwen3-8B (shapes of its config.json, no weights), planned for a
v5e-64: fsdp over all 64 chips, 64 prompts x 8 samples a step.

python -m rljax.training --config configs/pods/qwen3_8b_grpo.py --plan v5e-64
"""

from _pod import pod_grpo


def get_config():
  return pod_grpo("qwen3-8b", mesh=(1, 64, 1), prompts=64, microbatches=8)
