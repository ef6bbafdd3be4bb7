"""LoRA and QLoRA adapters on the decoder's stacked projections.

An adapted projection computes ``x W + (x A) B * (alpha / r)`` on the
activations (`rljax.models._transformer._proj`); W + A B is never formed
while training or sampling, only by `merge_lora` at export (in `_merge`: it
builds a `Transformer`, and `_transformer` imports this module). A and B
are `nnx.LoRAParam` attributes of the `Layers` module, stacked on the layer
axis like the base weights: ``{name}_lora_a`` [L, *in, r] and
``{name}_lora_b`` [L, r, *out] (qwix's names), with ``lora_scale`` [L]
holding alpha / r. A starts random (He-uniform, as PEFT's Kaiming init), B
at zero, so a fresh adapter leaves the model's outputs exactly as they were.

QLoRA (`quantize_base`) stores each adapted base matrix as int8 with one
float32 scale per output channel (symmetric absmax: ``q = round(127 W /
max|W|)``, ``|W - q s| <= s / 2``), dequantized inside the projection one
layer at a time.

Train states (`rljax.training`): a policy holding LoRAParams trains those
only (`trainable`); the frozen base stays in the policy's params and the
reference policy is the same base with its own adapter state
(`with_trainable`), zero at the start: no second copy of the base.

Why not qwix (0.1.8, what Tunix uses): qwix intercepts ``jnp.einsum`` calls
inside a flax module's method and finds the weight by identity with a
module attribute (``flax_util.find_param``); it then creates the adapter
params at the first call with the einsum operand's shape. In rljax the
layers run in a ``lax.scan`` over weights stacked [L, ...]: the einsum sees
a per-layer slice, which is no attribute, so qwix adds no adapter (and,
were it found, it would create [D, r] adapters shared by all layers, inside
a traced scan body). Its quantized arrays (`qwix.QArray`) carry their own
pytree and calibration machinery for a job that here is ten lines of
per-channel int8. So the adapters are written here, with qwix's parameter
names and its einsum rule for A and B (A over the weight's contracted
dims, B over its output dims).
"""

import json
import os
import pathlib

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

# Projection -> number of its input (contracted) dims after the layer axis.
PROJECTIONS = {
  "q_proj": 1,
  "k_proj": 1,
  "v_proj": 1,
  "o_proj": 2,
  "gate_proj": 1,
  "up_proj": 1,
  "down_proj": 1,
}
LORA_TARGETS = tuple(PROJECTIONS)


class LoraScale(nnx.Variable):
  """alpha / r per layer [L] (a constant, not trained)."""


class QuantScale(nnx.Variable):
  """Per-output-channel dequantization scales of an int8 base weight."""


def _check_targets(layers, targets) -> tuple[str, ...]:
  targets = tuple(targets)
  unknown = [t for t in targets if t not in PROJECTIONS]
  if unknown or not targets:
    raise ValueError(
      f"LoRA targets {targets!r}: each must be one of {tuple(PROJECTIONS)}"
      " (the decoder's projections), and at least one is needed."
    )
  missing = [t for t in targets if not hasattr(layers, t)]
  if missing:
    raise ValueError(
      f"LoRA targets {missing!r}: this model has no such projection (a"
      " mixture of experts has no dense gate/up/down_proj: its experts take"
      " no adapters); target the attention projections, e.g."
      " ('q_proj', 'k_proj', 'v_proj', 'o_proj')."
    )
  for t in targets:
    if hasattr(layers, f"{t}_lora_a"):
      raise ValueError(f"{t} already has a LoRA adapter.")
  return targets


def add_lora(
  model,
  *,
  rank: int,
  alpha: float,
  targets=LORA_TARGETS,
  seed: int = 0,
):
  """Adds zero-effect LoRA adapters to `model`'s `targets` (in place).

  Args:
    model: a `Transformer`.
    rank: r, the adapters' inner width.
    alpha: the scale numerator; the update is scaled by alpha / r.
    targets: projection names (`PROJECTIONS`).
    seed: seeds A's He-uniform init (B is zero).

  Returns:
    The model.
  """
  if rank <= 0 or alpha <= 0:
    raise ValueError(f"LoRA rank ({rank}) and alpha ({alpha}) must be > 0.")
  layers = model.layers
  targets = _check_targets(layers, targets)
  key = jax.random.key(seed)
  for i, name in enumerate(targets):
    base = getattr(layers, name)
    n_in = PROJECTIONS[name]
    axes = base.get_metadata()["logical_axes"]
    shape, dtype = base.shape, model.config.param_dtype
    fan_in = int(np.prod(shape[1 : 1 + n_in]))
    bound = float(np.sqrt(6.0 / fan_in))
    a = jax.random.uniform(
      jax.random.fold_in(key, i),
      (*shape[: 1 + n_in], rank),
      dtype,
      -bound,
      bound,
    )
    b = jnp.zeros((shape[0], rank, *shape[1 + n_in :]), dtype)
    a_axes = (*axes[: 1 + n_in], None)
    b_axes = (axes[0], None, *axes[1 + n_in :])
    setattr(layers, f"{name}_lora_a", nnx.LoRAParam(a, logical_axes=a_axes))
    setattr(layers, f"{name}_lora_b", nnx.LoRAParam(b, logical_axes=b_axes))
  scale = jnp.full((model.config.num_layers,), alpha / rank, jnp.float32)
  layers.lora_scale = LoraScale(scale, logical_axes=("layers",))
  return model


def quantize_base(model, targets=LORA_TARGETS):
  """Stores `model`'s `targets` projections as int8 with per-output-channel
  float32 scales (QLoRA's frozen base; in place). Returns the model."""
  layers = model.layers
  for name in targets:
    if name not in PROJECTIONS:
      raise ValueError(f"quantize target {name!r}: not in {PROJECTIONS}.")
    param = getattr(layers, name)
    q, scale = quantize_int8(param[...], PROJECTIONS[name])
    axes = param.get_metadata()["logical_axes"]
    setattr(layers, name, nnx.Param(q, logical_axes=axes))
    scale_axes = tuple(
      None if 1 <= d <= PROJECTIONS[name] else a for d, a in enumerate(axes)
    )
    setattr(
      layers, f"{name}_qscale", QuantScale(scale, logical_axes=scale_axes)
    )
  return model


def quantize_int8(w, n_in: int):
  """(int8 q, float32 scale) with w ~ q * scale; the scale is one absmax /
  127 per output channel (reduced over the `n_in` dims after the layer
  axis, kept as size-1 dims)."""
  w = jnp.asarray(w, jnp.float32)
  absmax = jnp.max(jnp.abs(w), axis=tuple(range(1, 1 + n_in)), keepdims=True)
  scale = jnp.where(absmax > 0, absmax / 127.0, 1.0)
  q = jnp.clip(jnp.round(w / scale), -127, 127).astype(jnp.int8)
  return q, scale


def base_weight(w, name, dtype):
  """Layer weight `name` of the per-layer dict `w` in `dtype`, dequantized
  when it is stored as int8."""
  if f"{name}_qscale" in w:
    return (w[name].astype(jnp.float32) * w[f"{name}_qscale"]).astype(dtype)
  return w[name].astype(dtype)


def adapter_delta(w, name, x, equation):
  """``(x A) B * alpha / r`` for `name`'s adapter, or None without one.

  A spans the weight's dims that x contracts, B its output dims (qwix's
  rule), so any projection equation works.
  """
  if f"{name}_lora_a" not in w:
    return None
  lhs_rhs, out = equation.split("->")
  lhs, rhs = lhs_rhs.split(",")
  r = sorted(set("abcdefghijklmnopqrstuvwxyz") - set(equation))[0]
  a_dims = "".join(c for c in rhs if c in lhs)
  b_dims = "".join(c for c in rhs if c not in lhs)
  kept = "".join(c for c in lhs if c not in a_dims)
  a = w[f"{name}_lora_a"].astype(x.dtype)
  b = w[f"{name}_lora_b"].astype(x.dtype)
  xa = jnp.einsum(f"{lhs},{a_dims}{r}->{kept}{r}", x, a)
  delta = jnp.einsum(f"{kept}{r},{r}{b_dims}->{out}", xa, b)
  return delta * w["lora_scale"].astype(x.dtype)


def trainable(params):
  """The part of a policy's `nnx.State` that trains: its LoRAParams when it
  has any, else all of it."""
  adapters = nnx.filter_state(params, nnx.LoRAParam)
  return adapters if jax.tree.leaves(adapters) else params


def with_trainable(params, trained):
  """`params` with its trainable part (`trainable`) replaced by `trained`
  (None stays None: a run without a reference)."""
  if trained is None:
    return None
  if not jax.tree.leaves(nnx.filter_state(params, nnx.LoRAParam)):
    return trained
  return nnx.merge_state(params, trained)


def adapters_off(params):
  """Zero adapters shaped like `params`' trainable part: with them the
  policy computes its frozen base exactly (the LoRA reference)."""
  return jax.tree.map(jnp.zeros_like, trainable(params))


def has_adapters(model) -> bool:
  """Whether `model` (a `Transformer`) carries LoRA adapters."""
  return hasattr(model.layers, "lora_scale")


def _adapted(layers):
  return [n for n in PROJECTIONS if hasattr(layers, f"{n}_lora_a")]


_PEFT_MODULES = {
  "q_proj": "self_attn.q_proj",
  "k_proj": "self_attn.k_proj",
  "v_proj": "self_attn.v_proj",
  "o_proj": "self_attn.o_proj",
  "gate_proj": "mlp.gate_proj",
  "up_proj": "mlp.up_proj",
  "down_proj": "mlp.down_proj",
}


def peft_tensors(model) -> dict[str, np.ndarray]:
  """The adapters under PEFT's names: ``lora_A.weight`` [r, in] and
  ``lora_B.weight`` [out, r] of every layer (float32)."""
  layers, out = model.layers, {}
  for name in _adapted(layers):
    a = np.asarray(getattr(layers, f"{name}_lora_a")[...], np.float32)
    b = np.asarray(getattr(layers, f"{name}_lora_b")[...], np.float32)
    for i in range(a.shape[0]):
      prefix = f"base_model.model.model.layers.{i}.{_PEFT_MODULES[name]}"
      rank = a.shape[-1]
      out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(
        a[i].reshape(-1, rank).T
      )
      out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(
        b[i].reshape(rank, -1).T
      )
  return out


def save_peft(model, directory: str | os.PathLike, base: str = "") -> None:
  """Writes adapter_config.json and adapter_model.safetensors that
  `peft.PeftModel.from_pretrained` loads onto the base model (e.g. the
  `rljax.checkpoints.save_hf` export of the model without adapters;
  ``base`` is recorded as base_model_name_or_path)."""
  layers = model.layers
  targets = _adapted(layers)
  if not targets:
    raise ValueError("the model has no LoRA adapters to save.")
  rank = getattr(layers, f"{targets[0]}_lora_a").shape[-1]
  scales = np.asarray(layers.lora_scale[...])
  config = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "base_model_name_or_path": str(base),
    "r": int(rank),
    "lora_alpha": float(scales[0] * rank),
    "lora_dropout": 0.0,
    "target_modules": sorted(targets),
    "bias": "none",
    "fan_in_fan_out": False,
    "use_rslora": False,
    "init_lora_weights": True,
    "inference_mode": True,
  }
  path = pathlib.Path(directory)
  path.mkdir(parents=True, exist_ok=True)
  tmp = path / "adapter_model.safetensors.tmp"
  safetensors.numpy.save_file(peft_tensors(model), tmp, {"format": "pt"})
  os.replace(tmp, path / "adapter_model.safetensors")
  (path / "adapter_config.json").write_text(json.dumps(config, indent=2))
