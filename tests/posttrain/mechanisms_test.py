"""Preference mechanisms: pair choice, DNO rewards, APO, CodeDPO, C3PO, DAPO."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.posttrain import _mechanisms as M

# ------------------------------------------------------------------ pairs


def test_best_worst_pairs_hand_values():
  rewards = jnp.array([[0.0, 1.0, 0.5], [1.0, 1.0, 1.0], [3.0, -1.0, 2.0]])
  valid = jnp.array([[1, 1, 1], [1, 1, 1], [1, 0, 1]])
  out = jax.jit(lambda r, v: M.best_worst_pairs(r, v, min_margin=0.5))(
    rewards, valid
  )
  # row 0: best 1 (1.0), worst 0 (0.0), margin 1 >= 0.5 kept.
  # row 1: all tied, margin 0: no preference, dropped.
  # row 2: sample 1 invalid; best 0 (3), worst 2 (2), margin 1 kept.
  np.testing.assert_array_equal(out.chosen, [1, 0, 0])
  np.testing.assert_array_equal(out.rejected, [0, 0, 2])
  np.testing.assert_array_equal(out.keep, [1.0, 0.0, 1.0])
  np.testing.assert_array_equal(out.margin, [1.0, 0.0, 1.0])
  strict = M.best_worst_pairs(rewards, valid, min_margin=1.5)
  np.testing.assert_array_equal(strict.keep, [0.0, 0.0, 0.0])


def test_best_worst_pairs_matches_numpy():
  rng = np.random.default_rng(0)
  r = rng.normal(size=(20, 6)).astype(np.float32)
  v = rng.uniform(size=(20, 6)) < 0.6
  out = jax.tree.map(np.asarray, M.best_worst_pairs(r, v, min_margin=0.8))
  for p in range(20):
    idx = np.flatnonzero(v[p])
    if len(idx) < 2:
      assert out.keep[p] == 0.0
      continue
    best = idx[np.argmax(r[p, idx])]
    worst = idx[np.argmin(r[p, idx])]
    margin = r[p, best] - r[p, worst]
    assert out.chosen[p] == best and out.rejected[p] == worst
    assert out.keep[p] == float(margin >= 0.8 and margin > 0)


def test_best_worst_pairs_bad_input():
  with pytest.raises(ValueError, match="rewards_PG"):
    M.best_worst_pairs(jnp.ones(4))
  with pytest.raises(ValueError, match="at least 2"):
    M.best_worst_pairs(jnp.ones((3, 1)))
  with pytest.raises(ValueError, match="valid_PG"):
    M.best_worst_pairs(jnp.ones((3, 2)), jnp.ones((3, 3)))
  with pytest.raises(ValueError, match="min_margin"):
    M.best_worst_pairs(jnp.ones((3, 2)), min_margin=-1.0)


# -------------------------------------------------------------------- DNO


def test_dno_win_rates_hand_values_and_masking():
  prefs = jnp.array([[[0.5, 0.8, 0.6], [0.2, 0.5, 0.5], [0.4, 0.5, 0.5]]])
  # diagonal ignored: (0.8 + 0.6) / 2 = 0.7, (0.2 + 0.5) / 2 = 0.35,
  # (0.4 + 0.5) / 2 = 0.45; without sample 2: 0.8, 0.2, and sample 2 has
  # valid opponents 0 and 1: 0.45.
  np.testing.assert_allclose(
    jax.jit(M.dno_win_rates)(prefs), [[0.7, 0.35, 0.45]], rtol=1e-6
  )
  np.testing.assert_allclose(
    M.dno_win_rates(prefs, jnp.array([[1, 1, 0]])), [[0.8, 0.2, 0.45]]
  )
  pairs = M.best_worst_pairs(M.dno_win_rates(prefs), min_margin=0.3)
  assert int(pairs.chosen[0]) == 0 and int(pairs.rejected[0]) == 1
  with pytest.raises(ValueError, match="square"):
    M.dno_win_rates(jnp.ones((1, 3, 2)))
  with pytest.raises(ValueError, match="valid_PG"):
    M.dno_win_rates(prefs, jnp.ones((1, 2)))


# -------------------------------------------------------------------- APO


def test_apo_extrapolate_params_and_logits():
  new = {"w": jnp.array([1.0, 2.0]), "b": jnp.array(3.0, jnp.bfloat16)}
  old = {"w": jnp.array([0.0, 4.0]), "b": jnp.array(1.0, jnp.bfloat16)}
  out = jax.jit(lambda a, b: M.apo_extrapolate(a, b, 0.5))(new, old)
  # w: 1 + 0.5 (1 - 0) = 1.5, 2 + 0.5 (2 - 4) = 1; b: 3 + 0.5 * 2 = 4.
  np.testing.assert_allclose(out["w"], [1.5, 1.0])
  assert out["b"].dtype == jnp.bfloat16 and float(out["b"]) == 4.0
  same = M.apo_extrapolate(new, old, 0.0)
  np.testing.assert_array_equal(same["w"], new["w"])
  # Logits: pi_new (pi_new / pi_old)^alpha normalised per token.
  rng = np.random.default_rng(1)
  ln, lo = rng.normal(size=(2, 5)), rng.normal(size=(2, 5))
  pn = np.exp(ln) / np.exp(ln).sum(-1, keepdims=True)
  po = np.exp(lo) / np.exp(lo).sum(-1, keepdims=True)
  want = pn * (pn / po) ** 0.3
  want /= want.sum(-1, keepdims=True)
  got = np.exp(np.asarray(M.apo_extrapolate_logits(ln, lo, 0.3)))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  with pytest.raises(ValueError, match="tree structure"):
    M.apo_extrapolate(new, {"w": old["w"]}, 0.5)
  with pytest.raises(ValueError, match="alpha"):
    M.apo_extrapolate(new, old, -0.1)
  with pytest.raises(ValueError, match="shapes differ"):
    M.apo_extrapolate({"w": jnp.ones(2)}, {"w": jnp.ones(3)}, 0.1)


# ---------------------------------------------------------------- CodeDPO


def test_codedpo_scores_hand_values():
  # X = [[1, 1], [1, 0]], d = 0.5, one iteration from all ones:
  # code = 0.5 * 1 + 0.5 * (1 + 1) = 1.5, 0.5 + 0.5 * 1 = 1.0;
  # test = 0.5 + 0.5 * (1 + 1) = 1.5, 0.5 + 0.5 * 1 = 1.0; /1.5 jointly.
  x = jnp.array([[1.0, 1.0], [1.0, 0.0]])
  out = M.codedpo_scores(x, damping=0.5, iterations=1)
  np.testing.assert_allclose(out.code, [1.0, 2 / 3], rtol=1e-6)
  np.testing.assert_allclose(out.test, [1.0, 2 / 3], rtol=1e-6)


def test_codedpo_scores_match_unscaled_numpy_recursion():
  rng = np.random.default_rng(2)
  x = (rng.uniform(size=(2, 6, 4)) < 0.5).astype(np.float32)
  d, k = 0.85, 8
  out = jax.jit(lambda a: M.codedpo_scores(a, damping=d, iterations=k))(x)
  for b in range(2):
    code, test = np.ones(6), np.ones(4)
    for _ in range(k):
      code, test = (
        (1 - d) * code + d * x[b] @ test,
        (1 - d) * test + d * x[b].T @ code,
      )
    scale = max(code.max(), test.max())
    np.testing.assert_allclose(out.code[b], code / scale, rtol=1e-4)
    np.testing.assert_allclose(out.test[b], test / scale, rtol=1e-4)
  # A code passing a superset of another's tests never scores lower.
  sup = np.array([[1, 1, 1], [1, 0, 0], [0, 1, 0]], np.float32)
  s = M.codedpo_scores(sup)
  assert s.code[0] >= s.code[1] and s.code[0] >= s.code[2]


def test_codedpo_bad_input():
  with pytest.raises(ValueError, match="passes_NM"):
    M.codedpo_scores(jnp.ones(3))
  with pytest.raises(ValueError, match="damping"):
    M.codedpo_scores(jnp.ones((2, 2)), damping=0.0)
  with pytest.raises(ValueError, match="iterations"):
    M.codedpo_scores(jnp.ones((2, 2)), iterations=0)


# ------------------------------------------------------------------- C3PO


def test_c3po_loss_hand_values_and_gradient():
  pref = jnp.array([0.6, 0.2, 9.0, 9.0, 9.0])
  nll = jnp.array([9.0, 9.0, 1.0, 3.0, 2.0])
  in_s = jnp.array([1.0, 1.0, 0.0, 0.0, 0.0])
  near = jnp.array([0.0, 0.0, 1.0, 1.0, 0.0])
  out_s = jnp.array([0.0, 0.0, 0.0, 0.0, 1.0])
  # dpo (0.6 + 0.2) / 2 = 0.4; near (1 + 3) / 2 = 2; out 2.
  # L = 0.4 + 0.5 * 2 + 0.25 * 2 = 1.9.
  fn = lambda p, n: M.c3po_loss(
    p, n, in_s, near, out_s, lambda_near=0.5, lambda_out=0.25
  )
  out = jax.jit(fn)(pref, nll)
  np.testing.assert_allclose(
    [out.loss, out.dpo, out.sft_near, out.sft_out], [1.9, 0.4, 2.0, 2.0]
  )
  g_p, g_n = jax.grad(lambda p, n: fn(p, n).loss, (0, 1))(pref, nll)
  np.testing.assert_allclose(g_p, [0.5, 0.5, 0, 0, 0])
  np.testing.assert_allclose(g_n, [0, 0, 0.25, 0.25, 0.25])
  with pytest.raises(ValueError, match="out_scope_B"):
    M.c3po_loss(pref, nll, in_s, near, jnp.ones(4))
  with pytest.raises(ValueError, match="lambda_out"):
    M.c3po_loss(pref, nll, in_s, near, out_s, lambda_out=-1.0)


# ------------------------------------------------------ direct advantage


def test_step_advantages_and_direct_advantage_loss():
  values = jnp.array([[0.2, 0.5, 0.4, 1.0]])  # 3 steps; last = outcome
  mask = jnp.array([[1.0, 1.0, 0.0]])
  adv = M.step_advantages(values, mask)
  # 0.5 - 0.2 = 0.3, 0.4 - 0.5 = -0.1, masked 0.
  np.testing.assert_allclose(adv, [[0.3, -0.1, 0.0]], rtol=1e-6)
  logp = jnp.array([[-1.0, -2.0, -3.0]])
  ref = jnp.array([[-2.0, -2.0, -1.0]])
  # beta 0.5: (1 - 0.6)^2 = 0.16, (0 + 0.2)^2 = 0.04, masked 0.
  fn = lambda lp: M.direct_advantage_loss(lp, ref, adv, mask, beta=0.5)
  np.testing.assert_allclose(jax.jit(fn)(logp), [[0.16, 0.04, 0.0]], rtol=1e-5)
  g = jax.grad(lambda lp: jnp.sum(fn(lp)))(logp)
  np.testing.assert_allclose(g, [[0.8, 0.4, 0.0]], rtol=1e-5)
  # Minimum where log pi / pi_ref = A / beta.
  at_opt = ref + adv / 0.5
  np.testing.assert_allclose(fn(at_opt), 0.0, atol=1e-10)


def test_direct_advantage_loss_matches_numpy():
  rng = np.random.default_rng(3)
  lp, rf, a = [rng.normal(size=(4, 6)).astype(np.float32) for _ in range(3)]
  m = (rng.uniform(size=(4, 6)) < 0.7).astype(np.float32)
  beta = 0.2
  fn = lambda x, r, aa: jnp.sum(M.direct_advantage_loss(x, r, aa, m, beta=beta))
  g_lp, g_rf, g_a = jax.jit(jax.grad(fn, (0, 1, 2)))(lp, rf, a)
  want = m * (lp - rf - a / beta) ** 2
  np.testing.assert_allclose(
    M.direct_advantage_loss(lp, rf, a, m, beta=beta), want, rtol=1e-5
  )
  np.testing.assert_allclose(
    g_lp, 2 * m * (lp - rf - a / beta), rtol=1e-4, atol=1e-6
  )
  np.testing.assert_array_equal(g_rf, 0.0)
  np.testing.assert_array_equal(g_a, 0.0)
  with pytest.raises(ValueError, match="mask_BS"):
    M.direct_advantage_loss(lp, rf, a, m[:, :3])
  with pytest.raises(ValueError, match="S \\+ 1"):
    M.step_advantages(jnp.ones((4, 6)), m)
