"""The literature's allocators and scored samplers (Knapsack RL, GVM-RAFT,
XRPO, MMR1's VAS, V0): their rules against numpy references and
hand-worked cases, the sampler invariants, and a short Trainer run."""

import json
import math
import pathlib

import numpy as np
import pytest
from scipy import stats as scipy_stats

from rljax import selection
from rljax import testing
from rljax.checkpointing import _json
from rljax.training import Trainer

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "grpo.py"


def _feedback(ids, correct, valid=None, rewards=None, lengths=None):
  correct = np.asarray(correct, bool)
  valid = np.ones_like(correct) if valid is None else np.asarray(valid, bool)
  return selection.Feedback(
    prompt_ids=np.asarray(ids, np.int64),
    rewards=correct.astype(np.float32) if rewards is None else rewards,
    correct=correct & valid,
    lengths=np.ones(correct.shape, np.int32) if lengths is None else lengths,
    valid=valid,
    step=0,
  )


def _round_trip(state):
  return _json.decode(json.loads(json.dumps(_json.encode(state, "state"))))


def _assert_states_equal(a, b):
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))


def _check_invariants(sampler, state, size, budget, num_prompts):
  """Sum <= budget, counts in bounds, deterministic, state round-trips."""
  chosen, after = sampler.select(state, 1, size)
  counts = chosen.num_samples
  assert counts.sum() <= budget
  assert counts.min() >= 1 and counts.max() <= sampler.max_samples
  selection.check_selection(
    chosen, size, num_prompts, sampler.max_samples, "test"
  )
  again, after2 = sampler.select(_round_trip(state), 1, size)
  np.testing.assert_array_equal(again.prompt_ids, chosen.prompt_ids)
  np.testing.assert_array_equal(again.num_samples, counts)
  _assert_states_equal(_round_trip(after), after2)
  return chosen


# --- Knapsack RL -------------------------------------------------------------


def _np_value(n, p):
  return (1 - p**n - (1 - p) ** n) * p * (1 - p) ** 2


def test_knapsack_value_by_hand_and_reference():
  # p = 1/2, N = 2: P(both outcomes) = 1 - 1/4 - 1/4 = 1/2, InfoGain =
  # 1/2 * 1/4 = 1/8, so Value = 1/16.
  assert selection.knapsack_value(2, 0.5) == pytest.approx(0.0625)
  n, p = np.meshgrid(np.arange(1, 10), np.linspace(0, 1, 11))
  np.testing.assert_allclose(selection.knapsack_value(n, p), _np_value(n, p))
  assert np.all(selection.knapsack_value(n, 0.0) == 0)


def _dp_best(p, budget, low, high):
  """Brute-force optimum of sum Value(N_i, p_i), N_i in [low, high],
  sum N_i <= budget (dynamic programming over prompts)."""
  best = {0: 0.0}  # samples used -> best value
  for p_i in p:
    nxt = {}
    for used, v in best.items():
      for n in range(low, high + 1):
        if used + n <= budget:
          val = v + _np_value(n, p_i)
          if val > nxt.get(used + n, -1):
            nxt[used + n] = val
    best = nxt
  return max(best.values())


@pytest.mark.parametrize("seed", range(6))
def test_knapsack_allocation_is_the_dp_optimum(seed):
  rng = np.random.default_rng(seed)
  p = rng.uniform(0.02, 0.98, size=5)
  p[rng.integers(5)] = rng.choice([0.0, 1.0])
  budget, low, high = 5 * 4, 2, 9
  counts = selection.knapsack_allocate(
    p, budget, low=low, high=high, fallback_confidence=None
  )
  assert counts.sum() <= budget and counts.min() >= low
  assert counts.max() <= high
  got = _np_value(counts, p).sum()
  assert got == pytest.approx(_dp_best(p, budget, low, high), rel=1e-12)


def test_knapsack_allocation_by_hand():
  # p = 0.5 gains 1/16, 1/32, 1/64, 1/128 for its 2nd..5th sample; p = 0.9
  # gains 0.00162 for its 2nd: every spare sample goes to p = 0.5 (cap 5).
  got = selection.knapsack_allocate(
    [0.5, 0.9], 6, low=1, high=5, fallback_confidence=None
  )
  np.testing.assert_array_equal(got, [5, 1])
  # Fallback, c = 0.9: p = 0.5 needs ceil(log 0.1 / log 0.5) = 4 samples
  # (2 above low); 8 spare - 2 = 6 go to the never-solved prompt; the
  # knapsack places the last 2.
  got = selection.knapsack_allocate([0.5, 0.0], 12, low=2, high=8)
  np.testing.assert_array_equal(got, [4, 8])
  # Without it the p = 0.5 prompt fills to 8, the rest spreads to p = 0.
  got = selection.knapsack_allocate(
    [0.5, 0.0], 12, low=2, high=8, fallback_confidence=None
  )
  np.testing.assert_array_equal(got, [8, 4])
  # Unseen prompts (NaN) keep `unseen` and take no part.
  got = selection.knapsack_allocate(
    [np.nan, 0.5], 10, low=1, high=8, unseen=4, fallback_confidence=None
  )
  np.testing.assert_array_equal(got, [4, 6])
  with pytest.raises(ValueError, match="cannot give"):
    selection.knapsack_allocate([0.5, 0.5], 3, low=2, high=4)
  with pytest.raises(ValueError, match="fallback_confidence"):
    selection.knapsack_allocate([0.5], 3, low=1, high=4, fallback_confidence=1)


def test_knapsack_sampler():
  sampler = selection.Knapsack(
    num_samples=4, min_samples=1, max_samples_per_prompt=10
  )
  state = sampler.init(4, seed=0)
  chosen, _ = sampler.select(state, 0, 4)
  np.testing.assert_array_equal(chosen.num_samples, 4)  # unseen: uniform
  correct = [[1] * 4, [0] * 4, [1, 0, 0, 0], [1, 1, 0, 0]]
  state = sampler.update(state, _feedback(np.arange(4), correct))
  np.testing.assert_array_equal(state["right"], [4, 0, 1, 2])
  np.testing.assert_array_equal(state["visits"], 1)
  state["position"] = 0  # the same four prompts again
  chosen = _check_invariants(sampler, state, 4, 16, 4)
  by_id = dict(zip(chosen.prompt_ids, chosen.num_samples))
  rates = np.array([1.0, 0.0, 0.25, 0.5])
  want = selection.knapsack_allocate(
    rates[chosen.prompt_ids], 16, low=1, high=10, fallback_confidence=0.9
  )
  np.testing.assert_array_equal(chosen.num_samples, want)
  assert by_id[0] == 1  # always solved: no value
  with pytest.raises(ValueError, match="min_samples <= num_samples"):
    selection.Knapsack(num_samples=8, max_samples_per_prompt=4)


# --- GVM-RAFT ----------------------------------------------------------------


def test_gvm_weights_by_hand_and_reference():
  # alpha = 0: G / sqrt(p): p = 1/4 -> 2, p = 1 -> 1, p = 0 -> 0.
  np.testing.assert_allclose(
    selection.gvm_weights([0.25, 1.0, 0.0], [1, 1, 1], alpha=0.0), [2, 1, 0]
  )
  # alpha = 1e-3, beta = 2: 1 / sqrt(0.25 + 0.004) = 1 / 0.503984 = 1.98419.
  assert selection.gvm_weights([0.25], [1.0])[0] == pytest.approx(
    1.98419, abs=1e-5
  )
  rng = np.random.default_rng(0)
  p, g = rng.uniform(0.01, 1, 20), rng.uniform(0, 3, 20)
  a, b = 0.01, 3.0
  want = g / np.sqrt(p + a / p ** (b - 1))
  np.testing.assert_allclose(
    selection.gvm_weights(p, g, alpha=a, beta=b), want, rtol=1e-12
  )


def test_gvm_sampler_allocates_by_acceptance_rate():
  sampler = selection.GVM(
    num_samples=4, min_samples=1, max_samples_per_prompt=8, alpha=0.0
  )
  state = sampler.init(4, seed=0)
  correct = [[1, 0, 0, 0], [1] * 4, [0] * 4, [0, 0, 0, 1]]
  state = sampler.update(state, _feedback(np.arange(4), correct))
  state["position"] = 0
  chosen = _check_invariants(sampler, state, 4, 16, 4)
  by_id = dict(zip(chosen.prompt_ids, chosen.num_samples))
  # Weights 2, 1, 0, 2 of a 16 budget: shares 6.4, 3.2, 0, 6.4 -> 6, 3,
  # 1 (min_samples), 6.
  assert [by_id[i] for i in range(4)] == [6, 3, 1, 6]
  # sqrt_length: G = sqrt(mean accepted length); prompt 0 accepted a
  # 16-token answer, prompt 3 a 1-token one: weights 8, 1, 0, 2.
  long = selection.GVM(
    num_samples=4,
    max_samples_per_prompt=12,
    alpha=0.0,
    gradient="sqrt_length",
  )
  lengths = np.array([[16, 1, 1, 1]] + [[1] * 4] * 3, np.int32)
  s = long.update(
    long.init(4, 0), _feedback(np.arange(4), correct, lengths=lengths)
  )
  s["position"] = 0
  chosen, _ = long.select(s, 1, 4)
  by_id = dict(zip(chosen.prompt_ids, chosen.num_samples))
  # Shares 16 * (8, 1, 0, 2) / 11 = 11.6, 1.5, 0, 2.9.
  assert [by_id[i] for i in range(4)] == [11, 1, 1, 3]
  with pytest.raises(ValueError, match="gradient must be"):
    selection.GVM(gradient="adam")


# --- XRPO --------------------------------------------------------------------


def test_xrpo_priority_by_hand_and_reference():
  # s = 1, n = 2, T = 0 (no bonus): h(2) = 12.7062 / sqrt 2 = 8.98464,
  # h(3) = 4.30265 / sqrt 3 = 2.48414; the reduction is 6.50050.
  got = selection.xrpo_priority(1.0, 2, 0)
  assert got == pytest.approx(6.50050, abs=1e-4)
  s = np.array([0.3, 0.5, 0.0, 0.45])
  n = np.array([2, 5, 3, 9])
  t = lambda df: scipy_stats.t.ppf(0.95, df)  # confidence 0.9
  want = (
    t(n - 1) * s / np.sqrt(n)
    - t(n) * s / np.sqrt(n + 1)
    + 0.2 * np.sqrt(np.log(1 + 7) / n)
  )
  got = selection.xrpo_priority(s, n, 7, confidence=0.9, exploration=0.2)
  np.testing.assert_allclose(got, want, rtol=1e-12)
  with pytest.raises(ValueError, match="num_samples >= 2"):
    selection.xrpo_priority(1.0, 1, 0)


def test_xrpo_allocate_is_the_greedy_priority_order():
  s = np.array([0.5, 0.1, 0.0, 0.4])
  step, budget, low, high = 3, 20, 2, 8
  got = selection.xrpo_allocate(s, budget, step, low=low, high=high)
  # Independent greedy: one sample at a time to the largest priority.
  counts = [low] * 4
  for _ in range(budget - 4 * low):
    pri = []
    for i in range(4):
      n = counts[i]
      h = lambda k, s_i=s[i]: (
        scipy_stats.t.ppf(0.975, k - 1) * s_i / math.sqrt(k)
      )
      bonus = 0.1 * math.sqrt(math.log(1 + step) / n)
      pri.append(h(n) - h(n + 1) + bonus if n < high else -np.inf)
    counts[int(np.argmax(pri))] += 1
  np.testing.assert_array_equal(got, counts)
  assert got.sum() == budget and got.max() <= high


def test_xrpo_sampler():
  sampler = selection.XRPO(num_samples=4, max_samples_per_prompt=8)
  state = sampler.init(4, seed=1)
  rewards = np.array([[1, 0, 1, 0], [1, 1, 1, 1], [0.5, 0, 1, 0], [0] * 4])
  fb = _feedback(np.arange(4), rewards > 0, rewards=rewards)
  state = sampler.update(state, fb)
  np.testing.assert_allclose(state["reward_std"], rewards.std(-1, ddof=1))
  state["position"] = 0
  chosen = _check_invariants(sampler, state, 4, 16, 4)
  want = selection.xrpo_allocate(
    rewards.std(-1, ddof=1)[chosen.prompt_ids], 16, 1, low=2, high=8
  )
  np.testing.assert_array_equal(chosen.num_samples, want)
  with pytest.raises(ValueError, match="min_samples >= 2"):
    selection.XRPO(min_samples=1)


# --- MMR1 VAS ----------------------------------------------------------------


def test_vas_scores_and_length_diversity():
  # p = 1/4: OVS = 3/16; TDS 0.5 with beta 2: 3/16 + 1 = 1.1875.
  assert selection.vas_scores(0.25, 0.5, beta=2.0) == pytest.approx(1.1875)
  p = np.linspace(0, 1, 9)
  np.testing.assert_allclose(selection.vas_scores(p), p * (1 - p))
  fb = _feedback(
    [0, 1],
    [[1, 0, 1], [0, 0, 0]],
    valid=[[1, 1, 1], [1, 1, 0]],
    lengths=np.array([[3, 3, 5], [2, 2, 9]], np.int32),
  )
  # Row 0: lengths {3, 5} of 3 samples; row 1: {2} of 2 valid samples.
  np.testing.assert_allclose(selection.length_diversity(fb), [2 / 3, 1 / 2])


def test_vas_draws_by_score_and_mixes_the_stream():
  sampler = selection.VAS(num_samples=2, mixture=0.5, update_every=1)
  state = sampler.init(6, seed=0)
  np.testing.assert_allclose(state["scores"], 0.25)  # p = 1/2
  # Only prompt 3 has outcome variance: every weighted draw is 3.
  correct = [[1, 1], [0, 0], [1, 1], [1, 0], [0, 0], [1, 1]]
  state = sampler.update(state, _feedback(np.arange(6), correct))
  np.testing.assert_allclose(state["scores"], [0, 0, 0, 0.25, 0, 0])
  chosen = _check_invariants(sampler, state, 4, 8, 6)
  np.testing.assert_array_equal(chosen.prompt_ids[0::2], [3, 3])
  stream, _ = selection.Shuffled(2).select(state, 1, 2)
  np.testing.assert_array_equal(chosen.prompt_ids[1::2], stream.prompt_ids)
  np.testing.assert_array_equal(chosen.num_samples, 2)
  # The drawing weights refresh every `update_every` steps only.
  lazy = selection.VAS(num_samples=2, update_every=4)
  s = lazy.update(lazy.init(6, 0), _feedback(np.arange(6), correct))
  _, s = lazy.select(s, 1, 4)
  np.testing.assert_allclose(s["weights"], 0.25)
  _, s = lazy.select(s, 4, 4)
  np.testing.assert_allclose(s["weights"], [0, 0, 0, 0.25, 0, 0])
  # Momentum: 0.5 * 0.25 + 0.5 * 0 for a solved prompt.
  slow = selection.VAS(num_samples=2, momentum=0.5)
  s = slow.update(slow.init(2, 0), _feedback([0, 1], [[1, 1], [1, 0]]))
  np.testing.assert_allclose(s["scores"], [0.125, 0.25])
  with pytest.raises(ValueError, match="diversity must be"):
    selection.VAS(diversity="bleu")


# --- V0 ----------------------------------------------------------------------


def test_v0_keep_and_beta_mean():
  # G = 4: p = 1/2 agrees with prob 2/16 = 0.125 (kept); p = 0.99 with
  # 0.99^4 + 0.01^4 = 0.9606 (skipped at 0.9).
  np.testing.assert_array_equal(
    selection.v0_keep([0.5, 0.99, 0.01], 4, 0.9), [True, False, False]
  )
  history = {"right_total": np.array([3.0]), "wrong_total": np.array([1.0])}
  assert selection.beta_mean(0, history) == pytest.approx(4 / 6)


def test_v0_skips_predicted_constant_groups():
  table = np.array([0.5, 0.99, 0.3, 0.0, 0.6, 0.5, 0.9, 0.5])
  sampler = selection.V0(
    num_samples=4,
    min_samples=1,
    max_samples_per_prompt=8,
    pool=2,
    predictor=lambda i, history: table[i],
  )
  state = sampler.init(8, seed=2)
  chosen = _check_invariants(sampler, state, 3, 12, 8)
  pool, _ = selection.Shuffled(4).select(state, 1, 6)
  p = table[pool.prompt_ids]
  kept = pool.prompt_ids[p**4 + (1 - p) ** 4 <= 0.9][:3]
  np.testing.assert_array_equal(chosen.prompt_ids, kept)
  w = table[kept] * (1 - table[kept])
  np.testing.assert_array_equal(
    chosen.num_samples, selection.allocate(w, 12, 1, 8)
  )
  # The default predictor learns from the rollouts.
  default = selection.V0(num_samples=2)
  s = default.update(default.init(3, 0), _feedback([1], [[1, 1]]))
  np.testing.assert_allclose(default.predict(s, [0, 1]), [0.5, 0.75])
  bad = selection.V0(predictor=lambda i, h: 2.0)
  with pytest.raises(ValueError, match="outside"):
    bad.predict(bad.init(2, 0), [0])


# --- VSPO --------------------------------------------------------------------


def test_vspo_value_by_hand_and_reference():
  # p = 1/2: 1/2 * 1/2 * 1/2 = 0.125; p = 1/4: 1/4 * 3/4 * 3/4 = 0.140625
  # (the harder prompt is worth more).
  np.testing.assert_allclose(
    selection.vspo_value([0.5, 0.25, 0.0, 1.0]), [0.125, 0.140625, 0, 0]
  )
  p = np.linspace(0, 1, 11)
  np.testing.assert_allclose(
    selection.vspo_value(p, difficulty=2.0), p * (1 - p) ** 3
  )


def test_vspo_swaps_constant_groups_for_valuable_prompts():
  sampler = selection.VSPO(num_samples=4)
  state = sampler.init(8, seed=0)
  # 0: all right, 1: all wrong, 2: p = 1/2, 3: p = 1/4, 5: p = 3/4.
  correct = [[1] * 4, [0] * 4, [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]]
  state = sampler.update(state, _feedback([0, 1, 2, 3, 5], correct))
  chosen = _check_invariants(sampler, state, 4, 16, 8)
  batch, _ = selection.Shuffled(4).select(state, 1, 4)
  # Reference: constant prompts, in batch order, take the informative
  # prompts outside the batch by decreasing value (3, then 2, then 5).
  by_value = [i for i in (3, 2, 5) if i not in batch.prompt_ids]
  want = []
  for i in batch.prompt_ids:
    want.append(by_value.pop(0) if i in (0, 1) and by_value else i)
  np.testing.assert_array_equal(chosen.prompt_ids, want)
  # Seed 0's stream starts 0, 4, 6, 7: the always-solved 0 becomes 3.
  np.testing.assert_array_equal(chosen.prompt_ids, [3, 4, 6, 7])
  np.testing.assert_array_equal(chosen.num_samples, 4)
  with pytest.raises(ValueError, match="difficulty"):
    selection.VSPO(difficulty=-1)


# --- every sampler ------------------------------------------------------------

ALL = {
  "knapsack": {"max_samples_per_prompt": 8},
  "gvm": {"max_samples_per_prompt": 8},
  "xrpo": {"max_samples_per_prompt": 8},
  "vas": {},
  "v0": {"max_samples_per_prompt": 8},
  "vspo": {},
}


@pytest.mark.parametrize("name", sorted(ALL))
def test_invariants_over_random_feedback(name):
  sampler = selection.get(name, num_samples=4, **ALL[name])
  state = sampler.init(12, seed=5)
  rng = np.random.default_rng(0)
  for step in range(5):
    chosen, state = sampler.select(state, step, 4)
    g = sampler.max_samples
    valid = np.arange(g)[None] < chosen.num_samples[:, None]
    correct = (rng.random((4, g)) < 0.4) & valid
    state = sampler.update(
      state, _feedback(chosen.prompt_ids, correct, valid=valid)
    )
    _check_invariants(sampler, state, 4, 16, 12)


@pytest.mark.slow  # 25-55 s each on a shared 2-core machine
@pytest.mark.parametrize(
  ("name", "kwargs"),
  [(n, k) for n, k in ALL.items()],
  ids=list(ALL),
)
def test_trainer_runs_each_sampler(tmp_path, name, kwargs):
  config = testing.tiny_run_config(
    CONFIG,
    tmp_path,
    "train.steps=2",
    f"sampler.prompts={name!r}",
    f"sampler.prompts_kwargs={kwargs!r}",
  )
  trainer = Trainer(config)
  out = trainer.run()
  assert len(out["history"]) == 2
  assert all(h["samples"] <= 8 * 4 for h in out["history"])
  state = trainer.prompt_state
  _assert_states_equal(_round_trip(state), state)
