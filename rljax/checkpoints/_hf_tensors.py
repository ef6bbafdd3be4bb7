"""Hugging Face tensor names and layouts, and the checked copy into a model.

HF stores linear weights as [out, in]; rljax stores them [in, out] with heads
split out, e.g. q_proj [D, H, K]. The table below is the whole mapping.

Every tensor copied in is checked: a missing, misshapen or non-float tensor
and a NaN or inf weight each raise one `CheckpointError` that names the file
and the tensor and says what to do.
"""

from collections.abc import Callable, Mapping
import dataclasses

import jax
import ml_dtypes
import numpy as np

from rljax._src.errors import CheckpointError
from rljax.checkpoints import _hf_moe
from rljax.checkpoints._hf_errors import _REDOWNLOAD
from rljax.checkpoints._hf_errors import MissingTensorError
from rljax.models._config import ModelConfig
from rljax.models._transformer import Transformer

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
