"""Group-level judge rewards: EMPO, P-GRPO, SPO, CGPO, TP-GRPO."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import testing
from rljax import transforms as T

# ---------------------------------------------------------------------------
# Independent float64 references, written from the papers' formulas.
# ---------------------------------------------------------------------------


def np_empo(ids, mask=None, max_entropy=None, min_entropy=None):
  ids = np.asarray(ids)
  mask = np.ones(ids.shape, bool) if mask is None else np.asarray(mask) != 0
  out = np.zeros(ids.shape)
  for p in range(ids.shape[0]):
    members = [i for i in range(ids.shape[1]) if mask[p, i]]
    n = len(members)
    # Clusters: unanswered samples are singletons.
    labels = [
      int(ids[p, i]) if ids[p, i] >= 0 else ("none", i) for i in members
    ]
    sizes = {lab: labels.count(lab) for lab in labels}
    probs = np.array([sizes[lab] / n for lab in sizes])
    h = -np.sum(probs * np.log(probs))
    limit = math.log(n) if max_entropy is None else max_entropy
    ok = h < limit - 1e-12 if max_entropy is None else h < limit
    if min_entropy is not None:
      ok = ok and h >= min_entropy
    for i, lab in zip(members, labels):
      if ok and ids[p, i] >= 0:
        out[p, i] = sizes[lab] / n
  return out


def np_win_rate(pref, mask):
  pref = np.asarray(pref, np.float64)
  out = np.zeros(pref.shape[:2])
  for p in range(pref.shape[0]):
    valid = [j for j in range(pref.shape[1]) if mask[p, j]]
    for i in valid:
      others = [j for j in valid if j != i]
      out[p, i] = np.mean([pref[p, i, j] for j in others]) if others else 0
  return out


# ---------------------------------------------------------------------------
# EMPO
# ---------------------------------------------------------------------------


def test_empo_by_hand():
  # Group 0: answers [a, a, b, none]: n = 4, clusters {a:2, b:1, none:1},
  # H = -(.5 log .5 + 2 * .25 log .25) = 1.0397 < log 4 = 1.386.
  # R = [2/4, 2/4, 1/4, 0] (no answer -> 0).
  # Group 1: all distinct [0, 1, 2, 3]: H = log 4, not < log 4 -> all 0.
  ids = np.array([[0, 0, 1, -1], [0, 1, 2, 3]], np.int32)
  r = jax.jit(T.cluster_frequency_rewards)(ids)
  np.testing.assert_allclose(r, [[0.5, 0.5, 0.25, 0.0], [0, 0, 0, 0]])


def test_empo_unanswered_are_singletons_and_count():
  # [none, none, a, b]: the two unanswered are distinct clusters, so all
  # four are distinct: H = log 4 -> zero rewards (as the official code,
  # where empty predictions never verify as equal).
  r = T.cluster_frequency_rewards(np.array([[-1, -1, 0, 1]], np.int32))
  np.testing.assert_array_equal(r, [[0, 0, 0, 0]])


def test_empo_matches_reference_with_mask_and_thresholds():
  rng = np.random.default_rng(0)
  ids = rng.integers(-1, 3, size=(64, 6)).astype(np.int32)
  mask = rng.random((64, 6)) > 0.2
  for kw in ({}, {"max_entropy": 1.0}, {"min_entropy": 0.5}):
    got = jax.jit(lambda i, m, kw=kw: T.cluster_frequency_rewards(i, m, **kw))(
      ids, mask
    )
    np.testing.assert_allclose(got, np_empo(ids, mask, **kw), atol=1e-6)


def test_empo_majority_gets_most_and_invalid_rows_zero():
  ids = np.array([[0, 0, 0, 1, 2, 0]], np.int32)
  mask = np.array([[1, 1, 1, 1, 1, 0]])
  r = np.asarray(T.cluster_frequency_rewards(ids, mask))
  assert r[0, 0] == pytest.approx(3 / 5) and r[0, 3] == pytest.approx(1 / 5)
  assert r[0, 5] == 0


def test_empo_rejects_float_ids():
  with pytest.raises(ValueError, match="integer cluster ids"):
    T.cluster_frequency_rewards(np.zeros((2, 3), np.float32))


def test_empo_transform_reads_extra_and_names_missing():
  batch = testing.random_batch(0, prompts=2, samples=4)
  with pytest.raises(ValueError, match="answer_ids_PG"):
    rljax.chain(T.empo_rewards()).prepare(batch, ((),))
  ids = np.array([[0, 0, 1, -1], [0, 1, 2, 3]], np.int32)
  out, _ = jax.jit(T.empo_rewards().prepare)(
    batch.with_extra(answer_ids_PG=ids), ()
  )
  np.testing.assert_allclose(out.rewards_PG, np_empo(ids))


# ---------------------------------------------------------------------------
# P-GRPO
# ---------------------------------------------------------------------------


def test_p_grpo_by_hand_and_gradient():
  # outcome [1, 0, 1], process [0.3, 0.9, -0.2]:
  # r = [1 + 0.3, 0 + 0, 1 - 0.2] = [1.3, 0, 0.8]; dr/dproc = [1, 0, 1].
  out = np.array([1.0, 0.0, 1.0])
  proc = np.array([0.3, 0.9, -0.2])
  f = jax.jit(T.success_gated_rewards)
  np.testing.assert_allclose(f(out, proc), [1.3, 0.0, 0.8], rtol=1e-6)
  grad = jax.grad(lambda p: jnp.sum(T.success_gated_rewards(out, p)))(proc)
  np.testing.assert_allclose(grad, [1, 0, 1])


def test_p_grpo_transform_columns_and_bad_column():
  batch = testing.random_batch(1, prompts=3, samples=4)
  out, _ = jax.jit(T.p_grpo_rewards().prepare)(batch, ())
  k = np.asarray(batch.rewards_PGK, np.float64)
  want = k[..., 0] + (k[..., 0] >= 1) * k[..., 1]
  np.testing.assert_allclose(out.rewards_PG, want)
  with pytest.raises(ValueError, match="column 5 is out of range"):
    T.p_grpo_rewards(process_column=5).prepare(batch, ())


def test_p_grpo_never_rewards_process_of_failures():
  rng = np.random.default_rng(2)
  out = rng.integers(0, 2, 100).astype(np.float32)
  proc = rng.normal(size=100).astype(np.float32)
  r = np.asarray(T.success_gated_rewards(out, proc))
  np.testing.assert_array_equal(r[out == 0], 0)


# ---------------------------------------------------------------------------
# SPO (self-play)
# ---------------------------------------------------------------------------


def test_spo_by_hand():
  # P(0>1) = .8, P(0>2) = .6, P(1>2) = .3 (antisymmetric).
  # R0 = (.8 + .6)/2 = .7; R1 = (.2 + .3)/2 = .25; R2 = (.4 + .7)/2 = .55.
  pref = np.array([[[0.5, 0.8, 0.6], [0.2, 0.5, 0.3], [0.4, 0.7, 0.5]]])
  r = jax.jit(T.win_rate_rewards)(pref)
  np.testing.assert_allclose(r, [[0.7, 0.25, 0.55]], rtol=1e-6)
  # Antisymmetric preferences: win rates average 1/2.
  assert float(jnp.mean(r)) == pytest.approx(0.5)


def test_spo_reference_value_and_gradient():
  rng = np.random.default_rng(3)
  pref = rng.random((5, 4, 4))
  mask = rng.random((5, 4)) > 0.25
  f = jax.jit(T.win_rate_rewards)
  np.testing.assert_allclose(f(pref, mask), np_win_rate(pref, mask), atol=1e-6)
  w = rng.normal(size=(5, 4))
  grad = jax.grad(lambda p: jnp.sum(w * T.win_rate_rewards(p, mask)))(
    jnp.asarray(pref, jnp.float32)
  )
  # d R_i / d P_ij = 1/(n-1) for valid j != i, valid i.
  n = mask.sum(-1)
  expect = np.zeros_like(pref)
  for p in range(5):
    for i in range(4):
      for j in range(4):
        if mask[p, i] and mask[p, j] and i != j:
          expect[p, i, j] = w[p, i] / (n[p] - 1)
  np.testing.assert_allclose(grad, expect, rtol=1e-5, atol=1e-7)


def test_spo_ignores_nan_outside_valid_pairs_and_checks_shape():
  pref = np.full((1, 3, 3), 0.5)
  pref[0, :, 2] = np.nan
  r = T.win_rate_rewards(pref, np.array([[1, 1, 0]]))
  np.testing.assert_allclose(r, [[0.5, 0.5, 0.0]])
  with pytest.raises(ValueError, match=r"\[..., G, G\]"):
    T.win_rate_rewards(np.zeros((2, 3)))


# ---------------------------------------------------------------------------
# CGPO
# ---------------------------------------------------------------------------


def test_cgpo_calibrated_by_hand_value_and_gradient():
  # sigmoid(2 - 2) = 0.5; sigmoid(ln 3) = 3/4; derivative s(1 - s) = 3/16.
  r = np.array([2.0, 1.0 + math.log(3)])
  ref = np.array([2.0, 1.0])
  f = jax.jit(T.calibrated_rewards)
  np.testing.assert_allclose(f(r, ref), [0.5, 0.75], rtol=1e-6)
  grad = jax.grad(lambda x: jnp.sum(T.calibrated_rewards(x, ref)))(r)
  np.testing.assert_allclose(grad, [0.25, 3 / 16], rtol=1e-5)


def test_cgpo_calibration_is_monotone_and_prompt_invariant():
  # Adding a constant to R(q, .) for a prompt (reference included) does
  # not change its calibrated rewards.
  r = np.array([[0.1, 0.7, 2.0]])
  a = T.calibrated_rewards(r, np.array([[0.5]]))
  b = T.calibrated_rewards(r + 10.0, np.array([[10.5]]))
  np.testing.assert_allclose(a, b, atol=1e-6)
  assert np.all(np.diff(np.asarray(a)) > 0)


def test_cgpo_constraint_mask_zeroes_flagged_positives_only():
  batch = testing.random_batch(4, prompts=2, samples=3)
  adv = np.array([[1.0, -1.0, 0.5], [2.0, -2.0, 0.0]], np.float32)
  flags = np.array([[1, 1, 0], [0, 1, 1]], np.float32)
  batch = batch._replace(advantages_PGT=adv[..., None] * batch.loss_mask())
  batch = batch.with_extra(flagged_PG=flags)
  out, _ = jax.jit(T.cgpo_constraint_mask().prepare)(batch, ())
  want = np.array([[0.0, -1.0, 0.5], [2.0, -2.0, 0.0]])
  np.testing.assert_allclose(
    out.advantages_PGT, want[..., None] * np.asarray(batch.loss_mask())
  )


def test_cgpo_calibrated_transform():
  batch = testing.random_batch(5, prompts=2, samples=3)
  ref = np.array([0.5, -1.0], np.float32)
  out, _ = T.cgpo_calibrated_rewards().prepare(
    batch.with_extra(reference_rewards_P=ref), ()
  )
  r = np.asarray(batch.rewards_PG, np.float64)
  np.testing.assert_allclose(
    out.rewards_PG, 1 / (1 + np.exp(-(r - ref[:, None]))), rtol=1e-6
  )


# ---------------------------------------------------------------------------
# TP-GRPO
# ---------------------------------------------------------------------------


def test_tp_grpo_by_hand():
  # Group accuracy 1/4 -> w = 1 - 1/4 = 0.75.
  # r = out + 0.75 * proc = [1 + 0.75*2, 0 - 0.75, 0, 0 + 0.75].
  out = np.array([[1.0, 0.0, 0.0, 0.0]])
  proc = np.array([[2.0, -1.0, 0.0, 1.0]])
  r = jax.jit(T.adaptive_process_rewards)(out, proc)
  np.testing.assert_allclose(r, [[2.5, -0.75, 0.0, 0.75]])


def test_tp_grpo_reference_and_custom_weight():
  rng = np.random.default_rng(6)
  out = rng.integers(0, 2, (8, 5)).astype(np.float64)
  proc = rng.normal(size=(8, 5))
  mask = rng.random((8, 5)) > 0.2
  acc = (out * mask).sum(-1, keepdims=True) / np.maximum(mask.sum(-1), 1)[
    :, None
  ]
  want = out + np.square(acc) * proc
  got = T.adaptive_process_rewards(
    out, proc, mask, weight=lambda a: jnp.square(a)
  )
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  grad = jax.grad(lambda p: jnp.sum(T.adaptive_process_rewards(out, p, mask)))(
    jnp.asarray(proc, jnp.float32)
  )
  np.testing.assert_allclose(grad, np.broadcast_to(1 - acc, (8, 5)), atol=1e-6)


def test_tp_grpo_transform_uses_columns():
  batch = testing.random_batch(7, prompts=3, samples=4)
  out, _ = T.tp_grpo_rewards().prepare(batch, ())
  k = np.asarray(batch.rewards_PGK, np.float64)
  acc = k[..., 0].mean(-1, keepdims=True)
  np.testing.assert_allclose(out.rewards_PG, k[..., 0] + (1 - acc) * k[..., 1])


# ---------------------------------------------------------------------------
# Shared: bfloat16, presets.
# ---------------------------------------------------------------------------


def test_bfloat16_inputs_give_float32():
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  x = np.array([[1.0, 0.0, 1.0]])
  outs = [
    T.success_gated_rewards(bf(x), bf(x)),
    T.win_rate_rewards(bf(np.full((1, 3, 3), 0.5))),
    T.calibrated_rewards(bf(x), bf(x)),
    T.mask_flagged_positives(bf(x), x),
    T.adaptive_process_rewards(bf(x), bf(x)),
  ]
  for o in outs:
    assert o.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(o)))


def test_empo_preset_loss_and_gradient_finite():
  from rljax.algorithms import _stateful

  algo = _stateful.empo()
  batch = testing.random_batch(8, prompts=3, samples=4)
  ids = np.array([[0, 0, 1, -1], [0, 1, 2, 3], [2, 2, 2, 0]], np.int32)
  batch = batch.with_extra(answer_ids_PG=ids)
  prepared, state = jax.jit(algo.prepare)(batch, algo.init())
  logp = testing.perturbed_logp(batch)

  def loss(lp):
    return algo.loss(lp, prepared, state)[0].value

  value, grad = jax.jit(jax.value_and_grad(loss))(jnp.asarray(logp))
  assert np.isfinite(value) and np.all(np.isfinite(grad))
  assert np.any(np.asarray(grad) != 0)
