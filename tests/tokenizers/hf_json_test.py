"""Tokenizer.from_hf_json, encode_batch and decode_batch on a word-level
tokenizer whose ids can be worked out by hand."""

import json

import numpy as np
import pytest
import tokenizers
from tokenizers import models
from tokenizers import pre_tokenizers
from tokenizers import processors

from rljax.tokenizers import Tokenizer

VOCAB = {
  "<unk>": 0,
  "<s>": 1,
  "</s>": 2,
  "<|im_start|>": 3,
  "<|im_end|>": 4,
  "hello": 5,
  "world": 6,
  "foo": 7,
  "bar": 8,
  "baz": 9,
  "[PAD]": 10,
}
CHATML = (
  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
  "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
  "assistant\n{% endif %}"
)


def _write(directory, *, config=None, bos_post_processor=True, files=None):
  """tokenizer.json (+ tokenizer_config.json and other files) in directory."""
  tok = tokenizers.Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens(["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"])
  if bos_post_processor:
    tok.post_processor = processors.TemplateProcessing(
      single="<s> $A", special_tokens=[("<s>", 1)]
    )
  tok.save(str(directory / "tokenizer.json"))
  if config is not None:
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
  for name, text in (files or {}).items():
    (directory / name).write_text(text)
  return directory


CONFIG = {
  "bos_token": "<s>",
  "eos_token": {"content": "</s>", "special": True},  # AddedToken form
  "unk_token": "<unk>",
  "chat_template": CHATML,
}


@pytest.fixture
def tok(tmp_path):
  return Tokenizer.from_hf_json(_write(tmp_path, config=CONFIG))


def test_properties(tok):
  assert tok.vocab_size == 11
  assert (tok.bos_id, tok.eos_id) == (1, 2)
  assert tok.pad_id == 2  # no pad_token: EOS pads
  assert tok.add_bos  # the post-processor prepends <s>
  assert tok.stop_ids == (2, 4)  # EOS, then <|im_end|> from the template
  assert tok.special_tokens == {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
  }


def test_encode_by_hand(tok):
  assert tok.encode("hello world") == [1, 5, 6]
  assert tok.encode("hello world", add_bos=False) == [5, 6]
  assert tok.encode("<s> hello") == [1, 5]  # BOS already there: not doubled
  assert tok.encode("<|im_start|>foo<|im_end|>", add_bos=False) == [3, 7, 4]
  assert tok.encode("qux") == [1, 0]  # unknown word
  assert tok.decode([1, 5, 6, 2]) == "hello world"
  assert tok.decode([1, 5, 2], skip_special=False) == "<s> hello </s>"


def test_encode_batch_left_padding_by_hand(tok):
  ids, mask = tok.encode_batch(["hello world foo", "bar", ""])
  # Lengths 4, 2, 1 with BOS; S = 4; EOS (2) pads on the left.
  np.testing.assert_array_equal(ids, [[1, 5, 6, 7], [2, 2, 1, 8], [2, 2, 2, 1]])
  np.testing.assert_array_equal(
    mask, [[1, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1]]
  )
  assert ids.dtype == np.int32 and mask.dtype == np.int32


def test_encode_batch_right_padding_and_max_length(tok):
  ids, mask = tok.encode_batch(
    ["bar", "hello world"], padding_side="right", max_length=5, add_bos=False
  )
  np.testing.assert_array_equal(ids, [[8, 2, 2, 2, 2], [5, 6, 2, 2, 2]])
  np.testing.assert_array_equal(mask, [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
  ids, mask = tok.encode_batch(["baz"], max_length=4)
  np.testing.assert_array_equal(ids, [[2, 2, 1, 9]])
  np.testing.assert_array_equal(mask, [[0, 0, 1, 1]])


def test_encode_batch_uses_pad_token(tmp_path):
  tok = Tokenizer.from_hf_json(
    _write(tmp_path, config={**CONFIG, "pad_token": "[PAD]"})
  )
  assert tok.pad_id == 10
  ids, mask = tok.encode_batch(["foo bar", "baz"], add_bos=False)
  np.testing.assert_array_equal(ids, [[7, 8], [10, 9]])
  np.testing.assert_array_equal(mask, [[1, 1], [0, 1]])


def test_encode_batch_errors(tok):
  with pytest.raises(
    ValueError, match=r"texts\[1\] has 4 tokens.*max_length=3"
  ):
    tok.encode_batch(["foo", "hello world foo"], max_length=3)
  with pytest.raises(ValueError, match="padding_side must be"):
    tok.encode_batch(["foo"], padding_side="middle")
  with pytest.raises(ValueError, match="non-empty list"):
    tok.encode_batch([])
  with pytest.raises(ValueError, match="non-empty list"):
    tok.encode_batch("foo")
  with pytest.raises(ValueError, match=r"texts\[1\] must be a str"):
    tok.encode_batch(["foo", 3])


def test_decode_batch_keeps_masked_positions(tok):
  ids, mask = tok.encode_batch(["hello world foo", "bar", ""])
  assert tok.decode_batch(ids, mask=mask) == ["hello world foo", "bar", ""]
  # Without the mask, the left padding (EOS) is special and skipped too.
  assert tok.decode_batch(ids) == ["hello world foo", "bar", ""]
  assert tok.decode_batch(ids, mask=mask, skip_special=False)[1] == "<s> bar"
  with pytest.raises(ValueError, match="mask shape"):
    tok.decode_batch(ids, mask=mask[:, :2])
  with pytest.raises(ValueError, match="ids must be 2-D"):
    tok.decode_batch(ids[0])


def test_no_config_has_no_special_ids(tmp_path):
  tok = Tokenizer.from_hf_json(_write(tmp_path) / "tokenizer.json")
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.stop_ids) == (
    None,
    None,
    None,
    (),
  )
  assert not tok.add_bos  # the post-processor's <s> is not a known BOS
  assert tok.encode("foo") == [7]
  with pytest.raises(ValueError, match="no BOS token"):
    tok.encode("foo", add_bos=True)
  with pytest.raises(ValueError, match="neither a pad nor an EOS"):
    tok.encode_batch(["foo", "foo bar"])
  with pytest.raises(ValueError, match="has no chat template"):
    tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_no_bos_post_processor_means_no_bos(tmp_path):
  tok = Tokenizer.from_hf_json(
    _write(tmp_path, config=CONFIG, bos_post_processor=False)
  )
  assert not tok.add_bos
  assert tok.encode("foo") == [7]
  assert tok.encode("foo", add_bos=True) == [1, 7]


def test_chat_template_sources(tmp_path):
  chat = [{"role": "user", "content": "hello"}]
  tok = Tokenizer.from_hf_json(_write(tmp_path, config=CONFIG))
  want = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
  assert tok.apply_chat_template(chat) == want
  assert tok.apply_chat_template(chat, add_generation_prompt=False) == (
    "<|im_start|>user\nhello<|im_end|>\n"
  )
  # chat_template.jinja wins over tokenizer_config.json, as in transformers.
  _write(
    tmp_path, config=CONFIG, files={"chat_template.jinja": "J{{ eos_token }}"}
  )
  assert Tokenizer.from_hf_json(tmp_path).apply_chat_template(chat) == "J</s>"
  # An explicit chat_template wins over both.
  tok = Tokenizer.from_hf_json(tmp_path, chat_template="E")
  assert tok.apply_chat_template(chat) == "E"


def test_named_chat_templates(tmp_path):
  named = [
    {"name": "tool_use", "template": "T"},
    {"name": "default", "template": "D"},
  ]
  tok = Tokenizer.from_hf_json(
    _write(tmp_path, config={**CONFIG, "chat_template": named})
  )
  assert tok.chat_template == "D"
  _write(tmp_path, config={**CONFIG, "chat_template": named[:1]})
  with pytest.raises(
    ValueError, match=r"\['tool_use'\] and none named 'default'"
  ):
    Tokenizer.from_hf_json(tmp_path)


def test_generation_config_adds_stop_ids_and_save_round_trip(tmp_path):
  gen = json.dumps({"eos_token_id": [2, 9]})
  (tmp_path / "a").mkdir()
  src = _write(
    tmp_path / "a", config=CONFIG, files={"generation_config.json": gen}
  )
  tok = Tokenizer.from_hf_json(src)
  assert tok.stop_ids == (2, 9, 4)
  tok.save(tmp_path / "b")
  back = Tokenizer.from_hf_json(tmp_path / "b")
  assert back.stop_ids == (2, 9, 4)
  assert back.encode("hello baz") == tok.encode("hello baz") == [1, 5, 9]
  assert back.special_tokens == tok.special_tokens
  assert back.chat_template == CHATML


def test_unknown_special_token_in_config(tmp_path):
  with pytest.raises(ValueError, match="eos_token '<nope>' of .* is not in"):
    Tokenizer.from_hf_json(
      _write(tmp_path, config={**CONFIG, "eos_token": "<nope>"})
    )


def test_missing_files_name_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match="tokenizer.json") as info:
    Tokenizer.from_hf_json(tmp_path)
  assert f"{tmp_path} is a directory without tokenizer.json" in str(info.value)
  missing = tmp_path / "missing"
  with pytest.raises(FileNotFoundError) as info:
    Tokenizer.from_hf_json(missing)
  assert f"{missing} does not exist" in str(info.value)
  assert "tokenizer.json" in str(info.value)


def test_bad_text_type(tok):
  with pytest.raises(ValueError, match="text must be a str"):
    tok.encode(["hello"])
