"""Delethink on 2-digit addition (see _arithmetic.py).

Delethink, "The Markovian Thinker" (arXiv 2510.06557): each answer is a
trace of chunks of bounded context (`rljax.rollouts.MarkovianChunks`).
The first chunk generates up to C = 3 tokens; the second restarts from the
query plus the trace's last token (keep_head 0, keep_tail m = 1) and
generates up to C - m = 2 tokens, so a trace holds up to 5 tokens (answers
are at most 3 digits and a stop token). Each group of 16 rows is 8 traces
x 2 chunks; every chunk is a training row with its own prompt (query +
carryover: 7 tokens, within max_prompt_tokens 8). The preset `delethink`
trains on the trace-level GRPO advantage with every token weighted by
1 / (its trace's length). The official 24K run uses C = 8192, keep_head
100, keep_tail C/2 - 100, 5 chunks; C = 2 would leave 3 tokens per trace
here, too few for a 3-digit answer and its stop token, hence C = 3.

python -m rljax.training --config configs/delethink.py [train.steps=100 ...]
"""

from _arithmetic import base

CHUNKS = 2


def get_config():
  return base(
    "delethink",
    task={"max_prompt_tokens": 8},
    sampler={
      "num_samples": 8 * CHUNKS,
      "groups": "markovian",
      "groups_kwargs": {
        "max_chunks": CHUNKS,
        "chunk_size": 3,
        "keep_head": 0,
        "keep_tail": 1,
      },
    },
  )
