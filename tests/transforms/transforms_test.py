"""Batch stages: what each writes into the Batch, with hand-worked numbers."""

import jax
import numpy as np
import pytest

import rljax
from rljax import testing


def _prepare(*transforms, batch):
  chained = rljax.chain(*transforms)
  return jax.jit(chained.prepare)(batch, chained.init())


def _tiny_batch():
  # One prompt, two samples of 3 tokens; sample 0 has 2 valid tokens.
  return rljax.Batch(
    mask_PGT=np.array([[[1, 1, 0], [1, 1, 1]]], np.float32),
    rewards_PG=np.array([[1.0, 0.0]], np.float32),
    old_logp_PGT=np.array(
      [[[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]]], np.float32
    ),
    ref_logp_PGT=np.array(
      [[[-1.5, -2.0, 0.0], [-0.5, -1.0, -0.5]]], np.float32
    ),
  )


def test_group_advantages_broadcast_over_valid_tokens():
  batch, _ = _prepare(
    rljax.transforms.group_advantages(rljax.advantages.dr_grpo),
    batch=_tiny_batch(),
  )
  # dr_grpo: R - mean = [0.5, -0.5], zero on padding.
  np.testing.assert_allclose(
    batch.advantages_PGT, [[[0.5, 0.5, 0.0], [-0.5, -0.5, -0.5]]]
  )


def test_kl_in_reward_enters_the_sequence_reward():
  batch, _ = _prepare(
    rljax.transforms.kl_in_reward(rljax.losses.kl_k1, coef=0.1),
    rljax.transforms.group_advantages(rljax.advantages.dr_grpo),
    batch=_tiny_batch(),
  )
  # k1 = old - ref = [0.5, 0] and [0, 0.5, 0]: each sum is 0.5, so
  # R = [1 - 0.05, 0 - 0.05]; the advantages are unchanged [0.5, -0.5].
  np.testing.assert_allclose(
    batch.token_rewards_PGT, [[[-0.05, 0, 0], [0, -0.05, 0]]], atol=1e-7
  )
  np.testing.assert_allclose(
    rljax.transforms.sequence_rewards(batch), [[0.95, -0.05]], rtol=1e-6
  )


def test_adaptive_kl_in_reward_updates_the_coefficient():
  chained = rljax.chain(
    rljax.transforms.adaptive_kl_in_reward(
      rljax.losses.kl_k1, init_coef=0.1, target=0.1, horizon=10
    )
  )
  _, (state,) = chained.prepare(_tiny_batch(), chained.init())
  # Measured KL = mean over sequences of token means = (0.25 + 1/6) / 2;
  # KL/target - 1 = 3.17 clips to 0.2; n_steps = P*G = 2:
  # 0.1 * (1 + 0.2 * 2 / 10) = 0.104.
  np.testing.assert_allclose(state.coef, 0.104, rtol=1e-6)


def test_dynamic_sampling_zeroes_constant_groups_and_reports_kept():
  batch = testing.random_batch(0)
  rewards = np.array([[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1]])
  out, _ = _prepare(
    rljax.transforms.dynamic_sampling(),
    batch=batch._replace(rewards_PG=rewards.astype(np.float32)),
  )
  np.testing.assert_array_equal(rljax.transforms.kept_groups(out), [0, 1, 0, 1])
  np.testing.assert_array_equal(out.samples()[0], [0, 0, 0, 0])


def test_overlong_penalty_is_counted_in_tokens():
  batch = rljax.Batch(
    mask_PGT=(np.arange(8) < np.array([[4, 6, 8]])[..., None]).astype(
      np.float32
    ),
    rewards_PG=np.ones((1, 3), np.float32),
  )
  out, _ = _prepare(
    rljax.transforms.overlong_penalty(max_length=8, buffer=4), batch=batch
  )
  # Lengths 4, 6, 8 with the penalty ramp from 4 to 8: 0, -0.5, -1.
  np.testing.assert_allclose(out.rewards_PG, [[1.0, 0.5, 0.0]])


def test_importance_weights_multiply_into_policy_weights():
  batch = testing.random_batch(1)
  out, _ = _prepare(
    rljax.transforms.token_tis(threshold=2.0),
    rljax.transforms.icepop(low=0.5, high=5.0),
    batch=batch,
  )
  lr = np.asarray(batch.old_logp_PGT) - np.asarray(batch.rollout_logp_PGT)
  rho = np.exp(lr)
  expected = np.minimum(rho, 2.0) * rho * ((rho >= 0.5) & (rho <= 5.0))
  expected *= np.asarray(batch.mask_PGT)
  np.testing.assert_allclose(out.policy_weights_PGT, expected, rtol=1e-5)


def test_importance_weights_scale_the_policy_term_only():
  batch = testing.random_batch(2)
  algo = rljax.Algorithm(
    rljax.chain(
      rljax.transforms.group_advantages(rljax.advantages.grpo),
      rljax.transforms.token_tis(threshold=1.5),
      rljax.objectives.policy(rljax.losses.reinforce),
      rljax.objectives.kl_penalty(rljax.losses.kl_k2, coef=0.5),
    ),
    rljax.aggregate.token_sum,
  )
  b, s = algo.prepare(batch, algo.init())
  logp = testing.perturbed_logp(batch)
  grad = jax.grad(lambda l: algo.loss(l, b, s)[0].value)(logp)
  mask = np.asarray(batch.mask_PGT)
  x = logp - np.asarray(batch.ref_logp_PGT)
  # d/dl of -w A l + 0.5 * x^2 / 2, with w the detached TIS weight.
  expected = (
    -np.asarray(b.policy_weights_PGT) * np.asarray(b.advantages_PGT) + 0.5 * x
  ) * mask
  np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-6)


def test_mask_truncated_excludes_truncated_completions():
  batch = testing.random_batch(3)
  out, _ = _prepare(rljax.transforms.mask_truncated(), batch=batch)
  truncated = np.asarray(batch.truncated_PG)
  assert truncated.any() and (~truncated).any()
  assert np.all(np.asarray(out.mask_PGT)[truncated] == 0)
  np.testing.assert_array_equal(
    np.asarray(out.mask_PGT)[~truncated], np.asarray(batch.mask_PGT)[~truncated]
  )


def test_gae_writes_whitened_advantages_and_returns():
  batch = testing.random_batch(4)
  out, _ = _prepare(
    rljax.transforms.gae_advantages(gamma=1.0, lam=1.0), batch=batch
  )
  mask = np.asarray(batch.mask_PGT, bool)
  adv = np.asarray(out.advantages_PGT)[mask]
  np.testing.assert_allclose(
    [adv.mean(), adv.std(ddof=1)], [0.0, 1.0], atol=1e-3
  )
  # gamma = lam = 1: the return at every valid token is the outcome reward.
  returns = np.broadcast_to(np.asarray(batch.rewards_PG)[..., None], mask.shape)
  np.testing.assert_allclose(
    np.asarray(out.returns_PGT)[mask], returns[mask], atol=1e-6
  )


def test_stages_that_need_a_field_say_which():
  batch = testing.random_batch(0)._replace(baseline_rewards_P=None)
  with pytest.raises(
    ValueError,
    match=r"remax_advantages needs Batch field\(s\) \['baseline_rewards_P'\]",
  ):
    _prepare(rljax.transforms.remax_advantages(), batch=batch)
  with pytest.raises(ValueError, match="rollout_logp_PGT"):
    _prepare(
      rljax.transforms.token_tis(), batch=batch._replace(rollout_logp_PGT=None)
    )
