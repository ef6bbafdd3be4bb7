"""LoRA / QLoRA adapters: exact no-op at init, merged-weight parity,
gradients by the chain rule, int8 base, greedy sampling, PEFT export."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import checkpoints
from rljax import sampling
from rljax import testing
from rljax.models import ModelConfig
from rljax.models import Transformer
from rljax.models import _lora
from rljax.models import add_lora
from rljax.models import merge_lora
from rljax.models import quantize_base
from rljax.models import save_peft


def _config(**kw):
  base = dict(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=24,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    tie_embeddings=False,
    rms_norm_eps=1e-5,
  )
  return ModelConfig(**(base | kw))


_forward = testing.jit_model_fn(lambda model, tokens: model(tokens)[0])
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 7)))


def _randomise_b(model, seed=1, scale=0.3):
  """Nonzero adapters: B ~ N(0, scale) (A is already random)."""
  rng = np.random.default_rng(seed)
  for name in _lora.PROJECTIONS:
    b = getattr(model.layers, f"{name}_lora_b", None)
    if b is not None:
      b.set_value(jnp.asarray(scale * rng.standard_normal(b.shape), b.dtype))
  return model


def _adapted(config=None, targets=tuple(_lora.PROJECTIONS), rank=3):
  model = testing.random_model(config or _config())
  return add_lora(model, rank=rank, alpha=6.0, targets=targets)


def test_zero_adapters_equal_the_base_exactly():
  base = testing.random_model(_config())
  model = _adapted()
  np.testing.assert_array_equal(_forward(model, TOKENS), _forward(base, TOKENS))


def test_adapters_equal_the_merged_weights():
  model = _randomise_b(_adapted())
  base = testing.random_model(_config())
  merged = merge_lora(model)
  got, want = _forward(model, TOKENS), _forward(merged, TOKENS)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
  assert np.max(np.abs(want - _forward(base, TOKENS))) > 0.1  # adapters act


def test_adapter_delta_against_numpy():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)  # [B, S, H, K]
  a = rng.standard_normal((4, 5, 2)).astype(np.float32)  # [H, K, r]
  b = rng.standard_normal((2, 6)).astype(np.float32)  # [r, D]
  w = dict(o_proj_lora_a=a, o_proj_lora_b=b, lora_scale=np.float32(1.5))
  got = _lora.adapter_delta(w, "o_proj", jnp.asarray(x), "bshk,hkd->bsd")
  want = 1.5 * x.reshape(2, 3, 20) @ a.reshape(20, 2) @ b
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gradients_follow_the_chain_rule_through_the_merged_weight():
  # dL/dA = s dL/dW B^T and dL/dB = s A^T dL/dW, W the merged weight.
  model = _randomise_b(_adapted(targets=("q_proj", "down_proj")))
  merged = merge_lora(model)

  def loss(m):
    return jnp.sum(jnp.tanh(m(TOKENS)[0]))

  graph, adapters, rest = nnx.split(model, nnx.LoRAParam, ...)
  g = jax.jit(jax.grad(lambda ad: loss(nnx.merge(graph, ad, rest))))(adapters)
  m_graph, m_state = nnx.split(merged)
  gw = jax.jit(jax.grad(lambda s: loss(nnx.merge(m_graph, s))))(m_state)
  s = 2.0  # alpha / r
  for name, n_in in (("q_proj", 1), ("down_proj", 1)):
    a = np.asarray(getattr(model.layers, f"{name}_lora_a")[...])
    b = np.asarray(getattr(model.layers, f"{name}_lora_b")[...])
    dw = np.asarray(gw["layers"][name][...])
    dw = dw.reshape(dw.shape[0], -1, int(np.prod(dw.shape[1 + n_in :])))
    bb = b.reshape(b.shape[0], b.shape[1], -1)
    want_a = s * np.einsum("lio,lro->lir", dw, bb)
    want_b = s * np.einsum("lir,lio->lro", a, dw)
    got_a = np.asarray(g["layers"][f"{name}_lora_a"][...])
    got_b = np.asarray(g["layers"][f"{name}_lora_b"][...]).reshape(bb.shape)
    np.testing.assert_allclose(got_a, want_a, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_b, want_b, rtol=1e-4, atol=1e-4)


def test_int8_base_error_is_bounded_by_half_a_step():
  model = testing.random_model(_config())
  w = np.asarray(model.layers.o_proj[...])  # [L, H, K, D]
  quantize_base(model)
  q = np.asarray(model.layers.o_proj[...])
  assert q.dtype == np.int8
  scale = np.asarray(model.layers.o_proj_qscale[...])
  want_scale = np.abs(w).max(axis=(1, 2), keepdims=True) / 127.0
  np.testing.assert_allclose(scale, want_scale, rtol=1e-6)
  err = np.abs(q.astype(np.float32) * scale - w)
  assert np.all(err <= scale / 2 * (1 + 1e-5))


def test_quantized_base_logits_stay_close_and_adapters_train():
  config = _config()
  plain = testing.random_model(config)
  model = quantize_base(add_lora(testing.random_model(config), rank=2, alpha=2))
  got = _forward(model, TOKENS)
  want = _forward(plain, TOKENS)
  assert np.max(np.abs(got - want)) < 0.05 * np.max(np.abs(want))
  # The merged export dequantizes, and equals the quantized model.
  np.testing.assert_allclose(
    _forward(merge_lora(model), TOKENS), got, atol=1e-4, rtol=1e-4
  )
  graph, adapters, rest = nnx.split(model, nnx.LoRAParam, ...)
  grads = jax.grad(
    lambda ad: jnp.sum(nnx.merge(graph, ad, rest)(TOKENS)[0] ** 2)
  )(adapters)
  assert float(np.abs(grads["layers"]["q_proj_lora_b"][...]).max()) > 0


def test_save_hf_refuses_adapters_and_names_merge_lora(tmp_path):
  with pytest.raises(ValueError, match="merge_lora"):
    checkpoints.save_hf(_adapted(), tmp_path)


def test_bad_targets_name_the_choices():
  with pytest.raises(ValueError, match="q_proj"):
    add_lora(testing.random_model(_config()), rank=2, alpha=2, targets=("qq",))


def test_greedy_sampling_with_adapters_equals_the_merged_model():
  model = _randomise_b(_adapted(_config(vocab_size=20)), scale=0.5)
  merged = merge_lora(model)
  prompts = jnp.asarray([[0, 3, 4, 5], [6, 7, 8, 9]], jnp.int32)
  mask = jnp.asarray([[0, 1, 1, 1], [1, 1, 1, 1]], jnp.int32)
  kw = dict(key=jax.random.key(0), max_new_tokens=6, greedy=True)
  a = sampling.generate(model, prompts, mask, **kw)
  b = sampling.generate(merged, prompts, mask, **kw)
  np.testing.assert_array_equal(a.tokens_PGT, b.tokens_PGT)
  engine = sampling.Engine(
    model.config, greedy=True, num_pages=16, max_length=12
  )
  c = sampling.rollout(
    engine, model, prompts, mask, key=kw["key"], max_new_tokens=6
  )
  np.testing.assert_array_equal(c.tokens_PGT, b.tokens_PGT)


def test_peft_loads_the_exported_adapters(tmp_path):
  torch = pytest.importorskip("torch")
  peft = pytest.importorskip("peft")
  transformers = pytest.importorskip("transformers")
  config = _config(qkv_bias=False)
  base = testing.random_model(config)
  checkpoints.save_hf(base, tmp_path / "base")
  model = add_lora(testing.random_model(config), rank=3, alpha=6.0)
  _randomise_b(model)
  save_peft(model, tmp_path / "adapter", base=str(tmp_path / "base"))
  hf = transformers.AutoModelForCausalLM.from_pretrained(
    tmp_path / "base", torch_dtype=torch.float32
  )
  hf = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
  with torch.no_grad():
    want = hf(torch.tensor(np.asarray(TOKENS))).logits.numpy()
  got = np.asarray(_forward(model, TOKENS))
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
  assert np.max(np.abs(want - np.asarray(_forward(base, TOKENS)))) > 0.1


def test_trainable_part_and_reference_helpers():
  model = _randomise_b(_adapted(targets=("v_proj",)))
  params = nnx.state(model)
  trained = _lora.trainable(params)
  assert set(trained["layers"]) == {"v_proj_lora_a", "v_proj_lora_b"}
  off = _lora.with_trainable(params, _lora.adapters_off(params))
  assert not np.any(np.asarray(off["layers"]["v_proj_lora_b"][...]))
  np.testing.assert_array_equal(
    off["layers"]["v_proj"][...], params["layers"]["v_proj"][...]
  )
  assert _lora.with_trainable(params, None) is None  # no reference kept
  plain = nnx.state(testing.random_model(_config()))
  assert _lora.trainable(plain) is plain  # full fine-tuning: everything
  assert _lora.with_trainable(plain, plain) is plain


def test_mixture_of_experts_targets_name_the_attention_projections():
  config = ModelConfig(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    num_experts=4,
    experts_per_token=2,
    expert_intermediate_size=8,
  )
  # Abstract (nothing computed): the targets are checked first.
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  with pytest.raises(ValueError, match="no dense gate/up/down_proj"):
    add_lora(model, rank=2, alpha=4.0, targets=_lora.LORA_TARGETS)
