"""Hugging Face config.json <-> `ModelConfig`, for every supported family.

Reading accepts both rope styles (top-level ``rope_theta``/``rope_scaling``
and transformers-5 ``rope_parameters``) and raises one `CheckpointError`
naming the file and key for anything unsupported or malformed; writing
refuses (`ValueError`) a config no transformers architecture can hold.
"""

import dataclasses
from typing import Any

from rljax._src.errors import CheckpointError
from rljax.checkpoints import _hf_moe
from rljax.models._config import FULL
from rljax.models._config import SLIDING
from rljax.models._config import LinearRopeScaling
from rljax.models._config import ModelConfig
from rljax.models._config import RopeScaling

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
