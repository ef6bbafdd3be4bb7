"""`rollout`: the engine's samples of a batch of prompts as a `Rollout`,
filled sample by sample with `RolloutBuilder`."""

from collections import abc
from typing import Optional

import jax
import numpy as np

from rljax.sampling._engine import Engine
from rljax.sampling._engine_programs import _fold_keys
from rljax.sampling._engine_sequence import STOP_ID
from rljax.sampling._engine_sequence import STOP_RULE
from rljax.sampling._engine_sequence import Sequence
from rljax.sampling._sampler import Rollout
from rljax.sampling._sampler import _check_prompt_values
from rljax.sampling._sampler import _check_prompts


def _host_rows(x) -> np.ndarray:
  """All rows of `x` on this host (replicated first when it spans
  several processes)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    whole = jax.sharding.NamedSharding(
      x.sharding.mesh, jax.sharding.PartitionSpec()
    )
    x = jax.jit(lambda a: a, out_shardings=whole)(x)
  return np.asarray(x)


def rollout(
  engine: Engine,
  model,
  prompt_tokens_PS,
  prompt_mask_PS,
  *,
  key: jax.Array,
  max_new_tokens: int,
  num_samples: int | abc.Sequence[int] = 1,
  temperature: float = 1.0,
  group_size: Optional[int] = None,
  width: Optional[int] = None,
  refresh=None,
  version: int = 0,
) -> Rollout:
  """`generate`'s `Rollout` from the engine: G samples of P prompts.

  Prompts come left-padded as for `generate`; the engine decodes them
  unpadded. Prompt p's sample g draws with ``fold_in(fold_in(key, p), g)``.
  `num_samples` may differ per prompt (a sequence of P counts >= 1): G is
  their maximum (or `group_size`), and a prompt's samples past its count
  are empty, with ``sample_mask_PG`` 0. Completions have at most
  `max_new_tokens` tokens in a rollout `width` tokens wide (default
  `max_new_tokens`; a wider one keeps the shapes of a run whose budget
  changes). The result is numpy, the whole batch on every process.
  ``refresh``: newer weights while it runs (`Engine.run`); the rollout then
  records each token's version (``version_PGT``), `model`'s being
  `version`.
  """
  tokens = _host_rows(prompt_tokens_PS).astype(np.int32)
  mask = _host_rows(prompt_mask_PS).astype(np.int32)
  _check_prompts(tokens, mask, model.config, 0)
  _check_prompt_values(tokens, mask, model.config)
  width = int(max_new_tokens if width is None else width)
  if width < max_new_tokens:
    raise ValueError(
      f"width={width} is below max_new_tokens={max_new_tokens}; the rollout"
      " must hold the longest completion."
    )
  if tokens.shape[1] + width > engine.max_length:
    raise ValueError(
      f"prompt_tokens_PS width {tokens.shape[1]} + rollout width {width}"
      f" exceeds the engine's max_length ({engine.max_length})."
    )
  p, s = tokens.shape
  counts = np.broadcast_to(np.asarray(num_samples, np.int64), (p,))
  if counts.min() < 1:
    raise ValueError(f"num_samples must be >= 1 per prompt; got {counts}.")
  g, t = int(group_size or counts.max()), width
  if g < counts.max():
    raise ValueError(
      f"group_size={group_size} is below the largest num_samples"
      f" ({counts.max()})."
    )
  keys = jax.random.wrap_key_data(_fold_keys(jax.random.key_data(key), 0, p))
  groups = [
    engine.add(
      row[m > 0],
      key=keys[i],
      max_new_tokens=int(max_new_tokens),
      num_samples=int(counts[i]),
      temperature=temperature,
      shard=i * engine.shards // p,
    )
    for i, (row, m) in enumerate(zip(tokens, mask))
  ]
  engine.run(model, refresh=refresh, version=version)
  out = RolloutBuilder(p, g, t, versions=refresh is not None)
  for i, group in enumerate(groups):
    for j, seq in enumerate(group):
      out.put(i, j, seq)
  return out.rollout(
    np.broadcast_to(tokens[:, None], (p, g, s)),
    np.broadcast_to(mask[:, None], (p, g, s)),
  )


class RolloutBuilder:
  """A [P, G, T] `Rollout` filled sample by sample from engine sequences
  (or given tokens); samples never put are invalid (``sample_mask_PG``
  0)."""

  def __init__(self, p: int, g: int, width: int, versions: bool = False):
    self.shape = (p, g, width)
    self.version = np.zeros(self.shape, np.int32) if versions else None
    self.tokens = np.zeros(self.shape, np.int32)
    self.mask = np.zeros(self.shape, np.int32)
    self.logp = np.zeros(self.shape, np.float32)
    self.full_logp = np.zeros(self.shape, np.float32)
    self.truncated = np.zeros((p, g), bool)
    self.present = np.zeros((p, g), np.int32)

  def put(self, i: int, j: int, seq: Sequence) -> None:
    """Sample (i, j) is `seq`'s completion, with its log-probs."""
    n = len(seq.completion)
    self.tokens[i, j, :n] = seq.completion
    self.mask[i, j, :n] = 1
    self.logp[i, j, :n] = seq.logp[:n]
    self.full_logp[i, j, :n] = seq.full_logp[:n]
    if self.version is not None:
      self.version[i, j, :n] = seq.version[:n]
    self.truncated[i, j] = seq.stop_reason not in (STOP_ID, STOP_RULE)
    self.present[i, j] = 1

  def put_tokens(
    self,
    i: int,
    j: int,
    ids,
    logp=None,
    full_logp=None,
    truncated: bool = False,
  ) -> None:
    """Sample (i, j) is the given `ids` with their log-probs (None: 0, not
    sampled)."""
    ids = list(ids)[: self.shape[2]]
    n = len(ids)
    self.tokens[i, j, :n] = ids
    self.mask[i, j, :n] = 1
    if logp is not None:
      self.logp[i, j, :n] = list(logp)[:n]
    if full_logp is not None:
      self.full_logp[i, j, :n] = list(full_logp)[:n]
    self.truncated[i, j] = truncated
    self.present[i, j] = 1

  def put_after(self, i: int, j: int, seq: Sequence, n: int) -> None:
    """Sample (i, j) continues at token `n` (after a prefix put with
    `put_tokens`) with `seq`'s completion and its log-probs."""
    m = max(0, min(len(seq.completion), self.shape[2] - n))
    sl = slice(n, n + m)
    self.tokens[i, j, sl] = seq.completion[:m]
    self.mask[i, j, sl] = 1
    self.logp[i, j, sl] = seq.logp[:m]
    self.full_logp[i, j, sl] = seq.full_logp[:m]
    self.truncated[i, j] = seq.stop_reason not in (STOP_ID, STOP_RULE)
    self.present[i, j] = 1

  def rollout(self, prompt_tokens_PGS, prompt_mask_PGS) -> Rollout:
    p, g, _ = self.shape
    return Rollout(
      prompt_tokens_PGS=prompt_tokens_PGS,
      prompt_mask_PGS=prompt_mask_PGS,
      tokens_PGT=self.tokens,
      mask_PGT=self.mask,
      logp_PGT=self.logp,
      truncated_PG=self.truncated,
      group_ids_PG=np.broadcast_to(
        np.arange(p, dtype=np.int32)[:, None], (p, g)
      ),
      full_logp_PGT=self.full_logp,
      sample_mask_PG=self.present,
      version_PGT=self.version,
    )
