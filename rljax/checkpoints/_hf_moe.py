"""Mixture-of-experts checkpoints: Qwen3-MoE and Mixtral config.json keys
and expert tensor names.

Published checkpoints, and transformers 5's ``save_pretrained``, store one
tensor per expert: Qwen3-MoE ``mlp.experts.{j}.{gate,up,down}_proj.weight``
with router ``mlp.gate.weight``; Mixtral ``block_sparse_moe.experts.{j}.
{w1,w3,w2}.weight`` (gate, up, down) with router
``block_sparse_moe.gate.weight``. transformers 5 holds them fused in
memory (``mlp.experts.gate_up_proj`` [E, 2F, D], gate rows first, and
``mlp.experts.down_proj`` [E, D, F]); loading reads all three forms,
export writes the per-expert form. rljax stacks experts as [L, E, D, F]
(``expert_gate``, ``expert_up``) and [L, E, F, D] (``expert_down``).
"""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from rljax._src.errors import CheckpointError
from rljax.models._config import ModelConfig

ARCHITECTURES = {
  "Qwen3MoeForCausalLM": "qwen3_moe",
  "MixtralForCausalLM": "mixtral",
}

# family -> (prefix inside model.layers.{i}, gate, up, down expert names)
_PER_EXPERT = {
  "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
  "mixtral": ("block_sparse_moe", "w1", "w3", "w2"),
}


def _reject(hf: dict[str, Any], family: str, where: str) -> None:
  """Raise for MoE features this decoder does not implement."""
  if family == "qwen3_moe":
    if hf.get("mlp_only_layers"):
      raise CheckpointError(
        f"{where} mlp_only_layers={hf['mlp_only_layers']!r}: dense layers"
        " among expert layers are not supported (rljax's layer scan needs"
        " one layer kind); every published Qwen3-MoE uses []."
      )
    if hf.get("decoder_sparse_step", 1) != 1:
      raise CheckpointError(
        f"{where} decoder_sparse_step={hf['decoder_sparse_step']!r}: only"
        " 1 (every layer a mixture of experts) is supported."
      )
  if family == "mixtral" and hf.get("sliding_window") is not None:
    raise CheckpointError(
      f"{where} sliding_window={hf['sliding_window']!r} is not supported by"
      " rljax's mixtral decoder; set it to null if the model never attends"
      " beyond it (Mixtral 8x7B v0.1 ships null)."
    )
  if hf.get("shared_expert_intermediate_size"):
    raise CheckpointError(
      f"{where} has shared experts (shared_expert_intermediate_size), which"
      " rljax's mixture of experts does not implement."
    )


def config_fields(
  hf: dict[str, Any], family: str, where: str, size: Callable
) -> dict[str, Any]:
  """The `ModelConfig` expert fields (and Mixtral's expert width as
  ``intermediate_size``) of a config.json; `size(hf, key, where)` reads a
  positive integer."""
  _reject(hf, family, where)
  if family == "mixtral":
    width = size(hf, "intermediate_size", where)
    return dict(
      num_experts=size(hf, "num_local_experts", where),
      experts_per_token=size(hf, "num_experts_per_tok", where),
      expert_intermediate_size=width,
      norm_topk_prob=True,
    )
  # Hub configs say num_experts; transformers 5 writes num_local_experts.
  key = "num_experts" if "num_experts" in hf else "num_local_experts"
  return dict(
    num_experts=size(hf, key, where),
    experts_per_token=size(hf, "num_experts_per_tok", where),
    expert_intermediate_size=size(hf, "moe_intermediate_size", where),
    norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
  )


def _form(tensors, i: int) -> tuple[str, str, str, str, bool]:
  """(prefix, gate, up, down, fused) of layer i's experts in `tensors`."""
  if f"model.layers.{i}.mlp.experts.gate_up_proj" in tensors:
    return "mlp", "", "", "", True
  for prefix, gate, up, down in _PER_EXPERT.values():
    if f"model.layers.{i}.{prefix}.gate.weight" in tensors:
      return prefix, gate, up, down, False
  return (*_PER_EXPERT["qwen3_moe"], False)  # reports the missing router


def _layer(get, tensors, i: int, c: ModelConfig, used: set) -> dict:
  """Layer i's router [D, E] and experts [E, D, F] / [E, F, D]."""
  E, D, F = c.num_experts, c.hidden_size, c.expert_intermediate_size
  prefix, gate, up, down, fused = _form(tensors, i)
  base = f"model.layers.{i}.{prefix}"
  used.add(f"{base}.gate.weight")
  out = {"router": get(f"{base}.gate.weight", (E, D)).T}
  if fused:
    names = (f"{base}.experts.gate_up_proj", f"{base}.experts.down_proj")
    used.update(names)
    gate_up = get(names[0], (E, 2 * F, D))
    out["expert_gate"] = gate_up[:, :F].transpose(0, 2, 1)
    out["expert_up"] = gate_up[:, F:].transpose(0, 2, 1)
    out["expert_down"] = get(names[1], (E, D, F)).transpose(0, 2, 1)
    return out
  for key, hf, shape in (
    ("expert_gate", gate, (F, D)),
    ("expert_up", up, (F, D)),
    ("expert_down", down, (D, F)),
  ):
    names = [f"{base}.experts.{j}.{hf}.weight" for j in range(E)]
    used.update(names)
    out[key] = np.stack([get(n, shape).T for n in names])
  return out


def load_experts(model, get, tensors, used: set) -> None:
  """Fill `model`'s router and expert weights from HF-named `tensors`
  (`get(name, hf_shape)` reads one, checked), adding the names read to
  `used`."""
  c = model.config
  layers = [_layer(get, tensors, i, c, used) for i in range(c.num_layers)]
  for key in layers[0]:
    stacked = np.stack([layer[key] for layer in layers])
    getattr(model.layers, key).set_value(jnp.asarray(stacked))


def _family(config: ModelConfig) -> str:
  """The transformers family that can hold `config`'s experts."""
  if config.qk_norm:
    return "qwen3_moe"
  if config.qkv_bias or not config.norm_topk_prob:
    raise ValueError(
      "no transformers mixture-of-experts family matches this config:"
      " Qwen3-MoE has qk_norm; Mixtral has neither qk_norm nor qkv_bias and"
      " always renormalises the top-k weights (norm_topk_prob=True)."
    )
  return "mixtral"


def expert_tensors(model) -> dict[str, np.ndarray]:
  """The router and expert weights under per-expert HF names (float32)."""
  c = model.config
  prefix, gate, up, down = _PER_EXPERT[_family(c)]
  w = {
    key: np.asarray(getattr(model.layers, key)[...], np.float32)
    for key in ("router", "expert_gate", "expert_up", "expert_down")
  }
  out = {}
  for i in range(c.num_layers):
    base = f"model.layers.{i}.{prefix}"
    out[f"{base}.gate.weight"] = np.ascontiguousarray(w["router"][i].T)
    for j in range(c.num_experts):
      for key, hf in (
        ("expert_gate", gate),
        ("expert_up", up),
        ("expert_down", down),
      ):
        out[f"{base}.experts.{j}.{hf}.weight"] = np.ascontiguousarray(
          w[key][i, j].T
        )
  return out


def hf_config_fields(config: ModelConfig) -> dict[str, Any]:
  """config.json keys of a mixture-of-experts config (architecture
  included), to update the dense keys with."""
  family = _family(config)
  if family == "mixtral":
    return {
      "architectures": ["MixtralForCausalLM"],
      "model_type": "mixtral",
      "intermediate_size": config.expert_intermediate_size,
      "num_local_experts": config.num_experts,
      "num_experts_per_tok": config.experts_per_token,
      "sliding_window": None,
    }
  return {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "num_experts": config.num_experts,
    "num_experts_per_tok": config.experts_per_token,
    "moe_intermediate_size": config.expert_intermediate_size,
    "norm_topk_prob": config.norm_topk_prob,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
  }
