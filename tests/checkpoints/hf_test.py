"""Hugging Face checkpoints: logits parity with transformers, round trips,
both config.json styles and clear errors on bad checkpoints.

The parity peer is transformers on CPU torch (the `test` extra); tiny random
models are built and saved locally, nothing comes from the hub.
"""

import functools
import json
import re

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from rljax import checkpoints
from rljax.models import ModelConfig
from rljax.models import RopeScaling
from rljax.models import Transformer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_COMMON = dict(
  vocab_size=64,
  hidden_size=32,
  intermediate_size=48,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  rms_norm_eps=1e-5,
  max_position_embeddings=64,
  attn_implementation="eager",
)
_LLAMA3 = dict(
  rope_type="llama3",
  rope_theta=500_000.0,
  factor=8.0,
  low_freq_factor=1.0,
  high_freq_factor=4.0,
  # Small, so the 10-token test sequences reach every frequency band.
  original_max_position_embeddings=16,
)
_KINDS = {
  # name: (config class, model class, extra config)
  "llama_tied": (
    "LlamaConfig",
    "LlamaForCausalLM",
    dict(head_dim=8, tie_word_embeddings=True),
  ),
  "llama3_rope": (
    "LlamaConfig",
    "LlamaForCausalLM",
    dict(head_dim=16, tie_word_embeddings=False, rope_parameters=_LLAMA3),
  ),
  "qwen2": (
    "Qwen2Config",
    "Qwen2ForCausalLM",
    dict(
      tie_word_embeddings=False,
      rope_parameters=dict(rope_type="default", rope_theta=5_000.0),
    ),
  ),
  "qwen3": (
    "Qwen3Config",
    "Qwen3ForCausalLM",
    # head_dim 16 != hidden_size / heads = 8: the qk-norm acts per head.
    dict(head_dim=16, tie_word_embeddings=False),
  ),
}


def _hf_model(kind, seed=0):
  """A tiny random transformers model whose norms and biases all matter."""
  config_cls, model_cls, extra = _KINDS[kind]
  config = getattr(transformers, config_cls)(**_COMMON, **extra)
  torch.manual_seed(seed)
  model = getattr(transformers, model_cls)(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.3 * torch.randn_like(p))
      else:
        p.copy_(0.2 * torch.randn_like(p))
  return model


def _batch(seed=0):
  """Three rows of 10 tokens, left-padded by 0, 3 and 6."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, _COMMON["vocab_size"], (3, 10))
  mask = np.ones((3, 10), np.int64)
  for row, pad in enumerate([0, 3, 6]):
    mask[row, :pad] = 0
    tokens[row, :pad] = 0
  return tokens, mask


def _hf_logits(model, tokens, mask):
  # transformers' forward does not derive positions from the padding mask
  # (generate() does); pass the same positions rljax uses.
  positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
  with torch.no_grad():
    out = model(
      input_ids=torch.from_numpy(tokens),
      attention_mask=torch.from_numpy(mask),
      position_ids=torch.from_numpy(positions),
    )
  return out.logits.numpy()


@functools.partial(
  jax.jit,
  static_argnums=0,
  compiler_options={"xla_backend_optimization_level": 0},
)
def _forward_split(graphdef, state, tokens, mask):
  return nnx.merge(graphdef, state)(tokens, mask)[0]


def _logits(model, tokens, mask):
  """rljax logits (jitted at XLA optimisation level 0: compiles faster)."""
  out = _forward_split(*nnx.split(model), jnp.asarray(tokens), mask)
  return np.asarray(out)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """kind -> (transformers model, its save_pretrained directory)."""
  out = {}
  for kind in _KINDS:
    model = _hf_model(kind)
    path = tmp_path_factory.mktemp(kind)
    model.save_pretrained(path)
    out[kind] = model, path
  return out


def _params(model):
  return {
    "/".join(map(str, path)): np.asarray(node[...])
    for path, node in nnx.iter_graph(model)
    if isinstance(node, nnx.Param)
  }


@pytest.mark.parametrize("kind", list(_KINDS))
def test_logits_match_transformers(saved, kind):
  hf_model, path = saved[kind]
  model = checkpoints.load_hf(path)
  tokens, mask = _batch()
  real = mask.astype(bool)
  expected = _hf_logits(hf_model, tokens, mask)[real]
  got = _logits(model, tokens, mask)[real]
  assert np.abs(expected).max() > 1.0  # logits far from uniform
  np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_loaded_configs(saved):
  llama = checkpoints.load_hf(saved["llama_tied"][1]).config
  assert llama.tie_embeddings and not llama.qkv_bias and not llama.qk_norm
  llama3 = checkpoints.load_hf(saved["llama3_rope"][1]).config
  assert llama3.rope_theta == 500_000.0 and not llama3.tie_embeddings
  assert llama3.rope_scaling == RopeScaling(
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=16,
  )
  qwen2 = checkpoints.load_hf(saved["qwen2"][1]).config
  assert qwen2.qkv_bias and not qwen2.qk_norm and qwen2.rope_theta == 5_000.0
  qwen3 = checkpoints.load_hf(saved["qwen3"][1]).config
  assert qwen3.qk_norm and not qwen3.qkv_bias and qwen3.head_dim == 16


def _old_style(hf):
  """A transformers-4 config.json: top-level rope_theta and rope_scaling."""
  hf = dict(hf)
  rope = dict(hf.pop("rope_parameters"))
  hf["rope_theta"] = rope.pop("rope_theta")
  hf["rope_scaling"] = None if rope["rope_type"] == "default" else rope
  return hf


@pytest.mark.parametrize("kind", list(_KINDS))
def test_config_json_styles_agree(saved, kind):
  hf = json.loads((saved[kind][1] / "config.json").read_text())
  assert "rope_parameters" in hf and "rope_theta" not in hf  # transformers 5
  assert checkpoints.config_from_hf(hf) == checkpoints.config_from_hf(
    _old_style(hf)
  )


def test_config_from_old_style_dict_by_hand():
  hf = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "rope_theta": 500000.0,
    "rope_scaling": {
      "type": "llama3",
      "factor": 32.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": True,
  }
  scaling = RopeScaling(
    factor=32.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
  )
  # head_dim = hidden_size / heads = 64 / 8 = 8; Llama's defaults elsewhere.
  assert checkpoints.config_from_hf(hf, dtype="bfloat16") == ModelConfig(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_layers=3,
    num_heads=8,
    num_kv_heads=2,
    head_dim=8,
    rope_theta=500000.0,
    rope_scaling=scaling,
    rms_norm_eps=1e-6,
    tie_embeddings=True,
    max_position_embeddings=2048,
    dtype="bfloat16",
  )


def test_config_family_defaults():
  hf = {
    "vocab_size": 16,
    "hidden_size": 32,
    "intermediate_size": 8,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
  }
  qwen3 = checkpoints.config_from_hf(
    hf | {"architectures": ["Qwen3ForCausalLM"]}
  )
  # transformers' Qwen3Config defaults head_dim to 128 (not 32 / 4).
  assert qwen3.head_dim == 128 and qwen3.num_kv_heads == 4
  assert qwen3.max_position_embeddings == 32768 and not qwen3.tie_embeddings
  qwen2 = checkpoints.config_from_hf(
    hf | {"architectures": ["Qwen2ForCausalLM"]}
  )
  assert qwen2.head_dim == 8 and qwen2.qkv_bias and not qwen2.qk_norm


@pytest.mark.parametrize("kind", list(_KINDS))
def test_export_round_trip(saved, kind, tmp_path):
  hf_model, path = saved[kind]
  model = checkpoints.load_hf(path)
  checkpoints.save_hf(model, tmp_path)
  assert sorted(p.name for p in tmp_path.iterdir()) == [
    "config.json",
    "model.safetensors",
  ]
  # Bitwise: HF tensors -> rljax -> HF tensors, and the re-imported model.
  original = safetensors.numpy.load_file(path / "model.safetensors")
  exported = safetensors.numpy.load_file(tmp_path / "model.safetensors")
  assert sorted(original) == sorted(exported)
  for name, value in original.items():
    np.testing.assert_array_equal(exported[name], value, err_msg=name)
  reloaded = checkpoints.load_hf(tmp_path)
  assert reloaded.config == model.config
  before, after = _params(model), _params(reloaded)
  assert sorted(before) == sorted(after)
  for name in before:
    np.testing.assert_array_equal(after[name], before[name], err_msg=name)
  # transformers reads the export back into the same model.
  hf_reloaded = transformers.AutoModelForCausalLM.from_pretrained(
    tmp_path, attn_implementation="eager"
  ).eval()
  assert type(hf_reloaded) is type(hf_model)
  tokens, mask = _batch(seed=1)
  real = mask.astype(bool)
  expected = _hf_logits(hf_model, tokens, mask)[real]
  np.testing.assert_allclose(
    _hf_logits(hf_reloaded, tokens, mask)[real], expected, atol=1e-6, rtol=0
  )
  np.testing.assert_allclose(
    _logits(reloaded, tokens, mask)[real], expected, atol=1e-4, rtol=0
  )


def _rljax_model(config, seed=0):
  """An rljax model with random weights, filled from numpy."""
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(seed)
  for _, node in nnx.iter_graph(model):
    if isinstance(node, nnx.Param):
      value = rng.standard_normal(node.shape).astype(jnp.dtype(node.dtype))
      node.set_value(jnp.asarray(value))
  return model


_SMALL = ModelConfig(
  vocab_size=16,
  hidden_size=8,
  intermediate_size=12,
  num_layers=2,
  num_heads=2,
  num_kv_heads=1,
  head_dim=4,
  qkv_bias=True,
  tie_embeddings=False,
)


def test_rljax_model_round_trips_exactly(tmp_path):
  model = _rljax_model(_SMALL)
  checkpoints.save_hf(model, tmp_path)
  reloaded = checkpoints.load_hf(tmp_path)
  assert reloaded.config == _SMALL
  before, after = _params(model), _params(reloaded)
  for name in before:
    np.testing.assert_array_equal(after[name], before[name], err_msg=name)
  hf = json.loads((tmp_path / "config.json").read_text())
  assert hf["architectures"] == ["Qwen2ForCausalLM"]


def test_bfloat16_checkpoint_loads(tmp_path):
  hf_model = _hf_model("qwen3", seed=3).to(torch.bfloat16)
  hf_model.save_pretrained(tmp_path)
  model = checkpoints.load_hf(tmp_path, param_dtype="bfloat16")
  assert model.layers.q_proj[...].dtype == jnp.bfloat16
  q = hf_model.model.layers[1].self_attn.q_proj.weight.detach().float()
  np.testing.assert_array_equal(
    np.asarray(model.layers.q_proj[...][1], np.float32).reshape(32, -1),
    q.numpy().T,
  )
  tokens, mask = _batch()
  real = mask.astype(bool)
  expected = _hf_logits(hf_model.float(), tokens, mask)[real]
  got = _logits(model, tokens, mask)[real]
  np.testing.assert_allclose(got, expected, atol=0.1 * np.abs(expected).max())


# Bad checkpoints.


@pytest.fixture
def small_dir(tmp_path):
  checkpoints.save_hf(_rljax_model(_SMALL), tmp_path)
  return tmp_path


def _edit_config(path, **changes):
  hf = json.loads((path / "config.json").read_text())
  (path / "config.json").write_text(json.dumps(hf | changes))


def test_unknown_architecture(small_dir):
  _edit_config(small_dir, architectures=["MistralForCausalLM"])
  with pytest.raises(ValueError, match="architectures.*MistralForCausalLM"):
    checkpoints.load_hf(small_dir)
  with pytest.raises(ValueError, match="architectures"):
    checkpoints.config_from_hf({"hidden_size": 8})


@pytest.mark.parametrize(
  "change, match",
  [
    (
      dict(architectures=["LlamaForCausalLM"], attention_bias=True),
      "attention_bias",
    ),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(use_sliding_window=True), "use_sliding_window"),
    (
      dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
      "rope_type 'yarn'",
    ),
    (dict(num_hidden_layers=None), "num_hidden_layers"),
  ],
)
def test_unsupported_config(small_dir, change, match):
  _edit_config(small_dir, **change)
  with pytest.raises(ValueError, match=match):
    checkpoints.load_hf(small_dir)


def test_missing_tensor():
  tensors = checkpoints.hf_tensors(_rljax_model(_SMALL))
  del tensors["model.layers.1.self_attn.k_proj.bias"]
  model = _rljax_model(_SMALL, seed=1)
  with pytest.raises(
    KeyError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias"
  ):
    checkpoints.load_hf_tensors(model, tensors)


@pytest.mark.parametrize(
  "name, shape",
  [
    ("model.layers.0.self_attn.q_proj.weight", (7, 8)),
    ("model.layers.1.mlp.down_proj.weight", (12, 8)),  # transposed
    ("model.embed_tokens.weight", (17, 8)),
    ("lm_head.weight", (16, 9)),
    ("model.norm.weight", (9,)),
  ],
)
def test_wrong_tensor_shape(name, shape):
  tensors = checkpoints.hf_tensors(_rljax_model(_SMALL))
  tensors[name] = np.zeros(shape, np.float32)
  with pytest.raises(
    ValueError, match=re.escape(f"{name!r} has shape {shape}")
  ):
    checkpoints.load_hf_tensors(_rljax_model(_SMALL), tensors)


def test_unexpected_tensor():
  tensors = checkpoints.hf_tensors(_rljax_model(_SMALL))
  tensors["model.layers.0.self_attn.o_proj.bias"] = np.zeros(8, np.float32)
  tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.zeros(2)
  with pytest.raises(ValueError, match=r"o_proj\.bias"):
    checkpoints.load_hf_tensors(_rljax_model(_SMALL), tensors)
  del tensors["model.layers.0.self_attn.o_proj.bias"]
  checkpoints.load_hf_tensors(_rljax_model(_SMALL), tensors)  # inv_freq: fine


def test_missing_config_json(tmp_path):
  missing = tmp_path / "nowhere"
  with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
    checkpoints.load_hf(missing)


def test_no_safetensors(small_dir):
  (small_dir / "model.safetensors").unlink()
  with pytest.raises(FileNotFoundError, match=re.escape(str(small_dir))):
    checkpoints.load_hf(small_dir)


def test_export_without_a_transformers_architecture():
  config = ModelConfig(**(vars(_SMALL) | dict(qk_norm=True)))
  with pytest.raises(ValueError, match="qk_norm"):
    checkpoints.hf_config(config)
