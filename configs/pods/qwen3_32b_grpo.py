"""GRPO on Qwen3-32B (shapes of its config.json, no weights), full
fine-tuning with Adam: fsdp over all the slice's chips, 64 prompts x 8
samples a step in 8 micro-batches. On a small slice it does not fit, and
the plan says so with the nearest configuration that does:

python -m rljax.training --config configs/pods/qwen3_32b_grpo.py --plan v5e:2x2 \
  train.prompts_per_step=4 sampler.num_samples=4 sampler.max_new_tokens=256 task.max_prompt_tokens=256 train.microbatches=1
"""

from _pod import pod_grpo


def get_config():
  return pod_grpo("qwen3-32b", prompts=64, microbatches=8)
