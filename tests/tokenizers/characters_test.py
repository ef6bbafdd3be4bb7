"""Tokenizer.from_characters: a character vocabulary for scratch models."""

import numpy as np
import pytest

from rljax.tokenizers import Tokenizer


def test_ids_by_hand_and_round_trip():
  tok = Tokenizer.from_characters("0123456789+=")
  # pad 0, eos 1, then sorted characters: "+" 2, "0".."9" 3..12, "=" 13.
  assert tok.vocab_size == 14
  assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, None)
  assert tok.stop_ids == (1,)
  assert tok.encode("23+45=") == [5, 6, 2, 7, 8, 13]
  assert tok.decode([4, 5, 1, 0]) == "12"  # EOS and pad are special
  ids, mask = tok.encode_batch(["1+2=", "23+45="])
  np.testing.assert_array_equal(ids[0], [0, 0, 4, 2, 5, 13])
  np.testing.assert_array_equal(mask[0], [0, 0, 1, 1, 1, 1])
  assert tok.decode_batch(ids, mask=mask) == ["1+2=", "23+45="]


def test_unknown_character_names_it_and_the_fix():
  tok = Tokenizer.from_characters("0123456789+=")
  with pytest.raises(
    ValueError, match=r"\['a', 'b'\] outside.*from_characters"
  ):
    tok.encode("a+b")
  with pytest.raises(ValueError, match="outside"):
    tok.encode_batch(["1+1=", "x"])
  with pytest.raises(ValueError, match="at least one character"):
    Tokenizer.from_characters("")


def test_save_and_reload(tmp_path):
  tok = Tokenizer.from_characters("0123456789+=")
  tok.save(tmp_path)
  again = Tokenizer.from_hf_json(tmp_path)
  assert again.encode("7+8=") == tok.encode("7+8=")
  assert again.eos_id == 1 and again.pad_id == 0
