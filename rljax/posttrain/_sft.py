"""Supervised fine-tuning: cross-entropy on the assistant tokens only."""

import functools
import time

import jax.numpy as jnp
import numpy as np

from rljax._src.base import Mean
from rljax.models import token_logprobs
from rljax.posttrain import _encode
from rljax.posttrain import _packing
from rljax.posttrain._run import PostTrainer


def sft_loss(model, block, *, schedule: str = "auto"):
  """Summed negative log-likelihood of a block's target tokens, and their
  number.

    L = -sum_{b, l} m_bl log p(x_bl | the earlier tokens of its example)

  `block` is a `rljax.posttrain.Packed` block: ``segment_ids_BL`` (0 on
  padding) keeps packed examples apart (a token attends only to its own
  example, whose positions restart at 0), ``loss_mask_BL`` marks the
  targets. Divide by the count summed over the whole batch for the mean
  token loss (TRL's and verl's SFT loss).
  """
  logp, _ = token_logprobs(
    model,
    block.tokens_BL,
    block.segment_ids_BL > 0,
    segment_ids_BS=block.segment_ids_BL,
    positions_BS=block.positions_BL,
    schedule=schedule,
  )
  mask = jnp.asarray(block.loss_mask_BL, jnp.float32)
  return -jnp.sum(logp * mask), jnp.sum(mask)


def _objective(schedule: str):
  def objective(model, frozen, block):
    del frozen
    nll, tokens = sft_loss(model, block, schedule=schedule)
    # The token count (no normaliser: summed over blocks) is the loss's
    # denominator.
    return nll, {"tokens": Mean(tokens, jnp.float32(0.0))}

  return objective


class SFTRun(PostTrainer):
  """Supervised fine-tuning (``kind="sft"``, ``configs/sft.py``).

  Each step takes ``train.prompts_per_step`` records (the prompt sampler's
  order over ``data.source``, checkpointed), encodes them (chat records
  through the tokenizer's template with ``model.chat_template``; loss on
  the assistant / completion tokens only), packs them into blocks of
  ``data.rows`` rows of ``data.max_length`` tokens (``data.packing``; one
  example a row otherwise) and takes one optimizer step on the mean token
  loss over the whole batch, its gradient summed over the blocks. Packing
  and the number of blocks change the cost, never the update.
  """

  KIND = "sft"
  PROGRESS_KEYS = {"loss": "loss", "eval_accuracy": "eval"}

  def _record_kinds(self, config) -> tuple[str, ...]:
    return ("prompt_completion", "chat")

  def encode(self, records) -> list:
    """Each record's tokens and target mask (`rljax.posttrain.Encoded`)."""
    return [
      _encode.encode_supervised(
        self.tokenizer,
        r,
        chat=self.config.model.chat_template,
        max_length=self.config.data.max_length,
      )
      for r in records
    ]

  def blocks(self, encoded) -> list:
    """`rljax.posttrain.Packed` blocks of the run's fixed shape."""
    rows, length = self._block_rows(), self.config.data.max_length
    out = []
    if self.config.data.packing:
      rest = list(encoded)
      while rest:
        block, rest = _packing.pack(rest, rows=rows, length=length)
        out.append(block)
      return out
    for i in range(0, len(encoded), rows):
      block = _packing.pad(encoded[i : i + rows], length=length)
      missing = rows - block.tokens_BL.shape[0]
      if missing:  # empty rows: segment 0, no targets
        empty = functools.partial(np.zeros, (missing, length))
        block = type(block)(
          *(np.concatenate([x, empty(dtype=x.dtype)]) for x in block)
        )
      out.append(block)
    return out

  def step(self, step: int) -> dict[str, float]:
    """One optimizer step on a batch of records; returns its metrics."""
    start = time.perf_counter()
    self._step = step
    _, records = self._next_records(step)
    encoded = self.encode(records)
    blocks = self.blocks(encoded)
    objective = _objective(self.config.model.logprob_schedule)
    total, grads, metrics = self._accumulate("sft", objective, None, blocks)
    count = float(metrics["tokens"].num)
    flags = self._apply(grads, total, count)
    out = self._finish(step, start, total, count, metrics, flags)
    real = sum(float(np.sum(b.segment_ids_BL > 0)) for b in blocks)
    out["packing_efficiency"] = real / sum(b.tokens_BL.size for b in blocks)
    out["blocks"] = float(len(blocks))
    return out
