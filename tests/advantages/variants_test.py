"""Advantage / reward variants: numpy float64 references, hand values,
finite-difference gradients, bfloat16 and the papers' properties."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import advantages as A

# ---------------------------------------------------------------------------
# Data: [P, G] = [5, 6] with a ragged mask (one group with a single valid
# sample, one empty) and garbage (NaN) at invalid samples.
# ---------------------------------------------------------------------------

P, G = 5, 6


def _data(seed=0):
  rng = np.random.default_rng(seed)
  mask = np.ones((P, G), np.float32)
  mask[1, 4:] = 0
  mask[2, 1:] = 0  # a single valid sample
  mask[3, :] = 0  # empty group
  rewards = rng.uniform(-1, 1, (P, G))
  correct = rng.integers(0, 2, (P, G)).astype(bool)
  correct[0, :3] = True
  lengths = rng.integers(3, 40, (P, G)).astype(np.float64)
  ids = rng.integers(-1, 3, (P, G)).astype(np.int32)
  adv = rng.normal(size=(P, G))
  return rewards, correct, lengths, ids, adv, mask


def _garbage(x, mask):
  return np.where(mask > 0, x, np.nan)


def _rows(mask):
  return [np.flatnonzero(mask[p] > 0) for p in range(mask.shape[0])]


def _fd(f, x, eps=1e-5):
  """Central finite differences of sum(f(x) * c), f a numpy function."""
  c = np.linspace(0.5, 1.5, x.size).reshape(x.shape)
  grad = np.zeros_like(x)
  for i in np.ndindex(x.shape):
    up, down = x.copy(), x.copy()
    up[i] += eps
    down[i] -= eps
    grad[i] = np.sum((f(up) - f(down)) * c) / (2 * eps)
  return grad, c


def _jax_grad(f, x, c):
  g = jax.jit(jax.grad(lambda x: jnp.sum(f(x) * c)))(
    jnp.asarray(x, jnp.float32)
  )
  return np.asarray(g, np.float64)


# ---------------------------------------------------------------------------
# numpy references, written from the formulas.
# ---------------------------------------------------------------------------


def np_grpo(r, mask, eps=1e-6):
  out = np.zeros(r.shape)
  for p, idx in enumerate(_rows(mask)):
    if len(idx) >= 2:
      g = r[p, idx]
      out[p, idx] = (g - g.mean()) / (g.std(ddof=1) + eps)
  return out


def np_aspo(adv, feat, lengths, elig, mask, delta=-2.0, k=0.7):
  out = np.where(mask > 0, adv, 0.0).astype(np.float64)
  for p, idx in enumerate(_rows(mask)):
    e = [i for i in idx if elig[p, i]]
    if not e:
      continue
    mp, ml = feat[p, e].mean(), lengths[p, e].mean()
    for i in e:
      b = delta * (feat[p, i] - mp) / ml
      bound = k * abs(adv[p, i])
      out[p, i] = adv[p, i] + min(max(b, -bound), bound)
  return out


def np_entropy_bits(ids):
  _, counts = np.unique(
    [i if i >= 0 else -1000 - j for j, i in enumerate(ids)], return_counts=True
  )
  p = counts / counts.sum()
  return -(p * np.log2(p)).sum()


def np_copo(r, ids, mask, eps=1e-6):
  glob, h = np.zeros(r.shape), np.zeros(r.shape[0])
  rows = _rows(mask)
  values = []
  for p, idx in enumerate(rows):
    if len(idx) == 0:
      continue
    h[p] = np_entropy_bits(ids[p, idx])
    n = len(idx)
    if n >= 2:
      lam = (1 - 1 / n) / math.log2(n)
      glob[p, idx] = r[p, idx].mean() * (1 - lam * h[p])
      values += [glob[p, idx]]
  v = np.concatenate(values)
  out = np.zeros(r.shape)
  for p, idx in enumerate(rows):
    if len(idx) >= 2:
      out[p, idx] = (glob[p, idx] - v.mean()) / (v.std(ddof=1) + eps)
  return out, h


def np_polychromic(r, ids, mask, n):
  out = np.zeros(r.shape)
  for p, idx in enumerate(_rows(mask)):
    if len(idx) < n:
      continue
    sets = list(itertools.combinations(idx, n))

    def f(s, p=p):
      labels = [ids[p, i] if ids[p, i] >= 0 else -1000 - i for i in s]
      return np.mean(r[p, list(s)]) * len(set(labels)) / n

    fs = {s: f(s) for s in sets}
    base = np.mean(list(fs.values()))
    for i in idx:
      out[p, i] = np.mean([v for s, v in fs.items() if i in s]) - base
  return out


def np_seed(adv, ids, logp, mask, alpha, fn, gamma=2.0):
  out = np.zeros(adv.shape)
  for p, idx in enumerate(_rows(mask)):
    if len(idx) == 0:
      continue
    w = np.ones(len(idx)) if logp is None else np.exp(logp[p, idx])
    w = w / w.sum()
    mass = {}
    for j, i in enumerate(idx):
      key = ids[p, i] if ids[p, i] >= 0 else -1000 - i
      mass[key] = mass.get(key, 0.0) + w[j]
    se = -np.mean(np.log(list(mass.values())))
    se_max = math.log(len(idx)) if len(idx) > 1 else 0.0
    x = alpha * se / se_max if se_max > 0 else 0.0
    f = {
      "linear": max(1 - x, 0),
      "exponential": math.exp(-x),
      "focal": max(1 - x, 0) ** gamma,
    }[fn]
    out[p, idx] = adv[p, idx] * f
  return out


def np_kimi(lengths, correct, mask):
  out = np.zeros(lengths.shape)
  for p, idx in enumerate(_rows(mask)):
    if len(idx) == 0:
      continue
    lo, hi = lengths[p, idx].min(), lengths[p, idx].max()
    for i in idx:
      lam = 0.5 - (lengths[p, i] - lo) / (hi - lo) if hi > lo else 0.0
      out[p, i] = lam if correct[p, i] else min(0.0, lam)
  return out


# ---------------------------------------------------------------------------
# ASPO.
# ---------------------------------------------------------------------------


def test_aspo_matches_numpy_values_and_gradients():
  _, correct, lengths, _, adv, mask = _data(1)
  rng = np.random.default_rng(2)
  feat = rng.uniform(0, 30, (P, G))
  elig = correct & (feat > 5)
  for delta, k in ((-2.0, 0.7), (3.0, 2.0)):
    want = np_aspo(adv, feat, lengths, elig, mask, delta, k)
    fn = jax.jit(
      lambda a, f, delta=delta, k=k: A.aspo(
        a, f, lengths, elig, mask, delta=delta, k=k
      )
    )
    got = fn(_garbage(adv, mask), feat)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # d/d feature (the bias, inside the clip) and d/d A (through the clip).
    for which in (0, 1):

      def ref(x, which=which, delta=delta, k=k):
        a, f = (x, feat) if which == 0 else (adv, x)
        return np_aspo(a, f, lengths, elig, mask, delta, k)

      x = adv if which == 0 else feat
      num, c = _fd(ref, x.copy())

      def jf(x, which=which, delta=delta, k=k):
        a, f = (x, feat) if which == 0 else (adv, x)
        return A.aspo(a, f, lengths, elig, mask, delta=delta, k=k)

      np.testing.assert_allclose(_jax_grad(jf, x, c), num, atol=2e-3)


def test_aspo_by_hand():
  # One group, all eligible: p = (2, 6), L = (10, 10): mean p 4, mean L 10.
  # b = -2 (p - 4) / 10 = (+0.4, -0.4); A = (1, 1), k = 0.7: |b| < 0.7.
  out = A.aspo([[1.0, 1.0]], [[2.0, 6.0]], [[10.0, 10.0]], [[1, 1]])
  np.testing.assert_allclose(out, [[1.4, 0.6]], rtol=1e-6)
  # Bias clipped at k |A| = 0.7 * 0.1 = 0.07; the wrong sample is unchanged.
  out = A.aspo(
    [[0.1, 0.1, -1.0]], [[2.0, 6.0, 0.0]], [[10, 10, 10]], [[1, 1, 0]]
  )
  np.testing.assert_allclose(out, [[0.17, 0.03, -1.0]], rtol=1e-6)


def test_aspo_never_flips_signs_for_k_below_one():
  rng = np.random.default_rng(3)
  adv = rng.normal(size=(50, 8))
  out = np.asarray(
    A.aspo(
      adv,
      rng.uniform(0, 100, adv.shape),
      np.full(adv.shape, 5.0),
      np.ones(adv.shape),
      k=0.99,
      delta=-50.0,
    )
  )
  assert np.all(np.sign(out) == np.sign(adv))


# ---------------------------------------------------------------------------
# HDPO.
# ---------------------------------------------------------------------------


def test_hdpo_matches_numpy_and_by_hand():
  rewards, correct, lengths, _, _, mask = _data(4)
  eff = 1.0 / (lengths + 1.0)
  want_acc = np_grpo(rewards, mask)
  want_eff = np_grpo(eff, mask * correct)
  got = jax.jit(lambda r, e: A.hdpo(r, e, correct, mask, weight=0.5))(
    _garbage(rewards, mask), eff
  )
  np.testing.assert_allclose(got, want_acc + 0.5 * want_eff, atol=2e-5)
  # Wrong samples get no efficiency advantage at all.
  _, a_eff = A.hdpo_channels(rewards, eff, correct, mask)
  assert np.all(np.asarray(a_eff)[~correct] == 0)
  # By hand: accuracy (1, 1, 0, 0): mean 0.5, std sqrt(1/3); A_acc = +-0.866.
  # Efficiency (1/2, 1/4) among the two correct ones: mean 3/8, std
  # sqrt(1/32) = 0.1768: A_eff = +-0.7071; A = A_acc + A_eff.
  out = A.hdpo([[1, 1, 0, 0]], [[0.5, 0.25, 1, 1]], [[1, 1, 0, 0]])
  s = math.sqrt(3) / 2
  np.testing.assert_allclose(
    out, [[s + 0.70711, s - 0.70711, -s, -s]], atol=1e-4
  )
  # Gradient w.r.t. the efficiency reward.
  num, c = _fd(lambda e: np_grpo(e, mask * correct), eff.copy())
  jg = _jax_grad(lambda e: A.hdpo(rewards, e, correct, mask), eff, c)
  np.testing.assert_allclose(jg, num, rtol=2e-3, atol=2e-2)


def test_hdpo_efficiency_is_silent_until_two_correct():
  out = A.hdpo_channels([[1, 0, 0]], [[5.0, 1.0, 9.0]], [[1, 0, 0]])[1]
  np.testing.assert_array_equal(out, 0.0)


# ---------------------------------------------------------------------------
# ADORA.
# ---------------------------------------------------------------------------


def test_adora_length_classes_by_hand_and_scaling():
  correct = [[1, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]]
  lengths = [[30, 10, 20, 20], [10, 20, 30, 5], [10, 99, 2, 2]]
  trunc = [[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]]
  # Row 0: max correct 30 > mean wrong 20 -> 1. Row 1: 10 < 55/3 -> 0.
  # Row 2: the long wrong sample is truncated: 10 > mean(2, 2) -> 1.
  cls = np.asarray(A.adora_length_classes(correct, lengths, truncated_PG=trunc))
  np.testing.assert_array_equal(cls[:, 0], [1, 0, 1])
  assert np.all(cls == cls[:, :1])
  adv = np.ones((3, 4))
  np.testing.assert_allclose(
    A.adora(adv, cls, (0.1, 2.0)), [[2] * 4, [0.1] * 4, [2] * 4]
  )
  # Gradient of the scaling is kappa.
  g = jax.grad(lambda a: jnp.sum(A.adora(a, cls, (0.1, 2.0))))(adv)
  np.testing.assert_allclose(g, A.adora(adv, cls, (0.1, 2.0)))


def test_adora_without_correct_or_wrong_counts_as_advantageous():
  cls = A.adora_length_classes([[0, 0], [1, 1]], [[5, 9], [5, 9]])
  np.testing.assert_array_equal(cls, 1)


# ---------------------------------------------------------------------------
# COPO.
# ---------------------------------------------------------------------------


def test_copo_matches_numpy_values_and_gradients():
  rewards, _, _, ids, _, mask = _data(5)
  want, want_h = np_copo(rewards, ids, mask)
  got, h = jax.jit(A.copo_global_advantages)(_garbage(rewards, mask), ids, mask)
  np.testing.assert_allclose(got, want, atol=2e-5)
  np.testing.assert_allclose(h, want_h, atol=1e-5)
  num, c = _fd(lambda r: np_copo(r, ids, mask)[0], rewards.copy())
  jg = _jax_grad(
    lambda r: A.copo_global_advantages(r, ids, mask)[0], rewards, c
  )
  np.testing.assert_allclose(jg, num, rtol=2e-3, atol=2e-3)


def test_copo_by_hand_and_consistency_property():
  # G = 4: group 0 all agree (H = 0) with mean 1 -> R_glob = 1; group 1
  # answers (0, 0, 1, 2): H = 1.5 bits, lambda = (3/4)/2 = 3/8, mean 1 ->
  # R_glob = 1 - 9/16 = 7/16. Batch z over 8 responses: mean 23/32, std
  # (ddof 1) = (9/32) sqrt(8/7) -> A = +-(9/32)/std = +-sqrt(7/8).
  r = np.ones((2, 4))
  ids = np.array([[3, 3, 3, 3], [0, 0, 1, 2]], np.int32)
  adv, h = A.copo_global_advantages(r, ids)
  np.testing.assert_allclose(h, [0.0, 1.5], atol=1e-6)
  z = math.sqrt(7 / 8)
  np.testing.assert_allclose(adv, [[z] * 4, [-z] * 4], atol=1e-5)
  # The weight of the local loss grows with the entropy.
  w = np.asarray(A.copo_weights(jnp.array([0.0, 0.5, 2.0])))
  np.testing.assert_allclose(w[1], 0.5)
  assert w[0] < w[1] < w[2]


# ---------------------------------------------------------------------------
# DaGRPO, TempSamp soft advantage.
# ---------------------------------------------------------------------------


def test_distinctiveness_mask_by_hand():
  s = [[0.5, 0.52, 0.9, 0.0], [0.3, 0.31, 0.32, 0.0]]
  m = [[1, 1, 1, 0], [1, 1, 1, 0]]
  # Row 0: every sample is >= 0.1 away from 0.9 (or is 0.9). Row 1: spread
  # 0.02 < 0.1: all masked. Invalid samples are 0.
  out = A.distinctiveness_mask(s, m, delta=0.1)
  np.testing.assert_array_equal(out, [[1, 1, 1, 0], [0, 0, 0, 0]])


def test_soft_advantage_properties_and_gradient():
  a = np.linspace(-4, 4, 17)
  phi = np.asarray(A.soft_advantage(a, tau_pos=1.0, tau_neg=2.0))
  want = np.where(a >= 0, np.tanh(a), 2.0 * np.expm1(a / 2.0))
  np.testing.assert_allclose(phi, want, atol=1e-6)
  assert np.all(phi <= 1.0) and np.all(phi >= -2.0)
  assert np.all(np.diff(phi) > 0)  # monotone: keeps the ranking
  g = jax.vmap(jax.grad(lambda x: A.soft_advantage(x, tau_neg=2.0)))(a)
  np.testing.assert_allclose(
    g, np.where(a >= 0, 1 - np.tanh(a) ** 2, np.exp(a / 2.0)), atol=1e-6
  )


# ---------------------------------------------------------------------------
# Polychromic.
# ---------------------------------------------------------------------------


def test_polychromic_matches_numpy_values_and_gradients():
  rewards, _, _, ids, _, mask = _data(6)
  for n in (2, 3):
    want = np_polychromic(rewards, ids, mask, n)
    got = jax.jit(lambda r, n=n: A.polychromic(r, ids, mask, set_size=n))(
      _garbage(rewards, mask)
    )
    np.testing.assert_allclose(got, want, atol=1e-5)
  num, c = _fd(lambda r: np_polychromic(r, ids, mask, 3), rewards.copy())
  jg = _jax_grad(lambda r: A.polychromic(r, ids, mask, set_size=3), rewards, c)
  np.testing.assert_allclose(jg, num, atol=1e-4)


def test_polychromic_rewards_a_failed_but_novel_answer():
  # Rewards (1, 1, 0), answers (a, a, b), sets of 2:
  # f({0,1}) = 1 * 1/2, f({0,2}) = f({1,2}) = 1/2 * 1 -> all 1/2: A = 0.
  # With answers (a, a, a): f({0,1}) = 1/3... check against by-hand sums.
  r = np.array([[1.0, 1.0, 0.0]])
  out = A.polychromic(r, np.array([[0, 0, 1]], np.int32), set_size=2)
  np.testing.assert_allclose(out, 0.0, atol=1e-7)
  # Answers (a, a, b, c), rewards (1, 1, 0, 0): the failed novel sample 2 is
  # pulled up relative to standard RL (where it gets a negative advantage).
  r = np.array([[1.0, 1.0, 0.0, 0.0]])
  out = np.asarray(
    A.polychromic(r, np.array([[0, 0, 1, 2]], np.int32), set_size=2)
  )
  # f: {01}=.5 {02}=.5 {03}=.5 {12}=.5 {13}=.5 {23}=0; mean 5/12.
  # A_0 = .5 - 5/12 = 1/12, A_2 = (.5 + .5 + 0)/3 - 5/12 = -1/12.
  np.testing.assert_allclose(
    out, [[1 / 12, 1 / 12, -1 / 12, -1 / 12]], atol=1e-6
  )
  assert out[0, 2] > -0.5  # grpo-style centring would give -0.5


# ---------------------------------------------------------------------------
# SEED-GRPO.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fn", ["linear", "exponential", "focal"])
def test_seed_grpo_matches_numpy(fn):
  _, _, _, ids, adv, mask = _data(7)
  logp = np.random.default_rng(8).normal(-3, 1, (P, G))
  for lp in (None, logp):
    want = np_seed(adv, ids, lp, mask, 0.8, fn)
    got = jax.jit(
      lambda a, lp=lp: A.seed_grpo(a, ids, mask, logp_PG=lp, alpha=0.8, f=fn)
    )(_garbage(adv, mask))
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_seed_grpo_gradient_wrt_logp_and_by_hand():
  _, _, _, ids, adv, mask = _data(9)
  logp = np.random.default_rng(10).normal(-1, 0.5, (P, G))
  num, c = _fd(lambda lp: np_seed(adv, ids, lp, mask, 0.5, "exponential"), logp)
  jg = _jax_grad(
    lambda lp: A.seed_grpo(
      adv, ids, mask, logp_PG=lp, alpha=0.5, f="exponential"
    ),
    logp,
    c,
  )
  np.testing.assert_allclose(jg, num, atol=1e-4)
  # By hand, uniform weights, G = 4 answers (a, a, b, b): p = (1/2, 1/2),
  # SE = log 2, SE_max = log 4: x = 1/2, linear f = 1/2.
  out = A.seed_grpo(np.ones((1, 4)), np.array([[0, 0, 1, 1]], np.int32))
  np.testing.assert_allclose(out, 0.5, rtol=1e-6)
  # All answers agree: SE = 0, the advantage is untouched.
  out = A.seed_grpo(np.ones((1, 4)), np.zeros((1, 4), np.int32))
  np.testing.assert_allclose(out, 1.0)


def test_seed_grpo_updates_less_on_uncertain_prompts():
  adv = np.ones((4, 6))
  ids = np.array(
    [[0] * 6, [0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 1, 2], [0, 1, 2, 3, 4, 5]],
    np.int32,
  )
  scale = np.asarray(A.seed_grpo(adv, ids))[:, 0]
  assert np.all(np.diff(scale) < 0)


# ---------------------------------------------------------------------------
# PF-PPO.
# ---------------------------------------------------------------------------


def test_pf_ppo_weights_by_hand():
  r = [[1.0, -2.0, 0.5, 0.0]]
  np.testing.assert_allclose(A.pf_ppo_weights(r, k=2.0), [[1, 4, 0.25, 0]])
  np.testing.assert_allclose(
    A.pf_ppo_weights(r, mode="max_min"), [[1, 1, 0, 0]]
  )
  np.testing.assert_allclose(
    A.pf_ppo_weights(r, mode="max_random"), [[0.4, 0.1, 0.1, 0.1]]
  )
  # Batch axis: max / min over everything; invalid samples get 0.
  r2 = [[1.0, 0.0], [3.0, -1.0]]
  np.testing.assert_allclose(
    A.pf_ppo_weights(r2, mode="max_min", axis="batch"), [[0, 0], [1, 1]]
  )
  np.testing.assert_allclose(
    A.pf_ppo_weights(r2, [[1, 0], [1, 1]], mode="pow", k=1.0), [[1, 0], [3, 1]]
  )


def test_pf_ppo_indices_follow_the_weights():
  w = jnp.array([[0.0, 1.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
  idx = np.asarray(
    jax.jit(lambda k: A.pf_ppo_indices(k, w, 20000))(jax.random.key(0))
  )
  freq = np.bincount(idx[0], minlength=4) / idx.shape[1]
  np.testing.assert_allclose(freq, [0, 0.25, 0.75, 0], atol=0.02)
  # A row of zero weights is drawn uniformly.
  freq = np.bincount(idx[1], minlength=4) / idx.shape[1]
  np.testing.assert_allclose(freq, 0.25, atol=0.02)


# ---------------------------------------------------------------------------
# Length rewards.
# ---------------------------------------------------------------------------


def test_kimi_length_reward_matches_numpy_and_by_hand():
  _, correct, lengths, _, _, mask = _data(11)
  want = np_kimi(lengths, correct, mask)
  got = jax.jit(A.kimi_length_reward)(_garbage(lengths, mask), correct, mask)
  np.testing.assert_allclose(got, want, atol=1e-6)
  # Lengths (10, 20, 30), correct (1, 1, 0): lambda = (0.5, 0, -0.5);
  # wrong gets min(0, -0.5).
  out = A.kimi_length_reward([[10, 20, 30, 10]], [[1, 1, 0, 0]])
  np.testing.assert_allclose(out, [[0.5, 0.0, -0.5, 0.0]])
  assert np.all(np.asarray(got) <= 0.5) and np.all(np.asarray(got) >= -0.5)
  # lambda_1 = 0.5 - (L1 - L0) / (L2 - L0) at L = (10, 20, 30):
  # d/dL1 = -1/20; d/dL0 = (L2 - L1) / 20^2 = 1/40; d/dL2 = (L1 - L0) / 20^2.
  g = jax.grad(lambda x: A.kimi_length_reward(x, [[1, 1, 1]])[0, 1])(
    jnp.array([[10.0, 20.0, 30.0]])
  )
  np.testing.assert_allclose(g, [[0.025, -0.05, 0.025]], atol=1e-7)


def test_l_grpo_bonus_only_in_all_correct_groups():
  lengths = [[10, 30], [10, 30]]
  out = A.l_grpo_bonus(lengths, [[1, 1], [1, 0]], max_length=40, alpha=0.5)
  # 0.5 * (1 - 10/40) = 0.375, 0.5 * (1 - 30/40) = 0.125.
  np.testing.assert_allclose(out, [[0.375, 0.125], [0, 0]])
  # A padded wrong sample does not break "all correct".
  out = A.l_grpo_bonus(
    lengths, [[1, 0], [1, 1]], [[1, 0], [1, 1]], max_length=40
  )
  np.testing.assert_allclose(out, [[0.75, 0], [0.75, 0.25]])


def test_grpo_lambda_mask_selects_top_groups():
  correct = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]])
  # ratios 0.5, 1, 0, 0.25: the top 50% (2 groups) are rows 1 and 0.
  np.testing.assert_array_equal(
    A.grpo_lambda_mask(correct, fraction=0.5), [True, True, False, False]
  )
  np.testing.assert_array_equal(
    A.grpo_lambda_mask(correct, fraction=0.0), [False] * 4
  )
  # ceil: 0.3 of 4 groups is 2 groups; an empty group is never selected.
  m = np.ones((4, 4))
  m[1] = 0
  np.testing.assert_array_equal(
    A.grpo_lambda_mask(correct, m, fraction=1.0), [True, False, True, True]
  )


# ---------------------------------------------------------------------------
# dtype, errors.
# ---------------------------------------------------------------------------


def test_bfloat16_inputs_give_finite_float32():
  rewards, correct, lengths, ids, adv, _ = _data(12)
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  outs = [
    A.aspo(bf(adv), bf(lengths), bf(lengths), correct),
    A.hdpo(bf(rewards), bf(1 / (lengths + 1)), correct),
    A.copo_global_advantages(bf(rewards), ids)[0],
    A.polychromic(bf(rewards), ids, set_size=2),
    A.seed_grpo(bf(adv), ids, logp_PG=bf(-lengths / 10)),
    A.kimi_length_reward(bf(lengths), correct),
    A.soft_advantage(bf(adv)),
    A.adora(bf(adv), A.adora_length_classes(correct, bf(lengths))),
    A.pf_ppo_weights(bf(rewards)),
    A.distinctiveness_mask(bf(rewards)),
  ]
  for out in outs:
    assert out.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(out)))


def test_bad_inputs_raise_clear_errors():
  r = np.zeros((2, 4))
  with pytest.raises(ValueError, match="integer answer cluster ids"):
    A.copo_global_advantages(r, r)
  with pytest.raises(ValueError, match="set_size"):
    A.polychromic(r, r.astype(np.int32), set_size=5)
  with pytest.raises(ValueError, match="shapes must match"):
    A.aspo(r, r[:, :3], r, r)
  with pytest.raises(ValueError, match="f must be one of"):
    A.seed_grpo(r, r.astype(np.int32), f="cubic")
  with pytest.raises(ValueError, match="mode must be one of"):
    A.pf_ppo_weights(r, mode="best")
  with pytest.raises(ValueError, match="max_length must be > 0"):
    A.l_grpo_bonus(r, r, max_length=0)
  with pytest.raises(ValueError, match="kappa must be >= 0"):
    A.adora(r, r.astype(np.int32), (-1.0, 1.0))
  with pytest.raises(ValueError, match="fraction"):
    A.grpo_lambda_mask(r, fraction=1.5)
