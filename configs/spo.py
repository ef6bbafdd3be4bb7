"""Single-stream SPO on 2-digit addition (see _arithmetic.py).

One sample per prompt, a per-prompt Beta tracker as the baseline,
advantages z-scored over the batch, prompts drawn by the tracker's
uncertainty (`rljax.selection.SingleStream`). 256 prompts x 1 sample a step
hold as many samples as the group configs' 16 prompts x 16.

python -m rljax.training --config configs/spo.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "spo",
    num_prompts=10_000,  # the task's train_size
    sampler={"num_samples": 1, "prompts": "single_stream"},
    train={"prompts_per_step": 256},
  )
