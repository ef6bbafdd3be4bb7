"""Gemma 1, 2 and 3 against transformers: logits, greedy generation through
the dense sampler and the rollout engine, export and re-import.

Tiny random models are built and saved locally with transformers (nothing
from the hub). HF zero-initialises Gemma's norm weights (1 + w = 1) and
draws small weights; here every tensor is redrawn, norms included, and
scaled up so that attention and final-logit soft-capping bite. Sequences
are longer than the sliding window and some rows are left-padded.
"""

import json

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import checkpoints
from rljax import models
from rljax import sampling
from rljax._src.errors import CheckpointError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_COMMON = dict(
  vocab_size=96,
  hidden_size=64,
  intermediate_size=96,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=16,
  max_position_embeddings=128,
  rms_norm_eps=1e-6,
  attn_implementation="eager",
  pad_token_id=0,
  bos_token_id=1,
  eos_token_id=2,
)
_KINDS = {
  # name: (config class, model class, extra config)
  "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(num_hidden_layers=2)),
  "gemma2": (
    "Gemma2Config",
    "Gemma2ForCausalLM",
    dict(
      num_hidden_layers=4,
      sliding_window=4,
      query_pre_attn_scalar=24,
      attn_logit_softcapping=3.0,
      final_logit_softcapping=4.0,
    ),
  ),
  "gemma3": (
    "Gemma3TextConfig",
    "Gemma3ForCausalLM",
    dict(
      num_hidden_layers=6,  # layers 0-4 local, 5 global (5:1)
      sliding_window=4,
      query_pre_attn_scalar=32,
      rope_parameters={
        "full_attention": {
          "rope_type": "linear",
          "factor": 2.0,
          "rope_theta": 1_000_000.0,
        },
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
      },
    ),
  ),
  "gemma3_capped": (
    "Gemma3TextConfig",
    "Gemma3ForCausalLM",
    dict(
      num_hidden_layers=3,
      sliding_window=3,
      layer_types=["sliding_attention", "full_attention"] * 1
      + ["sliding_attention"],
      final_logit_softcapping=4.0,
      # transformers' Gemma 3 attention ignores this (so must rljax).
      attn_logit_softcapping=3.0,
      tie_word_embeddings=False,
    ),
  ),
}

# Three rows of 12 tokens (window 3-4), two of them left-padded.
TOKENS = np.array(
  [
    [0, 0, 0, 5, 17, 33, 8, 41, 9, 60, 12, 3],
    [7, 81, 22, 5, 14, 90, 31, 8, 42, 11, 6, 19],
    [0, 0, 0, 0, 0, 0, 0, 50, 23, 4, 77, 30],
  ]
)
MASK = (TOKENS != 0).astype(np.int32)
MASK[1] = 1


def _randomize(model, scale):
  """Redraw every tensor: norms around HF's zero init, the rest larger."""
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in model.named_parameters():
      std = 0.5 if "norm" in name else scale
      p.copy_(torch.randn(p.shape, generator=gen) * std)


@pytest.fixture(scope="module", params=sorted(_KINDS))
def hf_model(request, tmp_path_factory):
  """(transformers model, its directory, kind) for one Gemma kind."""
  config_cls, model_cls, extra = _KINDS[request.param]
  config = getattr(transformers, config_cls)(**_COMMON, **extra)
  model = getattr(transformers, model_cls)(config).eval()
  _randomize(model, 0.15)
  path = tmp_path_factory.mktemp(request.param)
  model.save_pretrained(path)
  return model, path, request.param


def _hf_logits(model, tokens, mask):
  with torch.no_grad():
    out = model(torch.tensor(tokens), attention_mask=torch.tensor(mask))
  return out.logits.numpy()


@nnx.jit
def _logits(model, tokens, mask):
  return model(tokens, mask)[0]


def test_config_reads_the_gemma_features(hf_model):
  _, path, kind = hf_model
  c = checkpoints.load_hf(path).config
  assert c.embed_scale and c.norm_offset and c.activation == "gelu_tanh"
  if kind == "gemma":
    assert not c.post_norms and c.layer_types is None
  if kind == "gemma2":
    assert c.sliding_layers == (True, False, True, False)
    assert (c.attn_logit_softcap, c.final_logit_softcap) == (3.0, 4.0)
    assert c.query_pre_attn_scalar == 24 and c.sliding_window == 4
  if kind == "gemma3":
    assert c.sliding_layers == (True,) * 5 + (False,)
    assert c.qk_norm and c.local_rope_theta == 100.0
    assert c.rope_scaling == models.LinearRopeScaling(factor=2.0)
    assert c.attn_logit_softcap is None and c.final_logit_softcap is None
  if kind == "gemma3_capped":
    assert (c.attn_logit_softcap, c.final_logit_softcap) == (None, 4.0)


def test_logits_match_transformers(hf_model):
  hf, path, kind = hf_model
  model = checkpoints.load_hf(path)
  ours = np.asarray(_logits(model, jnp.asarray(TOKENS), jnp.asarray(MASK)))
  ref = _hf_logits(hf, TOKENS, MASK)
  real = MASK > 0
  # The logits are large enough for capping to matter and the comparison
  # to mean something.
  assert np.abs(ref[real]).max() > 2.0
  if kind in ("gemma2", "gemma3_capped"):
    assert np.abs(ref[real]).max() < 4.0  # capped at 4
  np.testing.assert_allclose(ours[real], ref[real], atol=1e-4, rtol=0)


def test_window_and_capping_matter(hf_model):
  """The same weights without the window / caps give other logits (the
  parity test above can fail)."""
  _, path, kind = hf_model
  if kind == "gemma":
    pytest.skip("no window or caps")
  model = checkpoints.load_hf(path)
  full = checkpoints.load_hf(path, layer_types=None)
  a = np.asarray(_logits(model, jnp.asarray(TOKENS), jnp.asarray(MASK)))
  b = np.asarray(_logits(full, jnp.asarray(TOKENS), jnp.asarray(MASK)))
  assert np.abs(a - b)[MASK > 0].max() > 1e-2


def test_token_logprobs_fused_path_is_capped(hf_model):
  hf, path, _ = hf_model
  model = checkpoints.load_hf(path)
  ref = torch.log_softmax(
    torch.tensor(_hf_logits(hf, TOKENS, MASK)), -1
  ).numpy()
  want = np.take_along_axis(ref[:, :-1], TOKENS[:, 1:, None], -1)[..., 0]
  want = want * MASK[:, 1:] * MASK[:, :-1]
  for schedule in ("auto", "dense"):
    logp, _ = nnx.jit(
      lambda m, t, k, s=schedule: models.token_logprobs(m, t, k, schedule=s)
    )(model, jnp.asarray(TOKENS), jnp.asarray(MASK))
    np.testing.assert_allclose(np.asarray(logp)[:, 1:], want, atol=1e-4)


def _hf_greedy(hf, tokens, mask, t):
  with torch.no_grad():
    out = hf.generate(
      torch.tensor(tokens),
      attention_mask=torch.tensor(mask),
      max_new_tokens=t,
      do_sample=False,
      eos_token_id=None,
      pad_token_id=0,
    )
  return out[:, tokens.shape[1] :].numpy()


def test_greedy_generation_matches_transformers(hf_model):
  hf, path, _ = hf_model
  model = checkpoints.load_hf(path)
  t = 10  # 22 tokens in all: several windows
  want = _hf_greedy(hf, TOKENS, MASK, t)
  static = sampling.generate(
    model, TOKENS, MASK, key=jax.random.key(0), max_new_tokens=t, greedy=True
  )
  np.testing.assert_array_equal(np.asarray(static.tokens_PGT[:, 0]), want)
  engine = sampling.Engine(
    model.config, slots=2, page_size=4, segment=4, max_length=32, greedy=True
  )
  out = sampling.rollout(
    engine, model, TOKENS, MASK, key=jax.random.key(0), max_new_tokens=t
  )
  np.testing.assert_array_equal(np.asarray(out.tokens_PGT[:, 0]), want)


def test_export_reimports_exactly_and_transformers_loads_it(hf_model, tmp_path):
  hf, path, _ = hf_model
  model = checkpoints.load_hf(path)
  checkpoints.save_hf(model, tmp_path)
  again = checkpoints.load_hf(tmp_path)
  a, b = nnx.state(model, nnx.Param), nnx.state(again, nnx.Param)
  jax.tree.map(np.testing.assert_array_equal, a, b)
  loaded = transformers.AutoModelForCausalLM.from_pretrained(
    tmp_path, attn_implementation="eager"
  ).eval()
  assert type(loaded) is type(hf)
  ref = _hf_logits(hf, TOKENS, MASK)
  got = _hf_logits(loaded, TOKENS, MASK)
  np.testing.assert_allclose(got[MASK > 0], ref[MASK > 0], atol=1e-5)


def test_unsupported_gemma_features_are_named(hf_model, tmp_path):
  _, path, kind = hf_model
  hf = json.loads((path / "config.json").read_text())
  bad = dict(hf, use_bidirectional_attention=True)
  with pytest.raises(CheckpointError, match="use_bidirectional_attention"):
    checkpoints.config_from_hf(bad)
  bad = dict(hf, architectures=["Gemma3ForConditionalGeneration"])
  with pytest.raises(CheckpointError, match="Gemma3ForConditionalGeneration"):
    checkpoints.config_from_hf(bad)
  if kind == "gemma3":
    rope = dict(hf["rope_parameters"])
    rope["full_attention"] = {"rope_type": "yarn", "factor": 2.0}
    with pytest.raises(CheckpointError, match="yarn"):
      checkpoints.config_from_hf(dict(hf, rope_parameters=rope))


@pytest.mark.parametrize("arch", ["gemma", "gemma2", "gemma3"])
def test_gguf_refuses_gemma(tmp_path, arch):
  gguf = pytest.importorskip("gguf")
  path = tmp_path / f"{arch}.gguf"
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(1)
  w.add_tensor("token_embd.weight", np.ones((4, 8), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(CheckpointError, match=f"'{arch}'.*load_hf"):
    checkpoints.load_gguf(path)
