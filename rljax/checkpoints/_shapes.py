"""The shapes of published models, without their weights.

Each entry is the architecture part of the model's Hugging Face
``config.json`` (https://huggingface.co/<repo>/blob/main/config.json, the
repository named in `SHAPES`), read by the same `config_from_hf` that loads
a checkpoint. Where a config.json omits a key (Gemma 3's multimodal configs
list only a few of their ``text_config`` fields), the entry writes out the
value transformers' config class defaults it to, so each entry is complete.
Values were read from copies of those files and checked against MaxText's
model configs (src/MaxText/configs/models/*.yml); where they differ (MaxText
gives Qwen3-30B-A3B the 2507 release's rope_theta of 1e7, and Gemma 3 the
tokenizer's 262144 vocabulary rather than the checkpoint's 262208
embedding rows), the entry follows config.json.

``model.source="shape:<name>"`` builds such a model abstractly (shapes and
shardings, no arrays): enough to compile and plan a run for it.
"""

from typing import Any

from rljax.checkpoints._hf_config import config_from_hf
from rljax.models._config import ModelConfig

_QWEN3 = {
  "architectures": ["Qwen3ForCausalLM"],
  "vocab_size": 151936,
  "head_dim": 128,
  "num_key_value_heads": 8,
  "rope_theta": 1000000.0,
  "rope_scaling": None,
  "rms_norm_eps": 1e-06,
  "max_position_embeddings": 40960,
  "attention_bias": False,
}


def _qwen3(hidden, intermediate, layers, heads, tie):
  return {
    **_QWEN3,
    "hidden_size": hidden,
    "intermediate_size": intermediate,
    "num_hidden_layers": layers,
    "num_attention_heads": heads,
    "tie_word_embeddings": tie,
  }


_LLAMA31 = {
  "architectures": ["LlamaForCausalLM"],
  "vocab_size": 128256,
  "num_key_value_heads": 8,
  "rope_theta": 500000.0,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
  },
  "rms_norm_eps": 1e-05,
  "max_position_embeddings": 131072,
  "tie_word_embeddings": False,
  "attention_bias": False,
}

# Gemma 3: every 6th layer attends globally (RoPE 1e6, linear factor 8 from
# 4B up), the others within a window (RoPE 1e4).
_GEMMA3 = {
  "architectures": ["Gemma3ForCausalLM"],
  "model_type": "gemma3_text",
  "vocab_size": 262208,
  "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh",
  "rope_theta": 1000000.0,
  "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
  "rope_local_base_freq": 10000.0,
  "rms_norm_eps": 1e-06,
  "max_position_embeddings": 131072,
  "tie_word_embeddings": True,
  "attention_bias": False,
  "query_pre_attn_scalar": 256,
  "sliding_window": 1024,
  "sliding_window_pattern": 6,
  "final_logit_softcapping": None,
  "attn_logit_softcapping": None,
}


def _gemma3(hidden, intermediate, layers, heads, kv_heads, **extra):
  return {
    **_GEMMA3,
    "hidden_size": hidden,
    "intermediate_size": intermediate,
    "num_hidden_layers": layers,
    "num_attention_heads": heads,
    "num_key_value_heads": kv_heads,
    **extra,
  }


# name: (Hugging Face repository, config.json architecture fields).
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
  "qwen3-0.6b": ("Qwen/Qwen3-0.6B", _qwen3(1024, 3072, 28, 16, True)),
  "qwen3-1.7b": ("Qwen/Qwen3-1.7B", _qwen3(2048, 6144, 28, 16, True)),
  "qwen3-4b": ("Qwen/Qwen3-4B", _qwen3(2560, 9728, 36, 32, True)),
  "qwen3-8b": ("Qwen/Qwen3-8B", _qwen3(4096, 12288, 36, 32, False)),
  "qwen3-14b": ("Qwen/Qwen3-14B", _qwen3(5120, 17408, 40, 40, False)),
  "qwen3-32b": ("Qwen/Qwen3-32B", _qwen3(5120, 25600, 64, 64, False)),
  "qwen3-30b-a3b": (
    "Qwen/Qwen3-30B-A3B",
    {
      **_qwen3(2048, 6144, 48, 32, False),
      "architectures": ["Qwen3MoeForCausalLM"],
      "num_key_value_heads": 4,
      "num_experts": 128,
      "num_experts_per_tok": 8,
      "moe_intermediate_size": 768,
      "norm_topk_prob": True,
      "decoder_sparse_step": 1,
      "mlp_only_layers": [],
    },
  ),
  "llama-3.1-8b": (
    "meta-llama/Llama-3.1-8B",
    {
      **_LLAMA31,
      "hidden_size": 4096,
      "intermediate_size": 14336,
      "num_hidden_layers": 32,
      "num_attention_heads": 32,
    },
  ),
  "llama-3.1-70b": (
    "meta-llama/Llama-3.1-70B",
    {
      **_LLAMA31,
      "hidden_size": 8192,
      "intermediate_size": 28672,
      "num_hidden_layers": 80,
      "num_attention_heads": 64,
    },
  ),
  "gemma-3-1b": (
    "google/gemma-3-1b-pt",
    _gemma3(
      1152,
      6912,
      26,
      4,
      1,
      vocab_size=262144,
      rope_scaling=None,
      max_position_embeddings=32768,
      sliding_window=512,
    ),
  ),
  "gemma-3-4b": ("google/gemma-3-4b-pt", _gemma3(2560, 10240, 34, 8, 4)),
  "gemma-3-12b": ("google/gemma-3-12b-pt", _gemma3(3840, 15360, 48, 16, 8)),
  "gemma-3-27b": (
    "google/gemma-3-27b-pt",
    _gemma3(5376, 21504, 62, 32, 16, head_dim=128, query_pre_attn_scalar=168),
  ),
}


def shape_config(name: str, **overrides) -> ModelConfig:
  """The `ModelConfig` of the published model `name` (a key of `SHAPES`),
  with `overrides` (``dtype="bfloat16"``, ...).

  Raises:
    ValueError: `name` is not in `SHAPES` (the message lists them).
  """
  if name not in SHAPES:
    raise ValueError(
      f"no model shape named {name!r}; known: {', '.join(sorted(SHAPES))}."
    )
  return config_from_hf(SHAPES[name][1], **overrides)
