"""Shared fixtures of the environment tests: a character tokenizer and a
tiny random model (2 layers, d = 32)."""

import pytest

from rljax import models
from rljax import testing
from rljax.tokenizers import Tokenizer

ALPHABET = "0123456789+-=ab"


def _tiny(vocab_size: int):
  config = models.ModelConfig(
    vocab_size=vocab_size,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    max_position_embeddings=64,
  )
  return testing.random_model(config, scale=0.5)


@pytest.fixture(scope="module")
def tokenizer():
  return Tokenizer.from_characters(ALPHABET)


@pytest.fixture(scope="module")
def model(tokenizer):
  """A tiny random model over the character tokenizer's ids."""
  return _tiny(tokenizer.vocab_size)


@pytest.fixture(scope="session")
def tiny_model():
  """Makes a tiny random model of a given vocabulary size."""
  return _tiny
