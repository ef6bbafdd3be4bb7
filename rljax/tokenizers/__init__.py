"""Tokenizers: text <-> token ids, chat templates, padded prompt batches.

`Tokenizer` wraps a sentencepiece model (`Tokenizer.from_sentencepiece`) or
an HF tokenizer.json (`Tokenizer.from_hf_json`); `tokenizer_from_gguf` builds
one from a llama.cpp GGUF file. Host-side Python, not jitted: `encode_batch`
turns prompts into left-padded int32 arrays [N, S] with a mask for the
sampler, and `decode_batch` turns sampled completions back into text for
reward functions. `apply_chat_template` renders chats as transformers does.
"""

from rljax.tokenizers._tokenizer import Tokenizer
from rljax.tokenizers._tokenizer import tokenizer_from_gguf

__all__ = [
  "Tokenizer",
  "tokenizer_from_gguf",
]
