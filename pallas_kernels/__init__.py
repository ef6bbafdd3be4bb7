"""Fused kernels for RL post-training of LLMs: token log-probs, entropies and
per-token policy losses straight from hidden states, without ever holding the
[tokens, vocab] logits.

One math core, several schedules behind one dispatch (`SCHEDULES`): a dense
reference (the oracle, and what "auto" runs for small logits: at most
`DENSE_AUTO_BYTES`, see `dense_up_to`), a chunked pure-XLA schedule (the CPU
default beyond that, and the fallback), and Pallas kernels for TPU (Mosaic)
and GPU (Triton), which also run under the Pallas interpreter on CPU. Every schedule implements the
forward/backward contract of `pallas_kernels._contract`; one custom_vjp makes
them differentiable. Shape suffixes: N tokens, D width, V vocabulary.

`grouped_matmul` runs a mixture of experts' expert layers on the megablox
TPU kernel when compiling for a TPU.

This package depends on jax only (it never imports rljax).
"""

from pallas_kernels._api import LOSSES
from pallas_kernels._api import policy_loss
from pallas_kernels._api import token_logprob
from pallas_kernels._contract import Stats
from pallas_kernels._dispatch import DEFAULT_BLOCKS
from pallas_kernels._dispatch import DENSE_AUTO_BYTES
from pallas_kernels._dispatch import PLATFORMS
from pallas_kernels._dispatch import SCHEDULES
from pallas_kernels._dispatch import compile_for
from pallas_kernels._dispatch import dense_up_to
from pallas_kernels._grouped import grouped_matmul

__all__ = [
  "DEFAULT_BLOCKS",
  "DENSE_AUTO_BYTES",
  "LOSSES",
  "PLATFORMS",
  "SCHEDULES",
  "Stats",
  "compile_for",
  "dense_up_to",
  "grouped_matmul",
  "policy_loss",
  "token_logprob",
]
