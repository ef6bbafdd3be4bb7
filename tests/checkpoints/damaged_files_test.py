"""Damaged checkpoint files: one `CheckpointError` naming file and tensor.

Each test writes a tiny valid checkpoint (an HF directory with `save_hf`, a
GGUF file with gguf's `GGUFWriter`), damages it in one way (truncation,
garbage, the wrong format, a bad config, a missing, misshapen, integer or
non-finite tensor) and checks that loading raises a `CheckpointError` whose
message names the file, the tensor where there is one, and what to do.
"""

from functools import partial
import json
import shutil
import struct

import gguf
import numpy as np
import pytest
import safetensors.numpy

from rljax import checkpoints
from rljax._src.errors import CheckpointError
from rljax.models import ModelConfig
from rljax.testing import random_model

# Qwen2 (biases, untied): every dimension a multiple of 32, so that any
# matrix can be stored as Q8_0 (one scale per 32 values along a row).
_CONFIG = ModelConfig(
  vocab_size=32,
  hidden_size=32,
  intermediate_size=32,
  num_layers=2,
  num_heads=2,
  num_kv_heads=1,
  head_dim=16,
  qkv_bias=True,
  tie_embeddings=False,
)
_UP = "model.layers.1.mlp.up_proj.weight"
_GGUF_UP = "blk.1.ffn_up.weight"


def _raises(load, *fragments) -> CheckpointError:
  """The `CheckpointError` `load()` raises; its message has `fragments`."""
  with pytest.raises(CheckpointError) as info:
    load()
  for fragment in fragments:
    assert str(fragment) in str(info.value), (fragment, str(info.value))
  return info.value


@pytest.fixture(scope="module")
def hf_tensors():
  return checkpoints.hf_tensors(random_model(_CONFIG))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, hf_tensors):
  """A valid HF directory, read-only by convention: copy before damaging."""
  path = tmp_path_factory.mktemp("pristine")
  checkpoints.save_hf(random_model(_CONFIG), path)
  return path


@pytest.fixture
def hf_dir(pristine, tmp_path):
  """A fresh copy of `pristine` to damage."""
  return shutil.copytree(pristine, tmp_path / "hf")


def _save(directory, tensors):
  safetensors.numpy.save_file(
    tensors, directory / "model.safetensors", metadata={"format": "pt"}
  )
  return directory / "model.safetensors"


# --- HF safetensors ----------------------------------------------------------


def test_pristine_files_load(hf_dir, gguf_path):
  assert checkpoints.load_hf(hf_dir).config == _CONFIG
  assert checkpoints.load_gguf(gguf_path).config.num_layers == 2


def _header(path):
  """(header length, JSON header) of a safetensors file, read by hand."""
  raw = path.read_bytes()
  (n,) = struct.unpack("<Q", raw[:8])
  return n, json.loads(raw[8 : 8 + n])


def _cuts(path):
  """name -> (offset to cut at, what the message must name)."""
  n, header = _header(path)
  size = path.stat().st_size
  begin, end = header[_UP]["data_offsets"]
  return {
    "empty": (0, "empty"),
    "inside the length": (5, "only 5 bytes"),
    "inside the header": (8 + n // 2, f"declares a {n}-byte header"),
    "after the header": (8 + n, "is truncated"),
    "inside a tensor": (8 + n + (begin + end) // 2, repr(_UP)),
    "last byte": (size - 1, "is truncated"),
  }


@pytest.mark.parametrize(
  "cut",
  [
    "empty",
    "inside the length",
    "inside the header",
    "after the header",
    "inside a tensor",
    "last byte",
  ],
)
def test_truncated_safetensors(hf_dir, cut):
  path = hf_dir / "model.safetensors"
  offset, names = _cuts(path)[cut]
  path.write_bytes(path.read_bytes()[:offset])
  _raises(lambda: checkpoints.load_hf(hf_dir), path, names, "Re-download")


def test_garbage_safetensors(hf_dir):
  path = hf_dir / "model.safetensors"
  size = path.stat().st_size
  path.write_bytes(np.random.default_rng(0).bytes(size))
  _raises(lambda: checkpoints.load_hf(hf_dir), path, "not a safetensors file")


def test_garbage_tensor_data(hf_dir):
  # The header survives; every byte of the data is 0xff, a float32 NaN.
  path = hf_dir / "model.safetensors"
  n, header = _header(path)
  raw = path.read_bytes()
  path.write_bytes(raw[: 8 + n] + b"\xff" * (len(raw) - 8 - n))
  _raises(lambda: checkpoints.load_hf(hf_dir), path, "NaN or inf")


@pytest.mark.parametrize(
  "entry",
  [
    {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]},
    {"dtype": "F32", "shape": [2, "x"], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": [4]},
    [1, 2],
  ],
)
def test_malformed_header_entry(hf_dir, entry):
  header = json.dumps({"model.norm.weight": entry}).encode()
  path = hf_dir / "model.safetensors"
  path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
  _raises(
    lambda: checkpoints.load_hf(hf_dir), path, "'model.norm.weight'", "damaged"
  )


def test_gguf_given_to_load_hf(hf_dir, gguf_path):
  shutil.copy(gguf_path, hf_dir / "model.safetensors")
  _raises(
    lambda: checkpoints.load_hf(hf_dir),
    hf_dir / "model.safetensors",
    "is a GGUF file",
    "load_gguf",
  )


def test_missing_config_json(hf_dir):
  (hf_dir / "config.json").unlink()
  error = _raises(lambda: checkpoints.load_hf(hf_dir), hf_dir / "config.json")
  assert isinstance(error, FileNotFoundError)  # as before


@pytest.mark.parametrize(
  "text, says",
  [
    ("{not json", "not valid JSON"),
    ("", "not valid JSON"),
    ("\x00\xff\xfe garbage", "not valid JSON"),
    ("[1, 2]", "holds a JSON list"),
    (None, "'big'"),  # hidden_size="big"
    ({"hidden_size": 0}, "hidden_size"),
    ({"rope_scaling": {"rope_type": "llama3"}}, "'factor'"),
    ({"rope_parameters": [1]}, "invalid value"),
    ({"num_attention_heads": 0}, "num_attention_heads=0"),
  ],
)
def test_malformed_config_json(hf_dir, text, says):
  path = hf_dir / "config.json"
  if not isinstance(text, str):
    hf = json.loads(path.read_text())
    text = json.dumps(hf | (text or {"hidden_size": "big"}))
  path.write_bytes(text.encode("latin-1"))
  error = _raises(lambda: checkpoints.load_hf(hf_dir), path, says)
  assert "Traceback" not in str(error)


def test_config_json_error_chains_the_cause(hf_dir):
  (hf_dir / "config.json").write_text("{not json")
  error = _raises(lambda: checkpoints.load_hf(hf_dir))
  assert isinstance(error.__cause__, json.JSONDecodeError)


def test_missing_tensor_in_file(hf_dir, hf_tensors):
  path = _save(hf_dir, {k: v for k, v in hf_tensors.items() if k != _UP})
  error = _raises(
    lambda: checkpoints.load_hf(hf_dir), path, repr(_UP), "Re-download"
  )
  assert isinstance(error, KeyError)  # as before


def test_wrong_shape_in_file(hf_dir, hf_tensors):
  path = _save(hf_dir, hf_tensors | {_UP: np.zeros((32, 31), np.float32)})
  _raises(
    lambda: checkpoints.load_hf(hf_dir),
    path,
    f"tensor {_UP!r} has shape (32, 31)",
    "expects (32, 32)",
  )


def test_integer_tensor_in_file(hf_dir, hf_tensors):
  path = _save(hf_dir, hf_tensors | {_UP: np.zeros((32, 32), np.int32)})
  _raises(lambda: checkpoints.load_hf(hf_dir), path, repr(_UP), "I32")


def test_integer_tensor_given_to_load_hf_tensors(hf_tensors):
  tensors = hf_tensors | {_UP: np.ones((32, 32), np.int64)}
  model = random_model(_CONFIG)
  _raises(
    lambda: checkpoints.load_hf_tensors(model, tensors), repr(_UP), "int64"
  )


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weight_in_file(hf_dir, hf_tensors, bad):
  up = hf_tensors[_UP].copy()
  up[3, :5] = bad
  path = _save(hf_dir, hf_tensors | {_UP: up})
  _raises(
    lambda: checkpoints.load_hf(hf_dir), path, repr(_UP), "5 of 1024", "NaN"
  )


def test_non_finite_every_tensor_is_checked(hf_dir, hf_tensors):
  for name in hf_tensors:
    value = hf_tensors[name].copy()
    value.flat[-1] = np.nan
    _save(hf_dir, hf_tensors | {name: value})
    _raises(lambda: checkpoints.load_hf(hf_dir), repr(name), "1 of")


def test_overflow_to_bfloat16_is_refused(hf_dir, hf_tensors):
  up = hf_tensors[_UP].copy()
  up[0, 0] = 3.4e38  # finite in float32, inf in bfloat16
  _save(hf_dir, hf_tensors | {_UP: up})
  checkpoints.load_hf(hf_dir)  # float32 parameters hold it
  _raises(
    lambda: checkpoints.load_hf(hf_dir, param_dtype="bfloat16"),
    repr(_UP),
    "1 of 1024 as bfloat16",
  )


def test_non_finite_given_to_model_from_tensors(hf_tensors):
  tensors = hf_tensors | {"model.norm.weight": np.full(32, np.nan, np.float32)}
  _raises(
    lambda: checkpoints.model_from_tensors(_CONFIG, tensors),
    "'model.norm.weight'",
    "32 of 32",
  )


# --- GGUF ----------------------------------------------------------------------

# HF name fragment -> GGUF name fragment, written out independently of _gguf.
_TO_GGUF = [
  ("model.embed_tokens", "token_embd"),
  ("model.norm", "output_norm"),
  ("lm_head", "output"),
  ("model.layers.", "blk."),
  ("input_layernorm", "attn_norm"),
  ("post_attention_layernorm", "ffn_norm"),
  ("self_attn.q_proj", "attn_q"),
  ("self_attn.k_proj", "attn_k"),
  ("self_attn.v_proj", "attn_v"),
  ("self_attn.o_proj", "attn_output"),
  ("mlp.gate_proj", "ffn_gate"),
  ("mlp.up_proj", "ffn_up"),
  ("mlp.down_proj", "ffn_down"),
]
_Q8_0 = gguf.GGMLQuantizationType.Q8_0


def _gguf_name(name):
  for hf, gg in _TO_GGUF:
    name = name.replace(hf, gg)
  return name


def _write_gguf(path, tensors, *, heads=2, skip=(), raw=None):
  """A qwen2 GGUF of HF `tensors` (no Q/K permutation for qwen2); the
  output matrix is Q8_0, `raw` replaces GGUF tensors by (bytes, shape, type).
  """
  w = gguf.GGUFWriter(str(path), "qwen2")
  w.add_block_count(_CONFIG.num_layers)
  w.add_context_length(_CONFIG.max_position_embeddings)
  w.add_embedding_length(_CONFIG.hidden_size)
  w.add_feed_forward_length(_CONFIG.intermediate_size)
  if heads is not None:
    w.add_head_count(heads)
  w.add_head_count_kv(_CONFIG.num_kv_heads)
  w.add_layer_norm_rms_eps(_CONFIG.rms_norm_eps)
  w.add_rope_freq_base(_CONFIG.rope_theta)
  raw = raw or {}
  for hf_name, x in tensors.items():
    name = _gguf_name(hf_name)
    if name in skip:
      continue
    if name in raw:
      data, shape, kind = raw[name]
      w.add_tensor(name, data, raw_shape=shape, raw_dtype=kind)
    elif name == "output.weight":
      q = gguf.quants.quantize(x, _Q8_0)
      w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=_Q8_0)
    else:
      w.add_tensor(name, x)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


@pytest.fixture(scope="module")
def pristine_gguf(tmp_path_factory, hf_tensors):
  return _write_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf", hf_tensors)


@pytest.fixture
def gguf_path(pristine_gguf, tmp_path):
  """A fresh copy of `pristine_gguf` to damage."""
  return shutil.copy(pristine_gguf, tmp_path / "model.gguf")


def _gguf_cuts(path):
  """name -> (offset to cut at, what the message must name)."""
  reader = gguf.GGUFReader(path)
  up = next(t for t in reader.tensors if t.name == _GGUF_UP)
  last = max(reader.tensors, key=lambda t: t.data_offset)
  # Field offsets: where each metadata entry and tensor description starts.
  metadata = reader.fields["general.architecture"].offset
  tensor_list = reader.tensors[1].field.offset
  return {
    "empty": (0, "empty"),
    "inside the magic": (2, "not a GGUF file"),
    "inside the counts": (12, "its header"),
    "inside the metadata": (metadata + 10, "its header"),
    "inside the tensor list": (tensor_list + 10, "its header"),
    "inside a tensor": (up.data_offset + up.n_bytes // 2, repr(_GGUF_UP)),
    "inside the last tensor": (
      last.data_offset + last.n_bytes - 1,
      repr(last.name),
    ),
  }


@pytest.mark.parametrize(
  "cut",
  [
    "empty",
    "inside the magic",
    "inside the counts",
    "inside the metadata",
    "inside the tensor list",
    "inside a tensor",
    "inside the last tensor",
  ],
)
def test_truncated_gguf(gguf_path, cut):
  offset, names = _gguf_cuts(gguf_path)[cut]
  raw = open(gguf_path, "rb").read()
  open(gguf_path, "wb").write(raw[:offset])
  _raises(lambda: checkpoints.load_gguf(gguf_path), gguf_path, names, "GGUF")
  _raises(lambda: checkpoints.read_gguf(gguf_path), gguf_path, names)


@pytest.mark.parametrize("keep", [0, 8])
def test_garbage_gguf(gguf_path, keep):
  # keep=8: the magic and version survive, the rest is random.
  raw = open(gguf_path, "rb").read()
  garbage = np.random.default_rng(keep).bytes(len(raw) - keep)
  open(gguf_path, "wb").write(raw[:keep] + garbage)
  _raises(lambda: checkpoints.load_gguf(gguf_path), gguf_path, "Re-download")


def test_safetensors_given_to_load_gguf(pristine):
  path = pristine / "model.safetensors"
  _raises(
    lambda: checkpoints.load_gguf(path),
    path,
    "is a safetensors file",
    "load_hf",
  )


def test_directory_given_to_load_gguf(pristine):
  _raises(lambda: checkpoints.load_gguf(pristine), pristine, "load_hf")


def test_missing_file_given_to_load_gguf(tmp_path):
  error = _raises(
    lambda: checkpoints.load_gguf(tmp_path / "no.gguf"), "no.gguf"
  )
  assert isinstance(error, FileNotFoundError)  # as before


def test_missing_metadata_in_gguf(tmp_path, hf_tensors):
  path = _write_gguf(tmp_path / "m.gguf", hf_tensors, heads=None)
  _raises(
    lambda: checkpoints.load_gguf(path), path, "'qwen2.attention.head_count'"
  )


def test_zero_heads_in_gguf(tmp_path, hf_tensors):
  path = _write_gguf(tmp_path / "m.gguf", hf_tensors, heads=0)
  _raises(
    lambda: checkpoints.load_gguf(path),
    path,
    "malformed metadata: num_attention_heads",
  )


@pytest.mark.parametrize("missing", [_GGUF_UP, "token_embd.weight"])
def test_missing_tensor_in_gguf(tmp_path, hf_tensors, missing):
  path = _write_gguf(tmp_path / "m.gguf", hf_tensors, skip={missing})
  error = _raises(lambda: checkpoints.load_gguf(path), path, repr(missing))
  assert isinstance(error, KeyError)


def test_wrong_shape_in_gguf(tmp_path, hf_tensors):
  up = np.zeros((31, 32), np.float32)
  path = _write_gguf(tmp_path / "m.gguf", hf_tensors | {_UP: up})
  _raises(
    lambda: checkpoints.load_gguf(path),
    path,
    f"{_GGUF_UP!r} ({_UP}) has shape (31, 32)",
  )


def test_integer_tensor_in_gguf(tmp_path, hf_tensors):
  up = np.ones((32, 32), np.int32)
  path = _write_gguf(tmp_path / "m.gguf", hf_tensors | {_UP: up})
  _raises(lambda: checkpoints.load_gguf(path), path, repr(_GGUF_UP), "I32")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_weight_in_gguf(tmp_path, hf_tensors, bad):
  up = hf_tensors[_UP].copy()
  up[:2, 7] = bad
  path = _write_gguf(tmp_path / "m.gguf", hf_tensors | {_UP: up})
  for load in (checkpoints.load_gguf, checkpoints.read_gguf):
    _raises(partial(load, path), path, repr(_GGUF_UP), "2 of 1024", "NaN")


def test_non_finite_after_dequantization(tmp_path, hf_tensors):
  # Q8_0 blocks are a float16 scale and 32 int8s; a NaN scale makes its
  # whole block NaN, which only shows once the tensor is dequantized.
  q = gguf.quants.quantize(hf_tensors["lm_head.weight"], _Q8_0)
  q[5, :2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
  raw = {"output.weight": (q, q.shape, _Q8_0)}
  path = _write_gguf(tmp_path / "m.gguf", hf_tensors, raw=raw)
  for load in (checkpoints.load_gguf, checkpoints.read_gguf):
    _raises(partial(load, path), path, "'output.weight'", "32 of 1024")
