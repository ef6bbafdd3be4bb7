"""The rollout engine against the static sampler, transformers, teacher-
forced log-probs and numpy: continuous batching, paging, extend, fork."""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from rljax import models
from rljax import sampling

# Three prompts of lengths 3, 5 and 1, left-padded to S = 5.
PROMPTS = np.array([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5], [0, 0, 0, 0, 9]])
MASK = (np.arange(5)[None, :] >= np.array([2, 0, 4])[:, None]).astype(np.int32)
T = 12


def _engine(model, **kwargs):
  kwargs = {"slots": 2, "page_size": 4, "segment": 4, "max_length": 48} | kwargs
  return sampling.Engine(model.config, **kwargs)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _dense_logprobs(graphdef, state, tokens_BS, temperature):
  model = nnx.merge(graphdef, state)
  return models.token_logprobs(
    model, tokens_BS, temperature=temperature, schedule="dense"
  )[0]


def _teacher_forced(model, tokens, temperature=1.0):
  """numpy log-probs of tokens[1:] given their prefix (one row).

  The row is right-padded to 64 tokens, so one program serves every length
  (the model is causal: what follows a token does not change its log-prob).
  """
  n = len(tokens)
  assert n <= 64, n
  padded = np.zeros((1, 64), np.int32)
  padded[0, :n] = tokens
  logp = _dense_logprobs(*nnx.split(model), padded, temperature)
  return np.asarray(logp[0, 1:n])


def test_greedy_equals_static_sampler_and_transformers(hf_model, model):
  # Two slots for six sequences of up to 17 tokens (5 pages each): slots
  # refill mid-run and the pool (7 pages of 4 tokens) runs short, so
  # sequences are preempted.
  stop = (17,)
  static = sampling.generate(
    model,
    PROMPTS,
    MASK,
    key=jax.random.key(0),
    max_new_tokens=T,
    num_samples=2,
    greedy=True,
    stop_ids=stop,
  )
  engine = _engine(
    model, greedy=True, stop_ids=stop, num_pages=8, max_length=20
  )
  out = sampling.rollout(
    engine,
    model,
    PROMPTS,
    MASK,
    key=jax.random.key(0),
    max_new_tokens=T,
    num_samples=2,
  )
  for field in ("tokens_PGT", "mask_PGT", "truncated_PG", "prompt_mask_PGS"):
    np.testing.assert_array_equal(getattr(out, field), getattr(static, field))
  for field in ("logp_PGT", "full_logp_PGT"):
    np.testing.assert_allclose(
      getattr(out, field), getattr(static, field), atol=1e-5
    )
  assert engine.stats["preempted"] > 0
  assert engine.pages_in_use() == 0  # everything released
  hf = (
    hf_model[0]
    .generate(
      torch.tensor(PROMPTS),
      attention_mask=torch.tensor(MASK),
      max_new_tokens=T,
      do_sample=False,
      eos_token_id=list(stop),
      pad_token_id=0,
    )[:, PROMPTS.shape[1] :]
    .numpy()
  )
  hf = np.pad(hf, ((0, 0), (0, T - hf.shape[1])))
  np.testing.assert_array_equal(out.tokens_PGT[:, 0], hf)


def test_no_decode_step_is_spent_on_finished_rows(model):
  # Lengths 1..8 via per-sequence budgets: continuous batching decodes
  # about sum(lengths) / slots steps; a static batch would run 8 x 2.
  engine = _engine(model, slots=4, segment=2, refill=1)
  key = jax.random.key(1)
  budgets = [1, 8, 1, 1, 2, 1, 1, 1]
  for i, b in enumerate(budgets):
    engine.add([5, 6], key=jax.random.fold_in(key, i), max_new_tokens=b)
  done = engine.run(model)
  assert [len(s.completion) for s in done] == budgets
  assert engine.stats["decode_steps"] <= 9  # the longest runs alone after


def test_a_tail_of_few_sequences_runs_on_fewer_rows(model):
  # 8 slots: seven budgets of 1 and one of 12. After the first step the
  # segment ends early (7 rows freed, none waiting) and the last sequence
  # decodes its 11 remaining tokens alone: 8 x 1 + 1 x 11 row-steps,
  # where staying on all 8 rows would take 8 x 12 = 96.
  engine = _engine(model, slots=8, segment=16)
  key = jax.random.key(2)
  budgets = [1] * 7 + [12]
  for i, b in enumerate(budgets):
    engine.add([5, 6], key=jax.random.fold_in(key, i), max_new_tokens=b)
  done = engine.run(model)
  assert [len(s.completion) for s in done] == budgets
  assert engine.stats["decode_steps"] == 12
  assert engine.stats["row_steps"] == 8 * 1 + 1 * 11
  assert engine.stats["segments"] == 2
  # The tail's tokens equal those of the sequence decoded on its own.
  alone = _engine(model, slots=8, segment=16)
  (seq,) = alone.add([5, 6], key=jax.random.fold_in(key, 7), max_new_tokens=12)
  alone.run(model)
  assert done[-1].completion == seq.completion


@pytest.mark.slow  # default-run time; run with -m slow
def test_sampled_rollout_is_deterministic_and_independent_of_slots(model):
  def run(**kwargs):
    engine = _engine(model, top_k=20, **kwargs)
    return sampling.rollout(
      engine,
      model,
      PROMPTS,
      MASK,
      key=jax.random.key(3),
      max_new_tokens=T,
      num_samples=3,
      temperature=0.8,
    )

  a, b = run(), run(slots=6, page_size=8, segment=5)
  np.testing.assert_array_equal(a.tokens_PGT, b.tokens_PGT)
  np.testing.assert_allclose(a.logp_PGT, b.logp_PGT, atol=1e-5)
  assert len({tuple(r) for r in a.tokens_PGT.reshape(9, T)}) > 3
  other = sampling.rollout(
    _engine(model, top_k=20),
    model,
    PROMPTS,
    MASK,
    key=jax.random.key(4),
    max_new_tokens=T,
    num_samples=3,
    temperature=0.8,
  )
  assert not np.array_equal(a.tokens_PGT, other.tokens_PGT)


def _processed_logp(model, tokens, start, temperature, top_k):
  """numpy: log-probs of tokens[start:] under temperature then top-k."""
  logits, _ = jax.jit(lambda t: model(t[None]))(jnp.asarray(tokens))
  z = np.asarray(logits[0], np.float64)[start - 1 : -1] / temperature
  kth = np.sort(z, axis=-1)[:, -top_k][:, None]
  z = np.where(z < kth, -np.inf, z)
  z = z - z.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return logp[np.arange(len(z)), tokens[start:]]


def test_logp_equals_teacher_forced_under_both_conventions(model):
  engine = _engine(model, top_k=5)
  [seq] = engine.add(
    [5, 6, 7], key=jax.random.key(2), max_new_tokens=10, temperature=0.7
  )
  engine.run(model)
  start = seq.prompt_length
  full = _teacher_forced(model, seq.tokens, 0.7)[start - 1 :]
  np.testing.assert_allclose(seq.full_logp, full, atol=1e-4)
  processed = _processed_logp(model, np.asarray(seq.tokens), start, 0.7, 5)
  np.testing.assert_allclose(seq.logp, processed, atol=1e-4)
  assert np.all(np.asarray(seq.logp) >= np.asarray(seq.full_logp) - 1e-6)
  assert seq.temperature == [pytest.approx(0.7)] * 10


def test_samples_follow_the_processed_distribution(hf_model, model):
  engine = _engine(model, slots=8, top_k=4, max_length=16)
  n = 4000
  seqs = engine.add(
    [3, 3, 3], key=jax.random.key(5), max_new_tokens=1, num_samples=n
  )
  engine.run(model)
  counts = np.bincount([s.completion[0] for s in seqs], minlength=64)
  with torch.no_grad():
    logits = hf_model[0](torch.tensor([[3, 3, 3]])).logits[0, -1].numpy()
  z = logits.astype(np.float64)
  z = np.where(z < np.sort(z)[-4], -np.inf, z)
  p = np.exp(z - z.max())
  p /= p.sum()
  kept = p > 0
  assert counts[~kept].sum() == 0
  chi2 = np.sum((counts[kept] - n * p[kept]) ** 2 / (n * p[kept]))
  dof = kept.sum() - 1
  critical = dof * (1 - 2 / (9 * dof) + 5 * np.sqrt(2 / (9 * dof))) ** 3
  assert chi2 < critical
  raw = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
  assert np.sum((counts - n * raw) ** 2 / (n * raw)) > 10 * critical


def test_extend_equals_decoding_in_one_go(model):
  key = jax.random.key(6)
  whole = _engine(model)
  [one] = whole.add([5, 6, 7], key=key, max_new_tokens=14, temperature=0.9)
  whole.run(model)
  parts = _engine(model)
  [seq] = parts.add(
    [5, 6, 7], key=key, max_new_tokens=5, temperature=0.9, keep=True
  )
  parts.run(model)
  assert seq.stop_reason == sampling.REASONS.index("length")
  parts.extend(seq, [], max_new_tokens=9)
  parts.run(model)
  assert seq.tokens == one.tokens
  np.testing.assert_allclose(seq.logp, one.logp, atol=1e-5)
  # Appended tokens (a tool's output) are prefilled, not sampled; greedy
  # decoding then continues as from a fresh prompt of the whole text.
  greedy = _engine(model, greedy=True)
  [seq] = greedy.add([5, 6, 7], key=key, max_new_tokens=4, keep=True)
  greedy.run(model)
  greedy.extend(seq, [9, 10, 11], max_new_tokens=6)
  greedy.run(model)
  assert seq.sampled == [1] * 4 + [0] * 3 + [1] * 6
  assert seq.logp[4:7] == [0.0] * 3
  fresh = _engine(model, greedy=True)
  [ref] = fresh.add(seq.tokens[:10], key=key, max_new_tokens=6)
  fresh.run(model)
  assert seq.tokens == ref.tokens
  np.testing.assert_allclose(seq.logp[7:], ref.logp, atol=1e-5)


def test_fork_children_share_the_prefix_and_match_teacher_forcing(model):
  engine = _engine(model, slots=4, page_size=4, num_pages=20)
  [seq] = engine.add(
    [5, 6, 7, 8, 9], key=jax.random.key(7), max_new_tokens=4, keep=True
  )
  engine.run(model)
  prefix = list(seq.tokens)
  held = engine.pages_in_use()
  children = engine.fork(seq, 3, max_new_tokens=6)
  engine.run(model)
  for child in children:
    assert child.tokens[: len(prefix)] == prefix
    assert len(child.completion) == 4 + 6
    tf = _teacher_forced(model, child.tokens)[len(prefix) - 1 :]
    np.testing.assert_allclose(child.full_logp[4:], tf, atol=1e-4)
  assert len({tuple(c.tokens) for c in children}) > 1
  assert engine.pages_in_use() == held  # the children's pages are freed
  # The parent is intact: it continues as if it had never forked.
  engine.extend(seq, [], max_new_tokens=3)
  engine.run(model)
  tf = _teacher_forced(model, seq.tokens)[len(prefix) - 1 :]
  np.testing.assert_allclose(seq.full_logp[4:], tf, atol=1e-4)
  engine.release(seq)
  assert engine.pages_in_use() == 0
  # Greedy children of one prefix are identical to each other.
  greedy = _engine(model, slots=4, greedy=True)
  [g] = greedy.add(
    [5, 6, 7], key=jax.random.key(0), max_new_tokens=2, keep=True
  )
  greedy.run(model)
  kids = greedy.fork(g, 3, max_new_tokens=5)
  greedy.run(model)
  assert kids[0].tokens == kids[1].tokens == kids[2].tokens


def test_fork_with_appended_tokens_branches_after_a_tool_output(model):
  # Children that first append a tool's output: the output is prefilled,
  # not sampled, and the branches match teacher forcing on the whole text.
  engine = _engine(model, slots=4, page_size=4, num_pages=20)
  [seq] = engine.add(
    [5, 6, 7], key=jax.random.key(2), max_new_tokens=3, keep=True
  )
  engine.run(model)
  prefix = list(seq.tokens)
  kids = engine.fork(seq, 2, max_new_tokens=4, tokens=[9, 10, 11])
  engine.release(seq)
  engine.run(model)
  for kid in kids:
    assert kid.tokens[: len(prefix) + 3] == prefix + [9, 10, 11]
    assert kid.sampled == [1] * 3 + [0] * 3 + [1] * 4
    assert kid.turn == kid.tokens[len(prefix) + 3 :]
    tf = _teacher_forced(model, kid.tokens)[len(prefix) + 2 :]
    np.testing.assert_allclose(kid.full_logp[6:], tf, atol=1e-4)
  assert engine.pages_in_use() == 0
  with pytest.raises(ValueError, match="leaves no room"):
    [s] = engine.add([5], key=jax.random.key(0), max_new_tokens=1, keep=True)
    engine.run(model)
    engine.fork(s, 1, max_new_tokens=1, tokens=list(range(50)))


def test_prompt_pages_are_shared_by_its_samples(model):
  # 9 tokens = 2 full pages of 4 + 1: eight samples hold 2 shared pages and
  # one copied page each, and the parent's pages are freed after forking.
  engine = _engine(model, slots=8, page_size=4, segment=1, max_length=16)
  engine.add(
    list(range(1, 10)),
    key=jax.random.key(0),
    max_new_tokens=3,
    num_samples=8,
  )
  engine._ensure_pool()
  engine._admit(*nnx.split(model))
  engine._reserve()
  assert engine.pages_in_use() == 2 + 8
  engine.run(model)
  assert engine.pages_in_use() == 0


def test_pause_rule_and_stop_rule(model):
  # Pause where the sampled token is unlikely (a branch point).
  engine = _engine(model, pause=lambda info: info.full_logp < -2.0, slots=4)
  seqs = engine.add(
    [5, 6, 7],
    key=jax.random.key(8),
    max_new_tokens=T,
    num_samples=4,
    keep=True,
  )
  engine.run(model)
  paused = [s for s in seqs if s.stop_reason == sampling.REASONS.index("pause")]
  assert paused
  for s in paused:
    assert s.full_logp[-1] < -2.0 and all(x >= -2.0 for x in s.full_logp[:-1])
  # Stop strings: letters a.. for ids; stop at the first "c" or "dd".
  decode = lambda ids: "".join(chr(97 + i % 26) for i in ids)  # noqa: E731
  rule = sampling.stop_at_strings(decode, ["c", "dd"])
  stopper = _engine(model, stop_rule=rule, slots=4)
  seqs = stopper.add(
    [5, 6, 7], key=jax.random.key(9), max_new_tokens=T, num_samples=8
  )
  stopper.run(model)
  for s in seqs:
    text = decode(s.completion)
    if s.stop_reason == sampling.REASONS.index("stop_rule"):
      assert text.endswith("c") or text.endswith("dd")
      assert "c" not in text[:-1] and "dd" not in text[:-1]
      assert len(s.logp) == len(s.completion)
    else:
      assert "c" not in text and "dd" not in text
  assert any(s.stop_reason == sampling.REASONS.index("stop_rule") for s in seqs)


def test_per_token_temperature(model):
  # A temperature that rises with the step: each token's log-probs use it.
  engine = _engine(
    model, temperature_fn=lambda logits, t, steps: t * (1.0 + 0.5 * steps)
  )
  [seq] = engine.add([5, 6], key=jax.random.key(1), max_new_tokens=4)
  engine.run(model)
  np.testing.assert_allclose(seq.temperature, [1.0, 1.5, 2.0, 2.5])
  for i, temp in enumerate(seq.temperature):
    tf = _teacher_forced(model, seq.tokens[: 3 + i], temp)[-1]
    np.testing.assert_allclose(seq.full_logp[i], tf, atol=1e-4)


@pytest.mark.slow  # default-run time; run with -m slow
def test_a_temperature_per_sample(model):
  # Samples of one prompt at their own temperatures: each sample's tokens
  # and log-probs are those of a lone request at its temperature.
  engine = _engine(model)
  key = jax.random.key(4)
  seqs = engine.add(
    [5, 6], key=key, max_new_tokens=5, num_samples=2, temperature=[0.5, 2.0]
  )
  engine.run(model)
  for j, temp in enumerate([0.5, 2.0]):
    assert seqs[j].temperature == [pytest.approx(temp)] * 5
    alone = _engine(model)
    ones = alone.add(
      [5, 6], key=key, max_new_tokens=5, num_samples=2, temperature=temp
    )
    alone.run(model)
    assert ones[j].tokens == seqs[j].tokens
    tf = _teacher_forced(model, seqs[j].tokens, temp)[1:]
    np.testing.assert_allclose(seqs[j].full_logp, tf, atol=1e-4)
  with pytest.raises(ValueError, match="3 values for 2 samples"):
    engine.add(
      [1], key=key, max_new_tokens=2, num_samples=2, temperature=[1] * 3
    )


def test_rollout_budget_within_a_wider_rollout(model):
  tokens = np.array([[0, 5, 6], [7, 8, 9]], np.int32)
  mask = (tokens > 0).astype(np.int32)
  out = sampling.rollout(
    _engine(model),
    model,
    tokens,
    mask,
    key=jax.random.key(0),
    max_new_tokens=3,
    num_samples=2,
    width=7,
  )
  assert out.tokens_PGT.shape == (2, 2, 7)
  assert out.mask_PGT.sum(-1).max() <= 3
  assert np.all(out.mask_PGT[..., 3:] == 0)
  np.testing.assert_array_equal(out.truncated_PG, out.mask_PGT.sum(-1) == 3)
  with pytest.raises(ValueError, match="below max_new_tokens"):
    sampling.rollout(
      _engine(model),
      model,
      tokens,
      mask,
      key=jax.random.key(0),
      max_new_tokens=3,
      width=2,
    )


def test_sharded_engine_equals_one_device(model):
  from rljax import sharding

  mesh = sharding.make_mesh(4, 1, 2)
  model_sharded = sharding.shard_model(model, mesh)
  kwargs = dict(
    key=jax.random.key(3), max_new_tokens=T, num_samples=2, temperature=0.8
  )
  one = sampling.rollout(
    _engine(model, slots=4), model, PROMPTS, MASK, **kwargs
  )
  many = sampling.rollout(
    _engine(model, slots=8, mesh=mesh),
    model_sharded,
    PROMPTS,
    MASK,
    **kwargs,
  )
  np.testing.assert_array_equal(one.tokens_PGT, many.tokens_PGT)
  # Tensor-parallel matmuls sum in another order.
  np.testing.assert_allclose(one.logp_PGT, many.logp_PGT, atol=1e-4)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(slots=3, mesh="mesh"), "multiple of the mesh"),
    (dict(max_length=1000), "max_position_embeddings"),
    (dict(num_pages=3), "num_pages"),
    (dict(stop_ids=(64,)), "stop_ids"),
    (dict(top_p=1.5), "top_p"),
  ],
)
def test_bad_engine_settings_raise(model, kwargs, match):
  from rljax import sharding

  if kwargs.get("mesh") == "mesh":
    kwargs["mesh"] = sharding.make_mesh(2, 1, 4)
  with pytest.raises(ValueError, match=match):
    _engine(model, **kwargs)


def test_bad_requests_raise(model):
  engine = _engine(model)
  key = jax.random.key(0)
  with pytest.raises(ValueError, match="empty"):
    engine.add([], key=key, max_new_tokens=2)
  with pytest.raises(ValueError, match="token ids"):
    engine.add([64], key=key, max_new_tokens=2)
  with pytest.raises(ValueError, match="max_length"):
    engine.add([1] * 48, key=key, max_new_tokens=2)
  [seq] = engine.add([1, 2], key=key, max_new_tokens=2)
  with pytest.raises(ValueError, match="stopped and was kept"):
    engine.fork(seq, 2, max_new_tokens=2)
  engine.run(model)
  with pytest.raises(ValueError, match="stopped and was kept"):
    engine.extend(seq, [3], max_new_tokens=2)


@pytest.mark.slow  # default-run time; run with -m slow
def test_idle_kept_sequences_give_their_pages_to_waiting_ones(model):
  # A kept sequence waiting to be extended (an agent's tool call) holds 11
  # of 13 pages; the next sequence takes them, and the kept one, extended
  # later, is re-prefilled and samples exactly what it would have.
  key = jax.random.key(0)
  engine = _engine(model, num_pages=14, max_length=48)  # 13 usable pages
  [kept] = engine.add(list(range(1, 40)), key=key, max_new_tokens=2, keep=True)
  engine.run(model)  # holds 11 pages
  [other] = engine.add(
    list(range(1, 30)), key=jax.random.key(1), max_new_tokens=2
  )
  engine.run(model)
  assert engine.stats["evicted"] == 1 and other.done
  engine.extend(kept, [3, 4], max_new_tokens=4)
  engine.run(model)
  ample = _engine(model, max_length=48)
  [ref] = ample.add(list(range(1, 40)), key=key, max_new_tokens=2, keep=True)
  ample.run(model)
  ample.extend(ref, [3, 4], max_new_tokens=4)
  ample.run(model)
  assert kept.tokens == ref.tokens
  np.testing.assert_allclose(kept.logp, ref.logp, atol=1e-5)


def test_a_queued_extended_sequence_gives_its_pages_to_a_running_one(model):
  # One slot: a new sequence is admitted first while an extended one waits
  # in the queue holding 11 of 13 pages. It gives them up (re-prefilled
  # later) instead of the run failing for want of pages, whatever order an
  # agent's environments return in.
  key = jax.random.key(0)
  engine = _engine(model, slots=1, num_pages=14)
  [kept] = engine.add(list(range(1, 40)), key=key, max_new_tokens=2, keep=True)
  engine.run(model)
  [other] = engine.add(
    list(range(1, 30)), key=jax.random.key(1), max_new_tokens=2
  )
  engine.extend(kept, [3, 4], max_new_tokens=4)
  engine.run(model)
  assert engine.stats["evicted"] == 1 and other.done and kept.done
  ample = _engine(model, slots=1)
  [ref] = ample.add(list(range(1, 40)), key=key, max_new_tokens=2, keep=True)
  ample.run(model)
  ample.extend(ref, [3, 4], max_new_tokens=4)
  ample.run(model)
  assert kept.tokens == ref.tokens
  np.testing.assert_allclose(kept.logp, ref.logp, atol=1e-5)


@pytest.mark.slow  # 8 s on 2 cores (the default run's budget)
def test_a_partial_rollout_continues_under_newer_weights(model):
  """New weights arrive after the first segment (an update finished): the
  sequences in flight continue under them, each token's version says which
  weights sampled it, and its log-probs are teacher-forced under those
  weights given its whole prefix (the cache was recomputed)."""
  graphdef, state = nnx.split(model)
  newer = nnx.merge(
    graphdef,
    jax.tree.map(
      lambda x: x * 1.05 + 0.01 if jnp.issubdtype(x.dtype, jnp.floating) else x,
      state,
    ),
  )
  by_version = {0: model, 1: newer}
  engine = _engine(model, slots=2, segment=3)
  seqs = engine.add(
    [5, 6, 7], key=jax.random.key(4), max_new_tokens=10, num_samples=3
  )
  calls = []

  def refresh():
    calls.append(None)
    return (1, newer) if len(calls) == 2 else None  # before segment 2

  engine.run(model, refresh=refresh)
  assert engine.stats["refreshed"] == 1
  # Two ran from the start (3 tokens under version 0, then version 1); the
  # third waited for a slot and ran under version 1 only.
  versions = [seq.version for seq in seqs]
  assert versions[0][:3] == [0, 0, 0] and versions[1][:3] == [0, 0, 0]
  assert set(versions[0][3:]) == {1} and set(versions[2]) == {1}
  for seq in seqs:
    start = seq.prompt_length
    for v in (0, 1):
      forced = _teacher_forced(by_version[v], seq.tokens)[start - 1 :]
      mine = np.asarray(seq.version) == v
      np.testing.assert_allclose(
        np.asarray(seq.full_logp)[mine], forced[mine], atol=1e-5, rtol=0
      )
  # A rollout records the versions.
  engine = _engine(model, slots=2, segment=3)
  calls.clear()
  out = sampling.rollout(
    engine,
    model,
    PROMPTS,
    MASK,
    key=jax.random.key(1),
    max_new_tokens=8,
    num_samples=2,
    refresh=refresh,
  )
  assert out.version_PGT.shape == out.tokens_PGT.shape
  assert set(np.unique(out.version_PGT[out.mask_PGT > 0])) == {0, 1}
