"""Sampling: the continuous-batching rollout engine and the static sampler.

`Engine` decodes sequences in a fixed number of slots over a paged KV
cache: finished sequences free their slot for waiting ones, prompts share
their pages with their samples, and a stopped sequence can be continued
with appended tokens (`Engine.extend`) or forked (`Engine.fork`).
`rollout` runs it on a batch of left-padded prompts and returns a
`Rollout` in group layout ([P, G, ...]), as `generate` (the static
one-program sampler) does, with the sampler's log-probs under the
processed and the full tempered distribution, completion masks (the stop
token included) and truncation flags. `process_logits` is the temperature
/ top-k / top-p processing both sample through (the transformers order).
"""

from rljax.sampling._engine import Engine
from rljax.sampling._engine_rollout import RolloutBuilder
from rljax.sampling._engine_rollout import rollout
from rljax.sampling._engine_sequence import REASONS
from rljax.sampling._engine_sequence import Sequence
from rljax.sampling._engine_sequence import StepInfo
from rljax.sampling._engine_sequence import stop_at_strings
from rljax.sampling._logits import process_logits
from rljax.sampling._sampler import Rollout
from rljax.sampling._sampler import generate

__all__ = [
  "REASONS",
  "Engine",
  "Rollout",
  "RolloutBuilder",
  "Sequence",
  "StepInfo",
  "generate",
  "process_logits",
  "rollout",
  "stop_at_strings",
]
