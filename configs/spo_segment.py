"""SPO-chain on 2-digit addition (see _arithmetic.py).

Segment Policy Optimization (arXiv 2505.23564), its short-CoT instance:
each response is cut before its tokens with probability < 0.9, every
low-probability token starting a segment of its own (the answers here are
at most 4 tokens; the paper's released runs put 5 low-probability tokens
in a segment), the state before each segment is valued by the mean reward
of 4 continuations sampled from it (`rljax.rollouts.SegmentRollouts`; the
paper's GSM8K runs use 9), and the segment advantage
V(s_{k+1}) - V(s_k) trains only the low-probability tokens (preset
`spo_segment`: PPO clip 0.2, whitened advantages, k3 KL 1e-4). 8 responses
per prompt, as in the paper's Qwen configs.

python -m rljax.training --config configs/spo_segment.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "spo_segment",
    sampler={
      "num_samples": 8,
      "groups": "segments",
      "groups_kwargs": {"rho": 0.9, "interval": 1, "num_continuations": 4},
    },
  )
