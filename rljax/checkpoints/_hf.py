"""Hugging Face safetensors checkpoints: config.json and tensor names.

HF stores linear weights as [out, in]; rljax stores them [in, out] with heads
split out, e.g. q_proj [D, H, K]. The table below is the whole mapping.

Loading checks everything it reads: a damaged, truncated or foreign file, a
malformed config.json, a missing, misshapen or non-float tensor and a NaN or
inf weight each raise one `CheckpointError` that names the file and the
tensor and says what to do.
"""

from collections.abc import Callable, Mapping
import dataclasses
import json
import math
import os
import pathlib
import struct
from typing import Any

from flax import nnx
import jax
import ml_dtypes
import numpy as np
import safetensors.numpy

from rljax._src.errors import CheckpointError
from rljax.checkpoints import _hf_moe
from rljax.models._config import FULL
from rljax.models._config import SLIDING
from rljax.models._config import LinearRopeScaling
from rljax.models._config import ModelConfig
from rljax.models._config import RopeScaling
from rljax.models._transformer import Transformer

ARCHITECTURES = {
  "LlamaForCausalLM": "llama",
  "Qwen2ForCausalLM": "qwen2",
  "Qwen3ForCausalLM": "qwen3",
  "GemmaForCausalLM": "gemma",
  "Gemma2ForCausalLM": "gemma2",
  "Gemma3ForCausalLM": "gemma3",
  **_hf_moe.ARCHITECTURES,
}
# config.json's model_type, where it is not the family's name.
_MODEL_TYPES = {"gemma3": "gemma3_text"}

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
# Gemma 2 and 3 norm after attention and around the MLP: HF's
# post_attention_layernorm is the post-attention norm there, not the MLP's.
_POST_NORMS = {
  "mlp_norm": ("pre_feedforward_layernorm.weight", "vector"),
  "post_attn_norm": ("post_attention_layernorm.weight", "vector"),
  "post_mlp_norm": ("post_feedforward_layernorm.weight", "vector"),
}


def _layer_names(config: ModelConfig) -> dict[str, tuple[str, str]]:
  """rljax layer weight -> (HF name, kind) for `config`'s family."""
  return {**_LAYER, **_POST_NORMS} if config.post_norms else _LAYER


_REDOWNLOAD = "Re-download the checkpoint or export it again."


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
  """A checkpoint file or directory does not exist."""


class MissingTensorError(CheckpointError, KeyError):
  """A checkpoint lacks a tensor the model needs."""

  __str__ = BaseException.__str__  # KeyError's would quote the message.


def _rope(
  hf: dict[str, Any], where: str, params=None, theta=10_000.0
) -> tuple[float, Any]:
  """rope theta and scaling from either config.json style (`params`: a
  layer type's ``rope_parameters``, Gemma 3)."""
  if params is None:
    params = hf.get("rope_parameters") or {}  # transformers >= 5
    scaling = hf.get("rope_scaling") or params
  else:
    scaling = params
  theta = params.get("rope_theta", hf.get("rope_theta", theta))
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind in (None, "default"):
    return theta, None
  if kind == "linear":
    factor = _require(scaling, "factor", f"{where} rope_scaling")
    return theta, LinearRopeScaling(factor=factor)
  if kind != "llama3":
    raise CheckpointError(
      f"{where} rope_type {kind!r} is not supported; supported: default,"
      " linear, llama3."
    )
  keys = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
  )
  return theta, RopeScaling(
    **{key: _require(scaling, key, f"{where} rope_scaling") for key in keys}
  )


def _require(hf: dict[str, Any], key: str, where: str) -> Any:
  if hf.get(key) is None:
    raise CheckpointError(
      f"{where} is missing the required key {key!r}; re-download it or"
      " export the checkpoint again."
    )
  return hf[key]


def _size(hf: dict[str, Any], key: str, where: str, default=None) -> int:
  """hf[key] (required unless `default` is given), a positive integer."""
  value = _require(hf, key, where) if default is None else hf.get(key)
  if value is None:  # JSON null or absent: the family's default
    return default
  if type(value) is not int or value <= 0:
    raise CheckpointError(
      f"{where} {key}={value!r} is not a positive integer; fix it, or"
      " re-download it or export the checkpoint again."
    )
  return value


def _unsupported(hf: dict[str, Any], family: str, where: str) -> None:
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
      raise CheckpointError(
        f"{where} {key}={hf[key]!r} is not supported by rljax's"
        f" {family} decoder."
      )


def config_from_hf(hf: dict[str, Any], **overrides) -> ModelConfig:
  """A `ModelConfig` from a transformers config.json dict.

  Accepts both rope styles (top-level ``rope_theta``/``rope_scaling`` and
  transformers-5 ``rope_parameters``); missing optional keys take the
  transformers defaults of the family.

  Args:
    hf: the parsed config.json.
    **overrides: `ModelConfig` fields to set, e.g. ``dtype="bfloat16"``.

  Returns:
    The model's `ModelConfig`.

  Raises:
    CheckpointError: an unsupported architecture or feature, a missing
      required key or a value of the wrong type or range.
  """
  return _config_from_hf(hf, "config.json", **overrides)


def _config_from_hf(hf: Any, where: str, **overrides) -> ModelConfig:
  """`config_from_hf`, naming `where` (a file) in its errors."""
  if not isinstance(hf, dict):
    raise CheckpointError(
      f"{where} holds a JSON {type(hf).__name__}, not an object; the file is"
      " damaged: re-download it or export the checkpoint again."
    )
  try:
    config = ModelConfig(**_config_fields(hf, where))
  except CheckpointError:
    raise
  except (AttributeError, TypeError, ValueError, ZeroDivisionError) as e:
    # A value of the wrong type or range (a string head count, 0 heads).
    raise CheckpointError(
      f"{where} has an invalid value ({e}); fix it, or re-download it or"
      " export the checkpoint again."
    ) from e
  # Outside the try: a bad override is the caller's error, not the file's.
  return dataclasses.replace(config, **overrides) if overrides else config


def _config_fields(hf: dict[str, Any], where: str) -> dict[str, Any]:
  """`ModelConfig` keyword arguments from a config.json dict."""
  arch = (hf.get("architectures") or [None])[0]
  if arch not in ARCHITECTURES:
    raise CheckpointError(
      f"{where} architectures {hf.get('architectures')!r} is not"
      f" supported; supported: {sorted(ARCHITECTURES)}."
    )
  family = ARCHITECTURES[arch]
  if family.startswith("gemma"):
    return _gemma_fields(hf, family, where)
  _unsupported(hf, family, where)
  theta, scaling = _rope(hf, where)
  hidden, heads = (
    _size(hf, "hidden_size", where),
    _size(hf, "num_attention_heads", where),
  )
  # transformers' Qwen3Config defaults head_dim to 128, the others derive it.
  head_dim = 128 if family == "qwen3" else hidden // heads
  experts = {}
  if family in _hf_moe.ARCHITECTURES.values():
    experts = _hf_moe.config_fields(hf, family, where, _size)
  return dict(
    **experts,
    vocab_size=_size(hf, "vocab_size", where),
    hidden_size=hidden,
    intermediate_size=_size(hf, "intermediate_size", where),
    num_layers=_size(hf, "num_hidden_layers", where),
    num_heads=heads,
    num_kv_heads=_size(hf, "num_key_value_heads", where, heads),
    head_dim=_size(hf, "head_dim", where, head_dim),
    rope_theta=theta,
    rope_scaling=scaling,
    rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
    tie_embeddings=hf.get("tie_word_embeddings", False),
    qkv_bias=family == "qwen2",
    qk_norm=family in ("qwen3", "qwen3_moe"),
    max_position_embeddings=hf.get(
      "max_position_embeddings", 2048 if family == "llama" else 32768
    ),
  )


def _gemma_unsupported(hf: dict[str, Any], family: str, where: str) -> None:
  """Raise for Gemma config.json features this decoder does not implement."""
  act = hf.get("hidden_activation") or hf.get("hidden_act")
  features = {
    "attention_bias": hf.get("attention_bias"),
    "use_bidirectional_attention": hf.get("use_bidirectional_attention"),
    # Gemma 1's legacy "gelu" means the tanh approximation (transformers).
    "hidden_activation": act not in (None, "gelu_pytorch_tanh", "gelu"),
  }
  for key, present in features.items():
    if present:
      value = hf.get(key, act)
      raise CheckpointError(
        f"{where} {key}={value!r} is not supported by rljax's {family} decoder."
      )


def _gemma_rope(hf: dict[str, Any], family: str, where: str):
  """(rope_theta, rope_scaling, local_rope_theta) of a Gemma config."""
  if family != "gemma3":
    return (*_rope(hf, where), None)
  params = hf.get("rope_parameters") or {}
  if SLIDING in params or FULL in params:  # transformers >= 5: per layer type
    full = _rope(hf, f"{where} rope_parameters.{FULL}", params.get(FULL) or {})
    local, scaling = _rope(
      hf, f"{where} rope_parameters.{SLIDING}", params.get(SLIDING) or {}
    )
    if scaling is not None:
      raise CheckpointError(
        f"{where} rope_parameters.{SLIDING}.rope_type"
        f" {params[SLIDING].get('rope_type')!r} is not supported: rljax"
        " scales only the full-attention layers' RoPE."
      )
    return (*full, local)
  theta, scaling = _rope(hf, where, theta=1_000_000.0)
  return theta, scaling, hf.get("rope_local_base_freq", 10_000.0)


def _layer_types(hf: dict[str, Any], family: str, layers: int, where: str):
  """Gemma 2 / 3 ``layer_types`` as a tuple (transformers' default when
  absent: every 2nd / 6th layer global)."""
  types = hf.get("layer_types")
  if types is None:
    period = 2 if family == "gemma2" else hf.get("sliding_window_pattern", 6)
    types = [SLIDING if (i + 1) % period else FULL for i in range(layers)]
  if not isinstance(types, list) or any(
    t not in (SLIDING, FULL) for t in types
  ):
    raise CheckpointError(
      f"{where} layer_types={types!r} is not supported: each entry must be"
      f" {SLIDING!r} or {FULL!r}."
    )
  return tuple(types)


def _gemma_fields(hf: dict[str, Any], family: str, where: str):
  """`ModelConfig` keyword arguments from a Gemma 1/2/3 config.json."""
  _gemma_unsupported(hf, family, where)
  theta, scaling, local_theta = _gemma_rope(hf, family, where)
  heads = _size(hf, "num_attention_heads", where)
  layers = _size(hf, "num_hidden_layers", where)
  fields = dict(
    vocab_size=_size(hf, "vocab_size", where),
    hidden_size=_size(hf, "hidden_size", where),
    intermediate_size=_size(hf, "intermediate_size", where),
    num_layers=layers,
    num_heads=heads,
    num_kv_heads=_size(hf, "num_key_value_heads", where, heads),
    head_dim=_size(hf, "head_dim", where, 256),
    rope_theta=theta,
    rope_scaling=scaling,
    rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
    tie_embeddings=hf.get("tie_word_embeddings", True),
    qk_norm=family == "gemma3",
    max_position_embeddings=hf.get(
      "max_position_embeddings", 131072 if family == "gemma3" else 8192
    ),
    embed_scale=True,
    norm_offset=True,
    activation="gelu_tanh",
  )
  if family == "gemma":
    return fields
  caps = (30.0, 50.0) if family == "gemma2" else (None, None)
  # transformers' Gemma 3 attention never applies attn_logit_softcapping
  # (its config keeps the key); rljax computes what transformers does.
  attn_cap = hf.get("attn_logit_softcapping", caps[1])
  return dict(
    fields,
    post_norms=True,
    query_pre_attn_scalar=hf.get("query_pre_attn_scalar", 256),
    final_logit_softcap=hf.get("final_logit_softcapping", caps[0]),
    attn_logit_softcap=attn_cap if family == "gemma2" else None,
    sliding_window=hf.get("sliding_window", 4096),
    layer_types=_layer_types(hf, family, layers, where),
    local_rope_theta=local_theta,
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


@dataclasses.dataclass(frozen=True)
class _Where:
  """Where HF-named tensors come from, for error messages.

  Attributes:
    checkpoint: the checkpoint as a whole (a file, a directory's shards).
    files: HF tensor name -> the file that holds it (else `checkpoint`).
    rename: HF tensor name -> its name in the file, when that differs.
    fix: what to do about a damaged tensor.
  """

  checkpoint: str = "checkpoint"
  files: Mapping[str, str] = dataclasses.field(default_factory=dict)
  rename: Callable[[str], str] = str
  fix: str = _REDOWNLOAD

  def name(self, name: str) -> str:
    """`name` as the file spells it (and as HF does, when they differ)."""
    own = self.rename(name)
    return repr(name) if own == name else f"{own!r} ({name})"

  def tensor(self, name: str) -> str:
    """The tensor `name` as ``<file>: tensor '<name>'``."""
    file = self.files.get(name, self.checkpoint)
    return f"{file}: tensor {self.name(name)}"


def _is_float(dtype: np.dtype) -> bool:
  return dtype.kind == "f" or dtype == ml_dtypes.bfloat16


def count_nonfinite(w: np.ndarray) -> int:
  """How many entries of the float array `w` are NaN or infinite.

  A finite sum proves every entry finite (NaN and inf propagate through
  it), so the mask that counts them is only built when the sum is not finite:
  a NaN, an inf, or finite values whose sum overflows.
  """
  acc = np.float32 if w.dtype.itemsize < 4 else w.dtype
  if np.isfinite(np.sum(w, dtype=acc)):
    return 0
  return int(w.size - np.count_nonzero(np.isfinite(w)))


def _get(tensors, name: str, shape, dtype, where: _Where) -> np.ndarray:
  """Tensor `name` in `dtype`, checked against the HF `shape` and for
  NaN/inf (after the cast: what the model will hold)."""
  if name not in tensors:
    raise MissingTensorError(
      f"{where.checkpoint} has no tensor {where.name(name)}; the file is"
      f" incomplete or does not match the config. {where.fix}"
    )
  value = tensors[name]
  if not hasattr(value, "dtype"):
    value = np.asarray(value)
  source = np.dtype(value.dtype)
  if not _is_float(source):
    raise CheckpointError(
      f"{where.tensor(name)} has dtype {source}; weights must be floating"
      f" point. {where.fix}"
    )
  if tuple(np.shape(value)) != tuple(shape):
    raise CheckpointError(
      f"{where.tensor(name)} has shape {tuple(np.shape(value))}; the config"
      f" expects {tuple(shape)}, so the file does not match its config."
      f" {where.fix}"
    )
  # Cast on the host straight to the parameter dtype: a bfloat16 model never
  # holds a float32 copy of the checkpoint.
  w = np.asarray(value, dtype)
  if bad := count_nonfinite(w):
    raise CheckpointError(
      f"{where.tensor(name)} has non-finite entries (NaN or inf): {bad} of"
      f" {w.size}{'' if source == w.dtype else f' as {w.dtype}'}; training"
      f" from it would diverge. {where.fix}"
    )
  return w


def _unused(tensors, used: set[str], tied: bool, where: _Where) -> None:
  """Raise for tensors the model has no place for (e.g. an o_proj bias)."""
  # Old checkpoints store RoPE tables; tied ones may repeat the embedding.
  ignored = {"lm_head.weight"} if tied else set()
  extra = sorted(
    n
    for n in tensors
    if n not in used and n not in ignored and not n.endswith("inv_freq")
  )
  if extra:
    names = ", ".join(where.name(n) for n in extra[:5])
    raise CheckpointError(
      f"{where.checkpoint} has tensors the config has no place for: [{names}"
      f"{' ...' if len(extra) > 5 else ''}] (check config.json)."
    )


def load_hf_tensors(model: Transformer, tensors: dict[str, np.ndarray]) -> None:
  """Copy HF-named tensors into `model` (in place), checking every tensor.

  Args:
    model: the model to fill (e.g. built with `nnx.eval_shape`).
    tensors: HF parameter name -> array.

  Raises:
    MissingTensorError: a tensor is missing (a `CheckpointError` and a
      `KeyError`).
    CheckpointError: a tensor has the wrong shape, a non-float dtype or NaN
      or inf entries, or the model has no parameter for it.
  """
  _fill(model, tensors, _Where())


def _fill(model: Transformer, tensors, where: _Where) -> None:
  """`load_hf_tensors`, naming files and tensors as `where` says."""
  c = model.config
  dtype = jax.numpy.dtype(c.param_dtype)
  get = lambda name, shape: _get(tensors, name, shape, dtype, where)
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
  for name, (hf_name, kind) in _layer_names(c).items():
    if not hasattr(model.layers, name):
      continue
    param = getattr(model.layers, name)
    shape = _hf_shape(kind, param.shape[1:])
    names = [f"model.layers.{i}.{hf_name}" for i in range(c.num_layers)]
    used.update(names)
    stacked = np.stack([_to_rljax(kind, get(n, shape), c) for n in names])
    param.set_value(jax.numpy.asarray(stacked))
  if c.num_experts:
    _hf_moe.load_experts(model, get, tensors, used)
  _unused(tensors, used, c.tie_embeddings, where)


def _check_plain(model: Transformer) -> None:
  """LoRA adapters or an int8 base have no HF tensor: refuse, not drop."""
  extra = [k for k in vars(model.layers) if k.endswith(("_lora_a", "_qscale"))]
  if extra:
    raise ValueError(
      f"the model carries LoRA adapters or an int8 base ({extra[0]}, ...);"
      " export rljax.models.merge_lora(model) (W + alpha / r A B), and the"
      " adapters with rljax.models.save_peft."
    )


def hf_tensors(model: Transformer) -> dict[str, np.ndarray]:
  """The model's weights under HF names and layouts (float32 numpy)."""
  _check_plain(model)
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
  for name, (hf_name, kind) in _layer_names(c).items():
    if not hasattr(model.layers, name):
      continue
    stacked = np.asarray(getattr(model.layers, name)[...], np.float32)
    for i in range(c.num_layers):
      out[f"model.layers.{i}.{hf_name}"] = np.ascontiguousarray(
        _to_hf(kind, stacked[i])
      )
  if c.num_experts:
    out.update(_hf_moe.expert_tensors(model))
  return out


def hf_config(config: ModelConfig) -> dict[str, Any]:
  """A transformers config.json dict (``rope_theta``/``rope_scaling`` style,
  which transformers 4 and 5 both read; Gemma 3's per-layer-type
  ``rope_parameters``, transformers >= 5)."""
  if config.norm_offset:
    return _gemma_config(config)
  gemma = [
    name
    for name in (
      "embed_scale",
      "post_norms",
      "query_pre_attn_scalar",
      "attn_logit_softcap",
      "final_logit_softcap",
      "layer_types",
      "local_rope_theta",
    )
    if getattr(config, name)
  ]
  if gemma or config.activation != "silu":
    raise ValueError(
      f"{gemma or ['activation']} are Gemma features, but norm_offset is"
      " False (Gemma's 1 + w RMSNorm); no transformers architecture has"
      " them with Llama's norm. Set norm_offset=True to export as Gemma."
    )
  if isinstance(config.rope_scaling, LinearRopeScaling):
    raise ValueError(
      "linear rope_scaling is exported for Gemma 3 only; a Llama-family"
      " config takes RopeScaling (llama3)."
    )
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
  if config.num_experts:
    out.update(_hf_moe.hf_config_fields(config))
  if config.rope_scaling is not None:
    out["rope_scaling"] = {"rope_type": "llama3", **vars(config.rope_scaling)}
  return out


def _gemma_family(c: ModelConfig) -> str:
  """Which Gemma generation `c` is, checking it has that generation's fixed
  features (ValueError naming the field otherwise)."""
  family = ("gemma3" if c.qk_norm else "gemma2") if c.post_norms else "gemma"
  wrong = {
    "embed_scale": not c.embed_scale,
    "activation": c.activation != "gelu_tanh",
    "qkv_bias": c.qkv_bias,
    "qk_norm": family == "gemma" and c.qk_norm,
    "local_rope_theta": family != "gemma3" and c.local_rope_theta is not None,
    "rope_scaling": family != "gemma3" and c.rope_scaling is not None,
    # transformers' Gemma 3 ignores attn_logit_softcapping.
    "attn_logit_softcap": family == "gemma3" and c.attn_logit_softcap,
  }
  if family == "gemma":
    for name in (
      "query_pre_attn_scalar",
      "attn_logit_softcap",
      "final_logit_softcap",
      "layer_types",
    ):
      wrong[name] = getattr(c, name) is not None
  if isinstance(c.rope_scaling, RopeScaling):
    wrong["rope_scaling"] = True
  bad = [name for name, is_bad in wrong.items() if is_bad]
  if bad:
    raise ValueError(
      f"cannot export as {family} (chosen by norm_offset, post_norms and"
      f" qk_norm): {bad} differ from what that transformers architecture"
      " supports (Gemma: embed_scale, gelu_tanh, no biases; soft-capping,"
      " sliding windows and query_pre_attn_scalar from Gemma 2, attention"
      " soft-capping in Gemma 2 only; qk_norm, local_rope_theta and linear"
      " rope_scaling in Gemma 3 only)."
    )
  return family


def _integral(x: float) -> float | int:
  """`x` as an int when it is one (transformers types some of these int)."""
  return int(x) if float(x).is_integer() else x


def _gemma_config(c: ModelConfig) -> dict[str, Any]:
  """`hf_config` of a Gemma 1, 2 or 3 config."""
  family = _gemma_family(c)
  arch = {v: k for k, v in ARCHITECTURES.items()}[family]
  out = {
    "architectures": [arch],
    "model_type": _MODEL_TYPES.get(family, family),
    "vocab_size": c.vocab_size,
    "hidden_size": c.hidden_size,
    "intermediate_size": c.intermediate_size,
    "num_hidden_layers": c.num_layers,
    "num_attention_heads": c.num_heads,
    "num_key_value_heads": c.num_kv_heads,
    "head_dim": c.head_dim,
    "rms_norm_eps": c.rms_norm_eps,
    "max_position_embeddings": c.max_position_embeddings,
    "tie_word_embeddings": c.tie_embeddings,
    "torch_dtype": "float32",
  }
  rope = {"rope_type": "default", "rope_theta": c.rope_theta}
  if family == "gemma":
    return dict(out, hidden_act="gelu_pytorch_tanh", rope_parameters=rope)
  out.update(
    hidden_activation="gelu_pytorch_tanh",
    query_pre_attn_scalar=_integral(c.query_pre_attn_scalar or c.head_dim),
    final_logit_softcapping=c.final_logit_softcap,
    attn_logit_softcapping=c.attn_logit_softcap,
    sliding_window=c.sliding_window or c.max_position_embeddings,
    layer_types=[SLIDING if s else FULL for s in c.sliding_layers],
  )
  if family == "gemma2":
    return dict(out, rope_parameters=rope)
  if c.rope_scaling is not None:
    rope.update(rope_type="linear", factor=c.rope_scaling.factor)
  local = c.rope_theta if c.local_rope_theta is None else c.local_rope_theta
  out["rope_parameters"] = {
    FULL: rope,
    SLIDING: {"rope_type": "default", "rope_theta": local},
  }
  return out


_DTYPES = {
  "BF16": ml_dtypes.bfloat16,
  "F16": np.float16,
  "F32": np.float32,
  "F64": np.float64,
}


def _safetensors_header(path: pathlib.Path) -> tuple[dict[str, Any], int, int]:
  """The JSON header of a safetensors file, its length and the file's size."""
  damaged = f"the file is damaged or truncated. {_REDOWNLOAD}"
  try:
    size = path.stat().st_size
    with open(path, "rb") as f:
      head = f.read(8)
      if head[:4] == b"GGUF":
        raise CheckpointError(
          f"{path} is a GGUF file, not safetensors; load it with"
          " rljax.checkpoints.load_gguf, or move it out of the directory."
        )
      if size < 8:
        raise CheckpointError(
          f"{path} is {'empty' if size == 0 else f'only {size} bytes long'};"
          f" a safetensors file starts with an 8-byte header length, so {damaged}"
        )
      (n,) = struct.unpack("<Q", head)
      if n > size - 8:
        raise CheckpointError(
          f"{path} declares a {n}-byte header but holds only {size - 8} bytes"
          f" after the length: it is not a safetensors file, or {damaged}"
        )
      raw = f.read(n)
  except OSError as e:
    raise CheckpointError(f"{path} cannot be read: {e}") from e
  try:
    header = json.loads(raw)
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    raise CheckpointError(
      f"{path} has a header that is not valid JSON ({e}): it is not a"
      f" safetensors file, or {damaged}"
    ) from e
  if not isinstance(header, dict):
    raise CheckpointError(
      f"{path} has a JSON {type(header).__name__} as its header, not an"
      f" object: it is not a safetensors file, or {damaged}"
    )
  return header, n, size


def _entry(path: pathlib.Path, name: str, info: Any) -> tuple[Any, ...]:
  """(numpy dtype, shape, begin, end) of one header entry, checked."""
  if not (
    isinstance(info, dict)
    and isinstance(info.get("dtype"), str)
    and isinstance(shape := info.get("shape"), list)
    and all(type(d) is int and d >= 0 for d in shape)
    and isinstance(offsets := info.get("data_offsets"), list)
    and len(offsets) == 2
    and all(type(o) is int for o in offsets)
    and 0 <= offsets[0] <= offsets[1]
  ):
    raise CheckpointError(
      f"{path}: tensor {name!r} has a malformed header entry"
      f" {str(info)[:100]}; the file is damaged. {_REDOWNLOAD}"
    )
  if info["dtype"] not in _DTYPES:
    raise CheckpointError(
      f"{path}: tensor {name!r} has dtype {info['dtype']}; supported:"
      f" {sorted(_DTYPES)}. Export the checkpoint again in float32, bfloat16"
      " or float16."
    )
  dtype = np.dtype(_DTYPES[info["dtype"]])
  begin, end = offsets
  if end - begin != math.prod(shape) * dtype.itemsize:
    raise CheckpointError(
      f"{path}: tensor {name!r} is {end - begin} bytes long, but shape"
      f" {tuple(shape)} of {info['dtype']} needs"
      f" {math.prod(shape) * dtype.itemsize}; the file is damaged."
      f" {_REDOWNLOAD}"
    )
  return dtype, tuple(shape), begin, end


def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
  """Memory-mapped tensors of one file, bfloat16 included, header checked.

  `safetensors.numpy` cannot represent bfloat16, the dtype of most
  published checkpoints, so the (simple) format is read directly: an 8-byte
  little-endian header length, a JSON header, then the tensor data.

  Raises:
    CheckpointError: the file is unreadable, truncated, not safetensors, or
      its header is malformed or has a dtype other than a float.
  """
  header, n, size = _safetensors_header(path)
  entries = {
    name: _entry(path, name, info)
    for name, info in header.items()
    if name != "__metadata__"
  }
  data_size = size - 8 - n
  cut = [(e[2], name) for name, e in entries.items() if e[3] > data_size]
  if cut:
    expected = 8 + n + max(e[3] for e in entries.values())
    others = f" and {len(cut) - 1} more lie" if len(cut) > 1 else " lies"
    raise CheckpointError(
      f"{path} is truncated: it has {size} bytes, its header describes"
      f" {expected}; tensor {min(cut)[1]!r}{others} past its end."
      f" {_REDOWNLOAD}"
    )
  if data_size == 0:  # np.memmap cannot map nothing
    data = np.zeros(0, np.uint8)
  else:
    data = np.memmap(path, np.uint8, "r", offset=8 + n, shape=(data_size,))
  return {
    name: data[begin:end].view(dtype).reshape(shape)
    for name, (dtype, shape, begin, end) in entries.items()
  }


def _read_config(path: pathlib.Path) -> Any:
  """The parsed config.json at `path`."""
  if not path.is_file():
    raise CheckpointNotFoundError(
      f"{path} not found: a Hugging Face checkpoint directory needs"
      " config.json and *.safetensors files."
    )
  try:
    return json.loads(path.read_bytes())
  except OSError as e:
    raise CheckpointError(f"{path} cannot be read: {e}") from e
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    raise CheckpointError(
      f"{path} is not valid JSON ({e}); the file is damaged: re-download it"
      " or export the checkpoint again."
    ) from e


def load_hf(
  directory: str | os.PathLike, *, rngs: nnx.Rngs | None = None, **overrides
) -> Transformer:
  """A `Transformer` from a directory with config.json and *.safetensors.

  Every tensor is checked as it is read: its presence, shape, dtype and that
  every entry is finite.

  Args:
    directory: a transformers checkpoint directory (shards are merged).
    rngs: unused: every weight comes from the files, so the model is built
      abstractly (no random init, no compile); kept for compatibility.
    **overrides: `ModelConfig` fields to set, e.g. ``dtype="bfloat16"``.

  Returns:
    The model, every parameter from the files.

  Raises:
    CheckpointNotFoundError: config.json or every *.safetensors file is
      missing (a `CheckpointError` and a `FileNotFoundError`).
    CheckpointError: a damaged, truncated or foreign file, a malformed or
      unsupported config.json, or a tensor that is missing, of the wrong
      shape or dtype, or not finite. The message names the file and tensor.
  """
  del rngs
  path = pathlib.Path(directory)
  config_path = path / "config.json"
  config = _config_from_hf(
    _read_config(config_path), str(config_path), **overrides
  )
  files = sorted(path.glob("*.safetensors"))
  if not files:
    raise CheckpointNotFoundError(
      f"no *.safetensors files in {path}; re-download the checkpoint or"
      " export it again."
    )
  tensors, owner = {}, {}
  for f in files:
    read = _read_safetensors(f)
    tensors.update(read)
    owner.update(dict.fromkeys(read, str(f)))
  where = _Where(
    checkpoint=str(files[0]) if len(files) == 1 else f"{path}/*.safetensors",
    files=owner,
  )
  return _model(config, tensors, where)


def model_from_tensors(
  config: ModelConfig, tensors: dict[str, np.ndarray]
) -> Transformer:
  """A `Transformer` whose every weight comes from HF-named `tensors`.

  The model is built abstractly (no random init, nothing compiled), then
  filled by `load_hf_tensors`, which checks every name, shape, dtype and
  that every entry is finite.

  Args:
    config: the model's config.
    tensors: HF parameter name -> array.

  Returns:
    The model.

  Raises:
    CheckpointError: as `load_hf_tensors`.
  """
  return _model(config, tensors, _Where())


def _model(config: ModelConfig, tensors, where: _Where) -> Transformer:
  """`model_from_tensors`, naming files and tensors as `where` says."""
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  _fill(model, tensors, where)  # sets every parameter
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
