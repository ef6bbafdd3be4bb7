"""`Tokenizer`: one host-side interface over sentencepiece and HF tokenizers."""

from collections.abc import Mapping, Sequence
import json
import os
from typing import Any

import numpy as np
import sentencepiece
import tokenizers

from rljax.tokenizers import _backends
from rljax.tokenizers import _chat
from rljax.tokenizers import _gguf_vocab

# Tokens that end an assistant turn in common chat templates. One is a stop
# token when the template writes it and the vocabulary has it.
_END_OF_TURN = (
  "<|im_end|>",  # ChatML: Qwen, SmolLM, ...
  "<|eot_id|>",  # Llama 3
  "<|eom_id|>",  # Llama 3.1 tool calls
  "<end_of_turn>",  # Gemma
  "<|end|>",  # Phi-3
  "<|END_OF_TURN_TOKEN|>",  # Command-R
  "<|return|>",  # gpt-oss
)


class Tokenizer:
  """Text <-> token ids, chat templates and batch padding (host-side).

  Wraps a sentencepiece model or an HF `tokenizers.Tokenizer`; build one
  with `Tokenizer.from_sentencepiece`, `Tokenizer.from_hf_json` or
  `rljax.tokenizers.tokenizer_from_gguf`. Nothing here is jitted: it turns
  prompts into the int32 arrays the sampler takes, and completions back into
  text for reward functions.

  `encode` never appends EOS, and adds BOS only once: a text that already
  starts with BOS (a rendered chat template that writes `bos_token`) gets no
  second one.
  """

  def __init__(
    self,
    backend: _backends.SentencePieceBackend | _backends.HuggingFaceBackend,
    *,
    special_tokens: Mapping[str, str],
    chat_template: str | None = None,
    add_bos: bool | None = None,
    extra_stop_ids: Sequence[int] = (),
    source: str = "",
  ):
    """Internal: use the `from_*` constructors."""
    self._backend, self._source = backend, source
    self._special_tokens = dict(special_tokens)
    self._ids = {k: self._id_of(k, v) for k, v in self._special_tokens.items()}
    self._chat_template = chat_template
    if add_bos is None:
      add_bos = backend.default_prefix()[:1] == [self.bos_id]
    self._add_bos = bool(add_bos) and self.bos_id is not None
    self._extra_stop_ids = tuple(int(i) for i in extra_stop_ids)

  def _id_of(self, name: str, token: str) -> int:
    """The id of a configured special token, which must be in the vocab."""
    token_id = self._backend.token_to_id(token)
    if token_id is None:
      raise ValueError(
        f"{name} {token!r} of {self._source} is not in the vocabulary."
      )
    return token_id

  @classmethod
  def from_sentencepiece(
    cls, path: str | os.PathLike, *, chat_template: str | None = None
  ) -> "Tokenizer":
    """Load a sentencepiece `.model` file or a directory with tokenizer.model.

    Optional files next to it: tokenizer_config.json (bos/eos/unk/pad
    tokens, add_bos_token, chat_template), chat_template.jinja (wins over
    the config's, as in transformers), generation_config.json (eos_token_id:
    extra stop ids). "<s>"-style control pieces in text encode as their ids.

    Args:
      path: the .model file or its directory.
      chat_template: a Jinja chat template overriding the directory's.

    Returns:
      The tokenizer. BOS/EOS/UNK/PAD come from the model unless
      tokenizer_config.json names others; BOS is added by default when the
      model has one, unless add_bos_token is false.
    """
    model_file = _backends.find_file(path, _backends.SP_FILE)
    proc = sentencepiece.SentencePieceProcessor(model_file=model_file)
    backend = _backends.SentencePieceBackend(proc)
    side = _backends.sidecars(model_file, chat_template)
    return cls(
      backend,
      special_tokens={**backend.named(), **side["tokens"]},
      chat_template=side["chat_template"],
      add_bos=side["add_bos"],
      extra_stop_ids=side["extra_stop_ids"],
      source=model_file,
    )

  @classmethod
  def from_hf_json(
    cls, path: str | os.PathLike, *, chat_template: str | None = None
  ) -> "Tokenizer":
    """Load an HF tokenizer.json or a directory with tokenizer.json.

    Optional files next to it: tokenizer_config.json (bos/eos/unk/pad
    tokens, chat_template), chat_template.jinja (wins over the config's, as
    in transformers), generation_config.json (eos_token_id: extra stop ids).

    Args:
      path: tokenizer.json or its directory.
      chat_template: a Jinja chat template overriding the directory's.

    Returns:
      The tokenizer. BOS is added by default iff tokenizer.json's
      post-processor adds it (transformers 5 ignores add_bos_token here).
    """
    json_file = _backends.find_file(path, _backends.HF_FILE)
    backend = _backends.HuggingFaceBackend(
      tokenizers.Tokenizer.from_file(json_file)
    )
    side = _backends.sidecars(json_file, chat_template)
    return cls(
      backend,
      special_tokens=side["tokens"],
      chat_template=side["chat_template"],
      extra_stop_ids=side["extra_stop_ids"],
      source=json_file,
    )

  @classmethod
  def from_characters(
    cls, alphabet: str, *, pad: str = "<pad>", eos: str = "<eos>"
  ) -> "Tokenizer":
    """One token per character of `alphabet`, plus pad (id 0) and EOS (id 1).

    For small models trained from scratch on a task with a known alphabet
    (`rljax.tasks.arithmetic` prompts like "23+45="). A character outside
    the alphabet raises ValueError in `encode`. EOS is the stop id.
    """
    chars = sorted(set(alphabet))
    if not chars:
      raise ValueError("alphabet must contain at least one character.")
    vocab = {pad: 0, eos: 1} | {c: i + 2 for i, c in enumerate(chars)}
    tok = tokenizers.Tokenizer(
      tokenizers.models.WordLevel(vocab, unk_token=pad)
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    tok.add_special_tokens([pad, eos])
    return cls(
      _backends.CharacterBackend(tok, alphabet="".join(chars)),
      special_tokens={"pad_token": pad, "eos_token": eos},
      source=f"characters {''.join(chars)!r}",
    )

  @property
  def vocab_size(self) -> int:
    """Number of ids, added tokens included."""
    return self._backend.vocab_size

  @property
  def bos_id(self) -> int | None:
    """Beginning-of-sequence id, or None."""
    return self._ids.get("bos_token")

  @property
  def eos_id(self) -> int | None:
    """End-of-sequence id, or None."""
    return self._ids.get("eos_token")

  @property
  def pad_id(self) -> int | None:
    """Padding id: the pad token, else EOS, else None.

    Falling back to EOS is safe: the mask, not this value, marks padding.
    """
    return self._ids.get("pad_token", self.eos_id)

  @property
  def add_bos(self) -> bool:
    """Whether `encode` adds BOS by default (the model's convention)."""
    return self._add_bos

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """Ids that end generation, in order, without repeats.

    EOS, generation_config.json's eos ids, and the end-of-turn tokens the
    chat template writes (e.g. <|im_end|>, <|eot_id|>, <end_of_turn>).
    """
    ids = [self.eos_id, *self._extra_stop_ids]
    for token in _END_OF_TURN:
      if self._chat_template and token in self._chat_template:
        ids.append(self._backend.token_to_id(token))
    return tuple(dict.fromkeys(i for i in ids if i is not None))

  @property
  def chat_template(self) -> str | None:
    """The Jinja chat template, or None."""
    return self._chat_template

  @property
  def special_tokens(self) -> dict[str, str]:
    """bos_token/eos_token/unk_token/pad_token strings the model names."""
    return dict(self._special_tokens)

  def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
    """Token ids of `text`; special-token strings in it become their ids.

    Args:
      text: the text.
      add_bos: prepend BOS (unless `text` already starts with it); None uses
        the model's convention (`self.add_bos`).

    Returns:
      The ids, without EOS.
    """
    if not isinstance(text, str):
      raise ValueError(f"text must be a str; got {type(text).__name__}.")
    return self._with_bos(self._backend.encode(text), add_bos)

  def _with_bos(self, ids: list[int], add_bos: bool | None) -> list[int]:
    """`ids` with BOS prepended when asked and not already there."""
    if add_bos is None:
      add_bos = self._add_bos
    if add_bos and self.bos_id is None:
      raise ValueError(
        f"add_bos=True but {self._source} has no BOS token; pass add_bos=False."
      )
    if add_bos and ids[:1] != [self.bos_id]:
      ids = [self.bos_id, *ids]
    return ids

  def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
    """Text of a 1-D sequence of ids (out-of-vocabulary ids raise).

    Args:
      ids: token ids, a list or 1-D array.
      skip_special: drop special tokens (BOS, EOS, <|im_end|>, ...).

    Returns:
      The text.
    """
    ids_S = np.asarray(ids, dtype=np.int64)
    if ids_S.ndim != 1:
      raise ValueError(
        f"ids must be 1-D; got shape {ids_S.shape} (use decode_batch)."
      )
    bad = (ids_S < 0) | (ids_S >= self.vocab_size)
    if bad.any():
      raise ValueError(
        f"ids contains {int(ids_S[bad][0])}, outside the vocabulary"
        f" [0, {self.vocab_size}); mask padding out, or keep the sampler"
        " within the vocabulary."
      )
    return self._backend.decode(ids_S.tolist(), skip_special)

  def decode_batch(
    self,
    ids: Any,
    *,
    mask: Any = None,
    skip_special: bool = True,
  ) -> list[str]:
    """Text of each row of ids [N, S], keeping only positions where mask=1.

    Args:
      ids: int array [N, S] (e.g. sampled completions).
      mask: optional 0/1 array [N, S]; positions with 0 are dropped.
      skip_special: drop special tokens.

    Returns:
      N strings.
    """
    ids_NS = np.asarray(ids)
    if ids_NS.ndim != 2:
      raise ValueError(f"ids must be 2-D [N, S]; got shape {ids_NS.shape}.")
    mask_NS = np.ones_like(ids_NS) if mask is None else np.asarray(mask)
    if mask_NS.shape != ids_NS.shape:
      raise ValueError(
        f"mask shape {mask_NS.shape} must equal ids shape {ids_NS.shape}."
      )
    return [
      self.decode(row[m.astype(bool)], skip_special=skip_special)
      for row, m in zip(ids_NS, mask_NS)
    ]

  def encode_batch(
    self,
    texts: Sequence[str],
    *,
    max_length: int | None = None,
    padding_side: str = "left",
    add_bos: bool | None = None,
  ) -> tuple[np.ndarray, np.ndarray]:
    """Encode and pad texts into one [N, S] array.

    Left padding (the default) right-aligns prompts, so every prompt's last
    token is at position S - 1, where the sampler starts decoding.

    Args:
      texts: N strings.
      max_length: pad to this length S; a longer text raises ValueError.
        None pads to the longest text.
      padding_side: "left" or "right".
      add_bos: as in `encode`.

    Returns:
      (ids [N, S] int32 with `pad_id` at padding, mask [N, S] int32 with 1 at
      real tokens and 0 at padding).
    """
    if isinstance(texts, str) or not len(texts):
      raise ValueError("texts must be a non-empty list of strings.")
    if padding_side not in ("left", "right"):
      raise ValueError(
        f"padding_side must be 'left' or 'right'; got {padding_side!r}."
      )
    for i, text in enumerate(texts):
      if not isinstance(text, str):
        raise ValueError(
          f"texts[{i}] must be a str; got {type(text).__name__}."
        )
    rows = [
      self._with_bos(ids, add_bos) for ids in self._backend.encode_many(texts)
    ]
    longest = max(len(r) for r in rows)
    S = longest if max_length is None else max_length
    for i, row in enumerate(rows):
      if len(row) > S:
        raise ValueError(
          f"texts[{i}] has {len(row)} tokens, more than max_length={S};"
          " raise max_length or shorten the text."
        )
    if self.pad_id is None and any(len(r) < S for r in rows):
      raise ValueError(
        f"{self._source} has neither a pad nor an EOS token to pad with."
      )
    ids_NS = np.full((len(rows), S), self.pad_id or 0, dtype=np.int32)
    mask_NS = np.zeros((len(rows), S), dtype=np.int32)
    for i, row in enumerate(rows):
      start = S - len(row) if padding_side == "left" else 0
      ids_NS[i, start : start + len(row)] = row
      mask_NS[i, start : start + len(row)] = 1
    return ids_NS, mask_NS

  def apply_chat_template(
    self,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    **template_kwargs: Any,
  ) -> str:
    """Render a conversation as transformers' apply_chat_template does.

    Same output as `apply_chat_template(messages, tokenize=False)` there.

    Args:
      messages: dicts with "role" and usually "content".
      add_generation_prompt: end with the header of an assistant turn.
      **template_kwargs: extra template variables (e.g. enable_thinking,
        tools); they override the special tokens of the same name.

    Returns:
      The rendered text; encode it with add_bos=False when the template
      writes BOS itself (encode never doubles it anyway).
    """
    if self._chat_template is None:
      raise ValueError(
        f"{self._source} has no chat template; pass chat_template= when"
        " loading the tokenizer."
      )
    return _chat.render(
      self._chat_template,
      messages,
      add_generation_prompt=add_generation_prompt,
      special_tokens=self._special_tokens,
      **template_kwargs,
    )

  def save(self, directory: str | os.PathLike) -> None:
    """Write the tokenizer to `directory` for the matching `from_*` loader.

    Writes tokenizer.json (or tokenizer.model), tokenizer_config.json and,
    when there are extra stop ids, generation_config.json; transformers'
    AutoTokenizer also loads a saved tokenizer.json directory.
    """
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    self._backend.save(directory)
    config = {**self._special_tokens, "add_bos_token": self._add_bos}
    if self._chat_template is not None:
      config["chat_template"] = self._chat_template
    with open(os.path.join(directory, _backends.CONFIG_FILE), "w") as f:
      json.dump(config, f, indent=2, ensure_ascii=False)
    if self._extra_stop_ids:
      eos = [i for i in (self.eos_id, *self._extra_stop_ids) if i is not None]
      with open(os.path.join(directory, _backends.GENERATION_FILE), "w") as f:
        json.dump({"eos_token_id": eos}, f, indent=2)

  def __repr__(self) -> str:
    return (
      f"Tokenizer({self._source!r}, vocab_size={self.vocab_size},"
      f" bos_id={self.bos_id}, eos_id={self.eos_id}, pad_id={self.pad_id})"
    )


def tokenizer_from_gguf(path: str | os.PathLike) -> Tokenizer:
  """The tokenizer stored in a llama.cpp GGUF file's metadata.

  Supports tokenizer.ggml.model "gpt2" (byte-level BPE: tokens, merges and
  the pre-tokenizer named by tokenizer.ggml.pre, e.g. "smollm", "llama-bpe",
  "qwen2") and "llama" (sentencepiece-style BPE from tokens and scores with
  byte fallback), built as transformers builds them from GGUF. Control
  tokens stay whole and count as special; BOS/EOS/PAD/UNK ids, add_bos_token
  and chat_template come from the file.

  Args:
    path: the .gguf file.

  Returns:
    The tokenizer (HF `tokenizers` backend; `save` writes tokenizer.json).

  References:
    transformers/integrations/gguf/gguf_tokenizer_mapping.py;
    llama.cpp src/llama-vocab.cpp (pre-tokenizer regexes).
  """
  path = os.fspath(path)
  meta = _gguf_vocab.read_gguf_metadata(path)
  if "tokenizer.ggml.tokens" not in meta:
    raise ValueError(f"{path} has no tokenizer (no tokenizer.ggml.tokens).")
  backend = _backends.HuggingFaceBackend(_gguf_vocab.build_hf_tokenizer(meta))
  keys = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
  }
  special = {k: _gguf_vocab.special_token(meta, v) for k, v in keys.items()}
  return Tokenizer(
    backend,
    special_tokens={k: v for k, v in special.items() if v is not None},
    chat_template=meta.get("tokenizer.chat_template"),
    source=path,
  )
