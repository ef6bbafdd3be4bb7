"""Delethink: chunked traces on a tiny model, the trace-level advantage and
the trace-length normaliser against numpy, and one trainer step."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import aggregate
from rljax import algorithms
from rljax import rollouts
from rljax import sampling
from rljax import testing
from rljax import transforms
from rljax._src.base import Batch
from rljax.training import Trainer

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs"
STOPS = (3, 4, 5)  # frequent stop ids: some traces end early


@pytest.fixture(scope="module")
def model(tiny_model):
  return tiny_model(17)


def _engine(model, stop_ids=STOPS):
  return sampling.Engine(
    model.config,
    slots=4,
    page_size=4,
    segment=4,
    max_length=24,
    stop_ids=stop_ids,
  )


# --- numpy references ---------------------------------------------------------


def _np_advantages(rewards, trace, chunk, valid, scale="std", eps=1e-6):
  """Loop reference: GRPO over each group's traces (reward of the last
  chunk), copied to the trace's rows."""
  p, g = rewards.shape
  out = np.zeros((p, g))
  for i in range(p):
    ids = sorted({int(t) for t, v in zip(trace[i], valid[i]) if t >= 0 and v})
    reward = {}
    for t in ids:
      rows = [j for j in range(g) if trace[i, j] == t and valid[i, j]]
      last = max(rows, key=lambda j: chunk[i, j])
      reward[t] = rewards[i, last]
    if len(ids) < 2:
      continue
    r = np.array([reward[t] for t in ids])
    for t in ids:
      a = reward[t] - r.mean()
      if scale == "std":
        a = a / (r.std(ddof=1) + eps)
      for j in range(g):
        if trace[i, j] == t and valid[i, j]:
          out[i, j] = a
  return out


def _np_loss_and_grad(adv_PG, trace, mask, logp, old, lo=0.8, hi=1.26):
  """Delethink's PPO-clip loss, -(1/#traces) sum_tau (1/ell(tau)) sum_t
  min(r_t A, clip(r_t, lo, hi) A), and its gradient in each log-prob
  (d/dlogp of r_t A is r_t A; the clipped branch has none)."""
  p, g, _ = mask.shape
  ratio = np.exp(logp - old)
  adv = adv_PG[..., None]
  plain, cut = ratio * adv, np.clip(ratio, lo, hi) * adv
  token_loss = -np.minimum(plain, cut)
  token_grad = np.where(plain <= cut, -ratio * adv, 0.0)
  loss, grad, traces = 0.0, np.zeros(mask.shape), 0
  for i in range(p):
    for t in set(trace[i][trace[i] >= 0].tolist()):
      rows = trace[i] == t
      length = mask[i, rows].sum()
      if length == 0:
        continue
      traces += 1
      loss += (token_loss[i, rows] * mask[i, rows]).sum() / length
      grad[i, rows] = token_grad[i, rows] * mask[i, rows] / length
  return loss / traces, grad / traces


def _random_layout(rng, p, traces, chunks):
  """Random traces: trace t ends after a random number of chunks."""
  g = traces * chunks
  trace = np.full((p, g), -1, np.int32)
  chunk = np.full((p, g), -1, np.int32)
  for i in range(p):
    for t in range(traces):
      for k in range(rng.integers(1, chunks + 1)):
        trace[i, t * chunks + k], chunk[i, t * chunks + k] = t, k
  return trace, chunk


# --- the advantage and the normaliser -----------------------------------------


def test_advantages_by_hand():
  # 3 traces x 2 chunks: trace 0 ends in its first chunk (row 1 unused),
  # traces 1 and 2 take two. Last-chunk rewards: R = (1, 0, 1); the other
  # rows' rewards (5) are never read. mean 2/3, unbiased std
  # sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3) = 0.57735:
  # A = (1/3) / 0.57735 = 0.57735 and (-2/3) / 0.57735 = -1.15470.
  rewards = np.array([[1.0, 9.0, 5.0, 0.0, 5.0, 1.0]])
  trace = np.array([[0, -1, 1, 1, 2, 2]], np.int32)
  chunk = np.array([[0, -1, 0, 1, 0, 1]], np.int32)
  adv = jax.jit(transforms.delethink_advantages_of)(rewards, trace, chunk)
  a, b = 0.57735, -1.15470
  np.testing.assert_allclose(adv, [[a, 0, b, b, a, a]], atol=1e-4)
  np.testing.assert_array_equal(
    transforms.final_chunks(trace, chunk), [[1, 0, 0, 1, 0, 1]]
  )
  # scale="none": R - mean only.
  adv = transforms.delethink_advantages_of(rewards, trace, chunk, scale="none")
  np.testing.assert_allclose(
    adv, [[1 / 3, 0, -2 / 3, -2 / 3, 1 / 3, 1 / 3]], atol=1e-6
  )


@pytest.mark.parametrize("scale", ["std", "none"])
def test_advantages_match_numpy(scale):
  rng = np.random.default_rng(0)
  trace, chunk = _random_layout(rng, p=5, traces=4, chunks=3)
  rewards = rng.normal(size=trace.shape).astype(np.float32)
  valid = (rng.random(trace.shape) > 0.1).astype(np.float32)
  fn = jax.jit(
    lambda r, t, c, v: transforms.delethink_advantages_of(
      r, t, c, v, scale=scale
    )
  )
  got = fn(rewards, trace, chunk, valid)
  want = _np_advantages(rewards, trace, chunk, valid > 0, scale)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_trace_lengths_by_hand():
  # Trace 0: rows of 3 and 1 tokens (ell 4); trace 1: one row of 2 tokens.
  mask = np.zeros((1, 4, 3), np.float32)
  mask[0, 0, :3] = mask[0, 1, :1] = mask[0, 2, :2] = 1
  trace = np.array([[0, 0, 1, -1]], np.int32)
  lengths = jax.jit(transforms.trace_lengths_of)(mask, trace)
  np.testing.assert_array_equal(lengths, [[4, 4, 2, 0]])


def _batch(rng, p=3, traces=3, chunks=2, t=5):
  trace, chunk = _random_layout(rng, p, traces, chunks)
  lengths = rng.integers(1, t + 1, size=trace.shape)
  mask = (np.arange(t) < lengths[..., None]).astype(np.float32)
  mask = mask * (trace >= 0)[..., None]
  return Batch(
    mask_PGT=mask,
    rewards_PG=rng.integers(0, 2, size=trace.shape).astype(np.float32),
    sample_mask_PG=(trace >= 0).astype(np.float32),
  ).with_extra(trace_PG=trace, chunk_PG=chunk)


def test_preset_loss_and_gradient_match_numpy():
  rng = np.random.default_rng(1)
  batch = _batch(rng)
  logp = rng.normal(size=batch.mask_PGT.shape).astype(np.float32)
  old = (logp + 0.3 * rng.normal(size=logp.shape)).astype(np.float32)
  batch = batch._replace(old_logp_PGT=old)
  algo = algorithms.delethink(tis_cap=None)
  prepared, state = jax.jit(algo.prepare)(batch, algo.init())
  logp = jnp.asarray(logp)

  def loss(logp):
    return algo.loss(logp, prepared, state)[0].value

  value, grad = jax.jit(jax.value_and_grad(loss))(logp)
  trace = np.asarray(batch.extra["trace_PG"])
  adv = _np_advantages(
    np.asarray(batch.rewards_PG),
    trace,
    np.asarray(batch.extra["chunk_PG"]),
    trace >= 0,
  )
  want, want_grad = _np_loss_and_grad(
    adv, trace, np.asarray(batch.mask_PGT), np.asarray(logp), old
  )
  assert abs(want) > 1e-3  # off-policy: the loss is not 0
  np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
  # Exact under micro-batching: the Means of two halves sum to the whole.
  halves = [
    jax.tree.map(lambda x, s=s: x[s], prepared)
    for s in (slice(0, 1), slice(1, None))
  ]
  a = algo.loss(logp[:1], halves[0], state)[0]
  b = algo.loss(logp[1:], halves[1], state)[0]
  np.testing.assert_allclose((a.num + b.num) / (a.den + b.den), want, rtol=1e-5)


def test_normaliser_by_hand():
  # Trace 0: 3 + 1 tokens, trace 1: 2 tokens; per-token loss 1 everywhere
  # except 4 on trace 1: J = (4 / 4 + 2 * 4 / 2) / 2 traces = 2.5 (a plain
  # token mean would give (4 + 8) / 6 = 2).
  mask = np.zeros((1, 4, 3), np.float32)
  mask[0, 0, :3] = mask[0, 1, :1] = mask[0, 2, :2] = 1
  batch = Batch(mask_PGT=mask).with_extra(
    trace_PG=np.array([[0, 0, 1, -1]], np.int32)
  )
  out, _ = transforms.trace_length_norm().prepare(batch, ())
  loss = np.ones((1, 4, 3), np.float32)
  loss[0, 2] = 4.0
  mean = aggregate.token_mean(loss, out.loss_mask())
  np.testing.assert_allclose(mean.value, 2.5, rtol=1e-6)
  np.testing.assert_allclose(mean.den, 2.0, rtol=1e-6)


def test_bad_inputs_raise():
  r = np.zeros((1, 4), np.float32)
  ids = np.zeros((1, 4), np.int32)
  with pytest.raises(ValueError, match="trace_PG must hold integer"):
    transforms.delethink_advantages_of(r, ids.astype(np.float32), ids)
  with pytest.raises(ValueError, match="scale"):
    transforms.delethink_advantages_of(r, ids, ids, scale="group")
  with pytest.raises(ValueError, match="chunk_PG"):
    transforms.delethink_advantages_of(r, ids, ids[:, :3])
  batch = Batch(mask_PGT=np.ones((1, 4, 2)), rewards_PG=r)
  with pytest.raises(ValueError, match="trace_PG"):
    algorithms.delethink().prepare(batch, algorithms.delethink().init())


# --- sampling -----------------------------------------------------------------


def test_carryover():
  assert rollouts.carryover([1, 2, 3, 4, 5, 6], 2, 1) == [1, 2, 6]
  assert rollouts.carryover([1, 2, 3, 4, 5, 6], 0, 3) == [4, 5, 6]
  assert rollouts.carryover([1, 2, 3], 2, 1) == [1, 2, 3]  # all of it


def test_draw_samples_chunked_traces(model):
  strategy = rollouts.MarkovianChunks(
    max_chunks=3, chunk_size=5, keep_head=1, keep_tail=2
  )
  assert strategy.budgets(5) == (5, 2, 2)  # C, keep_tail, C - 1 - 2
  prompts = [[6, 7, 8], [9, 10, 11, 12]]
  key = jax.random.key(3)
  engine = _engine(model)  # one engine: its programs compile once
  rollout, extra, *_ = strategy.draw(
    engine,
    model,
    prompts,
    np.array([6, 6]),
    key=key,
    max_new_tokens=5,
    width=5,
    temperature=1.0,
  )
  trace, chunk = extra["trace_PG"], extra["chunk_PG"]
  assert rollout.tokens_PGT.shape == (2, 6, 5)
  tokens, mask = rollout.tokens_PGT, rollout.mask_PGT > 0
  stopped = running = 0
  for i, prompt in enumerate(prompts):
    for t in range(2):
      so_far = []
      for k in range(3):
        j = t * 3 + k
        if trace[i, j] < 0:  # the trace ended before this chunk
          assert rollout.sample_mask_PG[i, j] == 0 and chunk[i, j] == -1
          continue
        assert (trace[i, j], chunk[i, j]) == (t, k)
        # Chunk k's own prompt: the query, then (k >= 1) the first token
        # and the last 2 tokens of the trace so far.
        own = rollout.prompt_tokens_PGS[i, j][rollout.prompt_mask_PGS[i, j] > 0]
        carry = [] if k == 0 else so_far[:1] + so_far[-2:]
        np.testing.assert_array_equal(own, prompt + carry)
        done = tokens[i, j][mask[i, j]].tolist()
        assert len(done) <= (5 if k == 0 else 2)
        so_far += done
        ends = done[-1] in STOPS
        if ends or k == 2:  # no later chunk
          assert np.all(trace[i, t * 3 + k + 1 : t * 3 + 3] == -1)
          stopped += ends
        else:  # a chunk goes on only when it used its whole budget
          assert len(done) == (5 if k == 0 else 2)
          running += 1
  assert stopped and running  # both cases occur with these stop ids
  # Deterministic for a fixed key; scoring_rollout holds each whole trace.
  again, *_ = strategy.draw(
    engine,
    model,
    prompts,
    np.array([6, 6]),
    key=key,
    max_new_tokens=5,
    width=5,
    temperature=1.0,
  )
  np.testing.assert_array_equal(again.tokens_PGT, rollout.tokens_PGT)
  whole = strategy.scoring_rollout(rollout, extra)
  for i in range(2):
    for j in range(6):
      if trace[i, j] < 0:
        continue
      rows = np.flatnonzero(trace[i] == trace[i, j])
      want = np.concatenate([tokens[i, r][mask[i, r]] for r in rows])
      got = whole.tokens_PGT[i, j][whole.mask_PGT[i, j] > 0]
      np.testing.assert_array_equal(got, want)
      assert whole.truncated_PG[i, j] == rollout.truncated_PG[i, rows[-1]]


@pytest.mark.slow  # its own engine compiles again (~20 s)
def test_draw_without_stops_runs_every_chunk(model):
  strategy = rollouts.MarkovianChunks(max_chunks=2, keep_head=0, keep_tail=1)
  rollout, extra, *_ = strategy.draw(
    _engine(model, stop_ids=()),
    model,
    [[6, 7]],
    np.array([4]),
    key=jax.random.key(0),
    max_new_tokens=3,
    width=3,
    temperature=1.0,
  )
  np.testing.assert_array_equal(extra["trace_PG"], [[0, 0, 1, 1]])
  np.testing.assert_array_equal(extra["chunk_PG"], [[0, 1, 0, 1]])
  np.testing.assert_array_equal(rollout.mask_PGT.sum(-1), [[3, 2, 3, 2]])
  # Chunk 1's prompt: the query and the last token of chunk 0.
  np.testing.assert_array_equal(
    rollout.prompt_tokens_PGS[0, 1][-3:],
    [6, 7, rollout.tokens_PGT[0, 0, 2]],
  )


def test_strategy_errors(model):
  with pytest.raises(ValueError, match="max_chunks"):
    rollouts.MarkovianChunks(max_chunks=0)
  with pytest.raises(ValueError, match="keep_tail"):
    rollouts.MarkovianChunks(keep_head=2).budgets(4)  # 4 // 2 - 2 = 0
  with pytest.raises(ValueError, match="intermediate_tokens"):
    rollouts.MarkovianChunks(keep_head=2, keep_tail=2).budgets(4)
  kwargs = dict(key=jax.random.key(0), width=4, temperature=1.0)
  strategy = rollouts.MarkovianChunks(max_chunks=2, keep_head=0, keep_tail=1)
  with pytest.raises(ValueError, match="multiple of 2"):
    strategy.draw(
      _engine(model), model, [[6]], np.array([3]), max_new_tokens=4, **kwargs
    )
  wide = rollouts.MarkovianChunks(
    max_chunks=2, chunk_size=6, keep_head=0, keep_tail=1
  )
  with pytest.raises(ValueError, match="rollout width"):
    wide.draw(
      _engine(model), model, [[6]], np.array([4]), max_new_tokens=4, **kwargs
    )


@pytest.mark.slow  # a trainer step
def test_trainer_step(tmp_path):
  config = testing.tiny_run_config(
    CONFIG / "delethink.py", tmp_path, "train.steps=1"
  )
  trainer = Trainer(config)
  trainer.step(0)
  last = trainer._last
  trace = last.extra["trace_PG"]
  assert trace.shape == (8, 4)  # tiny run: 4 rows = 2 traces x 2 chunks
  valid = last.rollout.sample_mask_PG > 0
  np.testing.assert_array_equal(trace >= 0, valid)
  # Every chunk-1 row's prompt ends with its trace's chunk-0 last token.
  tokens, prompts = last.rollout.tokens_PGT, last.rollout.prompt_tokens_PGS
  for i, j in zip(*np.nonzero(valid & (last.extra["chunk_PG"] == 1))):
    first = tokens[i, j - 1][last.rollout.mask_PGT[i, j - 1] > 0]
    assert prompts[i, j, -1] == first[-1]
