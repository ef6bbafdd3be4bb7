"""Read a llama.cpp GGUF file as Hugging Face-named float32 tensors.

The output is what a transformers ``config.json`` + ``model.safetensors`` pair
would hold for ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` or
``Qwen3ForCausalLM``, so the model's own HF importer consumes it unchanged:
weights are ``[out_features, in_features]`` (GGUF's ``ne`` order reversed,
which is how ``gguf.GGUFReader`` already exposes them), quantized types are
dequantized with ``gguf.quants.dequantize`` and llama.cpp's RoPE row
permutation of Q and K is undone for the llama architecture.

Reading checks the file: a truncated, damaged or foreign file, missing or
malformed metadata, an integer or unmapped tensor and a NaN or inf weight
(after dequantization) each raise one `CheckpointError` naming the file and
the tensor.
"""

import os
from typing import Any, NamedTuple

import gguf
import numpy as np

from rljax._src.errors import CheckpointError
from rljax.checkpoints._hf import _model
from rljax.checkpoints._hf_config import _config_from_hf
from rljax.checkpoints._hf_errors import CheckpointNotFoundError
from rljax.checkpoints._hf_errors import MissingTensorError
from rljax.checkpoints._hf_tensors import _Where
from rljax.checkpoints._hf_tensors import count_nonfinite
from rljax.models._transformer import Transformer

_FIX = "Re-download the GGUF file or convert it again."

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

_HF_GLOBAL = {hf: stem for stem, hf in _GLOBAL_TENSORS.items()}
_HF_LAYER = {hf: stem for stem, hf in _LAYER_TENSORS.items()}

# GGML types that hold integers, not (quantized) weights.
_INTEGER_TYPES = {
  gguf.GGMLQuantizationType.I8,
  gguf.GGMLQuantizationType.I16,
  gguf.GGMLQuantizationType.I32,
  gguf.GGMLQuantizationType.I64,
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

# GGML types that hold unquantized floats.
_FLOAT_TYPES = {
  gguf.GGMLQuantizationType.F16,
  gguf.GGMLQuantizationType.BF16,
  gguf.GGMLQuantizationType.F32,
  gguf.GGMLQuantizationType.F64,
}

# HF config keys that must be integers.
_SIZES = (
  "hidden_size",
  "intermediate_size",
  "num_hidden_layers",
  "num_attention_heads",
  "num_key_value_heads",
  "head_dim",
  "max_position_embeddings",
)

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
    CheckpointNotFoundError: ``path`` does not exist (a `CheckpointError`
      and a `FileNotFoundError`).
    CheckpointError: an empty, truncated, damaged or non-GGUF file, an
      unsupported architecture, a missing or malformed hyperparameter, a
      tensor with no HF equivalent (e.g. llama-3 ``rope_freqs.weight``) or of
      an integer type, or a NaN or inf weight (after dequantization). The
      message names the file and the tensor.

  References:
    llama.cpp ``convert_hf_to_gguf.py`` (``LlamaModel.permute``);
    transformers ``modeling_gguf_pytorch_utils.py`` (``LlamaTensorProcessor``).
  """
  return _read(os.fspath(path), check_finite=True)


def _read(path: str, *, check_finite: bool) -> GGUFCheckpoint:
  """`read_gguf`; `check_finite=False` leaves NaN/inf to the caller."""
  reader = _open(path)
  try:
    config = _config(reader, path)
  except CheckpointError:
    raise
  except (
    AttributeError,
    IndexError,
    KeyError,
    TypeError,
    ValueError,
    ZeroDivisionError,
  ) as e:
    # A value of the wrong type (a string head count) or 0 heads.
    raise CheckpointError(f"{path} has malformed metadata ({e}). {_FIX}") from e
  # Only llama.cpp's LlamaModel converter permutes Q/K; qwen2/qwen3 do not.
  permuted = {}
  if config["model_type"] == "llama":
    permuted = {
      "attn_q": config["num_attention_heads"],
      "attn_k": config["num_key_value_heads"],
    }
  tensors = dict(
    _hf_tensor(t, permuted, path, check_finite) for t in reader.tensors
  )
  if "model.embed_tokens.weight" not in tensors:
    raise MissingTensorError(
      f"{path} has no tensor 'token_embd.weight' (model.embed_tokens.weight);"
      f" the file is incomplete. {_FIX}"
    )
  config["vocab_size"] = tensors["model.embed_tokens.weight"].shape[0]
  config["tie_word_embeddings"] = "lm_head.weight" not in tensors
  return GGUFCheckpoint(config, tensors)


class _ShortRead(Exception):
  """A read past the end of a GGUF file.

  Attributes:
    offset: where the read started.
    tensor: the tensor whose data was read, if it was tensor data.
  """

  def __init__(self, offset: int):
    super().__init__(offset)
    self.offset = offset
    self.tensor = None


class _Reader(gguf.GGUFReader):
  """A `gguf.GGUFReader` that raises `_ShortRead` on reading past the end.

  The stock reader slices its memmap past the end, which silently gives a
  short array, and then fails later with an unrelated reshape or index error.
  """

  def _get(self, offset, dtype, count=1, *args, **kwargs):
    if int(offset) + np.dtype(dtype).itemsize * int(count) > self.data.size:
      raise _ShortRead(int(offset))
    return super()._get(offset, dtype, count, *args, **kwargs)

  def _build_tensors(self, start_offs, fields):
    try:
      super()._build_tensors(start_offs, fields)
    except _ShortRead as e:
      # A tensor info field's last part is its data offset.
      starts = {start_offs + int(f.parts[-1][0]): f.name for f in fields}
      e.tensor = starts.get(e.offset)
      raise


def _open(path: str) -> gguf.GGUFReader:
  """A reader of the GGUF file `path`, or a `CheckpointError` saying why not."""
  if os.path.isdir(path):
    raise CheckpointError(
      f"{path} is a directory, not a GGUF file; load a Hugging Face"
      " checkpoint directory with rljax.checkpoints.load_hf."
    )
  if not os.path.isfile(path):
    raise CheckpointNotFoundError(
      f"GGUF file not found: {path!r}; check the path."
    )
  try:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
      head = f.read(9)
  except OSError as e:
    raise CheckpointError(f"{path} cannot be read: {e}") from e
  if size == 0:
    raise CheckpointError(f"{path} is empty. {_FIX}")
  if head[:4] != b"GGUF":
    # A safetensors file: an 8-byte header length, then a JSON object.
    if head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < size:
      raise CheckpointError(
        f"{path} is a safetensors file, not GGUF; load its directory (with"
        " config.json) with rljax.checkpoints.load_hf."
      )
    raise CheckpointError(
      f"{path} is not a GGUF file (it does not start with the bytes 'GGUF');"
      f" it is damaged or of another format. {_FIX}"
    )
  try:
    return _Reader(path)
  except _ShortRead as e:
    part = "its header" if e.tensor is None else f"tensor {e.tensor!r}"
    raise CheckpointError(
      f"{path} is truncated or damaged: {part} runs past the end of the file"
      f" ({size} bytes). {_FIX}"
    ) from e
  except Exception as e:
    # gguf's reader fails on damaged bytes in many ways (ValueError,
    # KeyError, OverflowError, UnicodeDecodeError, ...).
    raise CheckpointError(
      f"{path} is damaged: gguf cannot parse it ({type(e).__name__}: {e})."
      f" {_FIX}"
    ) from e


def _config(reader: gguf.GGUFReader, path: str) -> dict[str, Any]:
  """Translates the GGUF metadata into a transformers config dict."""
  get = lambda key, default=None: (
    default if (f := reader.get_field(key)) is None else f.contents()
  )
  arch = get("general.architecture")
  if isinstance(arch, str) and arch.startswith("gemma"):
    raise CheckpointError(
      f"{path}: GGUF general.architecture {arch!r} is not supported: rljax"
      " does not read Gemma GGUF files (llama.cpp stores Gemma's norms as"
      " 1 + w and its own layout). Load the Hugging Face safetensors"
      " checkpoint with rljax.checkpoints.load_hf instead."
    )
  if arch not in _ARCHITECTURES:
    raise CheckpointError(
      f"{path}: unsupported GGUF general.architecture {arch!r}; supported"
      f" values are {sorted(_ARCHITECTURES)}."
    )
  model_type, hf_class = _ARCHITECTURES[arch]
  config = {"architectures": [hf_class], "model_type": model_type}
  for hf_key, (key, default) in _CONFIG_KEYS.items():
    config[hf_key] = _number(get(f"{arch}.{key}", default))
    if config[hf_key] is None:
      raise CheckpointError(
        f"{path} lacks the required metadata key '{arch}.{key}'. {_FIX}"
      )
  _check_sizes(config, path, arch)
  # Both default from the head count, as in llama.cpp's hparams loader.
  config["num_key_value_heads"] = get(
    f"{arch}.attention.head_count_kv", config["num_attention_heads"]
  )
  config["head_dim"] = get(
    f"{arch}.attention.key_length",
    config["hidden_size"] // config["num_attention_heads"],
  )
  _check_sizes(config, path, arch)
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


def _check_sizes(config: dict[str, Any], path: str, arch: str) -> None:
  """Raise unless the sizes in `config` so far are integers (heads > 0)."""
  for key in _SIZES:
    value = config.get(key)
    # Heads divide and split tensors here; `ModelConfig` checks the rest.
    least = 1 if key.endswith("heads") else 0
    if key in config and (type(value) is not int or value < least):
      raise CheckpointError(
        f"{path} has malformed metadata: {key} (from the GGUF keys under"
        f" '{arch}.') is {value!r}, not an integer >= {least}. {_FIX}"
      )


def _number(value: Any) -> Any:
  """Rounds a float32-stored float to its shortest decimal (1e-05 not 9.99e-06)."""
  return float(str(np.float32(value))) if isinstance(value, float) else value


def _hf_tensor(
  tensor, permuted: dict[str, int], path: str, check_finite: bool
) -> tuple[str, np.ndarray]:
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
    raise CheckpointError(
      f"{path}: GGUF tensor {tensor.name!r} has no Hugging Face equivalent;"
      " rljax reads llama, qwen2 and qwen3 weights only."
    )
  kind = tensor.tensor_type.name
  if tensor.tensor_type in _INTEGER_TYPES:
    raise CheckpointError(
      f"{path}: tensor {tensor.name!r} has type {kind}; weights must be"
      f" floating point or quantized. {_FIX}"
    )
  # A plain ndarray view dequantizes 2x faster than the np.memmap subclass.
  try:
    weights = gguf.quants.dequantize(
      np.asarray(tensor.data), tensor.tensor_type
    )
  except (NotImplementedError, ValueError) as e:
    raise CheckpointError(
      f"{path}: tensor {tensor.name!r} of type {kind} cannot be dequantized"
      f" ({type(e).__name__}: {e}); re-download the file, or convert the"
      " model to a type that gguf reads, such as Q8_0 or F16."
    ) from e
  if not weights.flags.writeable:  # F32 comes back as a view of the file.
    weights = weights.copy()
  weights = weights.astype(np.float32, copy=False)
  if check_finite and (bad := count_nonfinite(weights)):
    raise CheckpointError(
      f"{path}: tensor {tensor.name!r} has non-finite entries (NaN or inf):"
      f" {bad} of {weights.size} (stored as {kind}"
      f"{'' if tensor.tensor_type in _FLOAT_TYPES else ', dequantized'});"
      f" training from it would diverge. {_FIX}"
    )
  if parts[-1] in permuted:
    heads = permuted[parts[-1]]
    if not weights.shape or weights.shape[0] % (2 * heads):
      raise CheckpointError(
        f"{path}: tensor {tensor.name!r} has shape {weights.shape}, which"
        f" does not split into {heads} heads of even size. {_FIX}"
      )
    weights = _unpermute(weights, heads)
  return f"{hf_stem}.{suffix}", weights


def _gguf_name(hf_name: str) -> str:
  """The GGUF name of an HF tensor name (the inverse of `_hf_tensor`)."""
  stem, _, suffix = hf_name.rpartition(".")
  if stem in _HF_GLOBAL:
    return f"{_HF_GLOBAL[stem]}.{suffix}"
  parts = stem.split(".", 3)  # model, layers, i, rest
  if len(parts) == 4 and parts[:2] == ["model", "layers"]:
    if parts[3] in _HF_LAYER:
      return f"blk.{parts[2]}.{_HF_LAYER[parts[3]]}.{suffix}"
  return hf_name


def _unpermute(w: np.ndarray, num_heads: int) -> np.ndarray:
  """Inverts llama.cpp's per-head RoPE row permutation (interleaved -> halves)."""
  head = w.reshape(num_heads, w.shape[0] // num_heads // 2, 2, *w.shape[1:])
  return head.swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: str | os.PathLike, **overrides) -> Transformer:
  """A `Transformer` from a llama/qwen2/qwen3 GGUF file (see `read_gguf`).

  Every tensor is checked once, after dequantization and the cast to the
  parameter dtype: its presence, shape and that every entry is finite.

  Args:
    path: the ``.gguf`` file; quantized tensors are dequantized to float32.
    **overrides: `ModelConfig` fields to set, e.g. ``dtype="bfloat16"``.

  Returns:
    The model, every parameter from the file.

  Raises:
    CheckpointNotFoundError: ``path`` does not exist.
    CheckpointError: as `read_gguf`, and for a missing tensor or one of the
      wrong shape; the message names the file and the GGUF tensor.
  """
  path = os.fspath(path)
  checkpoint = _read(path, check_finite=False)  # checked once, below
  config = _config_from_hf(checkpoint.config, f"{path} metadata", **overrides)
  where = _Where(checkpoint=path, rename=_gguf_name, fix=_FIX)
  return _model(config, checkpoint.tensors, where)
