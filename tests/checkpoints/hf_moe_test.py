"""Mixture-of-experts checkpoints (Qwen3-MoE, Mixtral): logits and greedy
generation against transformers, every tensor layout, export round trips
and clear errors for unsupported configs.

Tiny random models are built and saved locally with transformers (CPU
torch); nothing comes from the hub.
"""

import json

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from rljax import checkpoints
from rljax import sampling
from rljax._src.errors import CheckpointError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_COMMON = dict(
  vocab_size=64,
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  num_experts_per_tok=2,
  rms_norm_eps=1e-5,
  max_position_embeddings=64,
  tie_word_embeddings=False,
  attn_implementation="eager",
)
_KINDS = {
  # name: (config class, model class, extra config)
  "qwen3_moe": (
    "Qwen3MoeConfig",
    "Qwen3MoeForCausalLM",
    dict(
      num_experts=8,
      head_dim=16,
      intermediate_size=48,
      moe_intermediate_size=24,
      norm_topk_prob=False,
    ),
  ),
  "qwen3_moe_norm": (
    "Qwen3MoeConfig",
    "Qwen3MoeForCausalLM",
    dict(
      num_experts=8,
      head_dim=16,
      intermediate_size=48,
      moe_intermediate_size=24,
      norm_topk_prob=True,
    ),
  ),
  "mixtral": (
    "MixtralConfig",
    "MixtralForCausalLM",
    dict(num_local_experts=8, intermediate_size=24),
  ),
}


def _hf_model(kind, seed=0):
  """A tiny random transformers model whose norms and routers matter."""
  config_cls, model_cls, extra = _KINDS[kind]
  config = getattr(transformers, config_cls)(**_COMMON, **extra)
  torch.manual_seed(seed)
  model = getattr(transformers, model_cls)(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      else:
        p.copy_(0.3 * torch.randn_like(p))
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
  positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
  with torch.no_grad():
    out = model(
      input_ids=torch.from_numpy(tokens),
      attention_mask=torch.from_numpy(mask),
      position_ids=torch.from_numpy(positions),
    )
  return out.logits.numpy()


def _logits(model, tokens, mask):
  graphdef, state = nnx.split(model)
  fn = jax.jit(lambda s, t, m: nnx.merge(graphdef, s)(t, m)[0])
  return np.asarray(fn(state, jnp.asarray(tokens), jnp.asarray(mask)))


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
  q = checkpoints.load_hf(saved["qwen3_moe"][1]).config
  assert (q.num_experts, q.experts_per_token) == (8, 2)
  assert q.expert_intermediate_size == 24 and q.qk_norm
  assert not q.norm_topk_prob
  assert checkpoints.load_hf(saved["qwen3_moe_norm"][1]).config.norm_topk_prob
  m = checkpoints.load_hf(saved["mixtral"][1]).config
  assert (m.num_experts, m.expert_intermediate_size) == (8, 24)
  assert m.norm_topk_prob and not m.qk_norm and m.head_dim == 8


def test_hub_expert_names_are_what_save_pretrained_writes(saved):
  names = set(
    safetensors.numpy.load_file(saved["mixtral"][1] / "model.safetensors")
  )
  assert "model.layers.1.block_sparse_moe.experts.7.w2.weight" in names
  assert "model.layers.1.block_sparse_moe.gate.weight" in names
  names = set(
    safetensors.numpy.load_file(saved["qwen3_moe"][1] / "model.safetensors")
  )
  assert "model.layers.1.mlp.experts.7.down_proj.weight" in names


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_fused_expert_tensors_load_the_same(saved, kind):
  # transformers 5's in-memory names (fused experts, "mlp." prefix).
  hf_model, path = saved[kind]
  fused = {k: v.numpy() for k, v in hf_model.state_dict().items()}
  assert "model.layers.0.mlp.experts.gate_up_proj" in fused
  config = checkpoints.load_hf(path).config
  a = _params(checkpoints.model_from_tensors(config, fused))
  b = _params(checkpoints.load_hf(path))
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("kind", list(_KINDS))
def test_export_reimports_exactly_and_transformers_loads_it(
  saved, kind, tmp_path
):
  hf_model, path = saved[kind]
  model = checkpoints.load_hf(path)
  checkpoints.save_hf(model, tmp_path)
  again = checkpoints.load_hf(tmp_path)
  assert again.config == model.config
  a, b = _params(model), _params(again)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
  assert type(exported) is type(hf_model)
  tokens, mask = _batch(1)
  real = mask.astype(bool)  # transformers' outputs on padding are arbitrary
  np.testing.assert_allclose(
    _hf_logits(exported.eval(), tokens, mask)[real],
    _hf_logits(hf_model, tokens, mask)[real],
    atol=1e-5,
    rtol=0,
  )


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_greedy_generation_equals_transformers(saved, kind):
  hf_model, path = saved[kind]
  model = checkpoints.load_hf(path)
  prompts = np.array([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5], [0, 0, 0, 0, 9]])
  mask = (prompts > 0).astype(np.int32)
  mask[1] = 1
  t = 8
  out = sampling.generate(
    model, prompts, mask, key=jax.random.key(0), max_new_tokens=t, greedy=True
  )
  hf = hf_model.generate(
    torch.tensor(prompts),
    attention_mask=torch.tensor(mask),
    max_new_tokens=t,
    do_sample=False,
    pad_token_id=0,
  )[:, prompts.shape[1] :].numpy()
  np.testing.assert_array_equal(np.asarray(out.tokens_PGT[:, 0]), hf)


def _config_json(saved, kind):
  return json.loads((saved[kind][1] / "config.json").read_text())


@pytest.mark.parametrize(
  "kind, key, value, match",
  [
    ("qwen3_moe", "mlp_only_layers", [1], "mlp_only_layers"),
    ("qwen3_moe", "decoder_sparse_step", 2, "decoder_sparse_step"),
    ("mixtral", "sliding_window", 4096, "sliding_window"),
    ("qwen3_moe", "shared_expert_intermediate_size", 16, "shared experts"),
    ("qwen3_moe", "num_experts_per_tok", None, "num_experts_per_tok"),
    ("mixtral", "num_experts_per_tok", 9, "experts_per_token"),
  ],
)
def test_unsupported_or_bad_moe_configs_raise(saved, kind, key, value, match):
  hf = _config_json(saved, kind)
  hf[key] = value
  with pytest.raises(CheckpointError, match=match):
    checkpoints.config_from_hf(hf)


def test_hub_style_num_experts_key(saved):
  hf = _config_json(saved, "qwen3_moe")
  hf["num_experts"] = hf.pop("num_local_experts")
  assert checkpoints.config_from_hf(hf).num_experts == 8


def test_missing_expert_tensor_is_named(saved):
  _, path = saved["mixtral"]
  tensors = safetensors.numpy.load_file(path / "model.safetensors")
  del tensors["model.layers.1.block_sparse_moe.experts.3.w3.weight"]
  config = checkpoints.load_hf(path).config
  with pytest.raises(CheckpointError, match=r"experts\.3\.w3"):
    checkpoints.model_from_tensors(config, tensors)


def test_mixtral_export_needs_renormalised_top_k(saved):
  model = checkpoints.load_hf(saved["qwen3_moe"][1])
  config = model.config.__class__(
    **{**vars(model.config), "qk_norm": False, "norm_topk_prob": False}
  )
  with pytest.raises(ValueError, match="norm_topk_prob"):
    checkpoints.hf_config(config)
