"""Building an HF `tokenizers.Tokenizer` from a llama.cpp GGUF file.

A GGUF has no tokenizer.json: it stores the vocabulary, merges, token types
and special ids as metadata under llama.cpp's keys (`tokenizer.ggml.*`). We
read only that key-value header (`gguf.GGUFReader` builds a numpy view per
string and takes seconds on a 100 MB file; this takes ~0.1 s) and rebuild the
tokenizer the way transformers does in
`transformers/integrations/gguf/gguf_tokenizer_mapping.py`.
"""

from collections.abc import Callable
import mmap
import os
import struct
from typing import Any

import numpy as np
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers
from tokenizers import processors

# GGUF value types (ggml's `gguf_type`) -> numpy dtype of fixed-size values.
_NUMERIC = {
  0: np.uint8,
  1: np.int8,
  2: np.uint16,
  3: np.int16,
  4: np.uint32,
  5: np.int32,
  6: np.float32,
  7: np.bool_,
  10: np.uint64,
  11: np.int64,
  12: np.float64,
}
_STRING, _ARRAY = 8, 9

# llama.cpp token types (`llama_token_type`).
_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4

# The pre-tokenization regexes llama.cpp uses for each `tokenizer.ggml.pre`
# (src/llama-vocab.cpp); the llama3 and qwen2 ones are the strings transformers
# uses for the same names.
_LLAMA3_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_pre() -> pre_tokenizers.PreTokenizer:
  """GPT-2: ByteLevel's built-in GPT-2 regex."""
  return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_gpt2_pre() -> pre_tokenizers.PreTokenizer:
  """StarCoder/SmolLM: every digit alone (`\\p{N}`), then the GPT-2 regex."""
  return pre_tokenizers.Sequence(
    [pre_tokenizers.Digits(individual_digits=True), _gpt2_pre()]
  )


def _split_pre(regex: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
  """A family regex split, then byte-level mapping without GPT-2's regex."""
  return lambda: pre_tokenizers.Sequence(
    [
      pre_tokenizers.Split(tokenizers.Regex(regex), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
  )


_PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
  "default": _gpt2_pre,
  "gpt2": _gpt2_pre,
  "gpt-2": _gpt2_pre,
  "mpt": _gpt2_pre,
  "olmo": _gpt2_pre,
  "smollm": _digits_gpt2_pre,
  "starcoder": _digits_gpt2_pre,
  "refact": _digits_gpt2_pre,
  "command-r": _digits_gpt2_pre,
  "codeshell": _digits_gpt2_pre,
  "exaone": _digits_gpt2_pre,
  "minerva": _digits_gpt2_pre,
  "llama3": _split_pre(_LLAMA3_SPLIT),
  "llama-v3": _split_pre(_LLAMA3_SPLIT),
  "llama-bpe": _split_pre(_LLAMA3_SPLIT),
  "falcon3": _split_pre(_LLAMA3_SPLIT),
  "smaug-bpe": _split_pre(_LLAMA3_SPLIT),
  "dbrx": _split_pre(_LLAMA3_SPLIT),
  "qwen2": _split_pre(_QWEN2_SPLIT),
  "deepseek-r1-qwen": _split_pre(_QWEN2_SPLIT),
  "megrez": _split_pre(_QWEN2_SPLIT),
}


class _Cursor:
  """Little-endian reads from a memory-mapped GGUF file."""

  def __init__(self, buffer, path: str):
    self.buffer, self.pos, self.path = buffer, 0, path

  def unpack(self, fmt: str) -> Any:
    value = struct.unpack_from("<" + fmt, self.buffer, self.pos)[0]
    self.pos += struct.calcsize("<" + fmt)
    return value

  def string(self) -> str:
    n = self.unpack("Q")
    raw = self.buffer[self.pos : self.pos + n]
    self.pos += n
    return raw.decode("utf-8", errors="replace")

  def array(self, dtype, count: int) -> np.ndarray:
    dtype = np.dtype(dtype).newbyteorder("<")
    out = np.frombuffer(self.buffer, dtype, count, self.pos).copy()
    self.pos += count * dtype.itemsize
    return out

  def value(self, kind: int) -> Any:
    if kind == _STRING:
      return self.string()
    if kind in _NUMERIC:
      return self.array(_NUMERIC[kind], 1)[0].item()
    if kind == _ARRAY:
      item_kind, count = self.unpack("I"), self.unpack("Q")
      if item_kind in _NUMERIC:
        return self.array(_NUMERIC[item_kind], count).tolist()
      return [self.value(item_kind) for _ in range(count)]
    raise ValueError(
      f"{self.path}: unknown GGUF value type {kind} at byte {self.pos}."
    )


def read_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
  """The key-value metadata of a GGUF (v2/v3, little-endian) file."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no such file; expected a .gguf file.")
  with (
    open(path, "rb") as f,
    mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm,
  ):
    cursor = _Cursor(mm, path)
    if mm[:4] != b"GGUF":
      raise ValueError(f"{path} is not a GGUF file (no 'GGUF' magic).")
    cursor.pos = 4
    version = cursor.unpack("I")
    if version not in (2, 3):
      raise ValueError(
        f"{path}: GGUF version {version} is not supported (2 or 3,"
        " little-endian)."
      )
    _, n_kv = cursor.unpack("Q"), cursor.unpack("Q")
    metadata = {}
    for _ in range(n_kv):
      key = cursor.string()
      metadata[key] = cursor.value(cursor.unpack("I"))
    return metadata


def bytes_to_unicode() -> dict[int, str]:
  """GPT-2's reversible map from the 256 bytes to printable characters."""
  printable = [
    *range(ord("!"), ord("~") + 1),
    *range(ord("¡"), ord("¬") + 1),
    *range(ord("®"), ord("ÿ") + 1),
  ]
  extra = [b for b in range(256) if b not in printable]
  chars = printable + [256 + i for i in range(len(extra))]
  return {b: chr(c) for b, c in zip(printable + extra, chars)}


def _byte_level_model(meta: dict[str, Any]) -> tokenizers.Tokenizer:
  """Byte-level BPE from tokens and merges (the `gpt2` tokenizer model)."""
  spelling = bytes_to_unicode()
  alphabet = set(spelling.values())
  vocab = {}
  for i, token in enumerate(meta["tokenizer.ggml.tokens"]):
    # llama.cpp may store a token as raw text; BPE looks tokens up spelled in
    # the byte alphabet.
    if not set(token) <= alphabet:
      token = "".join(spelling[b] for b in token.encode("utf-8"))
    vocab[token] = i
  merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
  tok = tokenizers.Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre not in _PRE_TOKENIZERS:
    raise ValueError(
      f"tokenizer.ggml.pre = {pre!r} is not supported; supported values:"
      f" {sorted(_PRE_TOKENIZERS)}."
    )
  tok.pre_tokenizer = _PRE_TOKENIZERS[pre]()
  tok.decoder = decoders.ByteLevel()
  return tok


def _sentencepiece_merges(tokens: list[str], scores: list[float]) -> list:
  """BPE merges implied by a sentencepiece vocabulary: best score first."""
  vocab = {t: i for i, t in enumerate(tokens)}
  merges = []
  for token, score in zip(tokens, scores):
    pairs = [
      (token[:k], token[k:])
      for k in range(1, len(token))
      if token[:k] in vocab and token[k:] in vocab
    ]
    pairs.sort(key=lambda p: (vocab[p[0]], vocab[p[1]]))
    merges += [(score, left, right) for left, right in pairs]
  # Stable sort, so ties keep vocabulary order (as transformers'
  # generate_merges does).
  merges.sort(key=lambda m: (m[0], len(m[1]), len(m[2])), reverse=True)
  return [(left, right) for _, left, right in merges]


def _sentencepiece_model(meta: dict[str, Any]) -> tokenizers.Tokenizer:
  """Sentencepiece-style BPE with byte fallback (the `llama` model)."""
  tokens = meta["tokenizer.ggml.tokens"]
  scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
  unk_id = meta.get("tokenizer.ggml.unknown_token_id")
  bpe = models.BPE(
    {t: i for i, t in enumerate(tokens)},
    _sentencepiece_merges(tokens, scores),
    unk_token=tokens[unk_id] if unk_id is not None else None,
    fuse_unk=True,
    byte_fallback=True,
  )
  tok = tokenizers.Tokenizer(bpe)
  # A normalizer, not transformers' Metaspace(prepend_scheme="first"): that
  # adds no "▁" to text that already starts with a space, while sentencepiece
  # and llama.cpp always do (to every text piece between special tokens).
  prefix = meta.get("tokenizer.ggml.add_space_prefix", True)
  spaces = [normalizers.Replace(" ", "▁")]
  if prefix:
    spaces.insert(0, normalizers.Prepend("▁"))
  tok.normalizer = normalizers.Sequence(spaces)
  steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
  if prefix:
    steps.append(decoders.Strip(content=" ", left=1))
  tok.decoder = decoders.Sequence(steps)
  return tok


_BUILDERS = {"gpt2": _byte_level_model, "llama": _sentencepiece_model}


def _add_special_tokens(tok: tokenizers.Tokenizer, meta: dict[str, Any]):
  """Keep control/user-defined tokens whole, as transformers and llama.cpp do."""
  tokens = meta["tokenizer.ggml.tokens"]
  types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
  vocab = tok.get_vocab()
  # A control token spelled outside the vocabulary (a llama.cpp mislabel in
  # byte-level files) would grow the vocabulary past the model's; skip it.
  named = {
    meta.get(f"tokenizer.ggml.{key}")
    for key in ("bos_token_id", "eos_token_id", "padding_token_id")
  }
  special = [
    tokenizers.AddedToken(t, special=True, normalized=False)
    for i, (t, kind) in enumerate(zip(tokens, types))
    if (kind in (_UNKNOWN, _CONTROL) or i in named) and t in vocab
  ]
  user = [
    tokenizers.AddedToken(t, special=False, normalized=False)
    for t, kind in zip(tokens, types)
    if kind == _USER_DEFINED and t in vocab
  ]
  tok.add_special_tokens(special)
  tok.add_tokens(user)


def _bos_processor(bos: str | None, bos_id: int | None, add_bos: bool):
  """A post-processor that prepends BOS iff the file asks for it."""
  if not add_bos or bos is None:
    return processors.TemplateProcessing(single="$A", pair="$A $B:1")
  return processors.TemplateProcessing(
    single=f"{bos} $A",
    pair=f"{bos} $A {bos}:1 $B:1",
    special_tokens=[(bos, bos_id)],
  )


def special_token(meta: dict[str, Any], key: str) -> str | None:
  """The token string whose id is stored under `tokenizer.ggml.<key>`."""
  token_id = meta.get(f"tokenizer.ggml.{key}")
  tokens = meta["tokenizer.ggml.tokens"]
  return tokens[token_id] if token_id is not None else None


def build_hf_tokenizer(meta: dict[str, Any]) -> tokenizers.Tokenizer:
  """The HF tokenizer described by GGUF metadata (see the module docstring)."""
  kind = meta.get("tokenizer.ggml.model")
  if kind not in _BUILDERS:
    raise ValueError(
      f"tokenizer.ggml.model = {kind!r} is not supported; supported values:"
      f" {sorted(_BUILDERS)}."
    )
  tok = _BUILDERS[kind](meta)
  _add_special_tokens(tok, meta)
  add_bos = meta.get("tokenizer.ggml.add_bos_token", kind == "llama")
  tok.post_processor = _bos_processor(
    special_token(meta, "bos_token_id"),
    meta.get("tokenizer.ggml.bos_token_id"),
    add_bos,
  )
  return tok
