"""Per-token log-probs and entropies of given sequences: the train step's
entry point into the model."""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

import pallas_kernels
from rljax._src import checks
from rljax.models._transformer import Transformer


def token_logprobs(
  model: Transformer,
  tokens_BS: ArrayLike,
  attention_mask_BS: Optional[ArrayLike] = None,
  *,
  temperature: float = 1.0,
  schedule: str = "auto",
) -> tuple[jax.Array, jax.Array]:
  """log p(token_s | tokens_<s) and the entropy of that distribution.

  Logits are divided by the sampling `temperature` first (verl, TRL), so the
  log-probs are those of the distribution that sampled the tokens. A token
  is predicted from the one before it, so position 0 and the first real
  token of a left-padded row (whose predecessor is padding) get 0, as do
  padding positions.

  By default the vocabulary projection runs in `pallas_kernels.token_logprob`
  (``schedule="auto"``: the Pallas kernel on TPU and GPU, the chunked XLA
  schedule on CPU), which never holds the [B, S, V] logits, forward or
  backward. ``schedule="dense"`` materialises them (the reference path).

  Returns:
    (logp_BS, entropy_BS), float32.
  """
  checks.positive(temperature=temperature)
  if schedule not in pallas_kernels.SCHEDULES:
    raise ValueError(
      f"schedule must be one of {sorted(pallas_kernels.SCHEDULES)}; got"
      f" {schedule!r}."
    )
  tokens = jnp.asarray(tokens_BS)
  mask = (
    jnp.ones(tokens.shape, jnp.float32)
    if attention_mask_BS is None
    else jnp.asarray(attention_mask_BS, jnp.float32)
  )
  hidden, _ = model.hidden_states(tokens, mask)
  if schedule == "dense":
    logp, entropy = _dense(model, hidden[:, :-1], tokens[:, 1:], temperature)
  else:
    unembed = model.unembedding().astype(hidden.dtype)
    logp, entropy = pallas_kernels.token_logprob(
      hidden[:, :-1],
      unembed,
      tokens[:, 1:],
      temperature=temperature,
      schedule=schedule,
    )
  pad = jnp.zeros(tokens.shape[:1] + (1,), jnp.float32)
  # A padding predecessor's hidden state is meaningless: mask those too.
  predicted = jnp.concatenate([pad, mask[:, 1:] * mask[:, :-1]], 1)
  logp = jnp.concatenate([pad, logp], 1) * predicted
  entropy = jnp.concatenate([pad, entropy], 1) * predicted
  return logp, entropy


def _dense(model, hidden_BSD, targets_BS, temperature):
  """The reference path: full float32 logits [B, S, V]."""
  logits = model.logits(hidden_BSD) / temperature
  logz = jax.nn.logsumexp(logits, axis=-1)
  picked = jnp.take_along_axis(logits, targets_BS[..., None], -1)[..., 0]
  probs = jax.nn.softmax(logits, axis=-1)
  entropy = logz - jnp.sum(probs * logits, axis=-1)
  return picked - logz, entropy
