"""Per-token log-probs and entropies of given sequences: the train step's
entry point into the model (`grouped_completion_logprobs`: a group's
completions with their shared prompt encoded once)."""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

import pallas_kernels
from rljax._src import checks
from rljax.models._transformer import Transformer
from rljax.models._transformer import init_cache
from rljax.models._transformer import positions_from_mask


def token_logprobs(
  model: Transformer,
  tokens_BS: ArrayLike,
  attention_mask_BS: Optional[ArrayLike] = None,
  *,
  segment_ids_BS: Optional[ArrayLike] = None,
  positions_BS: Optional[ArrayLike] = None,
  temperature: float = 1.0,
  schedule: str = "auto",
  routing_LBSK: Optional[ArrayLike] = None,
  return_routing: bool = False,
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
  A model with ``final_logit_softcap`` (Gemma 2) always takes the dense
  path: the kernel has no soft-capping, and capped logits are what the
  sampler drew from.

  Packed rows (`rljax.posttrain` packing) pass ``segment_ids_BS`` (0 on
  padding) and ``positions_BS`` (restarting at 0 in each segment; the
  default): each token is predicted from the earlier tokens of its own
  segment only, and the first token of every segment gets 0, so a packed
  row gives each example's log-probs as a row of its own would.

  A mixture-of-experts model routes by ``routing_LBSK`` when given (int32
  expert ids [layers, B, S, K], e.g. the sampler's: routing replay; see
  `rljax.models.Transformer.hidden_states`); ``return_routing=True`` also
  returns its `rljax.models.Routing` (for `rljax.models.load_balancing_loss`).

  Returns:
    (logp_BS, entropy_BS), float32 (and the routing when asked).
  """
  _check_options(temperature, schedule)
  tokens = jnp.asarray(tokens_BS)
  mask = (
    jnp.ones(tokens.shape, jnp.float32)
    if attention_mask_BS is None
    else jnp.asarray(attention_mask_BS, jnp.float32)
  )
  hidden, _, *routing = model.hidden_states(
    tokens,
    mask,
    positions_BS=positions_BS,
    segment_ids_BS=segment_ids_BS,
    routing_LBSK=routing_LBSK,
    return_routing=return_routing,
  )
  logp, entropy = _project(
    model, hidden[:, :-1], tokens[:, 1:], temperature, schedule
  )
  pad = jnp.zeros(tokens.shape[:1] + (1,), jnp.float32)
  # A padding predecessor's hidden state is meaningless: mask those too.
  predicted = mask[:, 1:] * mask[:, :-1]
  if segment_ids_BS is not None:
    # So is one from another segment (the last token of the example before).
    seg = jnp.asarray(segment_ids_BS, jnp.int32)
    predicted = predicted * (seg[:, 1:] == seg[:, :-1]) * (seg[:, 1:] > 0)
  predicted = jnp.concatenate([pad, predicted], 1)
  logp = jnp.concatenate([pad, logp], 1) * predicted
  entropy = jnp.concatenate([pad, entropy], 1) * predicted
  return (logp, entropy, *routing)


def grouped_completion_logprobs(
  model: Transformer,
  prompt_tokens_PS: ArrayLike,
  prompt_mask_PS: ArrayLike,
  tokens_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  *,
  temperature: float = 1.0,
  schedule: str = "auto",
) -> tuple[jax.Array, jax.Array]:
  """Completion log-probs of a GRPO group with its prompt encoded once.

  Prefix Grouper (Liu et al., 2025, arXiv 2506.05433, "Shared-Prefix
  Forward"): every sample of group p is prompt p followed by its own
  completion, so the prompt's hidden states, keys and values are the same
  for all G samples. They are computed once, on [P, S], and each
  completion's tokens attend to them and causally to themselves,

      O_S = Attn(Q_S, [K_P; K_S], [V_P; V_S])     (one softmax over both),

  with the prompt's keys / values broadcast over G (never copied G times);
  positions continue after each prompt's real length. The first completion
  token is predicted from the prompt's last hidden state. Log-probs,
  entropies and their gradients equal those of `token_logprobs` on the
  concatenated [P G, S + T] rows (the last T columns), up to float rounding;
  the prompt's layers and the prompt-prompt attention cost 1/G as much,
  forward and backward.

  Checked against the paper (the grouped attention, its equivalence claim)
  and the official PyTorch code (johncaged/PrefixGrouper,
  ``forward.py``: prefix self-attention, then suffix queries over the
  prefix's keys concatenated before their own). That code packs the prefix
  and all suffixes into one row and repeats the prefix's keys for each
  suffix; here the prompt runs as its own pass (a `KVCache` prefill) and
  the shared keys are broadcast inside the attention einsum.

  Args:
    model: the policy.
    prompt_tokens_PS: each group's prompt, left-padded.
    prompt_mask_PS: 1 on the prompts' real tokens. Where a prompt's last
      column is padding, its first completion tokens get 0 (their
      predecessor is padding), as in `token_logprobs`.
    tokens_PGT: the G completions of each prompt (right-padded).
    mask_PGT: 1 on the completions' real tokens.
    temperature: the sampling temperature (see `token_logprobs`).
    schedule: the vocabulary projection (see `token_logprobs`).

  Returns:
    (logp_PGT, entropy_PGT), float32, 0 where a token or its predecessor is
    padding: `token_logprobs` of the concatenated rows, last T columns.
  """
  _check_options(temperature, schedule)
  prompt = jnp.asarray(prompt_tokens_PS)
  tokens = jnp.asarray(tokens_PGT)
  checks.rank("prompt_tokens_PS", prompt, 2, "[P, S]")
  checks.rank("tokens_PGT", tokens, 3, "[P, G, T]")
  checks.same_shape(
    ("prompt_tokens_PS", "prompt_mask_PS"), prompt, prompt_mask_PS
  )
  checks.same_shape(("tokens_PGT", "mask_PGT"), tokens, mask_PGT)
  checks.leading_shape("tokens_PGT", tokens, prompt.shape[:1], "the prompts")
  p, s = prompt.shape
  _, g, t = tokens.shape
  prompt_mask = jnp.asarray(prompt_mask_PS, jnp.int32)
  mask = jnp.asarray(mask_PGT, jnp.float32).reshape(p * g, t)
  prefill = init_cache(model.config, p, s, windowed=False)
  prompt_hidden, prefix = model.hidden_states(
    prompt,
    prompt_mask,
    positions_BS=positions_from_mask(prompt_mask),
    cache=prefill,
  )
  hidden, _ = model.hidden_states(tokens.reshape(p * g, t), mask, prefix=prefix)
  # Token t is predicted from the hidden state before it: the prompt's last
  # for t = 0 (the same for all G samples), the completion's own after.
  last = jnp.broadcast_to(
    prompt_hidden[:, None, -1:], (p, g, 1, hidden.shape[-1])
  ).reshape(p * g, 1, -1)
  before = jnp.concatenate([last, hidden[:, :-1]], axis=1)
  logp, entropy = _project(
    model, before, tokens.reshape(p * g, t), temperature, schedule
  )
  before_mask = jnp.concatenate(
    [
      jnp.repeat(prompt_mask[:, -1:], g, axis=0).astype(jnp.float32),
      mask[:, :-1],
    ],
    axis=1,
  )
  predicted = mask * before_mask
  back = lambda x: (x * predicted).reshape(p, g, t)  # noqa: E731
  return back(logp), back(entropy)


def _check_options(temperature, schedule):
  checks.positive(temperature=temperature)
  if schedule not in pallas_kernels.SCHEDULES:
    raise ValueError(
      f"schedule must be one of {sorted(pallas_kernels.SCHEDULES)}; got"
      f" {schedule!r}."
    )


def _project(model, hidden_BSD, targets_BS, temperature, schedule):
  """(logp, entropy) [B, S] of `targets_BS` from the hidden states before
  (dense when the logits are soft-capped: the kernel does not cap)."""
  if schedule == "dense" or model.config.final_logit_softcap is not None:
    return _dense(model, hidden_BSD, targets_BS, temperature)
  return pallas_kernels.token_logprob(
    hidden_BSD,
    model.unembedding().astype(hidden_BSD.dtype),
    targets_BS,
    temperature=temperature,
    schedule=schedule,
  )


def _dense(model, hidden_BSD, targets_BS, temperature):
  """The reference path: full float32 logits [B, S, V]."""
  logits = model.logits(hidden_BSD) / temperature
  logz = jax.nn.logsumexp(logits, axis=-1)
  picked = jnp.take_along_axis(logits, targets_BS[..., None], -1)[..., 0]
  probs = jax.nn.softmax(logits, axis=-1)
  entropy = logz - jnp.sum(probs * logits, axis=-1)
  return picked - logz, entropy
