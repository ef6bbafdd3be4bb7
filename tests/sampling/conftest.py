"""A tiny random Llama in transformers, and the same model in rljax."""

import pytest
import torch
import transformers

from rljax.checkpoints._hf import load_hf


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
  """A tiny random Llama (GQA, untied) in transformers, and its directory."""
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
    # Large weights give peaked, input-dependent next-token distributions.
    initializer_range=0.5,
  )
  model = transformers.LlamaForCausalLM(config).eval()
  path = tmp_path_factory.mktemp("llama")
  model.save_pretrained(path)
  return model, path


@pytest.fixture(scope="module")
def model(hf_model):
  return load_hf(hf_model[1])
