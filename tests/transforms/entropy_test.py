"""D3S down-sampling and ARES entropy shaping: the pure functions of
`rljax.advantages._entropy` and the stages of `rljax.transforms._entropy`."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import rljax
from rljax import advantages as A
from rljax import aggregate
from rljax.advantages import _entropy as E
from rljax.testing import random_batch
from rljax.transforms import _entropy as TE


def _batch(seed=0, prompts=4, samples=6, tokens=8, dtype=np.float32):
  b = random_batch(seed, prompts=prompts, samples=samples, tokens=tokens)
  rng = np.random.default_rng(seed + 100)
  adv = rng.normal(0.0, 1.0, b.shape[:2])[..., None] * np.ones(b.shape)
  adv = adv + rng.normal(0.0, 0.1, b.shape)  # token-level differences too
  b = b._replace(advantages_PGT=adv * np.asarray(b.mask_PGT))
  return jax.tree.map(lambda x: np.asarray(x).astype(dtype), b)


def _prepare(stage, batch, state=None):
  algo = rljax.Algorithm(stage, aggregate.token_mean)
  state = algo.init() if state is None else state
  return jax.jit(algo.prepare)(batch, state)


def _half(batch, part, p):
  sl = slice(0, p // 2) if part == 0 else slice(p // 2, p)
  return jax.tree.map(lambda x: x[sl], batch)


# ---------------------------------------------------------------------------
# Numpy references (float64, explicit loops).
# ---------------------------------------------------------------------------


def np_best_variance(values, valid, k):
  """Brute force: the largest population variance over all k-subsets."""
  idx = [i for i in range(len(values)) if valid[i]]
  k = min(k, len(idx))
  best = -1.0
  for sub in itertools.combinations(idx, k):
    best = max(best, float(np.var(np.asarray(values, np.float64)[list(sub)])))
  return best


def np_token_mask(adv, ent, mask, rho):
  valid = mask > 0
  score = np.abs(adv.astype(np.float64)) * ent.astype(np.float64)
  if not valid.any():
    return np.zeros(mask.shape)
  tau = np.quantile(score[valid], 1.0 - rho)
  return ((score >= tau) & valid).astype(np.float64)


def np_window(h, m, w, lookahead):
  t = len(h)
  out, ok = np.zeros(t), np.zeros(t, bool)
  for i in range(t):
    start = i + (1 if lookahead else 0)
    pos = list(range(start, start + w))
    if m[i] > 0 and pos[-1] < t and all(m[p] > 0 for p in pos):
      out[i] = np.mean([float(h[p]) for p in pos])
      ok[i] = True
  return out, ok


def np_threshold(h_BT, m_BT, w, lookahead, pct):
  per = []
  for h, m in zip(
    h_BT.reshape(-1, h_BT.shape[-1]), m_BT.reshape(-1, h_BT.shape[-1])
  ):
    vals, ok = np_window(h, m, w, lookahead)
    if ok.any():
      per.append(np.percentile(vals[ok], pct))
  return np.median(per)


def np_counts(h_BT, m_BT, tau, w, lookahead, cand=None):
  flat_h = h_BT.reshape(-1, h_BT.shape[-1])
  flat_m = m_BT.reshape(-1, h_BT.shape[-1])
  out = []
  for r, (h, m) in enumerate(zip(flat_h, flat_m)):
    vals, ok = np_window(h, m, w, lookahead)
    n = 0
    for t in range(len(h)):
      c = True if cand is None else cand.reshape(flat_h.shape)[r, t] != 0
      if ok[t] and vals[t] >= tau and c:
        n += 1
    out.append(n)
  return np.asarray(out, np.float64).reshape(h_BT.shape[:-1])


def np_difficulty(correct, valid):
  out = []
  for c, v in zip(correct, valid):
    acc = np.sum(c * v) / max(np.sum(v), 1)
    out.append(0 if acc >= 2 / 3 else (1 if acc >= 1 / 3 else 2))
  return np.asarray(out)


def np_score(acc, diff, n, target, alpha):
  """The official `compute_score` entropy term, transcribed as plain Python."""
  name = ["easy", "medium", "hard"][diff]
  frac = {"easy": 0.15, "medium": 0.25, "hard": 0.35}[name]
  kappa = {"easy": 2.0, "medium": 3.0, "hard": 4.0}[name]
  temp = {"easy": 2.0, "medium": 2.5, "hard": 3.0}[name]
  cap = alpha * {"easy": 1.0, "medium": 1.0, "hard": 1.2}[name]

  def huber(x):
    x = max(x, 0.0)
    return 0.5 * x * x / kappa if x <= kappa else x - 0.5 * kappa

  def sig(x):
    return 1.0 / (1.0 + math.exp(-x / temp))

  delta = n - target
  margin = max(1.0, frac * max(target, 1.0))
  if name in ("easy", "medium"):
    if acc == 1.0:
      x = delta - margin if name == "easy" else abs(delta) - margin
      return -min(cap, huber(max(x, 0.0)) / (margin + kappa) * cap)
    gain = 0.6 if name == "easy" else 0.8
    return sig(max(delta - margin, 0.0)) * cap * gain
  if acc == 1.0:
    if delta >= -margin:
      return sig(delta + margin) * cap
    pen = huber(-delta - margin)
    return -min(cap, 0.5 * pen / (margin + kappa) * cap)
  return sig(max(delta - margin, 0.0)) * cap


# ---------------------------------------------------------------------------
# D3S: sample level.
# ---------------------------------------------------------------------------


def test_max_variance_subset_hand_worked():
  v = np.array([[0.0, 1.0, 2.0, 10.0]], np.float32)
  # k=2: {0, 10}. k=3: Var{0,1,10} = 182/9 beats {0,2,10} = 56/3, {1,2,10},
  # {0,1,2}.
  np.testing.assert_array_equal(
    E.max_variance_subset(v, None, 2), [[1, 0, 0, 1]]
  )
  np.testing.assert_array_equal(
    E.max_variance_subset(v, None, 3), [[1, 1, 0, 1]]
  )
  # The invalid 10 is never kept: then {0, 2} wins, and k >= n keeps all.
  m = np.array([[1, 1, 1, 0]], np.float32)
  np.testing.assert_array_equal(E.max_variance_subset(v, m, 2), [[1, 0, 1, 0]])
  np.testing.assert_array_equal(E.max_variance_subset(v, m, 4), [[1, 1, 1, 0]])


@pytest.mark.parametrize("seed", range(4))
def test_max_variance_subset_equals_brute_force(seed):
  rng = np.random.default_rng(seed)
  g = 7
  values = rng.normal(0, 1, (6, g)).astype(np.float32)
  values[0] = np.round(values[0])  # ties
  valid = rng.uniform(size=(6, g)) > 0.25
  valid[1] = False  # an empty group
  fn = jax.jit(E.max_variance_subset)
  for k in range(1, g + 1):
    keep = np.asarray(fn(values, valid.astype(np.float32), k))
    for p in range(6):
      kept = keep[p] > 0
      assert not (kept & ~valid[p]).any()
      assert kept.sum() == min(k, valid[p].sum())
      if kept.sum() == 0:
        continue
      got = float(np.var(values[p, kept].astype(np.float64)))
      want = np_best_variance(values[p], valid[p], k)
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_max_variance_subset_traced_and_per_group_k():
  rng = np.random.default_rng(3)
  v = rng.normal(size=(3, 6)).astype(np.float32)
  per = jax.jit(E.max_variance_subset)(v, None, jnp.array([1, 3, 6]))
  for p, k in enumerate([1, 3, 6]):
    np.testing.assert_array_equal(per[p], E.max_variance_subset(v, None, k)[p])


# ---------------------------------------------------------------------------
# D3S: token level.
# ---------------------------------------------------------------------------


def test_token_mask_hand_worked():
  adv = np.array([[1.0, -2.0, 0.5, 3.0, 9.0]], np.float32)
  ent = np.array([[1.0, 1.0, 2.0, 0.5, 9.0]], np.float32)
  mask = np.array([[1, 1, 1, 1, 0]], np.float32)
  # scores 1, 2, 1, 1.5 (the padded 81 is ignored); quantile_0.5 = 1.25.
  keep = E.adv_entropy_token_mask(adv, ent, mask, keep_fraction=0.5)
  np.testing.assert_array_equal(keep, [[0, 1, 0, 1, 0]])
  keep = E.adv_entropy_token_mask(adv, ent, mask, keep_fraction=1.0)
  np.testing.assert_array_equal(keep, [[1, 1, 1, 1, 0]])


@pytest.mark.parametrize("rho", [0.1, 0.25, 0.5, 0.8, 1.0])
def test_token_mask_matches_numpy_quantile(rho):
  b = _batch(1)
  mask = np.asarray(b.loss_mask())
  fn = jax.jit(
    lambda a, h, m, r: E.adv_entropy_token_mask(a, h, m, keep_fraction=r)
  )
  got = fn(b.advantages_PGT, b.old_entropy_PGT, mask, rho)  # traced rho
  want = np_token_mask(
    np.asarray(b.advantages_PGT), np.asarray(b.old_entropy_PGT), mask, rho
  )
  np.testing.assert_array_equal(got, want)
  static = E.adv_entropy_token_mask(
    b.advantages_PGT, b.old_entropy_PGT, mask, keep_fraction=rho
  )
  np.testing.assert_array_equal(static, want)


def test_token_mask_bad_fraction_raises():
  x = np.ones((2, 3), np.float32)
  with pytest.raises(ValueError, match="keep_fraction"):
    E.adv_entropy_token_mask(x, x, x, keep_fraction=0.0)
  with pytest.raises(ValueError, match="keep_fraction"):
    E.adv_entropy_token_mask(x, x, x, keep_fraction=1.5)


# ---------------------------------------------------------------------------
# D3S: the stage.
# ---------------------------------------------------------------------------


def test_keep_schedule_monotonic_and_forms():
  sched = TE.keep_schedule((0.25, 1.0), 10, name="r")
  vals = np.array([float(sched(s)) for s in range(20)])
  assert np.all(np.diff(vals) >= 0)
  np.testing.assert_allclose(vals[[0, 5, 10, 19]], [0.25, 0.625, 1.0, 1.0])
  assert float(TE.keep_schedule(0.3, 10, name="r")(7)) == pytest.approx(0.3)
  cos = optax.cosine_decay_schedule(1.0, 10)
  assert TE.keep_schedule(cos, 10, name="r") is cos
  for bad in (0.0, 1.5, (0.5, 2.0), "linear"):
    with pytest.raises(ValueError, match="r"):
      TE.keep_schedule(bad, 10, name="r")


def test_d3s_stage_matches_numpy_over_steps():
  b = _batch(2)
  g = b.shape[1]
  stage = TE.d3s_downsampling(
    sample_keep=(0.5, 1.0), token_keep=(0.3, 1.0), steps=4
  )
  algo = rljax.Algorithm(stage, aggregate.token_mean)
  state = algo.init()
  prep = jax.jit(algo.prepare)
  kept_counts = []
  for s in range(6):
    out, state = prep(b, state)
    assert int(state.step) == s + 1
    rho_s = 0.5 + 0.5 * min(s, 4) / 4
    rho_t = 0.3 + 0.7 * min(s, 4) / 4
    k = min(max(int(np.round(rho_s * g)), 2), g)
    mask = np.asarray(b.loss_mask(), np.float64)
    adv = np.asarray(b.advantages_PGT, np.float64)
    a_seq = (adv * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
    keep = np.asarray(out.sample_mask_PG)
    for p in range(b.shape[0]):
      assert keep[p].sum() == k
      got = float(np.var(a_seq[p, keep[p] > 0]))
      np.testing.assert_allclose(
        got, np_best_variance(a_seq[p], np.ones(g, bool), k), rtol=1e-5
      )
    new_mask = mask * keep[..., None]
    want_tok = np_token_mask(
      adv, np.asarray(b.old_entropy_PGT), new_mask, rho_t
    )
    np.testing.assert_array_equal(out.policy_weights_PGT, want_tok)
    kept_counts.append(keep.sum() + want_tok.sum())
  assert np.all(np.diff(kept_counts) >= 0)  # the curriculum relaxes
  # At the end of the schedule every sample and valid token is kept.
  assert kept_counts[-1] == b.shape[0] * g + float(b.loss_mask().sum())


def test_d3s_multiplies_existing_weights_and_ignores_invalid():
  b = _batch(3)
  rng = np.random.default_rng(0)
  w = rng.uniform(0.5, 2.0, b.shape).astype(np.float32)
  sm = np.ones(b.shape[:2], np.float32)
  sm[0, :2] = 0.0
  b = b._replace(policy_weights_PGT=w, sample_mask_PG=sm)
  stage = TE.d3s_downsampling(sample_keep=0.5, token_keep=0.5)
  out, _ = _prepare(stage, b)
  plain, _ = _prepare(stage, b._replace(policy_weights_PGT=None))
  np.testing.assert_allclose(
    out.policy_weights_PGT, w * plain.policy_weights_PGT
  )
  assert np.all(np.asarray(out.sample_mask_PG)[0, :2] == 0)
  # Garbage in invalid samples and padding changes nothing.
  pad = np.asarray(b.loss_mask()) == 0
  junk = b._replace(
    advantages_PGT=np.where(pad, 1e6, b.advantages_PGT).astype(np.float32),
    old_entropy_PGT=np.where(pad, 50.0, b.old_entropy_PGT).astype(np.float32),
  )
  out2, _ = _prepare(stage, junk)
  np.testing.assert_array_equal(out2.sample_mask_PG, out.sample_mask_PG)
  np.testing.assert_array_equal(
    out2.policy_weights_PGT * out2.loss_mask(),
    out.policy_weights_PGT * out.loss_mask(),
  )


def test_d3s_recompute_advantages_on_subset():
  b = _batch(4)
  stage = TE.d3s_downsampling(sample_keep=0.5, token_keep=1.0, recompute=A.grpo)
  out, _ = _prepare(stage, b)
  sm = np.asarray(out.sample_mask_PG)
  want = np.asarray(A.grpo(b.rewards_PG, sm))[..., None] * np.asarray(
    out.loss_mask()
  )
  np.testing.assert_allclose(out.advantages_PGT, want, rtol=1e-6, atol=1e-7)


def test_d3s_micro_batching():
  b = _batch(5)
  p = b.shape[0]
  stage = TE.d3s_downsampling(sample_keep=0.5, token_keep=0.4)
  out, state = _prepare(stage, b)
  # The sample level is per group: preparing halves gives the same subsets.
  halves = [_prepare(stage, _half(b, i, p))[0] for i in (0, 1)]
  np.testing.assert_array_equal(
    out.sample_mask_PG,
    np.concatenate([np.asarray(h.sample_mask_PG) for h in halves]),
  )
  # The token quantile is the whole batch's, stored in the batch: the loss
  # summed over micro-batches of the prepared batch is the whole loss.
  algo = rljax.Algorithm(
    rljax.chain(stage, rljax.objectives.policy(rljax.losses.ppo_clip)),
    aggregate.token_mean,
  )
  logp = np.asarray(b.old_logp_PGT) + 0.1
  st = algo.init()
  whole = algo.loss(logp, out, st)[0]
  parts = [
    algo.loss(logp[sl], _half(out, i, p), st)[0]
    for i, sl in enumerate((slice(0, p // 2), slice(p // 2, p)))
  ]
  num = sum(float(m.num) for m in parts)
  den = sum(float(m.den) for m in parts)
  # Halves summed vs the whole: float32 sums in another order.
  np.testing.assert_allclose(num / den, float(whole.value), rtol=1e-5)
  # No gradient reaches a dropped sample or token.
  grad = jax.grad(lambda lp: algo.loss(lp, out, st)[0].value)(jnp.asarray(logp))
  dropped = np.asarray(out.loss_mask() * out.policy_weights_PGT) == 0
  assert np.all(np.asarray(grad)[dropped] == 0)


def test_d3s_bfloat16_and_missing_fields():
  b = _batch(6, dtype=jnp.bfloat16)
  out, _ = _prepare(TE.d3s_downsampling(), b)
  assert out.policy_weights_PGT.dtype == jnp.float32
  assert np.isfinite(np.asarray(out.policy_weights_PGT)).all()
  assert np.isfinite(np.asarray(out.sample_mask_PG, np.float32)).all()
  with pytest.raises(ValueError, match="advantages_PGT"):
    _prepare(TE.d3s_downsampling(), b._replace(advantages_PGT=None))
  with pytest.raises(ValueError, match="old_entropy_PGT"):
    _prepare(TE.d3s_downsampling(), b._replace(old_entropy_PGT=None))
  with pytest.raises(ValueError, match="min_samples"):
    TE.d3s_downsampling(min_samples=0)


# ---------------------------------------------------------------------------
# ARES: window entropy, threshold, triggers, difficulty, reward.
# ---------------------------------------------------------------------------


def test_window_entropy_hand_worked():
  h = np.array([[1.0, 2.0, 3.0, 4.0, 5.0, 7.0]], np.float32)
  m = np.array([[1, 1, 1, 1, 1, 0]], np.float32)
  hwe, ok = E.window_entropy(h, m, window=2)
  np.testing.assert_allclose(hwe, [[1.5, 2.5, 3.5, 4.5, 0.0, 0.0]])
  np.testing.assert_array_equal(ok, [[1, 1, 1, 1, 0, 0]])
  hwe, ok = E.window_entropy(h, m, window=2, lookahead=True)
  np.testing.assert_allclose(hwe, [[2.5, 3.5, 4.5, 0.0, 0.0, 0.0]])
  np.testing.assert_array_equal(ok, [[1, 1, 1, 0, 0, 0]])
  # tau = 3.5: triggers at t = 2, 3 (>=), one with lookahead (t = 1, 2).
  np.testing.assert_array_equal(E.hwe_trigger_count(h, m, 3.5, window=2), [2.0])
  np.testing.assert_array_equal(
    E.hwe_trigger_count(h, m, 3.5, window=2, lookahead=True), [2.0]
  )
  cand = np.array([[0, 0, 1, 0, 1, 1]], np.float32)
  np.testing.assert_array_equal(
    E.hwe_trigger_count(h, m, 3.5, window=2, candidates_BT=cand), [1.0]
  )


@pytest.mark.parametrize("lookahead", [False, True])
@pytest.mark.parametrize("w", [1, 3])
def test_window_entropy_threshold_counts_match_numpy(lookahead, w):
  b = _batch(7, tokens=10)
  h, m = np.asarray(b.old_entropy_PGT), np.asarray(b.loss_mask())
  hwe, ok = jax.jit(
    lambda h, m: E.window_entropy(h, m, window=w, lookahead=lookahead)
  )(h, m)
  for idx in np.ndindex(h.shape[:2]):
    want, want_ok = np_window(h[idx], m[idx], w, lookahead)
    np.testing.assert_allclose(hwe[idx], want, rtol=1e-6)
    np.testing.assert_array_equal(ok[idx], want_ok)
  tau = E.hwe_threshold(h, m, window=w, lookahead=lookahead, percentile=90.0)
  want_tau = np_threshold(h, m, w, lookahead, 90.0)
  np.testing.assert_allclose(tau, want_tau, rtol=1e-6)
  counts = E.hwe_trigger_count(h, m, tau, window=w, lookahead=lookahead)
  np.testing.assert_array_equal(
    counts, np_counts(h, m, float(tau), w, lookahead)
  )


def test_difficulty_hand_worked():
  correct = np.array(
    [[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 0, 1]], np.float32
  )
  valid = np.ones_like(correct)
  valid[4, 2] = 0  # accuracy 1/2 over the valid two
  np.testing.assert_array_equal(
    E.ares_difficulty(correct, valid), [0, 0, 1, 2, 1]
  )


def test_entropy_reward_matches_official_transcription():
  rng = np.random.default_rng(8)
  n = rng.integers(0, 30, (60,)).astype(np.float32)
  target = rng.integers(0, 20, (60,)).astype(np.float32)
  diff = np.tile(np.arange(3), 20)
  acc = rng.integers(0, 2, (60,)).astype(np.float32)
  alpha = rng.uniform(0.0, 2.0, (60,)).astype(np.float32)
  got = jax.jit(E.ares_entropy_reward)(n, target, diff, acc, alpha)
  want = [
    np_score(
      float(acc[i]),
      int(diff[i]),
      float(n[i]),
      float(target[i]),
      float(alpha[i]),
    )
    for i in range(60)
  ]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_entropy_reward_hand_worked():
  # easy, correct, target 10, n 14: margin 1.5, over 2.5 > kappa 2 -> huber
  # 1.5; pen = 1.5 / 3.5 * 0.5 = 0.2142857.
  r = E.ares_entropy_reward([14.0], [10.0], [0], [1], [0.5])
  np.testing.assert_allclose(r, [-0.5 * 1.5 / 3.5], rtol=1e-6)
  # hard, wrong, n <= target + margin: sig(0) * cap = 0.5 * 0.5 * 1.2.
  r = E.ares_entropy_reward([3.0], [10.0], [2], [0], [0.5])
  np.testing.assert_allclose(r, [0.3], rtol=1e-6)


def test_bucket_targets_hand_worked():
  counts = np.array([[1, 3], [4, 4], [9, 0], [2, 2]], np.float32)
  valid = np.array([[1, 1], [1, 1], [1, 0], [0, 0]], np.float32)
  diff = np.array([0, 0, 2, 1])
  mean, target, present = E.ares_bucket_targets(counts, valid, diff)
  # easy: mean(2, 4) = 3; hard: 9 (the invalid 0 ignored); medium absent.
  np.testing.assert_allclose(mean, [3.0, 0.0, 9.0])
  np.testing.assert_allclose(target, [3.0, 0.0, 9.0])
  np.testing.assert_array_equal(present, [True, False, True])


# ---------------------------------------------------------------------------
# ARES: the stage.
# ---------------------------------------------------------------------------


def np_ares_stage(b, tau, alpha, w=4, lr=0.05):
  mask = np.asarray(b.loss_mask(), np.float64)
  valid = np.asarray(b.samples()) > 0
  h = np.asarray(b.old_entropy_PGT, np.float64)
  counts = np_counts(h, mask, tau, w, False)
  correct = (np.asarray(b.rewards_PGK)[..., 0] > 0).astype(np.float64)
  diff = np_difficulty(correct, valid)
  alpha = np.array(alpha, np.float64)
  means, targets = {}, {}
  for d in range(3):
    vals = [
      counts[p][valid[p]].mean()
      for p in range(len(diff))
      if diff[p] == d and valid[p].any()
    ]
    if vals:
      means[d] = float(np.mean(vals))
      targets[d] = float(np.round(means[d]))
      step = (means[d] - targets[d]) if d < 2 else (targets[d] - means[d])
      alpha[d] = np.clip(alpha[d] + lr * step, 0.0, 2.0)
  rewards = np.asarray(b.rewards_PG, np.float64).copy()
  for p, g in np.ndindex(rewards.shape):
    if valid[p, g]:
      d = diff[p]
      rewards[p, g] += np_score(
        correct[p, g], d, counts[p, g], targets[d], alpha[d]
      )
  return rewards, counts, diff, alpha


def test_ares_stage_matches_numpy_fixed_threshold():
  b = _batch(9, tokens=12)
  stage = TE.ares_entropy_shaping(threshold=1.2, kl_weights=(0.5, 1.0, 2.0))
  out, state = _prepare(stage, b)
  rewards, counts, diff, alpha = np_ares_stage(b, 1.2, [0.5, 0.5, 0.5])
  np.testing.assert_allclose(out.rewards_PG, rewards, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(out.extra["hwe_triggers_PG"], counts)
  np.testing.assert_array_equal(out.extra["difficulty_P"], diff)
  np.testing.assert_allclose(state.alpha_3, alpha, rtol=1e-6)
  np.testing.assert_allclose(
    out.extra["kl_weight_PG"],
    np.array([0.5, 1.0, 2.0])[diff][:, None] * np.ones(b.shape[:2]),
  )


def test_ares_adaptive_threshold_is_an_ema():
  b1, b2 = _batch(10, tokens=12), _batch(11, tokens=12)
  stage = TE.ares_entropy_shaping(ema=0.9)
  algo = rljax.Algorithm(stage, aggregate.token_mean)
  prep = jax.jit(algo.prepare)
  out1, s1 = prep(b1, algo.init())
  t1 = np_threshold(
    np.asarray(b1.old_entropy_PGT), np.asarray(b1.loss_mask()), 4, False, 95.0
  )
  np.testing.assert_allclose(s1.threshold, t1, rtol=1e-6)
  out2, s2 = prep(b2, s1)
  t2 = np_threshold(
    np.asarray(b2.old_entropy_PGT), np.asarray(b2.loss_mask()), 4, False, 95.0
  )
  np.testing.assert_allclose(s2.threshold, 0.9 * t1 + 0.1 * t2, rtol=1e-6)
  rewards, *_ = np_ares_stage(b2, 0.9 * t1 + 0.1 * t2, np.asarray(s1.alpha_3))
  np.testing.assert_allclose(out2.rewards_PG, rewards, rtol=1e-5, atol=1e-6)


def test_ares_invalid_samples_and_padding_have_no_effect():
  b = _batch(12, tokens=12)
  sm = np.ones(b.shape[:2], np.float32)
  sm[1, :3] = 0.0
  sm[2, 5] = 0.0
  b = b._replace(sample_mask_PG=sm)
  stage = TE.ares_entropy_shaping(threshold=1.0)
  out, state = _prepare(stage, b)
  pad = np.asarray(b.loss_mask()) == 0
  rng = np.random.default_rng(0)
  junk = b._replace(
    old_entropy_PGT=np.where(pad, 40.0, b.old_entropy_PGT).astype(np.float32),
    rewards_PGK=np.where(
      (sm == 0)[..., None],
      rng.integers(0, 2, b.rewards_PGK.shape),
      b.rewards_PGK,
    ).astype(np.float32),
  )
  out2, state2 = _prepare(stage, junk)
  v = sm > 0
  np.testing.assert_allclose(
    np.asarray(out2.rewards_PG)[v], np.asarray(out.rewards_PG)[v]
  )
  np.testing.assert_allclose(state2.alpha_3, state.alpha_3)


def test_ares_micro_batching():
  b = _batch(13, tokens=12)
  p = b.shape[0]
  stage = TE.ares_entropy_shaping(threshold=1.0)
  out, _ = _prepare(stage, b)
  halves = [_prepare(stage, _half(b, i, p))[0] for i in (0, 1)]
  # Triggers, difficulty and KL weights are per sample / per group.
  for name in ("hwe_triggers_PG", "difficulty_P", "kl_weight_PG"):
    np.testing.assert_array_equal(
      out.extra[name],
      np.concatenate([np.asarray(h.extra[name]) for h in halves]),
    )
  # The rewards use batch-wide bucket targets (documented): prepare sees the
  # whole batch, and the shaped rewards travel with it into micro-batches.


def test_ares_bfloat16_and_errors():
  b = _batch(14, tokens=12, dtype=jnp.bfloat16)
  out, state = _prepare(TE.ares_entropy_shaping(), b)
  assert out.rewards_PG.dtype == jnp.float32
  assert np.isfinite(np.asarray(out.rewards_PG)).all()
  assert np.isfinite(np.asarray(state.threshold))
  for fn in (
    lambda: E.window_entropy(b.old_entropy_PGT, b.mask_PGT, window=3)[0],
    lambda: E.hwe_threshold(b.old_entropy_PGT, b.mask_PGT),
  ):
    y = fn()
    assert y.dtype == jnp.float32 and np.isfinite(np.asarray(y)).all()
  with pytest.raises(ValueError, match="old_entropy_PGT"):
    _prepare(TE.ares_entropy_shaping(), b._replace(old_entropy_PGT=None))
  with pytest.raises(ValueError, match="trigger_PGT"):
    _prepare(TE.ares_entropy_shaping(candidates="trigger_PGT"), b)
  with pytest.raises(ValueError, match="_PGT"):
    TE.ares_entropy_shaping(candidates="trigger_PG")
  with pytest.raises(ValueError, match="window"):
    E.window_entropy(b.old_entropy_PGT, b.mask_PGT, window=0)
