"""GRPO on Qwen3-8B (shapes of its config.json, no weights): fsdp over all
the slice's chips, 64 prompts x 8 samples a step in 8 micro-batches. The
plans of docs/tpu_pods.md:

python -m rljax.training --config configs/pods/qwen3_8b_grpo.py --plan v5e-64
python -m rljax.training --config configs/pods/qwen3_8b_grpo.py --plan v5p-32
python -m rljax.training --config configs/pods/qwen3_8b_grpo.py --plan v6e-16
"""

from _pod import pod_grpo


def get_config():
  return pod_grpo("qwen3-8b", prompts=64, microbatches=8)
