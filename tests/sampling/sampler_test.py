"""The sampler against transformers, teacher-forced log-probs and numpy."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from rljax import models
from rljax import sampling
from rljax.checkpoints._hf import load_hf

# Three prompts of lengths 3, 5 and 1, left-padded to S = 5.
PROMPTS = np.array([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5], [0, 0, 0, 0, 9]])
MASK = (np.arange(5)[None, :] >= np.array([2, 0, 4])[:, None]).astype(np.int32)
T = 8


def _hf_greedy(hf, eos):
  """transformers' greedy completions and log-probs, padded to T columns."""
  out = hf.generate(
    torch.tensor(PROMPTS),
    attention_mask=torch.tensor(MASK),
    max_new_tokens=T,
    do_sample=False,
    eos_token_id=eos,
    pad_token_id=0,
    output_logits=True,
    return_dict_in_generate=True,
  )
  tokens = out.sequences[:, PROMPTS.shape[1] :]
  logp = torch.stack(out.logits, 1).log_softmax(-1)
  logp = logp.gather(-1, tokens[..., None])[..., 0].numpy()
  pad = ((0, 0), (0, T - tokens.shape[1]))
  return np.pad(tokens.numpy(), pad), np.pad(logp, pad)


def _greedy(model, stop_ids=()):
  return sampling.generate(
    model,
    PROMPTS,
    MASK,
    key=jax.random.key(0),
    max_new_tokens=T,
    greedy=True,
    stop_ids=stop_ids,
  )


def _expected_stops(tokens_BT, stop_ids):
  """numpy reference: cut each row after its first stop id."""
  tokens, mask = np.zeros_like(tokens_BT), np.zeros_like(tokens_BT)
  truncated = np.ones(len(tokens_BT), bool)
  for b, row in enumerate(tokens_BT):
    for t, token in enumerate(row):
      tokens[b, t], mask[b, t] = token, 1
      if token in stop_ids:
        truncated[b] = False
        break
  return tokens, mask, truncated


def test_greedy_equals_transformers_without_eos(hf_model, model):
  rollout = _greedy(model)
  expected, logp = _hf_greedy(hf_model[0], eos=None)
  np.testing.assert_array_equal(rollout.tokens_PGT[:, 0], expected)
  # Greedy log-probs are those of the temperature-1 distribution.
  np.testing.assert_allclose(rollout.logp_PGT[:, 0], logp, atol=1e-4)
  np.testing.assert_array_equal(rollout.mask_PGT, 1)
  np.testing.assert_array_equal(rollout.truncated_PG, True)


def test_greedy_equals_transformers_with_eos(hf_model, model):
  free = np.asarray(_greedy(model).tokens_PGT[:, 0])
  occurs = int(free[0, 2])  # row 0 emits it at step 2 (maybe earlier too)
  absent = int(np.setdiff1d(np.arange(64), free)[0])
  for eos in (occurs, absent):
    rollout = _greedy(model, stop_ids=(eos,))
    expected, logp = _hf_greedy(hf_model[0], eos=eos)
    np.testing.assert_array_equal(rollout.tokens_PGT[:, 0], expected)
    mask = np.asarray(rollout.mask_PGT[:, 0])
    np.testing.assert_allclose(rollout.logp_PGT[:, 0], logp * mask, atol=1e-4)
    tokens, mask, truncated = _expected_stops(free, (eos,))
    np.testing.assert_array_equal(rollout.tokens_PGT[:, 0], tokens)
    np.testing.assert_array_equal(rollout.mask_PGT[:, 0], mask)
    np.testing.assert_array_equal(rollout.truncated_PG[:, 0], truncated)
    # Row 0 stops by step 2 on `occurs`; nothing stops on `absent`.
    assert truncated.all() == (eos == absent)


def test_stop_ids_cut_rows_and_include_the_stop_token(model):
  free = np.asarray(_greedy(model).tokens_PGT[:, 0])
  # Two stop ids: the first token of row 1 and the fourth token of row 2;
  # row 0 stops wherever either occurs first, or runs to T (truncated).
  stop_ids = (int(free[1, 0]), int(free[2, 3]))
  rollout = _greedy(model, stop_ids)
  tokens, mask, truncated = _expected_stops(free, stop_ids)
  np.testing.assert_array_equal(rollout.tokens_PGT[:, 0], tokens)
  np.testing.assert_array_equal(rollout.mask_PGT[:, 0], mask)
  np.testing.assert_array_equal(rollout.truncated_PG[:, 0], truncated)
  # Row 1 stops at its first token: mask [1, 0, ..., 0], then pad 0.
  np.testing.assert_array_equal(rollout.mask_PGT[1, 0], [1] + [0] * (T - 1))
  np.testing.assert_array_equal(rollout.tokens_PGT[1, 0, 1:], 0)
  assert rollout.logp_PGT[1, 0, 0] < 0
  np.testing.assert_array_equal(rollout.logp_PGT[1, 0, 1:], 0.0)


def test_all_rows_stopping_at_once_ends_the_loop(model):
  free = np.asarray(_greedy(model).tokens_PGT[:, 0])
  rollout = _greedy(model, stop_ids=tuple(int(t) for t in free[:, 0]))
  np.testing.assert_array_equal(rollout.tokens_PGT[:, 0, 0], free[:, 0])
  np.testing.assert_array_equal(rollout.tokens_PGT[:, 0, 1:], 0)
  np.testing.assert_array_equal(rollout.mask_PGT.sum(-1), 1)
  np.testing.assert_array_equal(rollout.truncated_PG, False)


def _sample(model, key, **kwargs):
  kwargs = {"temperature": 0.7, "max_new_tokens": T, **kwargs}
  return sampling.generate(
    model, PROMPTS, MASK, key=key, num_samples=2, **kwargs
  )


def test_logp_equals_teacher_forced_logp(model):
  stop = (int(_greedy(model).tokens_PGT[0, 0, 1]),)
  r = _sample(model, jax.random.key(1), temperature=0.7, stop_ids=stop)
  assert r.mask_PGT.sum() < r.mask_PGT.size  # some rows stopped early
  tokens = jnp.concatenate([r.prompt_tokens_PGS, r.tokens_PGT], -1)
  mask = jnp.concatenate([r.prompt_mask_PGS, r.mask_PGT], -1)
  graphdef, state = nnx.split(model)

  @jax.jit
  def teacher_forced(state, tokens, mask):
    policy = nnx.merge(graphdef, state)
    return models.token_logprobs(policy, tokens, mask, temperature=0.7)[0]

  expected = teacher_forced(state, tokens.reshape(6, -1), mask.reshape(6, -1))
  expected = np.asarray(expected[:, 5:]).reshape(3, 2, T)
  np.testing.assert_allclose(r.logp_PGT, expected, atol=1e-4)
  np.testing.assert_array_equal(np.asarray(r.logp_PGT)[r.mask_PGT == 0], 0)


def test_group_layout(model):
  r = _sample(model, jax.random.key(2))
  assert r.tokens_PGT.shape == (3, 2, T) and r.tokens_PGT.dtype == jnp.int32
  assert r.logp_PGT.dtype == jnp.float32 and r.truncated_PG.dtype == bool
  np.testing.assert_array_equal(r.group_ids_PG, [[0, 0], [1, 1], [2, 2]])
  np.testing.assert_array_equal(r.prompt_tokens_PGS[:, 1], PROMPTS)
  np.testing.assert_array_equal(r.prompt_mask_PGS[:, 0], MASK)
  # The two samples of a prompt are independent draws.
  assert np.any(r.tokens_PGT[:, 0] != r.tokens_PGT[:, 1])


def test_deterministic_for_a_key_and_different_across_keys(model):
  a = _sample(model, jax.random.key(3))
  b = _sample(model, jax.random.key(3))
  c = _sample(model, jax.random.key(4))
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert np.any(a.tokens_PGT != c.tokens_PGT)


def _np_processed(logits, temperature, top_k, top_p):
  """numpy float64 reference of transformers' warpers (plain loops)."""
  z = np.asarray(logits, np.float64) / temperature
  if top_k is not None:
    kth = sorted(z, reverse=True)[min(top_k, len(z)) - 1]
    z = np.where(z < kth, -np.inf, z)
  if top_p is not None:
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-z, kind="stable")
    keep, mass = np.zeros(len(z), bool), 0.0
    for v in order:
      if mass < top_p:
        keep[v] = True
      mass += p[v]
    z = np.where(keep, z, -np.inf)
  p = np.exp(z - z.max())
  return p / p.sum()


def test_process_logits_by_hand():
  # probs [0.5, 0.3, 0.15, 0.05]; top_p = 0.7: masses ranked above are
  # 0, 0.5, 0.8, 0.95 -> keep the first two -> [0.5, 0.3] / 0.8.
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  probs = jax.nn.softmax(sampling.process_logits(logits, top_p=0.7))
  np.testing.assert_allclose(probs, [[0.625, 0.375, 0, 0]], atol=1e-6)
  # top_k = 3 then top_p = 0.9: [0.5, 0.3, 0.15] / 0.95; masses above are
  # 0, 0.526, 0.842 < 0.9 -> all three stay.
  probs = jax.nn.softmax(sampling.process_logits(logits, top_k=3, top_p=0.9))
  np.testing.assert_allclose(
    probs, [[0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0]], atol=1e-6
  )
  # temperature 0.5 squares the probabilities: [0.25, 0.09] / 0.34 after
  # top_k = 2.
  z = sampling.process_logits(logits, temperature=0.5, top_k=2)
  np.testing.assert_allclose(
    jax.nn.softmax(z), [[0.25 / 0.34, 0.09 / 0.34, 0, 0]], atol=1e-6
  )


@pytest.mark.parametrize(
  "temperature, top_k, top_p",
  [(1.0, 5, None), (0.7, None, 0.9), (1.5, 10, 0.6), (1.0, 100, 0.3)],
)
def test_process_logits_equals_transformers_warpers(temperature, top_k, top_p):
  logits = np.random.default_rng(0).normal(0, 2, (4, 50)).astype(np.float32)
  got = jax.jit(
    lambda x: sampling.process_logits(
      x, temperature=temperature, top_k=top_k, top_p=top_p
    )
  )(logits)
  scores = torch.tensor(logits)
  warpers = [transformers.TemperatureLogitsWarper(temperature)]
  if top_k is not None:
    warpers.append(transformers.TopKLogitsWarper(top_k))
  if top_p is not None:
    warpers.append(transformers.TopPLogitsWarper(top_p))
  for warper in warpers:
    scores = warper(None, scores)
  np.testing.assert_allclose(got, scores.numpy(), rtol=1e-6)
  for row, probs in zip(logits, np.asarray(jax.nn.softmax(got))):
    expected = _np_processed(row, temperature, top_k, top_p)
    np.testing.assert_allclose(probs, expected, atol=1e-6)


@pytest.mark.parametrize(
  "temperature, top_k, top_p",
  # One compiled program for both (top_k is static): top-k then top-p both
  # cut; then top-k alone (0.99 keeps all 4) at a flattening temperature.
  # The top-p-only path is the same `_process`, checked against
  # transformers above.
  [(1.0, 4, 0.8), (1.5, 4, 0.99)],
)
def test_samples_follow_the_processed_distribution(
  hf_model, model, temperature, top_k, top_p
):
  prompt = np.array([[3, 3, 3, 3, 3]])
  n = 20_000
  r = sampling.generate(
    model,
    prompt,
    np.ones_like(prompt),
    key=jax.random.key(5),
    max_new_tokens=1,
    num_samples=n,
    temperature=temperature,
    top_k=top_k,
    top_p=top_p,
  )
  with torch.no_grad():
    logits = hf_model[0](torch.tensor(prompt)).logits[0, -1].numpy()
  p = _np_processed(logits, temperature, top_k, top_p)
  kept = p > 0
  assert kept.sum() == (3 if top_p == 0.8 else 4)  # the filters bite
  counts = np.bincount(np.asarray(r.tokens_PGT).ravel(), minlength=64)
  assert counts[~kept].sum() == 0  # nothing outside top-k / the nucleus
  chi2 = np.sum((counts[kept] - n * p[kept]) ** 2 / (n * p[kept]))
  # Wilson-Hilferty chi-square quantile at z = 5 (p ~ 3e-7).
  dof = kept.sum() - 1
  critical = dof * (1 - 2 / (9 * dof) + 5 * np.sqrt(2 / (9 * dof))) ** 3
  assert chi2 < critical
  # The sampler's log-probs are those of p.
  np.testing.assert_allclose(
    np.exp(r.logp_PGT[0, :, 0]), p[np.asarray(r.tokens_PGT[0, :, 0])], 1e-4
  )
  # The test can fail: the unprocessed distribution is far from p.
  raw = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
  assert np.sum((counts - n * raw) ** 2 / (n * raw)) > 10 * critical


def test_bfloat16_model_gives_float32_logp(hf_model):
  bf16 = load_hf(hf_model[1], dtype="bfloat16")
  # One new token keeps this test to a single (prefill) compile.
  r = _sample(bf16, jax.random.key(6), max_new_tokens=1, temperature=1.0)
  assert r.logp_PGT.dtype == jnp.float32
  assert np.all(np.isfinite(r.logp_PGT)) and np.all(r.logp_PGT < 0)
  # bfloat16 activations move the log-probs only slightly from float32's.
  with torch.no_grad():
    logits = hf_model[0](
      torch.tensor(PROMPTS), attention_mask=torch.tensor(MASK)
    )
  logp = logits.logits[:, -1].log_softmax(-1).numpy()
  tokens = np.asarray(r.tokens_PGT[..., 0])
  expected = np.take_along_axis(logp, tokens, axis=1)
  np.testing.assert_allclose(r.logp_PGT[..., 0], expected, atol=0.1)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"max_new_tokens": 124}, "max_new_tokens"),  # 5 + 124 > 128 positions
    ({"num_samples": 0}, "num_samples"),
    ({"temperature": 0.0}, "temperature"),
    ({"temperature": -1.0, "greedy": False}, "temperature"),
    ({"top_k": 0}, "top_k"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"stop_ids": (64,)}, "stop_ids"),
    ({"prompt_tokens_PS": PROMPTS[0]}, "prompt_tokens_PS"),
    ({"prompt_mask_PS": MASK[:, 1:]}, "prompt_mask_PS"),
    ({"prompt_mask_PS": MASK[:, ::-1]}, "left-padded"),
    ({"prompt_mask_PS": MASK * 0}, "prompt_mask_PS"),
    ({"prompt_tokens_PS": PROMPTS + 60}, "prompt_tokens_PS"),
  ],
)
def test_bad_inputs_raise(model, kwargs, match):
  args = {
    "prompt_tokens_PS": PROMPTS,
    "prompt_mask_PS": MASK,
    "key": jax.random.key(0),
    "max_new_tokens": 4,
    **kwargs,
  }
  with pytest.raises(ValueError, match=match):
    sampling.generate(model, **args)


def test_greedy_ignores_temperature(model):
  # Greedy decoding needs no temperature; 0 is accepted and changes nothing.
  a = sampling.generate(
    model,
    PROMPTS,
    MASK,
    key=jax.random.key(0),
    max_new_tokens=T,
    greedy=True,
    temperature=0.0,
  )
  np.testing.assert_array_equal(a.tokens_PGT, _greedy(model).tokens_PGT)
