"""ModelConfig validation."""

import pytest

from rljax.models import ModelConfig
from rljax.models import RopeScaling

_BASE = dict(
  vocab_size=32,
  hidden_size=16,
  intermediate_size=24,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
)


def test_defaults_are_llama():
  config = ModelConfig(**_BASE)
  assert config.tie_embeddings and not config.qkv_bias and not config.qk_norm
  assert config.rope_theta == 10_000.0 and config.rope_scaling is None
  assert config.dtype == "float32" and config.param_dtype == "float32"


def test_frozen_and_hashable():
  config = ModelConfig(
    **_BASE,
    rope_scaling=RopeScaling(
      factor=8.0,
      low_freq_factor=1.0,
      high_freq_factor=4.0,
      original_max_position_embeddings=16,
    ),
  )
  assert hash(config) == hash(
    ModelConfig(**_BASE, rope_scaling=config.rope_scaling)
  )
  with pytest.raises(AttributeError):
    config.num_layers = 3


def test_heads_not_a_multiple_of_kv_heads():
  with pytest.raises(ValueError, match=r"num_heads \(4\).*num_kv_heads \(3\)"):
    ModelConfig(**(_BASE | dict(num_kv_heads=3)))


def test_odd_head_dim():
  with pytest.raises(ValueError, match="head_dim must be even"):
    ModelConfig(**(_BASE | dict(head_dim=7)))


@pytest.mark.parametrize(
  "name",
  [
    "vocab_size",
    "num_layers",
    "num_heads",
    "head_dim",
    "rope_theta",
    "scan_unroll",
  ],
)
def test_non_positive(name):
  with pytest.raises(ValueError, match=f"{name} must be > 0"):
    ModelConfig(**(_BASE | {name: 0}))


@pytest.mark.parametrize("name", ["dtype", "param_dtype"])
def test_unknown_dtype(name):
  with pytest.raises(ValueError, match=f"{name} must be one of"):
    ModelConfig(**_BASE, **{name: "float64"})


def test_rope_scaling_non_positive():
  with pytest.raises(ValueError, match="factor must be > 0"):
    RopeScaling(
      factor=0.0,
      low_freq_factor=1.0,
      high_freq_factor=4.0,
      original_max_position_embeddings=16,
    )
