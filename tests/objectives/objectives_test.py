"""Loss stages: penalties, masks, randomised objectives, the value loss."""

import jax
import numpy as np
import pytest

import rljax
from rljax import testing


def _prepared(algo, seed=0):
  batch = testing.random_batch(seed)
  batch, state = algo.prepare(batch, algo.init())
  return batch, state, testing.perturbed_logp(batch)


def _grad(algo, batch, state, logp, **kwargs):
  fn = lambda l: algo.loss(l, batch, state, **kwargs)[0].value  # noqa: E731
  return jax.jit(jax.grad(fn))(logp)


def test_kl_penalty_value_and_gradient_on_k3():
  algo = rljax.Algorithm(
    rljax.chain(rljax.objectives.kl_penalty(rljax.losses.kl_k3, coef=0.1)),
    rljax.aggregate.token_sum,
  )
  batch, state, logp = _prepared(algo)
  x = logp.astype(np.float64) - np.asarray(batch.ref_logp_PGT)
  mask = np.asarray(batch.mask_PGT)
  loss, metrics = algo.loss(logp, batch, state)
  k3 = np.exp(-x) - 1 + x
  np.testing.assert_allclose(loss.value, 0.1 * (k3 * mask).sum(), rtol=1e-5)
  np.testing.assert_allclose(
    metrics["kl_ref"].value, (k3 * mask).sum() / mask.sum(), rtol=1e-5
  )
  # d k3 / dx = 1 - e^{-x}
  expected = 0.1 * (1 - np.exp(-x)) * mask
  np.testing.assert_allclose(
    _grad(algo, batch, state, logp), expected, rtol=1e-4, atol=1e-7
  )


def test_entropy_bonus_lowers_the_loss_by_coef_times_mean_entropy():
  algo = rljax.Algorithm(
    rljax.chain(rljax.objectives.entropy_bonus(coef=0.01)),
    rljax.aggregate.token_mean,
  )
  batch, state, logp = _prepared(algo)
  entropy = np.asarray(batch.old_entropy_PGT)
  mask = np.asarray(batch.mask_PGT)
  loss, _ = algo.loss(logp, batch, state, entropy_PGT=entropy)
  np.testing.assert_allclose(
    loss.value, -0.01 * (entropy * mask).sum() / mask.sum(), rtol=1e-5
  )
  with pytest.raises(ValueError, match="pass entropy_PGT= to Algorithm.loss"):
    algo.loss(logp, batch, state)


def test_adaptive_entropy_bonus_follows_skywork_rule():
  t = rljax.objectives.adaptive_entropy_bonus(
    init_coef=0.01, target=0.5, delta=0.005
  )
  batch = testing.random_batch(0)
  low = batch._replace(old_entropy_PGT=np.full(batch.shape, 0.2, np.float32))
  high = batch._replace(old_entropy_PGT=np.full(batch.shape, 0.9, np.float32))
  _, s1 = t.prepare(low, t.init())  # H <= target: raise c, bonus on
  np.testing.assert_allclose([s1.coef, s1.active], [0.015, 1.0], rtol=1e-6)
  _, s2 = t.prepare(high, s1)  # H > target: lower c, bonus off
  np.testing.assert_allclose([s2.coef, s2.active], [0.010, 0.0], rtol=1e-6)


def test_adaptive_kl_penalty_uses_the_updated_coefficient():
  algo = rljax.Algorithm(
    rljax.chain(
      rljax.objectives.adaptive_kl_penalty(
        rljax.losses.kl_k1, init_coef=0.1, target=1e-6, horizon=160
      )
    ),
    rljax.aggregate.token_sum,
  )
  batch, (state,), logp = _prepared(algo)
  # KL far above target: the error clips at +0.2; n_steps = 16 samples.
  np.testing.assert_allclose(state.coef, 0.1 * (1 + 0.2 * 16 / 160), rtol=1e-6)
  _, metrics = algo.loss(logp, batch, (state,))
  np.testing.assert_allclose(metrics["kl_coef"].value, state.coef)


def test_top_entropy_mask_trains_only_high_entropy_tokens_but_keeps_kl():
  algo = rljax.Algorithm(
    rljax.chain(
      rljax.transforms.group_advantages(rljax.advantages.grpo),
      rljax.objectives.policy(rljax.losses.reinforce),
      rljax.objectives.top_entropy_mask(keep_fraction=0.2),
      rljax.objectives.kl_penalty(rljax.losses.kl_k2, coef=1.0),
    ),
    rljax.aggregate.token_sum,
  )
  batch, state, logp = _prepared(algo)
  entropy = np.asarray(batch.old_entropy_PGT)
  mask = np.asarray(batch.mask_PGT).astype(bool)
  threshold = np.quantile(entropy[mask], 0.8)
  keep = (entropy >= threshold) & mask
  grad = _grad(algo, batch, state, logp, entropy_PGT=entropy)
  x = logp - np.asarray(batch.ref_logp_PGT)
  expected = (-np.asarray(batch.advantages_PGT) * keep + x) * mask
  np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-6)


def test_off_policy_mask_drops_drifted_negative_sequences():
  algo = rljax.Algorithm(
    rljax.chain(
      rljax.transforms.group_advantages(rljax.advantages.dr_grpo),
      rljax.objectives.policy(rljax.losses.reinforce),
      rljax.objectives.off_policy_mask(delta=0.05),
    ),
    rljax.aggregate.token_sum,
  )
  batch, state, logp = _prepared(algo, seed=6)
  mask = np.asarray(batch.mask_PGT)
  adv = np.asarray(batch.advantages_PGT)
  drift = ((np.asarray(batch.rollout_logp_PGT) - logp) * mask).sum(
    -1
  ) / mask.sum(-1)
  seq_adv = (adv * mask).sum(-1) / mask.sum(-1)
  keep = (seq_adv >= 0) | (drift <= 0.05)
  assert (~keep).any() and keep.any()
  grad = _grad(algo, batch, state, logp)
  np.testing.assert_allclose(
    grad, -adv * keep[..., None] * mask, rtol=1e-5, atol=1e-7
  )


def test_randomized_policy_needs_a_key():
  algo = rljax.Algorithm(
    rljax.chain(
      rljax.transforms.group_advantages(rljax.advantages.grpo),
      rljax.objectives.randomized_policy(rljax.losses.clip_cov, ratio=0.1),
    ),
    rljax.aggregate.token_mean,
  )
  batch, state, logp = _prepared(algo)
  with pytest.raises(ValueError, match="pass key= to Algorithm.loss"):
    algo.loss(logp, batch, state)
  a = algo.loss(logp, batch, state, key=jax.random.key(0))[0].value
  b = algo.loss(logp, batch, state, key=jax.random.key(0))[0].value
  assert float(a) == float(b)


def test_value_loss_hand_numbers():
  batch = rljax.Batch(
    mask_PGT=np.ones((1, 1, 2), np.float32),
    old_values_PGT=np.array([[[0.0, 1.0]]], np.float32),
    returns_PGT=np.array([[[1.0, 1.0]]], np.float32),
  )
  values = np.array([[[0.5, 2.0]]], np.float32)
  loss, metrics = rljax.objectives.value_loss(values, batch, eps=0.2)
  # token 0: max((0.5-1)^2, (0.2-1)^2) = 0.64; token 1: max(1, 0.04) = 1.
  np.testing.assert_allclose(loss.value, 0.5 * (0.64 + 1.0) / 2, rtol=1e-6)
  np.testing.assert_allclose(metrics["value_clip_frac"].value, 0.5)
  grad = jax.grad(lambda v: rljax.objectives.value_loss(v, batch)[0].value)(
    values
  )
  # token 0 takes the clipped branch (no gradient), token 1: (2 - 1) / 2.
  np.testing.assert_allclose(grad, [[[0.0, 0.5]]], atol=1e-7)


def test_bad_coefficients_fail_early():
  with pytest.raises(ValueError, match="coef must be >= 0"):
    rljax.objectives.kl_penalty(rljax.losses.kl_k3, coef=-1.0)
  with pytest.raises(ValueError, match="init_coef must be in"):
    rljax.objectives.adaptive_entropy_bonus(init_coef=2.0)
