"""Read a llama.cpp GGUF file as Hugging Face-named float32 tensors.

The output is what a transformers ``config.json`` + ``model.safetensors`` pair
would hold for ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` or
``Qwen3ForCausalLM``, so the model's own HF importer consumes it unchanged:
weights are ``[out_features, in_features]`` (GGUF's ``ne`` order reversed,
which is how ``gguf.GGUFReader`` already exposes them), quantized types are
dequantized with ``gguf.quants.dequantize`` and llama.cpp's RoPE row
permutation of Q and K is undone for the llama architecture.
"""

import os
from typing import Any, NamedTuple

import gguf
import numpy as np

from rljax.checkpoints._hf import config_from_hf
from rljax.checkpoints._hf import model_from_tensors
from rljax.models._transformer import Transformer

# general.architecture -> (HF model_type, HF architectures entry).
_ARCHITECTURES = {
  "llama": ("llama", "LlamaForCausalLM"),
  "qwen2": ("qwen2", "Qwen2ForCausalLM"),
  "qwen3": ("qwen3", "Qwen3ForCausalLM"),
}

# GGUF tensor stem -> HF name, for "{stem}.weight" and "blk.{i}.{stem}.weight"
# (same for ".bias").
_GLOBAL_TENSORS = {
  "token_embd": "model.embed_tokens",
  "output_norm": "model.norm",
  "output": "lm_head",
}
_LAYER_TENSORS = {
  "attn_norm": "input_layernorm",
  "ffn_norm": "post_attention_layernorm",
  "attn_q": "self_attn.q_proj",
  "attn_k": "self_attn.k_proj",
  "attn_v": "self_attn.v_proj",
  "attn_output": "self_attn.o_proj",
  "attn_q_norm": "self_attn.q_norm",
  "attn_k_norm": "self_attn.k_norm",
  "ffn_gate": "mlp.gate_proj",
  "ffn_up": "mlp.up_proj",
  "ffn_down": "mlp.down_proj",
}

# HF config key -> (GGUF key under "{arch}.", default; None means required).
_CONFIG_KEYS = {
  "hidden_size": ("embedding_length", None),
  "intermediate_size": ("feed_forward_length", None),
  "num_hidden_layers": ("block_count", None),
  "num_attention_heads": ("attention.head_count", None),
  "rms_norm_eps": ("attention.layer_norm_rms_epsilon", None),
  "rope_theta": ("rope.freq_base", 10_000.0),  # llama.cpp's default
  "max_position_embeddings": ("context_length", None),
}

# HF rope_scaling key -> GGUF key under "{arch}.rope.scaling.".
_ROPE_SCALING_KEYS = {
  "factor": "factor",
  "original_max_position_embeddings": "original_context_length",
  "beta_fast": "yarn_beta_fast",
  "beta_slow": "yarn_beta_slow",
}


class GGUFCheckpoint(NamedTuple):
  """A GGUF checkpoint in Hugging Face form.

  Attributes:
    config: a transformers ``config.json`` dict (``rope_theta`` style).
    tensors: HF parameter name -> float32 array, ``[out, in]`` for weights.
  """

  config: dict[str, Any]
  tensors: dict[str, np.ndarray]


def read_gguf(path: str | os.PathLike) -> GGUFCheckpoint:
  """Reads a llama/qwen2/qwen3 GGUF file as an HF config and float32 tensors.

  Every tensor is dequantized (Q4_1, Q8_0, F16, ... via
  ``gguf.quants.dequantize``). For ``general.architecture == "llama"`` the
  rows of ``attn_q``/``attn_k`` are un-permuted. HF keeps each head's rotary
  pairs in halves ``(x_0..x_{K/2-1}, y_0..y_{K/2-1})``; llama.cpp's converter
  interleaves them ``(x_0, y_0, x_1, y_1, ...)`` for ggml's rope, i.e.
  ``w.reshape(H, 2, K/2, D).swapaxes(1, 2)``; the inverse used here is
  ``w.reshape(H, K/2, 2, D).swapaxes(1, 2)``. Embeddings are tied exactly
  when the file has no ``output.weight`` (then ``lm_head.weight`` is absent).

  Args:
    path: the ``.gguf`` file.

  Returns:
    A ``GGUFCheckpoint(config, tensors)``.

  Raises:
    FileNotFoundError: ``path`` does not exist.
    ValueError: unsupported architecture, a missing hyperparameter, or a
      tensor with no HF equivalent (e.g. llama-3 ``rope_freqs.weight``).

  References:
    llama.cpp ``convert_hf_to_gguf.py`` (``LlamaModel.permute``);
    transformers ``modeling_gguf_pytorch_utils.py`` (``LlamaTensorProcessor``).
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"GGUF file not found: {os.fspath(path)!r}")
  reader = gguf.GGUFReader(path)
  config = _config(reader)
  # Only llama.cpp's LlamaModel converter permutes Q/K; qwen2/qwen3 do not.
  permuted = {}
  if config["model_type"] == "llama":
    permuted = {
      "attn_q": config["num_attention_heads"],
      "attn_k": config["num_key_value_heads"],
    }
  tensors = dict(_hf_tensor(t, permuted) for t in reader.tensors)
  config["vocab_size"] = tensors["model.embed_tokens.weight"].shape[0]
  config["tie_word_embeddings"] = "lm_head.weight" not in tensors
  return GGUFCheckpoint(config, tensors)


def _config(reader: gguf.GGUFReader) -> dict[str, Any]:
  """Translates the GGUF metadata into a transformers config dict."""
  get = lambda key, default=None: (
    default if (f := reader.get_field(key)) is None else f.contents()
  )
  arch = get("general.architecture")
  if arch not in _ARCHITECTURES:
    raise ValueError(
      f"Unsupported GGUF general.architecture {arch!r}; supported values are"
      f" {sorted(_ARCHITECTURES)}."
    )
  model_type, hf_class = _ARCHITECTURES[arch]
  config = {"architectures": [hf_class], "model_type": model_type}
  for hf_key, (key, default) in _CONFIG_KEYS.items():
    config[hf_key] = _number(get(f"{arch}.{key}", default))
    if config[hf_key] is None:
      raise ValueError(f"GGUF file lacks the required key '{arch}.{key}'.")
  # Both default from the head count, as in llama.cpp's hparams loader.
  config["num_key_value_heads"] = get(
    f"{arch}.attention.head_count_kv", config["num_attention_heads"]
  )
  config["head_dim"] = get(
    f"{arch}.attention.key_length",
    config["hidden_size"] // config["num_attention_heads"],
  )
  config["bos_token_id"] = get("tokenizer.ggml.bos_token_id")
  config["eos_token_id"] = get("tokenizer.ggml.eos_token_id")
  prefix = f"{arch}.rope.scaling."
  rope_type = get(prefix + "type", "none")
  if rope_type != "none":
    config["rope_scaling"] = {"rope_type": rope_type}
    for hf_key, key in _ROPE_SCALING_KEYS.items():
      if (value := get(prefix + key)) is not None:
        config["rope_scaling"][hf_key] = _number(value)
  return config


def _number(value: Any) -> Any:
  """Rounds a float32-stored float to its shortest decimal (1e-05 not 9.99e-06)."""
  return float(str(np.float32(value))) if isinstance(value, float) else value


def _hf_tensor(tensor, permuted: dict[str, int]) -> tuple[str, np.ndarray]:
  """Dequantizes one GGUF tensor; returns its HF name and float32 value."""
  stem, _, suffix = tensor.name.rpartition(".")
  parts = stem.split(".")
  if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_TENSORS:
    hf_stem = f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}"
  elif stem in _GLOBAL_TENSORS:
    hf_stem = _GLOBAL_TENSORS[stem]
  else:
    hf_stem = None
  if hf_stem is None or suffix not in ("weight", "bias"):
    raise ValueError(
      f"GGUF tensor {tensor.name!r} has no Hugging Face equivalent."
    )
  # A plain ndarray view dequantizes 2x faster than the np.memmap subclass.
  weights = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
  if not weights.flags.writeable:  # F32 comes back as a view of the file.
    weights = weights.copy()
  weights = weights.astype(np.float32, copy=False)
  if parts[-1] in permuted:
    weights = _unpermute(weights, permuted[parts[-1]])
  return f"{hf_stem}.{suffix}", weights


def _unpermute(w: np.ndarray, num_heads: int) -> np.ndarray:
  """Inverts llama.cpp's per-head RoPE row permutation (interleaved -> halves)."""
  head = w.reshape(num_heads, w.shape[0] // num_heads // 2, 2, *w.shape[1:])
  return head.swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: str | os.PathLike, **overrides) -> Transformer:
  """A `Transformer` from a llama/qwen2/qwen3 GGUF file (see `read_gguf`).

  Args:
    path: the ``.gguf`` file; quantized tensors are dequantized to float32.
    **overrides: `ModelConfig` fields to set, e.g. ``dtype="bfloat16"``.
  """
  checkpoint = read_gguf(path)
  config = config_from_hf(checkpoint.config, **overrides)
  return model_from_tensors(config, checkpoint.tensors)
