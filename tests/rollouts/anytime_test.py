"""AnytimeReasoner / BRPO: the budget-relative advantage against a numpy
reference and by hand, the strategy's thinking cuts and forced summaries on
a tiny random model, and one trainer step."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import Batch
from rljax import algorithms
from rljax import rollouts
from rljax import sampling
from rljax import testing
from rljax import transforms
from rljax.training import Trainer

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "brpo.py"
STOP, MARK, CUT = 1, 5, 6


# --- numpy reference ---------------------------------------------------------


def _chunk_reference(r, p, baseline="brpo"):
  """A_{i,s} for one group, loops over the formula (r: [N, S])."""
  n, s = r.shape
  p = np.asarray(p, np.float64) / np.sum(p)
  ret = np.array([[sum(p[j] * r[i, j] for j in range(k, s)) for k in range(s)]
                  for i in range(n)])  # fmt: skip
  v1 = np.zeros((n, s))
  for i in range(n):
    for k in range(1, s):
      w = [2.0**j for j in range(k)]
      mean = sum(w[j] * r[i, j] for j in range(k)) / sum(w)
      v1[i, k] = mean * sum(p[k:])
  v2 = ret.mean(0) if n > 1 else np.zeros(s)
  out = np.zeros((n, s))
  for i in range(n):
    for k in range(s):
      base = {
        "brpo": (k * v1[i, k] + (s - k) * v2[k]) / s,
        "v1": v1[i, k],
        "v2": v2[k],
        "none": 0.0,
      }[baseline]
      out[i, k] = ret[i, k] - base
  return out


def _layout(rng, p, n, s, a, t):
  """A random AnytimeBudgets layout: rewards, trace, budget, length, chunk,
  mask (thinking lengths and where they end drawn at random)."""
  budgets = np.arange(1, s + 1) * (t // s)
  g = n * (1 + s * a)
  trace = np.full((p, g), -1)
  budget = np.full((p, g), -1)
  length = np.zeros((p, g), int)
  chunk = np.full((p, g, t), -1)
  mask = np.zeros((p, g, t))
  for i in range(p):
    for k in range(n):
      size = int(rng.integers(1, budgets[-1] + 1))
      trace[i, k] = k
      length[i, k] = size
      chunk[i, k, :size] = np.searchsorted(budgets, np.arange(size), "right")
      mask[i, k, :size] = 1
      for b in range(s):
        for c in range(a):
          row = n + (k * s + b) * a + c
          trace[i, row], budget[i, row] = k, b
          length[i, row] = min(budgets[b], size)
          mask[i, row, : int(rng.integers(1, t + 1))] = 1
  rewards = rng.integers(0, 2, (p, g)).astype(np.float32)
  return rewards, trace, budget, length, chunk, mask


def _reference(
  rewards, trace, budget, length, chunk, prior, baseline, summary_baseline,
  summaries,
):  # fmt: skip
  p_, g = rewards.shape
  s = len(prior)
  out = np.zeros(chunk.shape)
  for i in range(p_):
    n = trace[i].max() + 1
    r = np.zeros((n, s))
    for k in range(n):
      for b in range(s):
        rows = (trace[i] == k) & (budget[i] == b)
        r[k, b] = rewards[i, rows].mean()
    adv = _chunk_reference(r, prior, baseline)
    summary_rows = np.flatnonzero(budget[i] >= 0)
    for row in range(g):
      k = trace[i, row]
      if budget[i, row] < 0:
        for t in range(chunk.shape[2]):
          if chunk[i, row, t] >= 0:
            out[i, row, t] = adv[k, chunk[i, row, t]]
        continue
      if summary_baseline == "prefix":
        peers = [
          j
          for j in summary_rows
          if trace[i, j] == k and length[i, j] == length[i, row]
        ]
        mean = rewards[i, peers].mean() if len(peers) > 1 else 0.0
      else:
        peers = [j for j in summary_rows if budget[i, j] == budget[i, row]]
        mean = rewards[i, peers].mean()
      value = rewards[i, row] - mean
      last = max(j for j in summary_rows if trace[i, j] == k)
      if summaries == "last" and row != last:
        value = 0.0
      out[i, row, :] = value
  return out


# --- the advantage -----------------------------------------------------------


def test_chunk_advantages_by_hand():
  # Two traces, budgets s = 0, 1, uniform prior (0.5, 0.5); trace 0 answers
  # wrong then right (0, 1), trace 1 right at both (1, 1).
  # G = [[0.5, 0.5], [1.0, 0.5]]; V2 = (0.75, 0.5); V1 = 0 at s = 0,
  # V1_{0,1} = 0 * 0.5 = 0, V1_{1,1} = 1 * 0.5 = 0.5.
  # A_{i,0} = G_{i,0} - 2 V2_0 / 2: -0.25, 0.25.
  # A_{0,1} = 0.5 - (0 + 0.5) / 2 = 0.25; A_{1,1} = 0.5 - (0.5 + 0.5) / 2 = 0.
  r = jnp.array([[0.0, 1.0], [1.0, 1.0]])
  got = jax.jit(transforms.brpo_chunk_advantages)(r, jnp.array([0.5, 0.5]))
  np.testing.assert_allclose(got, [[-0.25, 0.25], [0.25, 0.0]], atol=1e-6)


@pytest.mark.parametrize("baseline", ["brpo", "v1", "v2", "none"])
def test_chunk_advantages_match_reference(baseline):
  rng = np.random.default_rng(0)
  r = rng.uniform(size=(3, 5, 4)).astype(np.float32)
  prior = rng.uniform(size=4).astype(np.float32)
  fn = jax.jit(
    lambda r, p: transforms.brpo_chunk_advantages(r, p, baseline=baseline)
  )
  got = fn(r, prior)
  want = np.stack([_chunk_reference(x, prior, baseline) for x in r])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # One trace: no group baseline (V2 = 0), as in the official code.
  one = transforms.brpo_chunk_advantages(r[0, :1], prior, baseline=baseline)
  np.testing.assert_allclose(
    one, _chunk_reference(r[0, :1], prior, baseline), rtol=1e-5, atol=1e-6
  )


@pytest.mark.parametrize(
  "baseline,summary_baseline,summaries",
  [
    ("brpo", "prefix", "all"),
    ("v2", "budget", "last"),
    ("v1", "prefix", "last"),
  ],
)
def test_advantages_match_reference(baseline, summary_baseline, summaries):
  rng = np.random.default_rng(1)
  rewards, trace, budget, length, chunk, _ = _layout(rng, 3, 3, 2, 2, 8)
  prior = transforms.budget_prior([4, 8], "linear")
  fn = jax.jit(
    lambda *a: transforms.brpo_advantages_of(
      *a,
      baseline=baseline,
      summary_baseline=summary_baseline,
      summaries=summaries,
    )
  )
  got = fn(rewards, trace, budget, length, chunk, prior)
  want = _reference(
    rewards,
    trace,
    budget,
    length,
    chunk,
    prior,
    baseline,
    summary_baseline,
    summaries,
  )
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_transform_writes_masked_advantages():
  rng = np.random.default_rng(2)
  rewards, trace, budget, length, chunk, mask = _layout(rng, 2, 2, 2, 1, 6)
  batch = Batch(mask_PGT=mask, rewards_PG=rewards).with_extra(
    anytime_trace_PG=trace,
    anytime_budget_PG=budget,
    anytime_length_PG=length,
    anytime_chunk_PGT=chunk,
  )
  prior = transforms.budget_prior([3, 6], "uniform")
  t = transforms.brpo_advantages(prior, summary_baseline="budget")
  out, _ = jax.jit(t.prepare)(batch, t.init())
  want = _reference(
    rewards, trace, budget, length, chunk, prior, "brpo", "budget", "all"
  )
  np.testing.assert_allclose(out.advantages_PGT, want * mask, atol=1e-6)
  with pytest.raises(ValueError, match="anytime_trace_PG"):
    t.prepare(Batch(mask_PGT=mask, rewards_PG=rewards), ())


def test_priors_and_bad_arguments():
  np.testing.assert_allclose(
    transforms.budget_prior([2, 4], "linear"), [1 / 3, 2 / 3]
  )
  np.testing.assert_allclose(transforms.budget_prior([2, 4], "base"), [0, 1])
  np.testing.assert_allclose(
    transforms.budget_prior([2, 4], [1, 3]), [0.25, 0.75]
  )
  with pytest.raises(ValueError, match="prior"):
    transforms.budget_prior([2, 4], "cubic")
  with pytest.raises(ValueError, match="one per budget"):
    transforms.budget_prior([2, 4], [1.0])
  with pytest.raises(ValueError, match="prior"):
    transforms.brpo_advantages([-1.0, 2.0])
  with pytest.raises(ValueError, match="baseline"):
    transforms.brpo_advantages([1.0], baseline="grpo")
  with pytest.raises(ValueError, match="prior"):
    transforms.brpo_chunk_advantages(jnp.ones((2, 3)), jnp.ones(2))
  with pytest.raises(ValueError, match="strictly increasing"):
    rollouts.AnytimeBudgets(marker=(MARK,), budgets=(4, 2))
  with pytest.raises(ValueError, match="marker"):
    rollouts.AnytimeBudgets(marker=())
  with pytest.raises(ValueError, match="num_summaries"):
    rollouts.AnytimeBudgets(marker=(MARK,), num_summaries=0)


def test_preset():
  algo = algorithms.get("brpo", budgets=(2, 4), num_summaries=1)
  assert algo.transform.prepare is not None


# --- the rollouts ------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tiny_model):
  return tiny_model(12)


@pytest.fixture(scope="module")
def engine(model):
  # Stop ids 1 and 2 end many drafts early, so both markers are exercised.
  # One engine for the strategy and the references: its compiled programs
  # are kept across runs.
  return sampling.Engine(
    model.config,
    slots=8,
    page_size=4,
    segment=4,
    max_length=32,
    stop_ids=(STOP, 2),
  )


@pytest.mark.slow  # about 25 s on a loaded 2-core machine (compiles)
def test_summaries_continue_the_cut_thinking(model, engine):
  strategy = rollouts.AnytimeBudgets(
    marker=(MARK,),
    cut_marker=(CUT, MARK),
    budgets=(2, 5),
    num_summaries=2,
    summary_tokens=3,
  )
  prompts = [[3, 4, 7], [8, 9]]
  n, s, a = 3, 2, 2
  key = jax.random.key(4)
  rollout, extra = strategy.draw(
    engine,
    model,
    prompts,
    np.full(2, n * strategy.rows_per_trace),
    key=key,
    max_new_tokens=5,
    width=6,
    temperature=1.0,
    groups=(),
    step=0,
    state={},
  )
  g = n * (1 + s * a)
  assert rollout.tokens_PGT.shape == (2, g, 6)
  assert np.all(rollout.sample_mask_PG == 1)
  # The thinking rows are N plain samples of each prompt.
  keys = [jax.random.fold_in(key, i) for i in range(2)]
  traces = [
    engine.add(x, key=jax.random.fold_in(k, 0), max_new_tokens=5, num_samples=n)
    for x, k in zip(prompts, keys)
  ]
  engine.run(model)
  reasons, expected = [], []
  for i, prompt in enumerate(prompts):
    for t, seq in enumerate(traces[i]):
      m = int(rollout.mask_PGT[i, t].sum())
      np.testing.assert_array_equal(
        rollout.tokens_PGT[i, t, :m], seq.completion
      )
      np.testing.assert_array_equal(
        extra["anytime_chunk_PGT"][i, t, :m], np.arange(m) >= 2
      )
      assert np.all(extra["anytime_chunk_PGT"][i, t, m:] == -1)
      thinking = list(seq.completion)
      ended = sampling.REASONS[seq.stop_reason] == "stop_id"
      reasons.append(ended)
      if ended:  # the stop id gives way to the marker
        thinking = thinking[:-1]
      lengths = [min(budget, len(thinking)) for budget in (2, 5)]
      for b, length in enumerate(lengths):
        forced = [MARK] if ended and length == len(thinking) else [CUT, MARK]
        prefix = prompt + thinking[:length] + forced
        # A summary at budget b samples prompt + thinking[:L] + marker;
        # budgets with one prefix share one add of A samples per budget,
        # key fold_in(fold_in(key_p, 1), t S + the first such budget).
        slots = [x for x, y in enumerate(lengths) if y == length]
        if slots[0] == b:
          subs = engine.add(
            prefix,
            key=jax.random.fold_in(
              jax.random.fold_in(keys[i], 1), t * s + slots[0]
            ),
            max_new_tokens=3,
            num_samples=a * len(slots),
          )
        for c in range(a):
          row = n + (t * s + b) * a + c
          expected.append(
            (i, row, t, b, length, prefix, subs[slots.index(b) * a + c])
          )
  engine.run(model)
  for i, row, t, b, length, prefix, sub in expected:
    m = int(rollout.mask_PGT[i, row].sum())
    np.testing.assert_array_equal(
      rollout.tokens_PGT[i, row, :m], sub.completion
    )
    p_mask = rollout.prompt_mask_PGS[i, row] > 0
    np.testing.assert_array_equal(
      rollout.prompt_tokens_PGS[i, row][p_mask], prefix
    )
    assert extra["anytime_trace_PG"][i, row] == t
    assert extra["anytime_budget_PG"][i, row] == b
    assert extra["anytime_length_PG"][i, row] == length
    assert np.all(extra["anytime_chunk_PGT"][i, row] == -1)
  assert any(reasons) and not all(reasons)  # both markers were used
  with pytest.raises(ValueError, match="multiple of 5"):
    strategy.draw(
      engine,
      model,
      prompts,
      np.full(2, 7),
      key=key,
      max_new_tokens=5,
      width=6,
      temperature=1.0,
    )


# --- the trainer -------------------------------------------------------------


@pytest.mark.slow  # about 30 s alone, more on a loaded machine
def test_trainer_step_with_anytime_budgets(tmp_path):
  config = testing.tiny_run_config(
    CONFIG, tmp_path, "train.steps=1", "sampler.num_samples=10"
  )
  trainer = Trainer(config)
  metrics = trainer.step(0)
  extra = trainer._last.extra
  assert extra["anytime_trace_PG"].shape == (8, 10)
  assert extra["anytime_chunk_PGT"].shape == (8, 10, 4)
  np.testing.assert_array_equal(extra["anytime_budget_PG"][0, :2], [-1, -1])
  # Summary rows' prompts end with the forced "=" (token 15).
  r = trainer._last.rollout
  assert np.all(r.prompt_tokens_PGS[:, 2:, -1] == 15)
  assert np.isfinite(metrics["loss"])
