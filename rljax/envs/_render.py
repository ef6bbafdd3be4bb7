"""`Renderer`: prompts and observations as tokens, with or without chat."""

from collections.abc import Mapping, Sequence
from typing import Any

from rljax.envs._base import Content

_SENTINEL = "\x00rljax-turn\x00"


def _is_tokens(content) -> bool:
  return (
    not isinstance(content, str)
    and len(content) > 0
    and all(isinstance(t, int) for t in content)
  )


def _messages(content) -> list[dict]:
  if isinstance(content, str):
    return [{"role": "user", "content": content}]
  if not all(isinstance(m, Mapping) and "role" in m for m in content):
    raise ValueError(
      "an environment's prompt or observation must be text, token ids or"
      ' chat messages ({"role": ..., "content": ...} dicts); got'
      f" {content!r:.200}."
    )
  return [dict(m) for m in content]


class Renderer:
  """Turns an environment's prompts and observations into token ids.

  In chat runs (``chat=True``) a prompt is rendered by the tokenizer's chat
  template (a text prompt as one user message, with the tools' schemas),
  and an observation's messages become the tokens the template writes
  after an assistant turn: what closes that turn (``<|im_end|>\\n``, less
  the stop token when the policy sampled it), the messages, and the next
  assistant header. The policy's own tokens are never re-tokenized. In
  plain runs text is encoded as it is and messages' contents are joined.
  Token ids pass through unchanged either way.
  """

  def __init__(self, tokenizer, *, chat: bool):
    self.tokenizer = tokenizer
    self.chat = bool(chat)
    self._close = None

  def prompt(self, content: Content, tools: Sequence[Mapping] = ()) -> list:
    """Token ids of an episode's first context."""
    if _is_tokens(content):
      return [int(t) for t in content]
    if not self.chat:
      return self.tokenizer.encode(self._plain(content))
    kwargs: dict[str, Any] = {"tools": list(tools)} if tools else {}
    text = self.tokenizer.apply_chat_template(_messages(content), **kwargs)
    return self.tokenizer.encode(text, add_bos=False)

  def observation(self, content: Content, *, stopped: bool) -> list:
    """Token ids appended after an action; `stopped`: the action ended
    with a stop token (chat runs then do not close the turn again)."""
    if content is None:
      content = ""
    if _is_tokens(content):
      return [int(t) for t in content]
    if not self.chat:
      text = self._plain(content)
      return self.tokenizer.encode(text, add_bos=False) if text else []
    close_stopped, close_open = self._closing()
    lead = close_stopped if stopped else close_open
    messages = _messages(content)
    context = [{"role": "user", "content": "x"}]
    turn = {"role": "assistant", "content": _SENTINEL}
    before = self.tokenizer.apply_chat_template(
      context + [turn], add_generation_prompt=False
    )
    after = self.tokenizer.apply_chat_template(
      context + [turn] + messages, add_generation_prompt=True
    )
    if not after.startswith(before):
      raise ValueError(
        "the chat template renders earlier turns differently once an"
        " observation follows them, so an observation's tokens cannot be"
        " appended; return token ids from the environment instead."
      )
    return self.tokenizer.encode(lead + after[len(before) :], add_bos=False)

  def _closing(self) -> tuple[str, str]:
    """What the template writes after an assistant turn's content: without
    the stop token's text (the policy sampled it) and in full."""
    if self._close is None:
      text = self.tokenizer.apply_chat_template(
        [
          {"role": "user", "content": "x"},
          {"role": "assistant", "content": _SENTINEL},
        ],
        add_generation_prompt=False,
      )
      tail = text[text.index(_SENTINEL) + len(_SENTINEL) :]
      stopped = tail
      for i in self.tokenizer.stop_ids:
        token = self.tokenizer.decode([i], skip_special=False)
        if token and tail.startswith(token):
          stopped = tail[len(token) :]
          break
      self._close = (stopped, tail)
    return self._close

  @staticmethod
  def _plain(content) -> str:
    if isinstance(content, str):
      return content
    return "".join(str(m.get("content", "")) for m in _messages(content))
