"""Tokenizer backends (sentencepiece, HF tokenizers) and the files beside them."""

from collections.abc import Mapping, Sequence
import json
import os
import re
from typing import Any

import sentencepiece
import tokenizers

SP_FILE = "tokenizer.model"
HF_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
GENERATION_FILE = "generation_config.json"

_NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


class SentencePieceBackend:
  """Backend over `sentencepiece.SentencePieceProcessor`."""

  def __init__(self, proc: sentencepiece.SentencePieceProcessor):
    self.proc = proc
    self.control = {
      proc.id_to_piece(i): i
      for i in range(proc.get_piece_size())
      if proc.is_control(i)
    }
    # Longest first, so that a control piece containing another wins.
    names = sorted(self.control, key=len, reverse=True)
    self.split = re.compile("(" + "|".join(map(re.escape, names)) + ")")

  @property
  def vocab_size(self) -> int:
    return self.proc.get_piece_size()

  def token_to_id(self, token: str) -> int | None:
    i = self.proc.piece_to_id(token)
    return None if self.proc.is_unknown(i) and token != self.unk() else i

  def unk(self) -> str:
    return self.proc.id_to_piece(self.proc.unk_id())

  def named(self) -> dict[str, str]:
    """The model's own bos/eos/unk/pad pieces (ids < 0 mean "none")."""
    ids = {
      "bos_token": self.proc.bos_id(),
      "eos_token": self.proc.eos_id(),
      "unk_token": self.proc.unk_id(),
      "pad_token": self.proc.pad_id(),
    }
    return {k: self.proc.id_to_piece(i) for k, i in ids.items() if i >= 0}

  def encode(self, text: str) -> list[int]:
    # sentencepiece reads "<s>" in text as three characters; a rendered chat
    # template needs it read as the control token, as transformers does.
    if not self.control:
      return self.proc.encode(text)
    ids = []
    for part in self.split.split(text):
      if part in self.control:
        ids.append(self.control[part])
      elif part:
        ids += self.proc.encode(part)
    return ids

  def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
    return [self.encode(t) for t in texts]

  def decode(self, ids: list[int], skip_special: bool) -> str:
    if skip_special:
      return self.proc.decode(ids)
    pieces, run = [], []
    for i in ids:
      if self.proc.is_control(i):
        pieces += [self.proc.decode(run), self.proc.id_to_piece(i)]
        run = []
      else:
        run.append(i)
    return "".join(pieces) + self.proc.decode(run)

  def default_prefix(self) -> list[int]:
    """sentencepiece models (Llama, Mistral) are used with BOS."""
    return [self.proc.bos_id()] if self.proc.bos_id() >= 0 else []

  def save(self, directory: str) -> None:
    with open(os.path.join(directory, SP_FILE), "wb") as f:
      f.write(self.proc.serialized_model_proto())


class HuggingFaceBackend:
  """Backend over an HF `tokenizers.Tokenizer`."""

  def __init__(self, tok: tokenizers.Tokenizer):
    self.tok = tok

  @property
  def vocab_size(self) -> int:
    return self.tok.get_vocab_size(with_added_tokens=True)

  def token_to_id(self, token: str) -> int | None:
    return self.tok.token_to_id(token)

  def named(self) -> dict[str, str]:
    return {}

  def encode(self, text: str) -> list[int]:
    return self.tok.encode(text, add_special_tokens=False).ids

  def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
    # One call: the Rust side encodes the texts in parallel.
    encodings = self.tok.encode_batch(list(texts), add_special_tokens=False)
    return [e.ids for e in encodings]

  def decode(self, ids: list[int], skip_special: bool) -> str:
    return self.tok.decode(ids, skip_special_tokens=skip_special)

  def default_prefix(self) -> list[int]:
    """What tokenizer.json's post-processor puts before any text."""
    return self.tok.encode("", add_special_tokens=True).ids

  def save(self, directory: str) -> None:
    self.tok.save(os.path.join(directory, HF_FILE))


class CharacterBackend(HuggingFaceBackend):
  """A character vocabulary that rejects characters it does not have."""

  def __init__(self, tok: tokenizers.Tokenizer, *, alphabet: str):
    super().__init__(tok)
    self.alphabet = frozenset(alphabet)

  def _check(self, text: str) -> None:
    unknown = sorted(set(text) - self.alphabet)
    if unknown:
      raise ValueError(
        f"text {text!r} has characters {unknown} outside the tokenizer's"
        " alphabet; build it with Tokenizer.from_characters(alphabet) from"
        " every character the task uses."
      )

  def encode(self, text: str) -> list[int]:
    self._check(text)
    return super().encode(text)

  def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
    for text in texts:
      self._check(text)
    return super().encode_many(texts)


def find_file(path: str | os.PathLike, filename: str) -> str:
  """`path` itself if it is a file, else `path/filename`; or a clear error."""
  path = os.fspath(path)
  if os.path.isfile(path):
    return path
  if not os.path.exists(path):
    raise FileNotFoundError(
      f"{path} does not exist; expected a {filename} file or a directory"
      f" containing {filename}."
    )
  candidate = os.path.join(path, filename)
  if not os.path.isfile(candidate):
    raise FileNotFoundError(
      f"{path} is a directory without {filename}; expected {candidate}."
    )
  return candidate


def _read_json(path: str) -> dict[str, Any]:
  """The JSON object in `path`, or {} when there is no such file."""
  if not os.path.isfile(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _token_text(value: Any) -> str | None:
  """A special token as tokenizer_config writes it: a string or AddedToken."""
  if isinstance(value, Mapping):
    return value.get("content")
  return value


def _template_from_config(config: Mapping[str, Any], where: str) -> str | None:
  """tokenizer_config's chat_template: a string or a list of named ones."""
  template = config.get("chat_template")
  if not isinstance(template, list):
    return template
  named = {t["name"]: t["template"] for t in template}
  if "default" not in named:
    raise ValueError(
      f"{where} has chat templates {sorted(named)} and none named 'default';"
      " pass the one you want as chat_template=."
    )
  return named["default"]


def sidecars(model_file: str, chat_template: str | None) -> dict[str, Any]:
  """Special tokens, chat template and stop ids from files next to the model."""
  directory = os.path.dirname(model_file)
  config_file = os.path.join(directory, CONFIG_FILE)
  config = _read_json(config_file)
  if chat_template is None:
    template_file = os.path.join(directory, TEMPLATE_FILE)
    if os.path.isfile(template_file):  # transformers: this file wins
      with open(template_file, encoding="utf-8") as f:
        chat_template = f.read()
    else:
      chat_template = _template_from_config(config, config_file)
  eos = _read_json(os.path.join(directory, GENERATION_FILE)).get(
    "eos_token_id", []
  )
  return {
    "tokens": {
      k: _token_text(config[k]) for k in _NAMED_TOKENS if config.get(k)
    },
    "chat_template": chat_template,
    "add_bos": config.get("add_bos_token"),
    "extra_stop_ids": [eos] if isinstance(eos, int) else list(eos),
  }
