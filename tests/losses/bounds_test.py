"""Adaptive / per-token clip-bound losses: numpy float64 references, hand
values, gradients and the properties the papers state."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.losses import _bounds as B
from rljax.losses import _policy as P

SHAPE = (2, 3, 7)


def _data(seed=0, d_range=0.8, shape=SHAPE):
  """Per-token advantages; padded positions hold garbage."""
  rng = np.random.default_rng(seed)
  old = rng.uniform(-4.0, -0.05, shape)
  logp = old + rng.uniform(-d_range, d_range, shape)
  adv = rng.normal(size=shape)
  t = shape[-1]
  lengths = rng.integers(1, t + 1, shape[:-1])
  lengths.flat[0] = 0
  lengths.flat[1] = t
  mask = (np.arange(t) < lengths[..., None]).astype(np.float32)
  logp = np.where(mask > 0, logp, 50.0)
  old = np.where(mask > 0, old, -60.0)
  adv = np.where(mask > 0, adv, 7.0)
  return tuple(np.asarray(a, np.float32) for a in (logp, old, adv, mask))


def _extra(seed, shape=SHAPE, low=-1.0, high=1.0):
  rng = np.random.default_rng(seed + 100)
  return rng.uniform(low, high, shape).astype(np.float32)


@functools.cache
def _compiled(fn, static):
  def total(logp, old, adv, mask, dyn):
    out = fn(logp, old, adv, mask, **dict(static), **dyn)
    return jnp.sum(out.loss * mask), out

  @jax.jit
  def both(logp, old, adv, mask, dyn):
    (_, out), grad = jax.value_and_grad(total, has_aux=True)(
      logp, old, adv, mask, dyn
    )
    return out, grad

  return both


def _run(fn, logp, old, adv, mask, **kw):
  """Jitted (TokenLoss, d/dlogp sum(loss * mask)); arrays in kw are traced."""
  static = tuple(sorted((k, v) for k, v in kw.items() if np.ndim(v) == 0))
  dyn = {k: v for k, v in kw.items() if np.ndim(v) > 0}
  return jax.device_get(_compiled(fn, static)(logp, old, adv, mask, dyn))


def _tokens(f, *arrays, mask):
  """Apply a scalar float64 function token by token (0 where masked)."""
  arrays = [np.asarray(a, np.float64) for a in arrays]
  out = np.zeros(mask.shape)
  for idx in np.ndindex(mask.shape):
    if mask[idx] > 0:
      out[idx] = f(*(a[idx] for a in arrays))
  return out


def _ppo(lp, olp, a, lo, hi, c=None):
  """Value and gradient of PPO clip with bounds [lo, hi] (float64)."""
  r = math.exp(lp - olp)
  unclipped, clipped = -a * r, -a * min(max(r, lo), hi)
  loss = max(unclipped, clipped)
  grad = -a * r if unclipped >= clipped else 0.0
  if c is not None and a < 0 and loss > -c * a:
    loss, grad = -c * a, 0.0
  return loss, grad


# --------------------------------------------------------------------------
# ppo_clip_bounds


def test_ppo_clip_bounds_matches_numpy_with_per_token_bounds():
  logp, old, adv, mask = _data(1)
  lo = 1.0 - np.abs(_extra(1)) * 0.4
  hi = 1.0 + np.abs(_extra(2)) * 0.4
  out, grad = _run(
    B.ppo_clip_bounds, logp, old, adv, mask, ratio_low=lo, ratio_high=hi,
    dual_clip=2.0,
  )  # fmt: skip
  want = _tokens(
    lambda *a: _ppo(*a, c=2.0)[0], logp, old, adv, lo, hi, mask=mask
  )
  want_g = _tokens(
    lambda *a: _ppo(*a, c=2.0)[1], logp, old, adv, lo, hi, mask=mask
  )
  np.testing.assert_allclose(out.loss * mask, want, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(grad, want_g, rtol=1e-4, atol=1e-6)
  assert 0 < (out.clip_high * mask).sum() and 0 < (out.clip_low * mask).sum()


def test_ppo_clip_bounds_with_scalar_bounds_is_ppo_clip():
  data = _data(2)
  a, ga = _run(B.ppo_clip_bounds, *data, ratio_low=0.8, ratio_high=1.28)
  b, gb = _run(P.ppo_clip, *data, eps_low=0.2, eps_high=0.28)
  np.testing.assert_allclose(a.loss, b.loss, rtol=1e-6)
  np.testing.assert_allclose(ga, gb, rtol=1e-6)


def test_ppo_clip_bounds_hand_values():
  # r = [1.5, 0.5]; A = [1, -1]; per-token bounds [0.9, 1.4] and [0.6, 1.1].
  logp = np.log([1.5, 0.5]).astype(np.float32)
  z = np.zeros(2, np.float32)
  out, grad = _run(
    B.ppo_clip_bounds, logp, z, np.array([1.0, -1.0], np.float32),
    np.ones(2, np.float32), ratio_low=np.array([0.9, 0.6], np.float32),
    ratio_high=np.array([1.4, 1.1], np.float32),
  )  # fmt: skip
  # max(-1.5, -1.4) = -1.4 (cut high); max(0.5, 0.6) = 0.6 (cut low).
  np.testing.assert_allclose(out.loss, [-1.4, 0.6], rtol=1e-6)
  np.testing.assert_array_equal(grad, [0.0, 0.0])
  np.testing.assert_array_equal(out.clip_high, [1.0, 0.0])
  np.testing.assert_array_equal(out.clip_low, [0.0, 1.0])


def test_ppo_clip_bounds_bad_bound_shape_raises():
  data = _data(0)
  with pytest.raises(ValueError, match="ratio_low"):
    B.ppo_clip_bounds(*data, ratio_low=np.ones(3), ratio_high=1.2)
  with pytest.raises(ValueError, match="ratio_high"):
    B.ppo_clip_bounds(*data, ratio_low=0.8, ratio_high=np.ones((2, 2, 7)))


# --------------------------------------------------------------------------
# BAPO


def test_bapo_candidates_follow_the_official_search_order():
  lo, hi = B.bapo_candidates(
    low_start=0.8, low_max=0.95, low_step=0.05, high_start=1.2,
    high_max=1.45, high_step=0.1,
  )  # fmt: skip
  # c_lo 0.8, 0.85, 0.9, 0.95 at c_hi 1.2; then c_hi 1.3, 1.4, 1.45 (capped).
  np.testing.assert_allclose(lo, [0.8, 0.85, 0.9, 0.95, 0.95, 0.95, 0.95])
  np.testing.assert_allclose(hi, [1.2, 1.2, 1.2, 1.2, 1.3, 1.4, 1.45])
  with pytest.raises(ValueError, match="low_max"):
    B.bapo_candidates(low_start=0.8, low_max=0.7)
  with pytest.raises(ValueError, match="ratio bounds"):
    B.bapo_candidates(low_start=0.2, high_start=0.2, high_max=0.3)


def _np_contrib(logp, old, adv, mask, lo, hi, kind="clamped"):
  r = np.exp(np.clip(np.float64(logp) - old, -20, 20))
  if kind == "clamped":
    eff = np.where(adv >= 0, np.minimum(r, hi), np.maximum(r, lo)) * adv
  else:
    keep = np.where(adv > 0, r <= hi, r >= lo)
    eff = np.where(keep, r * adv, 0.0)
  m = mask > 0
  return np.maximum(eff, 0)[m].sum(), np.maximum(-eff, 0)[m].sum()


def _np_bapo_search(logp, old, adv, mask, rho0, lo, lo_max, lo_step, hi,
                    hi_max, hi_step, eps=1e-8):  # fmt: skip
  """The official while-loops, transcribed (float64)."""

  def ratio(lo, hi):
    p, n = _np_contrib(logp, old, adv, mask, lo, hi)
    return math.inf if n <= 0 else p / (n + eps)

  rho = ratio(lo, hi)
  while rho < rho0 and lo < lo_max:
    lo = min(lo + lo_step, lo_max)
    rho = ratio(lo, hi)
  while rho < rho0 and hi < hi_max:
    hi = min(hi + hi_step, hi_max)
    rho = ratio(lo, hi)
  return lo, hi


@pytest.mark.parametrize(
  "seed,which", [(0, 0), (1, 1), (3, 2), (5, 1), (4, None), (6, 2)]
)
def test_bapo_search_equals_the_official_loop(seed, which):
  logp, old, adv, mask = _data(seed, d_range=1.0)
  adv = adv - 0.4 * (mask > 0)  # negative-dominated, like stale batches
  grid = {"low_start": 0.6, "low_max": 0.9, "low_step": 0.05}
  grid.update(high_start=1.2, high_max=3.0, high_step=0.1)
  lows, highs = B.bapo_candidates(**grid)
  ratios = [
    np.divide(*_np_contrib(logp, old, adv, mask, lo, hi))
    for lo, hi in zip(lows, highs, strict=True)
  ]
  # Candidates whose ratio beats every earlier one; rho0 just below one of
  # them (first, middle or last; unreachable for None) stops the search
  # exactly there.
  records = [
    k for k in range(len(ratios)) if ratios[k] > max(ratios[:k] or [0])
  ]
  target = None if which is None else records[[0, len(records) // 2, -1][which]]
  if target is None:
    rho0 = 1.01 * max(ratios)
  else:
    rho0 = ratios[target] - 0.3 * (ratios[target] - max(ratios[:target] or [0]))
  p, n = jax.jit(B.bapo_contributions)(logp, old, adv, mask, lows, highs)
  for k in range(len(lows)):
    want = _np_contrib(logp, old, adv, mask, lows[k], highs[k])
    np.testing.assert_allclose([p[k], n[k]], want, rtol=1e-5)
  k = int(B.bapo_select(p, n, rho0=rho0))
  want = _np_bapo_search(logp, old, adv, mask, rho0, *grid.values())
  np.testing.assert_allclose([lows[k], highs[k]], want, rtol=1e-6)
  # The property: the chosen bounds give P/N >= rho0, i.e. a positive share
  # P / (P + N) >= rho0 / (1 + rho0), whenever some candidate reaches it,
  # and no earlier candidate does.
  share = p / (p + n)
  reachable = np.any(share >= rho0 / (1 + rho0) - 1e-7)
  assert k == (len(lows) - 1 if target is None else target)
  assert which is None or which == 0 or target > 6  # the c_hi stage is hit
  if reachable:
    assert share[k] >= rho0 / (1 + rho0) - 1e-6
    assert np.all(p[:k] / n[:k] < rho0)
  else:
    assert k == len(lows) - 1


def test_bapo_unclipped_contributions_are_monotone_in_the_bounds():
  logp, old, adv, mask = _data(3, d_range=1.0)
  lows, highs = B.bapo_candidates()
  p, n = B.bapo_contributions(
    logp, old, adv, mask, lows, highs, contribution="unclipped"
  )
  # Raising c_lo filters negatives (N falls); raising c_hi admits positives.
  assert np.all(np.diff(n) <= 1e-6) and np.all(np.diff(p) >= -1e-6)
  assert n[-1] < n[0] and p[-1] > p[0]
  for k in (0, 9, len(lows) - 1):
    want = _np_contrib(logp, old, adv, mask, lows[k], highs[k], "unclipped")
    np.testing.assert_allclose([p[k], n[k]], want, rtol=1e-5)


def test_bapo_select_hand_values():
  # P/N = [0.2, 0.4, 0.6]: rho0 0.5 -> index 2; rho0 1 -> none, the last;
  # N = 0 counts as an infinite ratio.
  p, n = np.array([1.0, 2.0, 3.0]), np.array([5.0, 5.0, 5.0])
  assert int(B.bapo_select(p, n, rho0=0.5, eps=0.0)) == 2
  assert int(B.bapo_select(p, n, rho0=1.0)) == 2
  assert int(B.bapo_select(p, n, rho0=0.3)) == 1
  assert int(B.bapo_select(p, np.array([5.0, 0.0, 5.0]), rho0=9.0)) == 1


# --------------------------------------------------------------------------
# DCPO


def test_dcpo_bounds_readme_table():
  # README: eps 0.16 / 0.2. q = 0.9: lo = 1/2 + 1/2 sqrt(1 - 0.64/0.9)
  # = 0.76875 (q lo = 0.69), hi = 1/2 + 1/2 sqrt(1 + 0.8/0.9) = 1.18718
  # (q hi = 1.068). q = 0.01: lo = 1/2 (q lo = 0.005), hi = 1/2 + 9/2 = 5
  # (q hi = 0.05).
  lo, hi = B.dcpo_bounds(np.log([0.9, 0.01]).astype(np.float32))
  want_lo = [0.5 + 0.5 * math.sqrt(1 - 0.64 / 0.9), 0.5]
  want_hi = [0.5 + 0.5 * math.sqrt(1 + 0.8 / 0.9), 5.0]
  np.testing.assert_allclose(lo, want_lo, rtol=1e-6)
  np.testing.assert_allclose(hi, want_hi, rtol=1e-5)
  np.testing.assert_allclose(
    np.array([0.9, 0.01]) * lo, [0.69, 0.005], atol=2e-3
  )
  # The cap: q = 1e-3 would give 1/2 + 1/2 sqrt(801) = 14.65 > 10.
  _, hi = B.dcpo_bounds(np.log([1e-3]).astype(np.float32))
  np.testing.assert_allclose(hi, [10.0])
  _, hi = B.dcpo_bounds(np.log([1e-3]).astype(np.float32), max_high=None)
  np.testing.assert_allclose(hi, [0.5 + 0.5 * math.sqrt(801)], rtol=1e-5)


def test_dcpo_bounds_widen_as_q_falls():
  q = np.geomspace(1.0, 1e-6, 200)
  lo, hi = B.dcpo_bounds(np.log(q).astype(np.float32), max_high=None)
  assert np.all(np.diff(lo) <= 0) and np.all(np.diff(hi) >= 0)
  assert lo[-1] == 0.5 and hi[0] < hi[-1]
  # At q = 1 the bounds satisfy |(r - 1) r| q = eps exactly.
  np.testing.assert_allclose((1 - lo[0]) * lo[0], 0.16, rtol=1e-5)
  np.testing.assert_allclose((hi[0] - 1) * hi[0], 0.2, rtol=1e-5)


def test_dcpo_clip_matches_numpy():
  logp, old, adv, mask = _data(4, d_range=1.5)
  out, grad = _run(B.dcpo_clip, logp, old, adv, mask)

  def token(lp, olp, a):
    q = math.exp(olp)
    lo = 0.5 + 0.5 * math.sqrt(max(1 - 0.64 / q, 0.0))
    hi = min(0.5 + 0.5 * math.sqrt(1 + 0.8 / q), 10.0)
    return _ppo(lp, olp, a, lo, hi, c=3.0)

  want = _tokens(lambda *a: token(*a)[0], logp, old, adv, mask=mask)
  want_g = _tokens(lambda *a: token(*a)[1], logp, old, adv, mask=mask)
  np.testing.assert_allclose(out.loss * mask, want, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(grad, want_g, rtol=1e-4, atol=1e-6)
  assert (out.clip_high + out.clip_low)[mask > 0].sum() > 0


def _np_sas(rewards_steps):
  """The official per-prompt loop: one [G] reward row per step."""
  times, mean, std, out = 0, 0.0, 0.0, []
  for r in rewards_steps:
    r = np.asarray(r, np.float64)
    mu_new, s_new = r.mean(), r.std(ddof=1)
    if times == 0:
      mean, std = mu_new, s_new
    else:
      n = times + 1
      var = (times * std**2 + s_new**2 + times / n * (mu_new - mean) ** 2) / n
      mean, std = (mean * times + mu_new) / n, math.sqrt(var)
    a_new = (r - mu_new) / s_new if s_new > 0 else np.zeros_like(r)
    a_old = (r - mean) / std if std > 0 else np.zeros_like(r)
    i = times + 1
    s1 = a_old / i + (1 - 1 / i) * a_new
    s2 = a_new / i + (1 - 1 / i) * a_old
    out.append(np.where(np.abs(s1) < np.abs(s2), s1, s2))
    times += 1
  return out


def test_dcpo_sas_function_matches_the_official_loop():
  steps = [[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 1, 0], [0.5, 1, 0, 0]]
  count, mean, std = np.zeros(1), np.zeros(1), np.zeros(1)
  want = _np_sas(steps)
  for k, r in enumerate(steps):
    r = np.asarray([r], np.float32)
    adv, count, mean, std = B.dcpo_sas(r, np.ones_like(r), count, mean, std)
    np.testing.assert_allclose(adv[0], want[k], rtol=1e-5, atol=1e-6)
  assert float(count[0]) == 4
  # Step 2 is all-equal: A_new = 0, A = (1/2) A_tot, not 0 (the README).
  assert np.all(np.abs(want[1]) > 0)


# --------------------------------------------------------------------------
# DISPO


def _dispo_token(lp, olp, a, mode, eps, correct=None):
  correct = a > 0 if correct is None else correct > 0
  lo_e, hi_e = (eps[0], eps[1]) if correct else (eps[2], eps[3])
  lo, hi = 1 - lo_e, 1 + hi_e
  r = math.exp(lp - olp)
  if mode == "clip":
    w = min(max(r, lo), hi)
  else:
    w = r if lo <= r <= hi else 0.0
  return -w * a * lp, -w * a


@pytest.mark.parametrize("mode", ["clip", "mask"])
def test_dispo_matches_numpy(mode):
  logp, old, adv, mask = _data(5)
  eps = (0.1, 0.3, 0.25, 0.15)
  kw = dict(zip(("eps_low_pos", "eps_high_pos", "eps_low_neg", "eps_high_neg"),
                eps, strict=True))  # fmt: skip
  out, grad = _run(B.dispo, logp, old, adv, mask, mode=mode, **kw)
  f = functools.partial(_dispo_token, mode=mode, eps=eps)
  np.testing.assert_allclose(
    out.loss * mask, _tokens(lambda *a: f(*a)[0], logp, old, adv, mask=mask),
    rtol=2e-5, atol=2e-6,
  )  # fmt: skip
  np.testing.assert_allclose(
    grad, _tokens(lambda *a: f(*a)[1], logp, old, adv, mask=mask), rtol=1e-5,
    atol=1e-6,
  )  # fmt: skip
  # Correctness from a separate array (e.g. reward > 0), not the sign of A.
  correct = (_extra(5) > 0).astype(np.float32)
  out, grad = _run(
    B.dispo, logp, old, adv, mask, mode=mode, correct_BT=correct, **kw
  )
  g = _tokens(lambda *a: f(*a[:3], correct=a[3])[1], logp, old, adv, correct,
              mask=mask)  # fmt: skip
  np.testing.assert_allclose(grad, g, rtol=1e-5, atol=1e-6)


def test_dispo_hand_values_and_cispo_special_case():
  # r = 1.5 on a correct token (A = 2): clip -> w = 1.2, mask -> w = 0.
  lp = np.float32(np.log(1.5))
  args = (np.array([lp]), np.zeros(1, np.float32), np.array([2.0], np.float32),
          np.ones(1, np.float32))  # fmt: skip
  _, g = _run(B.dispo, *args, mode="clip")
  np.testing.assert_allclose(g, [-2.4], rtol=1e-6)  # -1.2 * 2
  out, g = _run(B.dispo, *args, mode="mask")
  np.testing.assert_array_equal(g, [0.0])
  assert out.clip_high[0] == 1.0
  data = _data(6)
  a, ga = _run(B.dispo, *data)
  b, gb = _run(P.cispo, *data)
  np.testing.assert_allclose(a.loss, b.loss, rtol=1e-6)
  np.testing.assert_allclose(ga, gb, rtol=1e-6)


# --------------------------------------------------------------------------
# ETR


def test_etr_eps_matches_numpy_and_widens_with_signal():
  rng = np.random.default_rng(7)
  rewards = rng.integers(0, 2, (5, 4)).astype(np.float32)
  valid = np.ones_like(rewards)
  valid[0, 3] = 0.0
  adv = rng.normal(size=(5, 4)).astype(np.float32)
  got = B.etr_eps(adv, rewards, valid, eps0=0.2)
  want = np.zeros_like(rewards, dtype=np.float64)
  for p in range(5):
    keep = valid[p] > 0
    var = rewards[p][keep].astype(np.float64).var()
    want[p] = np.where(keep, 0.2 * (1 + 0.5 * abs(adv[p])) * (1 + 4 * var), 0)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  # Hand: |A| = 1, pass rate 1/2 (var 1/4): 0.2 * 1.5 * 2 = 0.6.
  got = B.etr_eps(np.ones((1, 2)), np.array([[0.0, 1.0]]), eps0=0.2)
  np.testing.assert_allclose(got, [[0.6, 0.6]], rtol=1e-6)


# --------------------------------------------------------------------------
# HAPO


def _np_scores(entropy, mask, pivot, sign):
  u = np.log(np.maximum(np.float64(entropy), 1e-6))
  vals = np.sort(u[mask > 0])
  m = vals[int(np.round(pivot * (len(vals) - 1)))]
  d = np.where(mask > 0, u - m, 0.0)
  s = math.sqrt(max((d**2).sum() / (mask > 0).sum(), 1e-6))
  h = d / s
  hp = h[(mask > 0) & (h > 0)].max()
  hn = h[(mask > 0) & (h < 0)].min()
  neg = 1 / hn if sign == "code" else -1 / hn
  return np.where(mask > 0, np.clip(np.where(h > 0, h / hp, h * neg), -1, 1), 0)


@pytest.mark.parametrize("sign", ["paper", "code"])
def test_hapo_entropy_scores_match_numpy(sign):
  _, _, _, mask = _data(8)
  entropy = np.abs(_extra(8, low=0.01, high=3.0))
  got = jax.jit(B.hapo_entropy_scores, static_argnames="sign")(
    entropy, mask, sign=sign
  )
  np.testing.assert_allclose(
    got, _np_scores(entropy, mask, 0.8, sign), atol=1e-5
  )
  valid = got[mask > 0]
  assert valid.max() == pytest.approx(1.0)
  if sign == "paper":
    assert valid.min() == pytest.approx(-1.0)
  else:  # the official scale flips low-entropy tokens to h^ >= 0
    assert valid.min() >= 0.0


def test_hapo_token_advantages_match_numpy():
  rewards = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]], np.float32)
  lengths = np.array([[2.0, 6.0, 4.0, 4.0], [1.0, 100.0, 100.0, 100.0]])
  got = B.hapo_token_advantages(rewards, lengths.astype(np.float32))
  # Group 0 (by hand): tokens 16, mean (2 + 4)/16 = 0.375, var 0.234375.
  mu, sd = 0.375, math.sqrt(0.375 * 0.625)
  np.testing.assert_allclose(got[0], (rewards[0] - mu) / (sd + 1e-6), rtol=1e-5)
  # Group 1: the one correct token of 301 gives |A| = 17.3 >= 5: GRPO instead.
  r = rewards[1].astype(np.float64)
  np.testing.assert_allclose(
    got[1], (r - r.mean()) / (r.std(ddof=1) + 1e-6), rtol=1e-5
  )


def _hapo_token(lp, olp, a, h, eps_lo=0.2, eps_hi=0.28, alpha=1.0, beta=1.0):
  lo_e = eps_lo * (1 - alpha * h) if h <= 0 else eps_lo
  hi_e = eps_hi * (1 + alpha * h) if h > 0 else eps_hi
  r = math.exp(lp - olp)
  neutral = 1 - lo_e / 2 < r < 1 + hi_e / 2
  a_ent = a * (1 + beta * h)
  a2 = (a if neutral else a_ent) if h > 0 else (a_ent if neutral else a)
  return _ppo(lp, olp, a2, 1 - lo_e, 1 + hi_e, c=3.0)


def test_hapo_het_matches_numpy():
  logp, old, adv, mask = _data(9, d_range=0.5)
  h = _extra(9)
  out, grad = _run(B.hapo_het, logp, old, adv, mask, entropy_scores_BT=h)
  want = _tokens(lambda *a: _hapo_token(*a)[0], logp, old, adv, h, mask=mask)
  want_g = _tokens(lambda *a: _hapo_token(*a)[1], logp, old, adv, h, mask=mask)
  np.testing.assert_allclose(out.loss * mask, want, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(grad, want_g, rtol=1e-4, atol=1e-6)


def test_hapo_het_bounds_hand_values():
  # h^ = 1 doubles eps_high (0.28 -> 0.56); h^ = -1 doubles eps_low.
  # r = 1.5, A = 1, h^ = 1: not neutral -> A_ent = 2; clip at 1.56 not hit:
  # L = -2 * 1.5 = -3. r = 0.5, A = -1, h^ = -1: A_ent = 0 inside the
  # neutral zone only; r = 0.5 is outside (0.8 < r needed): A = -1, bound
  # 1 - 0.4 = 0.6: L = max(0.5, 0.6) = 0.6.
  logp = np.log([1.5, 0.5]).astype(np.float32)
  out, _ = _run(
    B.hapo_het, logp, np.zeros(2, np.float32),
    np.array([1.0, -1.0], np.float32), np.ones(2, np.float32),
    entropy_scores_BT=np.array([1.0, -1.0], np.float32),
  )  # fmt: skip
  np.testing.assert_allclose(out.loss, [-3.0, 0.6], rtol=1e-6)


# --------------------------------------------------------------------------
# AEPO


def _aepo_token(lp, olp, a, z, preserve="high", eps=0.2, alpha=0.2):
  a2 = a * (1 + alpha * z)
  r = math.exp(lp - olp)
  loss, grad = _ppo(lp, olp, a2, 1 - eps, 1 + eps, c=3.0)
  keep = z > 0 if preserve == "high" else z <= 0
  if keep and a2 > 0 and r > 1 + eps:  # gradient-preserving upper clip
    grad = -a2 * (1 + eps)
  return loss, grad


@pytest.mark.parametrize("preserve", ["high", "low"])
def test_aepo_matches_numpy(preserve):
  logp, old, adv, mask = _data(10, d_range=1.0)
  z = _extra(10, low=-2, high=2)
  out, grad = _run(
    B.aepo, logp, old, adv, mask, entropy_z_BT=z, preserve=preserve
  )
  f = functools.partial(_aepo_token, preserve=preserve)
  want = _tokens(lambda *a: f(*a)[0], logp, old, adv, z, mask=mask)
  want_g = _tokens(lambda *a: f(*a)[1], logp, old, adv, z, mask=mask)
  np.testing.assert_allclose(out.loss * mask, want, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(grad, want_g, rtol=1e-4, atol=1e-6)
  # Both kinds of clipped high tokens are present: the test can tell.
  r = np.exp(np.where(mask > 0, logp - old, 0.0))
  cut = (mask > 0) & (adv * (1 + 0.2 * z) > 0) & (r > 1.2)
  assert (cut & (z > 0)).any() and (cut & (z <= 0)).any()


# --------------------------------------------------------------------------
# R^2VPO and LLDS


def test_r2vpo_penalty_token_mean_has_the_gradient_of_the_variance():
  logp, old, _, mask = _data(11, d_range=0.3)
  m = mask > 0
  r = np.exp(np.float64(logp) - old)
  mu = r[m].mean()

  @jax.jit
  def token_mean(lp):
    pen = B.r2vpo_penalty(lp, old, mask, mean_ratio=jnp.float32(mu))
    return jnp.sum(pen * mask) / jnp.sum(mask)

  value, grad = jax.value_and_grad(token_mean)(logp)

  def var(lp):
    return np.exp(lp - old)[m].var()

  np.testing.assert_allclose(value, var(np.float64(logp)), rtol=1e-5)
  fd = np.zeros(SHAPE)
  for idx in zip(*np.nonzero(m), strict=True):
    up, down = np.float64(logp), np.float64(logp)
    up[idx] += 1e-6
    down[idx] -= 1e-6
    fd[idx] = (var(up) - var(down)) / 2e-6
  np.testing.assert_allclose(grad, fd, rtol=1e-3, atol=1e-6)


def _np_llds(logp, old, adv, mask, preserve):
  out, grad = np.zeros(SHAPE), np.zeros(SHAPE)
  for idx in np.ndindex(SHAPE[:-1]):
    keep = (mask[idx] > 0) & ((adv[idx] >= 0) | (preserve == "all"))
    drop = np.float64(old[idx]) - logp[idx]
    if drop[keep].sum() > 0:
      out[idx] = np.where(keep, np.maximum(drop, 0), 0)
      grad[idx] = np.where(keep & (drop > 0), -1.0, 0.0)
  return out, grad


@pytest.mark.parametrize("preserve", ["nonnegative", "all"])
def test_llds_matches_numpy(preserve):
  logp, old, adv, mask = _data(12, d_range=0.5)

  @jax.jit
  def total(lp):
    pen = B.llds(lp, old, adv, mask, preserve=preserve)
    return jnp.sum(pen * mask), pen

  (_, pen), grad = jax.value_and_grad(total, has_aux=True)(logp)
  want, want_g = _np_llds(logp, old, adv, mask, preserve)
  np.testing.assert_allclose(pen * mask, want, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(grad, want_g, atol=1e-7)
  gated = (want.sum(-1) > 0) & (mask.sum(-1) > 0)
  assert gated.any() and not gated[mask.sum(-1) > 0].all()


def test_llds_hand_values():
  # l - l_old = [-0.5, +0.2, -0.1]: sum -0.4 < 0, gate on: penalty on the
  # tokens that fell: [0.5, 0, 0.1]. A second row rose overall: no penalty.
  old = np.zeros((2, 3), np.float32)
  logp = np.array([[-0.5, 0.2, -0.1], [-0.1, 0.3, 0.0]], np.float32)
  pen = B.llds(logp, old, np.ones((2, 3)), np.ones((2, 3)))
  np.testing.assert_allclose(pen, [[0.5, 0.0, 0.1], [0.0, 0.0, 0.0]], atol=1e-7)


# --------------------------------------------------------------------------
# dtype, validation


def _all_losses():
  z = _extra(0)
  return {
    "ppo_clip_bounds": (
      B.ppo_clip_bounds,
      {"ratio_low": 0.8, "ratio_high": 1.3},
    ),
    "dcpo_clip": (B.dcpo_clip, {}),
    "dispo_clip": (B.dispo, {}),
    "dispo_mask": (B.dispo, {"mode": "mask"}),
    "hapo_het": (B.hapo_het, {"entropy_scores_BT": z}),
    "aepo": (B.aepo, {"entropy_z_BT": z}),
  }


@pytest.mark.parametrize("name", list(_all_losses()))
def test_bfloat16_inputs_give_finite_float32(name):
  fn, kw = _all_losses()[name]
  logp, old, adv, mask = (jnp.asarray(a, jnp.bfloat16) for a in _data(3))
  out, grad = _run(fn, logp, old, adv, mask, **kw)
  for field in out:
    assert field.dtype == jnp.float32 and np.all(np.isfinite(field))
  assert np.all(np.isfinite(np.asarray(grad, np.float32)))
  assert np.all(np.asarray(grad)[np.asarray(mask) == 0] == 0)
  pen = B.llds(logp, old, adv, mask)
  assert pen.dtype == jnp.float32 and np.all(np.isfinite(pen))


BAD = [
  (B.dcpo_clip, {"eps_low": 0.0}, "eps_low"),
  (B.dcpo_clip, {"max_high": 0.0}, "max_high"),
  (B.dispo, {"mode": "soft"}, "mode"),
  (B.dispo, {"eps_high_neg": -0.1}, "eps_high_neg"),
  (B.aepo, {"entropy_z_BT": 0.0, "preserve": "mid"}, "preserve"),
  (B.hapo_het, {"entropy_scores_BT": np.zeros(3)}, "entropy_scores_BT"),
  (
    B.ppo_clip_bounds,
    {"ratio_low": 0.8, "ratio_high": 1.2, "dual_clip": 1.0},
    "dual_clip",
  ),  # fmt: skip
]


@pytest.mark.parametrize("fn,kw,match", BAD, ids=[m for _, _, m in BAD])
def test_bad_arguments_raise(fn, kw, match):
  with pytest.raises(ValueError, match=match):
    fn(*_data(0), **kw)
  with pytest.raises(ValueError, match="adv_BT"):
    logp, old, adv, mask = _data(0)
    B.llds(logp, old, adv[..., :-1], mask)
