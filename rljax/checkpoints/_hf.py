"""Hugging Face safetensors checkpoints: config.json and tensor names.

HF stores linear weights as [out, in]; rljax stores them [in, out] with heads
split out, e.g. q_proj [D, H, K]. The table below is the whole mapping.
"""

import json
import os
import pathlib
from typing import Any

from flax import nnx
import jax
import numpy as np
import safetensors.numpy

from rljax.models._config import ModelConfig
from rljax.models._config import RopeScaling
from rljax.models._transformer import Transformer

ARCHITECTURES = {
  "LlamaForCausalLM": "llama",
  "Qwen2ForCausalLM": "qwen2",
  "Qwen3ForCausalLM": "qwen3",
}

# rljax layer weight -> (HF name inside model.layers.{i}, kind)
_LAYER = {
  "attn_norm": ("input_layernorm.weight", "vector"),
  "q_proj": ("self_attn.q_proj.weight", "in_heads"),
  "k_proj": ("self_attn.k_proj.weight", "in_kv_heads"),
  "v_proj": ("self_attn.v_proj.weight", "in_kv_heads"),
  "o_proj": ("self_attn.o_proj.weight", "out_heads"),
  "q_bias": ("self_attn.q_proj.bias", "bias_heads"),
  "k_bias": ("self_attn.k_proj.bias", "bias_kv_heads"),
  "v_bias": ("self_attn.v_proj.bias", "bias_kv_heads"),
  "q_norm": ("self_attn.q_norm.weight", "vector"),
  "k_norm": ("self_attn.k_norm.weight", "vector"),
  "mlp_norm": ("post_attention_layernorm.weight", "vector"),
  "gate_proj": ("mlp.gate_proj.weight", "linear"),
  "up_proj": ("mlp.up_proj.weight", "linear"),
  "down_proj": ("mlp.down_proj.weight", "linear"),
}


def _rope(hf: dict[str, Any]) -> tuple[float, Any]:
  """rope theta and scaling from either config.json style."""
  params = hf.get("rope_parameters") or {}  # transformers >= 5
  theta = params.get("rope_theta", hf.get("rope_theta", 10_000.0))
  scaling = hf.get("rope_scaling") or params
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind in (None, "default"):
    return theta, None
  if kind != "llama3":
    raise ValueError(
      f"config.json rope_type {kind!r} is not supported; supported: default, llama3."
    )
  return theta, RopeScaling(
    factor=scaling["factor"],
    low_freq_factor=scaling["low_freq_factor"],
    high_freq_factor=scaling["high_freq_factor"],
    original_max_position_embeddings=scaling[
      "original_max_position_embeddings"
    ],
  )


def config_from_hf(hf: dict[str, Any], **overrides) -> ModelConfig:
  """A `ModelConfig` from a transformers config.json dict."""
  arch = (hf.get("architectures") or [None])[0]
  if arch not in ARCHITECTURES:
    raise ValueError(
      f"config.json architectures {hf.get('architectures')!r} is not supported; supported: {sorted(ARCHITECTURES)}."
    )
  family = ARCHITECTURES[arch]
  theta, scaling = _rope(hf)
  heads = hf["num_attention_heads"]
  return ModelConfig(
    vocab_size=hf["vocab_size"],
    hidden_size=hf["hidden_size"],
    intermediate_size=hf["intermediate_size"],
    num_layers=hf["num_hidden_layers"],
    num_heads=heads,
    num_kv_heads=hf.get("num_key_value_heads") or heads,
    head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
    rope_theta=theta,
    rope_scaling=scaling,
    rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
    tie_embeddings=hf.get("tie_word_embeddings", False),
    qkv_bias=family == "qwen2" or bool(hf.get("attention_bias", False)),
    qk_norm=family == "qwen3",
    max_position_embeddings=hf.get("max_position_embeddings", 2048),
    **overrides,
  )


def _to_rljax(kind: str, w: np.ndarray, c: ModelConfig) -> np.ndarray:
  """One HF tensor in rljax's layout."""
  H, N, K = c.num_heads, c.num_kv_heads, c.head_dim
  if kind == "in_heads":
    return w.T.reshape(-1, H, K)
  if kind == "in_kv_heads":
    return w.T.reshape(-1, N, K)
  if kind == "out_heads":
    return w.T.reshape(H, K, -1)
  if kind == "bias_heads":
    return w.reshape(H, K)
  if kind == "bias_kv_heads":
    return w.reshape(N, K)
  if kind == "linear":
    return w.T
  return w


def _to_hf(kind: str, w: np.ndarray) -> np.ndarray:
  """One rljax tensor in HF's layout."""
  if kind in ("in_heads", "in_kv_heads"):
    return w.reshape(w.shape[0], -1).T
  if kind == "out_heads":
    return w.reshape(-1, w.shape[-1]).T
  if kind in ("bias_heads", "bias_kv_heads"):
    return w.reshape(-1)
  if kind == "linear":
    return w.T
  return w


def _get(tensors, name):
  if name not in tensors:
    raise KeyError(f"checkpoint is missing tensor {name!r}.")
  return np.asarray(tensors[name], np.float32)


def load_hf_tensors(model: Transformer, tensors: dict[str, np.ndarray]) -> None:
  """Copy HF-named tensors into `model` (in place), checking every name."""
  c = model.config
  dtype = c.param_dtype
  model.embed.value = jax.numpy.asarray(
    _get(tensors, "model.embed_tokens.weight"), dtype
  )
  model.final_norm.value = jax.numpy.asarray(
    _get(tensors, "model.norm.weight"), dtype
  )
  if not c.tie_embeddings:
    model.lm_head.value = jax.numpy.asarray(
      _get(tensors, "lm_head.weight").T, dtype
    )
  for name, (hf_name, kind) in _LAYER.items():
    if not hasattr(model.layers, name):
      continue
    stacked = np.stack(
      [
        _to_rljax(kind, _get(tensors, f"model.layers.{i}.{hf_name}"), c)
        for i in range(c.num_layers)
      ]
    )
    param = getattr(model.layers, name)
    if stacked.shape != param.value.shape:
      raise ValueError(
        f"tensor model.layers.*.{hf_name} has shape {stacked.shape[1:]} per layer; the config expects {param.value.shape[1:]}."
      )
    param.value = jax.numpy.asarray(stacked, dtype)


def hf_tensors(model: Transformer) -> dict[str, np.ndarray]:
  """The model's weights under HF names and layouts (float32 numpy)."""
  c = model.config
  out = {
    "model.embed_tokens.weight": np.asarray(model.embed.value, np.float32),
    "model.norm.weight": np.asarray(model.final_norm.value, np.float32),
  }
  if not c.tie_embeddings:
    out["lm_head.weight"] = np.asarray(model.lm_head.value, np.float32).T
  for name, (hf_name, kind) in _LAYER.items():
    if not hasattr(model.layers, name):
      continue
    stacked = np.asarray(getattr(model.layers, name).value, np.float32)
    for i in range(c.num_layers):
      out[f"model.layers.{i}.{hf_name}"] = np.ascontiguousarray(
        _to_hf(kind, stacked[i])
      )
  return out


def hf_config(config: ModelConfig) -> dict[str, Any]:
  """A transformers config.json dict (rope in both the old and new style)."""
  arch = (
    "Qwen3ForCausalLM"
    if config.qk_norm
    else "Qwen2ForCausalLM"
    if config.qkv_bias
    else "LlamaForCausalLM"
  )
  out = {
    "architectures": [arch],
    "model_type": ARCHITECTURES[arch],
    "vocab_size": config.vocab_size,
    "hidden_size": config.hidden_size,
    "intermediate_size": config.intermediate_size,
    "num_hidden_layers": config.num_layers,
    "num_attention_heads": config.num_heads,
    "num_key_value_heads": config.num_kv_heads,
    "head_dim": config.head_dim,
    "rms_norm_eps": config.rms_norm_eps,
    "rope_theta": config.rope_theta,
    "max_position_embeddings": config.max_position_embeddings,
    "tie_word_embeddings": config.tie_embeddings,
    "hidden_act": "silu",
    "torch_dtype": "float32",
  }
  if config.rope_scaling is not None:
    out["rope_scaling"] = {"rope_type": "llama3", **vars(config.rope_scaling)}
  return out


def load_hf(
  directory: str | os.PathLike, *, rngs: nnx.Rngs | None = None, **overrides
) -> Transformer:
  """A `Transformer` from a directory with config.json and *.safetensors."""
  path = pathlib.Path(directory)
  config_path = path / "config.json"
  if not config_path.is_file():
    raise FileNotFoundError(
      f"{config_path} not found: a Hugging Face checkpoint directory needs config.json and *.safetensors files."
    )
  config = config_from_hf(json.loads(config_path.read_text()), **overrides)
  files = sorted(path.glob("*.safetensors"))
  if not files:
    raise FileNotFoundError(f"no *.safetensors files in {path}.")
  tensors = {}
  for f in files:
    tensors.update(safetensors.numpy.load_file(f))
  model = Transformer(config, rngs=rngs or nnx.Rngs(0))
  load_hf_tensors(model, tensors)
  return model


def save_hf(model: Transformer, directory: str | os.PathLike) -> None:
  """Write config.json and model.safetensors that transformers can load.

  Files are written under temporary names and renamed into place, so a
  crash never leaves a half-written checkpoint behind.
  """
  path = pathlib.Path(directory)
  path.mkdir(parents=True, exist_ok=True)
  tmp_cfg, tmp_st = path / "config.json.tmp", path / "model.safetensors.tmp"
  tmp_cfg.write_text(json.dumps(hf_config(model.config), indent=2))
  safetensors.numpy.save_file(
    hf_tensors(model), tmp_st, metadata={"format": "pt"}
  )
  os.replace(tmp_st, path / "model.safetensors")
  os.replace(tmp_cfg, path / "config.json")
