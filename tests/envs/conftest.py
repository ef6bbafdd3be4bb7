"""Shared fixtures of the environment tests: a character tokenizer and a
tiny random model (2 layers, d = 32)."""

import pytest

from rljax import testing
from rljax.tokenizers import Tokenizer

ALPHABET = "0123456789+-=ab"


@pytest.fixture(scope="module")
def tokenizer():
  return Tokenizer.from_characters(ALPHABET)


@pytest.fixture(scope="module")
def model(tokenizer):
  """A tiny random model over the character tokenizer's ids."""
  return testing.tiny_model(tokenizer.vocab_size)


@pytest.fixture(scope="session")
def tiny_model():
  """Makes a tiny random model of a given vocabulary size."""
  return testing.tiny_model
