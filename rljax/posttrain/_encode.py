"""Records as token ids with a loss mask: which tokens the model learns.

`Encoded(tokens, loss_mask)`: loss_mask[t] is 1 where token t is a target
(a completion's or an assistant turn's token, the end-of-turn or EOS token
that closes it included) and 0 on prompts, system and user turns, and the
template's own tokens. Token 0 is never a target (nothing predicts it).

Plain runs (``chat=False``) encode a prompt as the tokenizer does (BOS by
its convention) and a completion without BOS, followed by EOS. Chat runs
render with the tokenizer's chat template, as `rljax.envs.Renderer` renders
the prompts the policy samples from (the text encoded with
``add_bos=False``: a template writes BOS itself when the model wants it).
An assistant turn's tokens are found by rendering the template on growing
prefixes of the messages and encoding each; every prefix's token ids must
be a prefix of the whole conversation's, else the encoding raises (a
template that rewrites earlier turns once later ones follow, or a
tokenizer that merges tokens across a turn boundary). Text is never
searched for.
"""

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from rljax.posttrain._data import completion_text
from rljax.posttrain._data import messages
from rljax.posttrain._data import record_kind


class Encoded(NamedTuple):
  """One example's token ids and which of them are targets."""

  tokens: np.ndarray  # int32 [n]
  loss_mask: np.ndarray  # float32 [n], 1 on target tokens


def encode_supervised(
  tokenizer, record: Mapping[str, Any], *, chat: bool, max_length: int
) -> Encoded:
  """Tokens and loss mask of a chat or prompt/completion record.

  A prompt/completion record is `encode_prompt_completion`'s prompt
  (unscored) then completion (scored, with what closes it). A chat record
  (``{"messages": [...]}``, needs ``chat=True``) is its whole rendered
  conversation with only the assistant turns' tokens scored: each turn's
  content and the template's end-of-turn token (the first stop token in
  the turn); what the template writes after it (e.g. ChatML's newline) is
  context, as the sampler never generates it. A turn the template closes
  with no stop token is scored whole, and when it is the last turn EOS is
  appended, scored, so the model learns to stop.

  Examples longer than `max_length` are truncated from the right (their
  last tokens are dropped, so a truncated completion is not closed).

  Args:
    tokenizer: a `rljax.tokenizers.Tokenizer`.
    record: a "chat" or "prompt_completion" record (`record_kind`).
    chat: render with the tokenizer's chat template.
    max_length: the most tokens kept.

  Returns:
    The `Encoded` example.
  """
  if not isinstance(max_length, int) or max_length < 2:
    raise ValueError(f"max_length must be an int >= 2; got {max_length!r}.")
  kind = record_kind(record)
  if kind == "chat":
    if not chat:
      raise ValueError(
        "a chat record (messages) needs chat=True: its turns are rendered"
        " with the tokenizer's chat template."
      )
    tokens, mask = _chat_example(tokenizer, messages(record["messages"]))
  elif kind == "prompt_completion":
    prompt_ids, completion_ids = encode_prompt_completion(
      tokenizer, record["prompt"], record["completion"], chat=chat
    )
    tokens = np.concatenate([prompt_ids, completion_ids])
    mask = np.concatenate(
      [np.zeros(len(prompt_ids)), np.ones(len(completion_ids))]
    )
  else:
    raise ValueError(
      f"encode_supervised takes chat or prompt_completion records; got a"
      f" {kind} record (encode its completions with"
      " encode_prompt_completion)."
    )
  mask = np.asarray(mask, np.float32)[:max_length]
  mask[:1] = 0.0
  return Encoded(np.asarray(tokens, np.int32)[:max_length], mask)


def encode_prompt_completion(
  tokenizer, prompt: Any, completion: Any, *, chat: bool
) -> tuple[np.ndarray, np.ndarray]:
  """Token ids of a prompt and of the completion that follows it.

  Plain: ``tokenizer.encode(prompt)`` and the completion's ids (no BOS)
  followed by EOS. Chat: the prompt (a string is one user message) rendered
  with ``add_generation_prompt=True``, and the completion as the template
  writes it as the next assistant turn, through the end-of-turn token (the
  first stop token; EOS appended when the template writes none). Used for
  supervised examples and for each side of a preference pair.

  Args:
    tokenizer: a `rljax.tokenizers.Tokenizer`.
    prompt: a string, or (chat only) a list of messages.
    completion: a string or one assistant message.
    chat: render with the tokenizer's chat template.

  Returns:
    (prompt_ids, completion_ids), int32 arrays.
  """
  text = completion_text(completion)
  if not chat:
    if not isinstance(prompt, str):
      raise ValueError(
        "a prompt given as messages needs chat=True; with chat=False the"
        f" prompt must be a string, got {type(prompt).__name__}."
      )
    prompt_ids = tokenizer.encode(prompt)
    completion_ids = tokenizer.encode(text, add_bos=False)
    completion_ids = [*completion_ids, _eos_id(tokenizer)]
    return np.asarray(prompt_ids, np.int32), np.asarray(
      completion_ids, np.int32
    )
  turns = [*messages(prompt), {"role": "assistant", "content": text}]
  ids, spans = _assistant_spans(tokenizer, turns)
  start, _ = spans[-1]
  completion_ids = _closed_turn(tokenizer, ids[start:], last=True)
  return np.asarray(ids[:start], np.int32), np.asarray(completion_ids, np.int32)


def _chat_example(tokenizer, turns: list[dict]) -> tuple[list, np.ndarray]:
  """The conversation's ids and its assistant-turn mask (unclipped)."""
  ids, spans = _assistant_spans(tokenizer, turns)
  if not spans:
    raise ValueError(
      "a chat record needs at least one assistant message to learn from;"
      f" its roles are {[m['role'] for m in turns]}."
    )
  mask = np.zeros(len(ids), np.float32)
  for start, end in spans:
    target = _closed_turn(tokenizer, ids[start:end], last=end == len(ids))
    if start + len(target) > len(ids):  # EOS appended after the last turn
      ids = [*ids, target[-1]]
      mask = np.append(mask, 0.0)
    mask[start : start + len(target)] = 1.0
  return ids, mask


def _closed_turn(tokenizer, turn_ids: Sequence[int], *, last: bool) -> list:
  """An assistant turn's ids through its first stop token; without one,
  the whole turn, plus EOS when it ends the conversation."""
  stops = set(tokenizer.stop_ids)
  for i, token in enumerate(turn_ids):
    if token in stops:
      return list(turn_ids[: i + 1])
  return [*turn_ids, _eos_id(tokenizer)] if last else list(turn_ids)


def _assistant_spans(tokenizer, turns: list[dict]) -> tuple[list, list]:
  """The conversation's ids and each assistant turn's [start, end)."""
  render = lambda msgs, gen: tokenizer.apply_chat_template(  # noqa: E731
    msgs, add_generation_prompt=gen
  )
  full_text = render(turns, False)
  ids = tokenizer.encode(full_text, add_bos=False)
  spans = []
  for i, turn in enumerate(turns):
    if turn["role"] != "assistant":
      continue
    start = _prefix_length(
      tokenizer, render(turns[:i], True), full_text, ids, i
    )
    end = len(ids)
    if i + 1 < len(turns):
      through = render(turns[: i + 1], False)
      end = _prefix_length(tokenizer, through, full_text, ids, i)
    spans.append((start, end))
  return ids, spans


def _prefix_length(tokenizer, text: str, full_text: str, ids, index) -> int:
  """len of `text`'s ids, which must be a prefix of the conversation's."""
  prefix = tokenizer.encode(text, add_bos=False)
  if list(ids[: len(prefix)]) == list(prefix):
    return len(prefix)
  if not full_text.startswith(text):
    raise ValueError(
      f"the chat template renders the conversation up to message {index}"
      " differently once later messages follow (e.g. it rewrites or drops"
      " earlier turns' content), so assistant turns cannot be located;"
      " use a template that renders earlier turns unchanged."
    )
  raise ValueError(
    f"the tokens of the conversation up to message {index} are not a prefix"
    " of the whole conversation's tokens (the tokenizer merges text across"
    " the turn boundary, e.g. content that starts with whitespace); strip"
    " the messages or use a template with a separator there."
  )


def _eos_id(tokenizer) -> int:
  if tokenizer.eos_id is None:
    raise ValueError(
      "the tokenizer has no EOS token to close completions with; load one"
      " whose tokenizer_config.json names eos_token."
    )
  return tokenizer.eos_id
