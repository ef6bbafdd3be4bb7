"""The in-JAX sampler: KV-cache prefill and a jitted decode loop.

`generate` samples G completions for each of P left-padded prompts and
returns a `Rollout` in group layout ([P, G, ...]) with the sampler's own
log-probs, completion masks (the stop token included) and truncation flags.
`process_logits` is the temperature / top-k / top-p processing it samples
through (the transformers order).
"""

from rljax.sampling._logits import process_logits
from rljax.sampling._sampler import Rollout
from rljax.sampling._sampler import generate

__all__ = [
  "Rollout",
  "generate",
  "process_logits",
]
