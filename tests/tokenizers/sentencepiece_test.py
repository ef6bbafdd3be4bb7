"""Tokenizer.from_sentencepiece: a model trained here and Mistral's v1 model."""

import importlib.util
import json
import os
import random

import numpy as np
import pytest
import sentencepiece

from rljax.tokenizers import Tokenizer

_WORDS = (
  "the a cat dog runs over under quick brown lazy fox jumps and or not seven"
  " eight nine river tree house blue green red small large"
).split()

PARAGRAPH = (
  "On 12 March 2024, the committee approved 3 of the 7 proposals (about"
  " 42.9%). Costs rose to $1,250.75 per unit; delivery takes 14-21 days."
  " Questions? Write to support@example.com, or call +1 (555) 010-9999!"
)


def _lines(n: int = 400) -> list[str]:
  """Deterministic sentences of common words, numbers and punctuation."""
  rng = random.Random(0)
  lines = []
  for _ in range(n):
    words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
    if rng.random() < 0.5:
      words.insert(rng.randint(0, len(words)), str(rng.randint(0, 999)))
    text = " ".join(words)
    lines.append(text[0].upper() + text[1:] + rng.choice(".!?,;"))
  return lines


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def trained(request, tmp_path_factory):
  """(path, processor) of a 200-piece model trained on generated text."""
  prefix = tmp_path_factory.mktemp(request.param) / "tiny"
  sentencepiece.SentencePieceTrainer.train(
    sentence_iterator=iter(_lines()),
    model_prefix=str(prefix),
    vocab_size=200,
    model_type=request.param,
    minloglevel=2,
  )
  path = f"{prefix}.model"
  return path, sentencepiece.SentencePieceProcessor(model_file=path)


def _mistral_v1() -> str:
  spec = importlib.util.find_spec("mistral_common")
  if spec is None:
    pytest.skip("mistral-common (its data file) is not installed")
  path = os.path.join(
    spec.submodule_search_locations[0], "data", "tokenizer.model.v1"
  )
  if not os.path.isfile(path):
    pytest.skip(f"{path} is missing")
  return path


def test_trained_model_ids_equal_sentencepiece_and_round_trip(trained):
  path, sp = trained
  tok = Tokenizer.from_sentencepiece(path)
  assert tok.vocab_size == 200 == sp.get_piece_size()
  assert (tok.bos_id, tok.eos_id) == (1, 2)  # trainer defaults
  assert tok.pad_id == 2  # no <pad> piece (pad_id=-1): falls back to EOS
  texts = _lines(30)[5:] + ["Seven red 123 foxes; 9 dogs!", ""]
  for text in texts:
    ids = tok.encode(text, add_bos=False)
    assert ids == sp.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode(text) == [1, *sp.encode(text)]  # BOS by default


def test_trained_model_directory_with_config(trained, tmp_path):
  path, sp = trained
  with open(path, "rb") as f:
    (tmp_path / "tokenizer.model").write_bytes(f.read())
  template = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
  )
  config = {"add_bos_token": False, "chat_template": template}
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  tok = Tokenizer.from_sentencepiece(tmp_path)
  assert not tok.add_bos
  assert tok.encode("the cat") == sp.encode("the cat")
  chat = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "yo"},
  ]
  assert tok.apply_chat_template(chat) == "[user] hi\n[assistant] yo\n"


def test_mistral_v1_paragraph_ids_equal_sentencepiece():
  path = _mistral_v1()
  sp = sentencepiece.SentencePieceProcessor(model_file=path)
  tok = Tokenizer.from_sentencepiece(path)
  assert tok.vocab_size == 32000
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 2)
  assert tok.special_tokens == {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
  }
  ids = tok.encode(PARAGRAPH)
  assert ids == [1, *sp.encode(PARAGRAPH)]
  assert tok.decode(ids) == PARAGRAPH
  # Checked by hand against the vocabulary: "hello" -> "▁hell" + "o".
  assert tok.encode("hello") == [1, 6312, 28709]
  assert [sp.id_to_piece(i) for i in (6312, 28709)] == ["▁hell", "o"]


def test_mistral_v1_control_tokens_in_text_and_no_double_bos():
  tok = Tokenizer.from_sentencepiece(_mistral_v1())
  # "<s>" and "</s>" in text are the control tokens, as in transformers. Each
  # text piece gets sentencepiece's dummy "▁" prefix: " x" -> "▁▁x" =
  # [28705 "▁", 1318 "▁x"], and "y" -> [337 "▁y"].
  ids = tok.encode("<s> x</s>y")
  assert ids == [1, 28705, 1318, 2, 337]
  # Skipping specials leaves "▁▁x▁y"; sentencepiece drops the first "▁".
  assert tok.decode(ids) == " x y"
  assert tok.decode(ids, skip_special=False) == "<s> x</s>y"
  assert ids.count(1) == 1  # BOS in the text, so encode adds none


def test_encode_batch_left_pads_with_eos(trained):
  path, sp = trained
  tok = Tokenizer.from_sentencepiece(path)
  texts = ["The lazy dog jumps over the tree.", "Red fox!"]
  ids, mask = tok.encode_batch(texts)
  rows = [[1, *sp.encode(t)] for t in texts]  # BOS + sentencepiece's ids
  S = max(len(r) for r in rows)
  want = [[2] * (S - len(r)) + r for r in rows]  # EOS (2) pads on the left
  assert ids.tolist() == want
  assert mask.tolist() == [[0] * (S - len(r)) + [1] * len(r) for r in rows]


def test_decode_rejects_out_of_vocab_ids(trained):
  tok = Tokenizer.from_sentencepiece(trained[0])
  with pytest.raises(ValueError, match=r"ids contains 200, outside"):
    tok.decode([5, 200])
  with pytest.raises(ValueError, match=r"ids must be 1-D"):
    tok.decode(np.zeros((2, 2), np.int32))


def test_save_round_trip(trained, tmp_path):
  tok = Tokenizer.from_sentencepiece(
    trained[0], chat_template="{{ bos_token }}"
  )
  tok.save(tmp_path)
  back = Tokenizer.from_sentencepiece(tmp_path)
  text = "The lazy dog jumps 42 times."
  assert back.encode(text) == tok.encode(text)
  assert back.chat_template == "{{ bos_token }}"
  assert back.apply_chat_template([]) == "<s>"
  assert back.add_bos and back.special_tokens == tok.special_tokens


def test_missing_model_file_names_path(tmp_path):
  missing = tmp_path / "nope.model"
  with pytest.raises(FileNotFoundError, match="nope.model does not exist"):
    Tokenizer.from_sentencepiece(missing)
  with pytest.raises(FileNotFoundError) as info:
    Tokenizer.from_sentencepiece(tmp_path)
  assert str(tmp_path) in str(info.value)
  assert "tokenizer.model" in str(info.value)
