"""Batch stages of the advantage / reward variants, the mixed policy loss
stage and the presets built on them."""

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
from rljax.algorithms import _variants as presets
from rljax.testing import random_batch
from rljax.transforms import _variants

IDS = np.array(
  [[0, 0, 1, -1], [2, 2, 2, 2], [0, 1, 2, 3], [1, 1, 0, 0]], np.int32
)


def _batch(seed=0, dtype=np.float32):
  b = random_batch(seed, prompts=4, samples=4, tokens=6, dtype=dtype)
  rng = np.random.default_rng(seed)
  return b.with_extra(
    answer_ids_PG=IDS,
    tool_position_PG=rng.integers(-1, 5, (4, 4)).astype(np.float32),
    tool_calls_PG=rng.integers(0, 4, (4, 4)).astype(np.float32),
  )


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
# mixed_policy (COPO's two-advantage loss).
# ---------------------------------------------------------------------------


def np_ppo(logp, old, adv, eps=0.2):
  r = np.exp(logp - old)
  return np.maximum(-adv * r, -adv * np.clip(r, 1 - eps, 1 + eps))


def test_copo_loss_matches_numpy_value_and_gradient():
  b = _prepare(T.copo_advantages(), _batch(1))
  algo = presets.copo()
  logp = np.asarray(b.old_logp_PGT, np.float64) + np.random.default_rng(
    2
  ).normal(0, 0.3, b.shape)
  mask = np.asarray(b.loss_mask(), np.float64)
  w = np.asarray(b.extra["copo_local_weight_PG"], np.float64)[..., None]
  a_loc = np.asarray(b.advantages_PGT, np.float64)
  a_glob = np.asarray(b.extra["advantages_global_PGT"], np.float64)
  old = np.asarray(b.old_logp_PGT, np.float64)

  def np_loss(lp):
    per = w * np_ppo(lp, old, a_loc) + (1 - w) * np_ppo(lp, old, a_glob)
    per_seq = (per * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
    return per_seq[mask.sum(-1) > 0].mean()

  value, grad = jax.jit(
    jax.value_and_grad(lambda lp: algo.loss(lp, b, algo.init())[0].value)
  )(jnp.asarray(logp, jnp.float32))
  np.testing.assert_allclose(value, np_loss(logp), rtol=1e-5, atol=1e-6)
  num = np.zeros_like(logp)
  for i in np.ndindex(logp.shape):
    up, down = logp.copy(), logp.copy()
    up[i] += 1e-6
    down[i] -= 1e-6
    num[i] = (np_loss(up) - np_loss(down)) / 2e-6
  np.testing.assert_allclose(grad, num, atol=1e-4)


def test_mixed_policy_is_exact_under_micro_batching():
  b = _prepare(T.copo_advantages(), _batch(3))
  algo = rljax.Algorithm(
    objectives.mixed_policy(losses.ppo_clip, mix=T.COPO_MIX),
    aggregate.token_mean,
  )
  logp = np.asarray(b.old_logp_PGT) + 0.2
  whole = algo.loss(logp, b, ())[0]
  halves = [
    algo.loss(logp[s], _half(b, i), ())[0]
    for i, s in enumerate((slice(0, 2), slice(2, 4)))
  ]
  summed = jax.tree.map(jnp.add, *halves)
  # Halves summed vs the whole: float32 sums in another order.
  np.testing.assert_allclose(summed.value, whole.value, rtol=1e-5, atol=1e-7)


def test_mixed_policy_by_hand_and_hdpo_modes_agree_when_linear():
  # REINFORCE is linear in A: L(A_acc) + w L(A_eff) == L(A_acc + w A_eff).
  b = _batch(4)
  logp = np.asarray(b.old_logp_PGT) - 0.1
  sum_mode = rljax.Algorithm(
    rljax.chain(
      T.hdpo_advantages(weight=0.5), objectives.policy(losses.reinforce)
    ),
    aggregate.token_mean,
  )
  loss_mode = rljax.Algorithm(
    rljax.chain(
      T.hdpo_advantages(weight=0.5, combine="loss"),
      objectives.mixed_policy(
        losses.reinforce,
        mix=(("advantages_PGT", 1.0), ("advantages_efficiency_PGT", 0.5)),
      ),
    ),
    aggregate.token_mean,
  )
  values = []
  for algo in (sum_mode, loss_mode):
    pb, st = algo.prepare(b, algo.init())
    values.append(algo.loss(logp, pb, st)[0].value)
  np.testing.assert_allclose(values[0], values[1], rtol=1e-5)
  # By hand: one token, A = 2 and 4 with weights 0.25 / 0.75, logp = old:
  # REINFORCE loss -A logp = (0.25 * 2 + 0.75 * 4) * 1.0 = 3.5 at logp -1.
  one = rljax.Batch(
    mask_PGT=np.ones((1, 1, 1), np.float32),
    advantages_PGT=np.full((1, 1, 1), 2.0, np.float32),
    old_logp_PGT=np.full((1, 1, 1), -1.0, np.float32),
  ).with_extra(a2_PGT=np.full((1, 1, 1), 4.0, np.float32), w_PG=[[0.75]])
  algo = rljax.Algorithm(
    objectives.mixed_policy(
      losses.reinforce, mix=(("advantages_PGT", 0.25), ("a2_PGT", "w_PG"))
    ),
    aggregate.token_mean,
  )
  loss, _ = algo.loss(np.full((1, 1, 1), -1.0, np.float32), one, ())
  np.testing.assert_allclose(loss.value, 3.5, rtol=1e-6)


def test_mixed_policy_rejects_bad_mix():
  with pytest.raises(ValueError, match="_PGT"):
    objectives.mixed_policy(losses.ppo_clip, mix=(("adv", 1.0),))
  with pytest.raises(ValueError, match="_PG"):
    objectives.mixed_policy(losses.ppo_clip, mix=(("advantages_PGT", "w"),))
  with pytest.raises(ValueError, match=">= 0"):
    objectives.mixed_policy(losses.ppo_clip, mix=(("advantages_PGT", -1.0),))
  algo = rljax.Algorithm(
    objectives.mixed_policy(losses.ppo_clip, mix=T.COPO_MIX),
    aggregate.token_mean,
  )
  b = random_batch(0)
  b = b._replace(advantages_PGT=b.old_values_PGT).with_extra(
    copo_local_weight_PG=np.ones((4, 4)), copo_global_weight_PG=np.ones((4, 4))
  )
  with pytest.raises(ValueError, match="advantages_global_PGT"):
    algo.loss(b.old_logp_PGT, b, ())


# ---------------------------------------------------------------------------
# Batch stages against the array functions.
# ---------------------------------------------------------------------------


def test_copo_stage_writes_both_advantages_and_weights():
  b = _prepare(T.copo_advantages(forced=True), _batch(5))
  r = np.asarray(b.rewards_PG)
  a_glob, h = A.copo_global_advantages(r, IDS)
  mask = np.asarray(b.loss_mask())
  np.testing.assert_allclose(
    b.extra["advantages_global_PGT"],
    np.asarray(a_glob)[..., None] * mask,
    atol=1e-6,
  )
  w = np.asarray(A.copo_weights(h))[:, None] * np.ones((4, 4))
  flat = np.all(np.asarray(A.grpo(r)) == 0, axis=-1, keepdims=True)
  np.testing.assert_allclose(
    b.extra["copo_local_weight_PG"], np.where(flat, 0, w), rtol=1e-6
  )
  np.testing.assert_allclose(
    b.extra["copo_global_weight_PG"] + b.extra["copo_local_weight_PG"], 1.0
  )


def test_aspo_stage_by_hand():
  # One prompt, G = 2, T = 4: both correct and tool-using. A = (1, -1) on
  # every valid token; lengths (4, 2); p = (3, 1): mean p 2, mean L 3:
  # bias = -2 (p - 2) / 3 = (-2/3, +2/3), clipped to +-0.7.
  b = rljax.Batch(
    mask_PGT=np.array([[[1, 1, 1, 1], [1, 1, 0, 0]]], np.float32),
    rewards_PG=np.ones((1, 2), np.float32),
  ).with_extra(tool_position_PG=[[3.0, 1.0]])
  b = _prepare(
    rljax.chain(T.group_advantages(A.dr_grpo), T.aspo_shaping()),
    b._replace(rewards_PG=np.array([[1.0, 0.5]], np.float32)),
  )
  # dr_grpo of (1, 0.5): (0.25, -0.25); bias clip 0.7 * 0.25 = 0.175;
  # but sample 1 (reward 0.5 > 0) is correct too: bias (-0.175, +0.175).
  np.testing.assert_allclose(
    b.advantages_PGT,
    [[[0.075] * 4, [-0.075, -0.075, 0, 0]]],
    atol=1e-6,
  )


def test_hdpo_adora_seed_dagrpo_stages_match_functions():
  b = _batch(6)
  r, mask = np.asarray(b.rewards_PG), np.asarray(b.loss_mask())
  correct = np.asarray(b.rewards_PGK[..., 0]) > 0
  lengths = np.asarray(b.mask_PGT).sum(-1)
  calls = np.asarray(b.extra["tool_calls_PG"])
  out = _prepare(T.hdpo_advantages(weight=0.3), b)
  want = A.hdpo(r, 1 / (calls + 1), correct, weight=0.3)
  np.testing.assert_allclose(
    out.advantages_PGT, np.asarray(want)[..., None] * mask, atol=1e-6
  )
  grpo = _prepare(T.group_advantages(A.grpo), b)
  out = _prepare(T.adora_advantages(kappa=(0.5, 2.0)), grpo)
  cls = A.adora_length_classes(correct, lengths, None, b.truncated_PG)
  factor = np.where(np.asarray(cls) == 1, 2.0, 0.5)[..., None]
  np.testing.assert_allclose(
    out.advantages_PGT, np.asarray(grpo.advantages_PGT) * factor, atol=1e-6
  )
  custom = _prepare(
    T.adora_advantages(classify=lambda b: jnp.zeros((4, 4), jnp.int32)), grpo
  )
  np.testing.assert_allclose(custom.advantages_PGT, 0.1 * grpo.advantages_PGT)
  out = _prepare(T.seed_grpo_advantages(weighting="count", alpha=0.7), grpo)
  scale = A.seed_grpo(np.ones((4, 4)), IDS, alpha=0.7)
  np.testing.assert_allclose(
    out.advantages_PGT,
    np.asarray(grpo.advantages_PGT) * np.asarray(scale)[..., None],
    atol=1e-6,
  )
  out = _prepare(T.dagrpo_mask(delta=0.5), b)
  w = A.distinctiveness_mask(r, delta=0.5)
  np.testing.assert_allclose(
    out.policy_weights_PGT, np.broadcast_to(np.asarray(w)[..., None], b.shape)
  )


def test_polychromic_and_soft_stages():
  b = _batch(7)
  out = _prepare(T.polychromic_advantages(set_size=2), b)
  want = A.polychromic(b.rewards_PG, IDS, set_size=2)
  np.testing.assert_allclose(
    out.advantages_PGT, np.asarray(want)[..., None] * b.loss_mask(), atol=1e-6
  )
  soft = _prepare(T.soft_advantages(tau_pos=0.5), out)
  np.testing.assert_allclose(
    soft.advantages_PGT,
    A.soft_advantage(out.advantages_PGT, tau_pos=0.5) * b.loss_mask(),
    atol=1e-6,
  )


def test_length_reward_stages():
  b = _batch(8)
  r = np.asarray(b.rewards_PG)
  correct = np.asarray(b.rewards_PGK[..., 0]) > 0
  lengths = np.asarray(b.mask_PGT).sum(-1)
  out = _prepare(T.kimi_length_rewards(coef=0.5), b)
  np.testing.assert_allclose(
    out.rewards_PG, r + 0.5 * np.asarray(A.kimi_length_reward(lengths, correct))
  )
  out = _prepare(T.l_grpo_rewards(), b)  # L_max = T = 6
  bonus = A.l_grpo_bonus(lengths, correct, max_length=6)
  np.testing.assert_allclose(out.rewards_PG, r + np.asarray(bonus))
  out = _prepare(T.grpo_lambda_rewards(fraction=0.5), b)
  top = np.asarray(A.grpo_lambda_mask(correct, fraction=0.5))
  kimi = np.asarray(A.kimi_length_reward(lengths, correct))
  np.testing.assert_allclose(
    out.rewards_PG, r + np.where(top[:, None], kimi, 0)
  )
  assert top.sum() == 2


# ---------------------------------------------------------------------------
# PF-PPO resampling.
# ---------------------------------------------------------------------------


def test_pf_ppo_group_draws_follow_weights_as_multiplicities():
  b = _prepare(T.group_advantages(A.grpo), _batch(9))
  b = b._replace(
    rewards_PG=np.array(
      [[1, 0, 0, 0], [0.5, 2, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], np.float32
    ),
    sample_mask_PG=None,
  )
  out = _prepare(T.pf_ppo_resample(mode="pow", k=1.0), b, key=3)
  counts = np.asarray(out.sample_mask_PG)
  # G draws per prompt; zero-weight samples are never drawn; the rows (and
  # so their alignment with the update's sequences) do not move.
  np.testing.assert_array_equal(counts.sum(-1)[:3], [4, 4, 4])
  np.testing.assert_array_equal(counts[0], [4, 0, 0, 0])
  assert counts[1, 2:].sum() == 0
  np.testing.assert_array_equal(out.tokens_PGT, b.tokens_PGT)
  np.testing.assert_array_equal(out.rewards_PG, b.rewards_PG)


def test_pf_ppo_multiplicities_equal_the_resampled_batch_under_token_mean():
  # Hand case: one prompt, G = 2, sample 0 drawn twice, sample 1 never.
  counts = _variants.draw_counts(jnp.array([[0, 0]]), "group")
  np.testing.assert_array_equal(counts, [[2.0, 0.0]])
  b = _batch(12)
  logp = jnp.asarray(b.old_logp_PGT) + 0.1
  algo = rljax.Algorithm(
    rljax.objectives.policy(rljax.losses.reinforce), aggregate.token_mean
  )
  b = b._replace(advantages_PGT=jnp.ones(b.shape), sample_mask_PG=None)
  idx = jnp.array([[0, 0, 1, 3]] * 4)
  weighted = b._replace(sample_mask_PG=_variants.draw_counts(idx, "group"))
  take = lambda x: jnp.take_along_axis(  # noqa: E731
    jnp.asarray(x), idx.reshape(idx.shape + (1,) * (jnp.ndim(x) - 2)), axis=1
  )
  duplicated = b._replace(
    mask_PGT=take(b.mask_PGT),
    advantages_PGT=take(b.advantages_PGT),
    old_logp_PGT=take(b.old_logp_PGT),
  )

  def value(batch, lp):
    return algo.loss(lp, batch, algo.init())[0].value

  np.testing.assert_allclose(
    value(weighted, logp), value(duplicated, take(logp)), rtol=1e-6
  )


def test_pf_ppo_batch_draws_and_needs_a_key():
  b = _batch(10)._replace(sample_mask_PG=None)
  out = _prepare(T.pf_ppo_resample(mode="max_min", axis="batch"), b)
  counts = np.asarray(out.sample_mask_PG)
  assert counts.sum() == 16
  r = np.asarray(b.rewards_PG)
  assert set(r[counts > 0].ravel()) <= {r.max(), r.min()}
  algo = rljax.Algorithm(T.pf_ppo_resample(), aggregate.token_mean)
  with pytest.raises(ValueError, match="PRNG key"):
    algo.prepare(b, algo.init())


# ---------------------------------------------------------------------------
# Errors, dtype, presets.
# ---------------------------------------------------------------------------


def test_stages_raise_clear_errors():
  b = random_batch(0)
  with pytest.raises(ValueError, match="answer_ids_PG"):
    _prepare(T.copo_advantages(), b)
  with pytest.raises(ValueError, match="advantages_PGT"):
    _prepare(T.aspo_shaping(feature=1), b)
  with pytest.raises(ValueError, match="end with _PG"):
    _prepare(T.hdpo_advantages("calls"), b)
  with pytest.raises(ValueError, match="out of range"):
    _prepare(T.hdpo_advantages(5), b)
  with pytest.raises(ValueError, match="old_logp_PGT"):
    _prepare(
      rljax.chain(T.group_advantages(A.grpo), T.seed_grpo_advantages()),
      _batch(0)._replace(old_logp_PGT=None),
    )
  with pytest.raises(ValueError, match="weighting must be one of"):
    T.seed_grpo_advantages(weighting="tokens")
  with pytest.raises(ValueError, match="axis must be one of"):
    T.pf_ppo_resample(axis="prompt")


def test_bfloat16_batch_gives_finite_float32():
  b = _batch(11, dtype=jnp.bfloat16)
  for name in ("copo", "seed_grpo", "hdpo", "grpo_lambda"):
    algo = presets.PRESETS[name]()
    pb = jax.jit(lambda b, a=algo: a.prepare(b, a.init())[0])(b)
    assert pb.advantages_PGT.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(pb.advantages_PGT)))


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_presets_give_finite_loss_and_gradient(name):
  algo = presets.PRESETS[name]()
  assert presets.PRESETS[name].__name__ == name
  b = _batch(12)
  state = algo.init()
  pb, state = jax.jit(lambda b, s: algo.prepare(b, s, key=jax.random.key(0)))(
    b, state
  )
  logp = np.asarray(pb.old_logp_PGT) + 0.1
  loss, grad = jax.jit(
    jax.value_and_grad(lambda lp: algo.loss(lp, pb, state)[0].value)
  )(logp)
  assert np.isfinite(loss)
  assert np.all(np.isfinite(np.asarray(grad)))
