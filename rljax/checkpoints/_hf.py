"""Hugging Face safetensors checkpoints: config.json and tensor names.

HF stores linear weights as [out, in]; rljax stores them [in, out] with heads
split out, e.g. q_proj [D, H, K]. The table below is the whole mapping.
"""

import json
import os
import pathlib
import struct
from typing import Any

from flax import nnx
import jax
import ml_dtypes
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


def _require(hf: dict[str, Any], key: str) -> Any:
  if hf.get(key) is None:
    raise ValueError(f"config.json is missing the required key {key!r}.")
  return hf[key]


def _unsupported(hf: dict[str, Any], family: str) -> None:
  """Raise for config.json features this decoder does not implement."""
  # Llama's and Qwen3's `attention_bias` also puts a bias on o_proj, which
  # this decoder lacks; silently dropping it would give wrong logits.
  features = {
    "attention_bias": family != "qwen2" and hf.get("attention_bias"),
    "mlp_bias": hf.get("mlp_bias"),
    "use_sliding_window": hf.get("use_sliding_window"),
    "hidden_act": hf.get("hidden_act", "silu") not in ("silu", "swish"),
  }
  for key, present in features.items():
    if present:
      raise ValueError(
        f"config.json {key}={hf[key]!r} is not supported by rljax's"
        f" {family} decoder."
      )


def config_from_hf(hf: dict[str, Any], **overrides) -> ModelConfig:
  """A `ModelConfig` from a transformers config.json dict.

  Accepts both rope styles (top-level ``rope_theta``/``rope_scaling`` and
  transformers-5 ``rope_parameters``); missing optional keys take the
  transformers defaults of the family. ``overrides`` (e.g. ``dtype``) are
  passed to `ModelConfig`.
  """
  arch = (hf.get("architectures") or [None])[0]
  if arch not in ARCHITECTURES:
    raise ValueError(
      f"config.json architectures {hf.get('architectures')!r} is not"
      f" supported; supported: {sorted(ARCHITECTURES)}."
    )
  family = ARCHITECTURES[arch]
  _unsupported(hf, family)
  theta, scaling = _rope(hf)
  hidden, heads = (
    _require(hf, "hidden_size"),
    _require(hf, "num_attention_heads"),
  )
  # transformers' Qwen3Config defaults head_dim to 128, the others derive it.
  head_dim = 128 if family == "qwen3" else hidden // heads
  return ModelConfig(
    vocab_size=_require(hf, "vocab_size"),
    hidden_size=hidden,
    intermediate_size=_require(hf, "intermediate_size"),
    num_layers=_require(hf, "num_hidden_layers"),
    num_heads=heads,
    num_kv_heads=hf.get("num_key_value_heads") or heads,
    head_dim=hf.get("head_dim") or head_dim,
    rope_theta=theta,
    rope_scaling=scaling,
    rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
    tie_embeddings=hf.get("tie_word_embeddings", False),
    qkv_bias=family == "qwen2",
    qk_norm=family == "qwen3",
    max_position_embeddings=hf.get(
      "max_position_embeddings", 2048 if family == "llama" else 32768
    ),
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


def _hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The HF shape of an rljax tensor of `shape` (see `_to_hf`)."""
  if kind in ("in_heads", "in_kv_heads"):
    return (shape[1] * shape[2], shape[0])
  if kind == "out_heads":
    return (shape[2], shape[0] * shape[1])
  if kind in ("bias_heads", "bias_kv_heads"):
    return (shape[0] * shape[1],)
  if kind == "linear":
    return shape[::-1]
  return shape


def _get(tensors, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
  """Tensor `name` in `dtype`, checked against the HF `shape`."""
  if name not in tensors:
    raise KeyError(f"checkpoint is missing tensor {name!r}.")
  # Cast on the host straight to the parameter dtype: a bfloat16 model never
  # holds a float32 copy of the checkpoint.
  w = np.asarray(tensors[name], dtype)
  if w.shape != tuple(shape):
    raise ValueError(
      f"tensor {name!r} has shape {w.shape}; the config expects {tuple(shape)}."
    )
  return w


def _unused(tensors, used: set[str], tied: bool) -> None:
  """Raise for tensors the model has no place for (e.g. an o_proj bias)."""
  # Old checkpoints store RoPE tables; tied ones may repeat the embedding.
  ignored = {"lm_head.weight"} if tied else set()
  extra = sorted(
    n
    for n in tensors
    if n not in used and n not in ignored and not n.endswith("inv_freq")
  )
  if extra:
    raise ValueError(
      f"checkpoint has tensors the config has no place for: {extra[:5]}"
      f"{' ...' if len(extra) > 5 else ''} (check config.json)."
    )


def load_hf_tensors(model: Transformer, tensors: dict[str, np.ndarray]) -> None:
  """Copy HF-named tensors into `model` (in place), checking every name.

  Raises KeyError naming a missing tensor, and ValueError for a tensor of the
  wrong shape or one the model has no parameter for.
  """
  c = model.config
  dtype = jax.numpy.dtype(c.param_dtype)
  get = lambda name, shape: _get(tensors, name, shape, dtype)
  used = {"model.embed_tokens.weight", "model.norm.weight"}
  model.embed.set_value(
    jax.numpy.asarray(get("model.embed_tokens.weight", model.embed.shape))
  )
  model.final_norm.set_value(
    jax.numpy.asarray(get("model.norm.weight", model.final_norm.shape))
  )
  if not c.tie_embeddings:
    used.add("lm_head.weight")
    w = get("lm_head.weight", model.lm_head.shape[::-1])
    model.lm_head.set_value(jax.numpy.asarray(w.T))
  for name, (hf_name, kind) in _LAYER.items():
    if not hasattr(model.layers, name):
      continue
    param = getattr(model.layers, name)
    shape = _hf_shape(kind, param.shape[1:])
    names = [f"model.layers.{i}.{hf_name}" for i in range(c.num_layers)]
    used.update(names)
    stacked = np.stack([_to_rljax(kind, get(n, shape), c) for n in names])
    param.set_value(jax.numpy.asarray(stacked))
  _unused(tensors, used, c.tie_embeddings)


def hf_tensors(model: Transformer) -> dict[str, np.ndarray]:
  """The model's weights under HF names and layouts (float32 numpy)."""
  c = model.config
  out = {
    "model.embed_tokens.weight": np.asarray(model.embed[...], np.float32),
    "model.norm.weight": np.asarray(model.final_norm[...], np.float32),
  }
  if not c.tie_embeddings:
    # Contiguous: safetensors writes a transposed view's buffer as is.
    out["lm_head.weight"] = np.ascontiguousarray(
      np.asarray(model.lm_head[...], np.float32).T
    )
  for name, (hf_name, kind) in _LAYER.items():
    if not hasattr(model.layers, name):
      continue
    stacked = np.asarray(getattr(model.layers, name)[...], np.float32)
    for i in range(c.num_layers):
      out[f"model.layers.{i}.{hf_name}"] = np.ascontiguousarray(
        _to_hf(kind, stacked[i])
      )
  return out


def hf_config(config: ModelConfig) -> dict[str, Any]:
  """A transformers config.json dict (``rope_theta``/``rope_scaling`` style,
  which transformers 4 and 5 both read)."""
  if config.qk_norm and config.qkv_bias:
    raise ValueError(
      "no transformers architecture has qk_norm with biases on q, k and v"
      " only (Qwen3's attention_bias also biases o_proj); cannot export."
    )
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


_DTYPES = {
  "BF16": ml_dtypes.bfloat16,
  "F16": np.float16,
  "F32": np.float32,
  "F64": np.float64,
}


def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
  """Memory-mapped tensors of one file, bfloat16 included.

  `safetensors.numpy` cannot represent bfloat16, the dtype of most
  published checkpoints, so the (simple) format is read directly.
  """
  with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
  data = np.memmap(path, np.uint8, "r", offset=8 + n)
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    if info["dtype"] not in _DTYPES:
      raise ValueError(
        f"{path}: tensor {name!r} has dtype {info['dtype']}; supported:"
        f" {sorted(_DTYPES)}."
      )
    begin, end = info["data_offsets"]
    flat = data[begin:end].view(_DTYPES[info["dtype"]])
    out[name] = flat.reshape(info["shape"])
  return out


def load_hf(
  directory: str | os.PathLike, *, rngs: nnx.Rngs | None = None, **overrides
) -> Transformer:
  """A `Transformer` from a directory with config.json and *.safetensors.

  Args:
    directory: a transformers checkpoint directory (shards are merged).
    rngs: unused: every weight comes from the files, so the model is built
      abstractly (no random init, no compile); kept for compatibility.
    **overrides: `ModelConfig` fields to set, e.g. ``dtype="bfloat16"``.
  """
  del rngs
  path = pathlib.Path(directory)
  config_path = path / "config.json"
  if not config_path.is_file():
    raise FileNotFoundError(
      f"{config_path} not found: a Hugging Face checkpoint directory needs"
      " config.json and *.safetensors files."
    )
  config = config_from_hf(json.loads(config_path.read_text()), **overrides)
  files = sorted(path.glob("*.safetensors"))
  if not files:
    raise FileNotFoundError(f"no *.safetensors files in {path}.")
  tensors = {}
  for f in files:
    tensors.update(_read_safetensors(f))
  return model_from_tensors(config, tensors)


def model_from_tensors(
  config: ModelConfig, tensors: dict[str, np.ndarray]
) -> Transformer:
  """A `Transformer` whose every weight comes from HF-named `tensors`.

  The model is built abstractly (no random init, nothing compiled), then
  filled by `load_hf_tensors`, which checks every name and shape.
  """
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  load_hf_tensors(model, tensors)  # sets every parameter
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
