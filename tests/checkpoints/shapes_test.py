"""Published models' shapes (`rljax.checkpoints.SHAPES`): abstract models
whose parameter counts are the model cards'."""

import math

from flax import nnx
import jax
import pytest

from rljax.checkpoints import SHAPES
from rljax.checkpoints import shape_config
from rljax.models import Transformer

# (total, non-embedding) parameters as the model cards round them:
# huggingface.co/<repo>; Llama 3.1: 8.03B and 70.6B (Meta's model card),
# Gemma 3 1B: 1B (the text-only model).
CARDS = {
  "qwen3-0.6b": (0.6e9, 0.44e9),
  "qwen3-1.7b": (1.7e9, 1.4e9),
  "qwen3-4b": (4.0e9, 3.6e9),
  "qwen3-8b": (8.2e9, 6.95e9),
  "qwen3-14b": (14.8e9, 13.2e9),
  "qwen3-32b": (32.8e9, 31.2e9),
  "qwen3-30b-a3b": (30.5e9, 29.9e9),
  "llama-3.1-8b": (8.03e9, None),
  "llama-3.1-70b": (70.6e9, None),
  "gemma-3-1b": (1.0e9, None),
}


def _counts(name):
  config = shape_config(name)
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  params = nnx.state(model, nnx.Param)
  total = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
  tied = 1 if config.tie_embeddings else 2
  return total, total - tied * config.vocab_size * config.hidden_size


def test_qwen3_8b_by_hand():
  # config.json: D=4096, 36 layers, 32 heads and 8 KV heads of 128, MLP
  # 12288, vocab 151936, untied; q/k norms of 128 and two norms a layer.
  d, kv, mlp, vocab = 4096, 8 * 128, 12288, 151936
  layer = 2 * d * d + 2 * d * kv + 3 * d * mlp + 2 * d + 2 * 128
  non_embedding = 36 * layer + d  # and the final norm
  assert _counts("qwen3-8b") == (non_embedding + 2 * vocab * d, non_embedding)
  assert non_embedding == 6_946_075_648


@pytest.mark.parametrize("name", sorted(CARDS))
def test_parameter_counts_are_the_model_cards(name):
  total, non_embedding = _counts(name)
  card_total, card_non_embedding = CARDS[name]
  digits = 2 if card_total < 1e10 else 3
  assert float(f"{total:.{digits}g}") == pytest.approx(card_total, rel=0.01)
  if card_non_embedding is not None:
    assert non_embedding == pytest.approx(card_non_embedding, rel=0.02)


def test_every_shape_builds_and_has_its_family_features():
  for name in SHAPES:
    config = shape_config(name, dtype="bfloat16")
    assert config.dtype == "bfloat16"
  assert shape_config("qwen3-30b-a3b").num_experts == 128
  assert shape_config("qwen3-30b-a3b").experts_per_token == 8
  assert shape_config("qwen3-8b").qk_norm
  gemma = shape_config("gemma-3-27b")
  assert gemma.query_pre_attn_scalar == 168 and gemma.head_dim == 128
  assert gemma.layer_types.count("full_attention") == 10  # every 6th of 62
  assert shape_config("llama-3.1-70b").rope_scaling.factor == 8.0


def test_an_unknown_shape_names_the_known_ones():
  with pytest.raises(
    ValueError, match="no model shape named 'qwen9'.*qwen3-8b"
  ):
    shape_config("qwen9")
