"""GRPO with rank-16 LoRA on Llama-3.1-70B (shapes of its config.json, no
weights): the frozen base in bfloat16 split over all the slice's chips
(fsdp), adapters and their Adam moments in float32, 64 prompts x 8 samples
a step in 8 micro-batches.

python -m rljax.training --config configs/pods/llama3_70b_lora_grpo.py --plan v5p-128
"""

from _pod import pod_grpo


def get_config():
  return pod_grpo("llama-3.1-70b", prompts=64, microbatches=8, lora_rank=16)
