"""ProGRPO's ARM, RED-Drop, GRPO-S, RAPO's tilted-reference weights, the
weighted KL penalty and Thinkless's decoupled aggregation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import advantages as A
from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms as T
from rljax.testing import random_batch


def _prepare(stage, batch, key=0):
  algo = rljax.Algorithm(stage, aggregate.token_mean)
  out, _ = jax.jit(
    lambda b: algo.prepare(b, algo.init(), key=jax.random.key(key))
  )(batch)
  return out


def _half(batch, part):
  sl = slice(0, 2) if part == 0 else slice(2, 4)
  return jax.tree.map(lambda x: x[sl], batch)


# ---------------------------------------------------------------------------
# ARM / ProGRPO
# ---------------------------------------------------------------------------


def np_confidence(logp, mask, low_fraction):
  out = np.zeros(logp.shape[:2])
  for p, g in np.ndindex(*logp.shape[:2]):
    vals = np.sort(logp[p, g][mask[p, g] > 0])
    if len(vals) == 0:
      continue
    k = (
      len(vals)
      if low_fraction is None
      else max(1, int(np.ceil(low_fraction * len(vals))))
    )
    out[p, g] = np.exp(vals[:k].mean())
  return out


@pytest.mark.parametrize("low_fraction", [None, 0.2, 0.5, 1.0])
def test_answer_confidence_matches_numpy(low_fraction):
  b = random_batch(3, tokens=9)
  got = jax.jit(
    lambda lp, m: A.answer_confidence(lp, m, low_fraction=low_fraction)
  )(b.old_logp_PGT, b.mask_PGT)
  want = np_confidence(
    np.asarray(b.old_logp_PGT, np.float64), b.mask_PGT, low_fraction
  )
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_arm_by_hand():
  # Group 0: rewards [1, 0, 1], confidences [0.9, 0.5, 0.4], c(q) = 0.6.
  # Group 1: all rewards 0 -> advantages unchanged.
  adv = np.array([[0.5, -1.0, 0.5], [0.0, 0.0, 0.0]], np.float32)
  r = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]], np.float32)
  c = np.array([[0.9, 0.5, 0.4], [0.2, 0.3, 0.4]], np.float32)
  got = A.arm(adv, r, c, alpha=0.5)
  # 0.5 + 0.5 (0.6 - 0.9) = 0.35; -1 + 0.5 (0.6 - 0.5) = -0.95;
  # 0.5 + 0.5 (0.6 - 0.4) = 0.6
  np.testing.assert_allclose(got[0], [0.35, -0.95, 0.6], rtol=1e-6)
  np.testing.assert_allclose(got[1], [0.0, 0.0, 0.0])
  got = A.arm(adv, r, c, alpha=0.5, prompt_confidence_P=np.array([1.0, 1.0]))
  np.testing.assert_allclose(got[0], [0.55, -0.75, 0.8], rtol=1e-6)


@pytest.mark.parametrize("prompt", [False, True])
def test_arm_stage_matches_numpy_and_splits_exactly(prompt):
  b = random_batch(5, tokens=8)
  b = b._replace(sample_mask_PG=np.array([[1, 1, 0, 1]] * 4, np.float32))
  prompt_logp = np.array([-0.5, -1.0, -0.1, -2.0], np.float32)
  b = b.with_extra(prompt_logp_P=prompt_logp)
  stage = rljax.chain(
    T.group_advantages(A.grpo),
    T.arm_advantages(
      alpha=0.3,
      low_fraction=0.5,
      prompt_logp="prompt_logp_P" if prompt else None,
    ),
  )
  out = _prepare(stage, b)
  mask = np.asarray(b.loss_mask(), np.float64)
  valid = np.asarray(b.samples())
  conf = np_confidence(np.asarray(b.old_logp_PGT, np.float64), mask, 0.5)
  base = np.asarray(_prepare(T.group_advantages(A.grpo), b).advantages_PGT)
  r = np.asarray(b.rewards_PG, np.float64)
  want = base.astype(np.float64).copy()
  for p in range(4):
    v = valid[p] > 0
    if (r[p][v]).sum() == 0:
      continue
    c_q = np.exp(prompt_logp[p]) if prompt else conf[p][v].mean()
    for g in range(4):
      if v[g]:
        want[p, g] += 0.3 * (c_q - conf[p, g]) * mask[p, g]
  np.testing.assert_allclose(out.advantages_PGT, want, rtol=1e-5, atol=1e-6)
  halves = [_prepare(stage, _half(b, i)).advantages_PGT for i in (0, 1)]
  np.testing.assert_allclose(  # other batch shapes: float32 reductions reordered
    np.concatenate(halves), out.advantages_PGT, rtol=1e-5, atol=1e-6
  )
  # Higher confidence -> smaller advantage among correct samples.
  assert np.all(np.isfinite(out.extra["answer_confidence_PG"]))


def test_arm_bfloat16_and_missing_fields():
  b = random_batch(1, dtype=jnp.bfloat16).with_extra(
    prompt_logp_P=np.zeros(4, jnp.bfloat16)
  )
  stage = rljax.chain(T.group_advantages(A.grpo), T.arm_advantages())
  assert stage.rescores == (rljax.Rescore("prompt_logp_P", span="prompt"),)
  assert T.arm_advantages(prompt_logp=None).rescores == ()
  out = _prepare(stage, b)
  assert out.advantages_PGT.dtype == jnp.float32
  assert np.all(np.isfinite(out.advantages_PGT))
  with pytest.raises(ValueError, match="behaviour log-probs"):
    _prepare(stage, b._replace(old_logp_PGT=None, rollout_logp_PGT=None))
  with pytest.raises(ValueError, match="low_fraction"):
    T.arm_advantages(low_fraction=1.5)
  with pytest.raises(ValueError, match="_P entry"):
    T.arm_advantages(prompt_logp="prompt_logp_PG")
  with pytest.raises(ValueError, match="prompt_logp_P"):
    _prepare(stage, random_batch(1))


# ---------------------------------------------------------------------------
# RED-Drop
# ---------------------------------------------------------------------------


def np_red_drop(r, kept, std_normalize=False, eps=1e-6):
  out = np.zeros_like(r)
  for p in range(r.shape[0]):
    k = kept[p] > 0
    if k.sum() < 2:
      continue
    mean = r[p][k].mean()
    adv = r[p] - mean
    if std_normalize:
      adv = adv / (r[p][k].std() + eps)
    out[p] = np.where(k, adv, 0.0)
  return out


def test_red_drop_by_hand():
  # Rewards [1, 0, 0, 0, 0]: mean 0.2, one positive, four negatives: three
  # negatives are dropped; the kept pair [1, 0] has mean 0.5.
  r = np.array([[1.0, 0.0, 0.0, 0.0, 0.0]], np.float32)
  adv, kept = A.red_drop(r, jax.random.key(0))
  assert kept[0, 0] == 1 and kept.sum() == 2
  np.testing.assert_allclose(adv[0, 0], 0.5)
  np.testing.assert_allclose(adv.sum(), 0.0, atol=1e-7)
  # Balanced or positive-heavy groups drop nothing.
  r = np.array([[1.0, 1.0, 1.0, 0.0]], np.float32)
  adv, kept = A.red_drop(r, jax.random.key(0))
  np.testing.assert_array_equal(kept, 1.0)
  np.testing.assert_allclose(adv, [[0.25, 0.25, 0.25, -0.75]])


@pytest.mark.parametrize("std_normalize", [False, True])
def test_red_drop_matches_numpy_and_balances(std_normalize):
  rng = np.random.default_rng(0)
  r = rng.integers(0, 3, size=(64, 8)).astype(np.float32)
  valid = (rng.uniform(size=(64, 8)) < 0.9).astype(np.float32)
  adv, kept = jax.jit(
    lambda r, v: A.red_drop(
      r, jax.random.key(1), v, std_normalize=std_normalize
    )
  )(r, valid)
  kept = np.asarray(kept)
  assert np.all(kept <= valid)
  for p in range(64):
    v = valid[p] > 0
    mean = r[p][v].mean()
    pos = (r[p] >= mean) & v
    neg = (r[p] < mean) & v
    k = kept[p] > 0
    # Only negatives are dropped, and exactly the surplus.
    assert np.all(k[pos])
    assert (neg & k).sum() == min(neg.sum(), pos.sum())
  np.testing.assert_allclose(
    adv, np_red_drop(r.astype(np.float64), kept, std_normalize), atol=1e-5
  )


def test_red_drop_stage_masks_or_zeroes():
  b = random_batch(2, samples=6)
  b = b._replace(rewards_PG=np.array([[1, 0, 0, 0, 0, 0]] * 4, np.float32))
  masked = _prepare(T.red_drop_advantages(), b)
  assert np.asarray(masked.sample_mask_PG).sum(-1).tolist() == [2.0] * 4
  zeroed = _prepare(T.red_drop_advantages(drop="zero"), b)
  assert zeroed.sample_mask_PG is None
  np.testing.assert_allclose(zeroed.advantages_PGT, masked.advantages_PGT)
  with pytest.raises(ValueError, match="PRNG key"):
    algo = rljax.Algorithm(T.red_drop_advantages(), aggregate.token_mean)
    algo.prepare(b, algo.init())


# ---------------------------------------------------------------------------
# GRPO-S and RAPO weights
# ---------------------------------------------------------------------------


def test_grpo_s_by_hand_and_numpy():
  r = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)
  h = np.array([0.5, 0.0], np.float32)
  ref = np.array([0.5, 1.0], np.float32)
  got = A.grpo_s_scale(r, h, ref, alpha=1.0, beta=2.0)
  # Prompt 0: gap 0.5 - 0.5 = 0 -> w = 1 + 0.5 + 2 * 0.5 = 2.5.
  # Prompt 1: gap 1 - 1 = 0 -> w = 1 + 0 + 1 = 2.
  np.testing.assert_allclose(got, [[2.5, 0.0], [2.0, 2.0]], rtol=1e-6)
  rng = np.random.default_rng(0)
  r = rng.normal(size=(5, 4))
  h = rng.uniform(size=5)
  ref = rng.normal(size=5)
  w = 1 + 0.3 * h + 0.7 / (1 + np.exp(-(ref - r.mean(-1)) / 0.5))
  got = jax.jit(
    lambda *a: A.grpo_s_scale(*a, alpha=0.3, beta=0.7, temperature=0.5)
  )(r.astype(np.float32), h.astype(np.float32), ref.astype(np.float32))
  np.testing.assert_allclose(got, r * w[:, None], rtol=1e-5, atol=1e-6)


def test_grpo_s_stage_reads_hardness_and_reference():
  b = random_batch(0)
  stage = T.grpo_s_rewards()
  with pytest.raises(ValueError, match="baseline_rewards_P"):
    _prepare(stage, b._replace(baseline_rewards_P=None))
  with pytest.raises(ValueError, match="hardness_P"):
    _prepare(stage, b)
  out = _prepare(stage, b.with_extra(hardness_P=np.zeros(4, np.float32)))
  assert np.all(np.asarray(out.rewards_PG) >= np.asarray(b.rewards_PG))


def test_rapo_weights_by_hand_and_properties():
  r = np.array([[1.0, 0.0], [0.0, 0.0]], np.float32)
  w = A.rapo_weights(r, temperature=1.0)
  e = np.e
  np.testing.assert_allclose(
    w, [[2 * e / (e + 1), 2 / (e + 1)], [1, 1]], rtol=1e-6
  )
  rng = np.random.default_rng(0)
  r = rng.normal(size=(6, 5)).astype(np.float32) * 30  # exp overflow bait
  valid = (rng.uniform(size=(6, 5)) < 0.8).astype(np.float32)
  w = np.asarray(A.rapo_weights(r, valid, temperature=0.5))
  assert np.all(np.isfinite(w)) and np.all(w[valid == 0] == 0)
  for p in range(6):
    if valid[p].sum():
      np.testing.assert_allclose(w[p][valid[p] > 0].mean(), 1.0, rtol=1e-5)


def test_weighted_kl_penalty_value_and_gradient():
  b = random_batch(4)
  b = _prepare(T.rapo_weights(temperature=0.5), b)
  algo = rljax.Algorithm(
    objectives.kl_penalty(losses.kl_k3, coef=0.1, weight="kl_weight_PG"),
    aggregate.token_mean,
  )
  logp = np.asarray(b.old_logp_PGT, np.float64)
  ref = np.asarray(b.ref_logp_PGT, np.float64)
  w = np.asarray(b.extra["kl_weight_PG"], np.float64)[..., None]
  mask = np.asarray(b.loss_mask(), np.float64)

  def np_loss(lp):
    k3 = np.exp(ref - lp) - (ref - lp) - 1
    return (0.1 * w * k3 * mask).sum() / mask.sum()

  value, grad = jax.jit(
    jax.value_and_grad(lambda lp: algo.loss(lp, b, algo.init())[0].value)
  )(jnp.asarray(logp, jnp.float32))
  np.testing.assert_allclose(value, np_loss(logp), rtol=1e-5)
  want = 0.1 * w * (1 - np.exp(ref - logp)) * mask / mask.sum()
  np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-7)
  with pytest.raises(ValueError, match="_PG or _PGT"):
    objectives.kl_penalty(losses.kl_k3, weight="kl_weight")


# ---------------------------------------------------------------------------
# DeGRPO's decoupled aggregation
# ---------------------------------------------------------------------------

LOSS = np.array([[2.0, 1.0, 3.0, 9.0], [4.0, 6.0, 0.0, 0.0]], np.float32)
MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)


def test_decoupled_by_hand():
  # Paper: ((0.5 * 2 + (1 + 3) / 2) + (0.5 * 4 + 6 / 1)) / 2 = (3 + 8) / 2.
  got = aggregate.decoupled(alpha=0.5)(LOSS, MASK).value
  np.testing.assert_allclose(got, 5.5)
  # Code: 0.5 * (2 + 4) / 2 + (1 + 3 + 6) / 3.
  got = aggregate.decoupled(alpha=0.5, body="token_mean")(LOSS, MASK).value
  np.testing.assert_allclose(got, 1.5 + 10 / 3, rtol=1e-6)


def np_decoupled(loss, mask, alpha):
  total, n = 0.0, 0
  for i in range(loss.shape[0]):
    idx = np.nonzero(mask[i] > 0)[0]
    if len(idx) == 0:
      continue
    n += 1
    body = idx[1:]
    total += alpha * loss[i, idx[0]]
    if len(body):
      total += loss[i, body].mean()
  return total / n


def test_decoupled_matches_numpy_gradients_and_splits_exactly():
  rng = np.random.default_rng(0)
  loss = rng.normal(size=(6, 7))
  mask = (rng.uniform(size=(6, 7)) < 0.7).astype(np.float64)
  mask[0] = 0.0
  mask[1] = [0, 0, 1, 0, 0, 0, 0]  # a left-padded single-token sequence
  fn = aggregate.decoupled(alpha=0.3)
  value, grad = jax.jit(jax.value_and_grad(lambda l: fn(l, mask).value))(
    jnp.asarray(loss, jnp.float32)
  )
  np.testing.assert_allclose(value, np_decoupled(loss, mask, 0.3), rtol=1e-5)
  eps = 1e-6
  num = np.zeros_like(loss)
  for i in np.ndindex(loss.shape):
    up, down = loss.copy(), loss.copy()
    up[i] += eps
    down[i] -= eps
    num[i] = (np_decoupled(up, mask, 0.3) - np_decoupled(down, mask, 0.3)) / (
      2 * eps
    )
  np.testing.assert_allclose(grad, num, atol=1e-5)
  parts = [fn(loss[s], mask[s]) for s in (slice(0, 3), slice(3, 6))]
  whole = jax.tree.map(jnp.add, *parts)
  # Parts summed vs the whole: float32 sums in another order, ~n*eps32 off.
  np.testing.assert_allclose(whole.value, value, rtol=1e-5, atol=1e-7)
  bf = fn(jnp.asarray(loss, jnp.bfloat16), mask).value
  assert bf.dtype == jnp.float32 and np.isfinite(bf)


def test_decoupled_alpha_scales_only_the_control_token():
  # The body's gradient does not depend on alpha; the control token's is
  # alpha / E.
  g = jax.grad(lambda l: aggregate.decoupled(alpha=0.01)(l, MASK).value)(LOSS)
  np.testing.assert_allclose(g[:, 0], [0.005, 0.005], rtol=1e-6)
  np.testing.assert_allclose(g[0, 1:3], [0.25, 0.25], rtol=1e-6)
  np.testing.assert_allclose(g[1, 1], 0.5, rtol=1e-6)
