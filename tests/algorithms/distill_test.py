"""On-policy distillation: `transforms.opd_advantages`, presets `opd` and
`opd_grpo` against a numpy reference (advantages, loss, gradient), zero at
teacher == student, a hand-worked case, composition and errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import algorithms
from rljax import testing
from rljax import transforms

# --------------------------------------------------------------------------
# numpy reference


def _np_opd(teacher, old, mask, coef=1.0, gamma=0.0):
  """coef * sum_{k >= t, valid} gamma^(#valid steps) (teacher - old)_k."""
  teacher, old = np.asarray(teacher, np.float64), np.asarray(old, np.float64)
  valid = np.asarray(mask) > 0
  r = np.where(valid, teacher - old, 0.0)
  adv = np.zeros_like(r)
  for idx in np.ndindex(r.shape[:-1]):
    running = 0.0
    for t in reversed(range(r.shape[-1])):
      if valid[idx + (t,)]:
        running = r[idx + (t,)] + gamma * running
        adv[idx + (t,)] = running
  return coef * adv


def _np_grpo(rewards, eps=1e-6):
  r = np.asarray(rewards, np.float64)
  mean = r.mean(-1, keepdims=True)
  std = r.std(-1, ddof=1, keepdims=True)
  return (r - mean) / (std + eps)


def _np_ratio_pg(logp, old, adv, mask):
  """token mean of -A r and its gradient w.r.t. logp."""
  m = np.asarray(mask, np.float64)
  r = np.exp(np.asarray(logp, np.float64) - np.asarray(old, np.float64))
  loss = (-adv * r * m).sum() / m.sum()
  return loss, -adv * r * m / m.sum()


def _batch(seed=0, samples=4):
  return testing.random_batch(seed, samples=samples)


def _loss_and_grad(algo, batch, logp):
  batch, state = jax.jit(lambda b: algo.prepare(b, algo.init()))(batch)

  def loss(lp):
    value, metrics = algo.loss(lp, batch, state)
    return value.value, metrics

  (value, metrics), grad = jax.jit(jax.value_and_grad(loss, has_aux=True))(logp)
  return batch, value, rljax.finalize(metrics), grad


# --------------------------------------------------------------------------
# advantages


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_token_advantages_match_numpy(gamma):
  batch = _batch(0)
  mask = np.asarray(batch.mask_PGT).copy()
  mask[0, 0, 1] = 0.0  # a hole: masked tokens neither add nor discount
  got = jax.jit(
    functools.partial(transforms.opd_token_advantages, coef=0.7, gamma=gamma)
  )(batch.teacher_logp_PGT, batch.old_logp_PGT, mask)
  want = _np_opd(
    batch.teacher_logp_PGT, batch.old_logp_PGT, mask, coef=0.7, gamma=gamma
  )
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_stage_starts_from_zero_or_adds_to_earlier_advantages():
  batch = _batch(1)
  alone, _ = transforms.opd_advantages(0.5).prepare(batch, ())
  opd = _np_opd(batch.teacher_logp_PGT, batch.old_logp_PGT, batch.mask_PGT, 0.5)
  np.testing.assert_allclose(alone.advantages_PGT, opd, rtol=1e-5, atol=1e-6)

  chain = rljax.chain(
    transforms.group_advantages(rljax.advantages.grpo),
    transforms.opd_advantages(0.5),
  )
  both, _ = chain.prepare(batch, chain.init())
  grpo = _np_grpo(batch.rewards_PG)[..., None] * np.asarray(batch.mask_PGT)
  np.testing.assert_allclose(
    both.advantages_PGT, grpo + opd, rtol=1e-5, atol=1e-5
  )


# --------------------------------------------------------------------------
# the opd preset


def test_teacher_equal_to_student_gives_exactly_zero_loss_and_gradient():
  batch = _batch(2)
  batch = batch._replace(teacher_logp_PGT=batch.old_logp_PGT)
  logp = testing.perturbed_logp(batch)  # ratios away from 1
  for algo in (algorithms.opd(), algorithms.opd(eps=0.2)):
    _, value, metrics, grad = _loss_and_grad(algo, batch, logp)
    assert float(value) == 0.0
    assert np.all(np.asarray(grad) == 0.0)
    assert metrics["opd_reverse_kl"] == 0.0


def test_opd_loss_and_gradient_match_numpy():
  batch = _batch(3)
  logp = testing.perturbed_logp(batch)
  _, value, metrics, grad = _loss_and_grad(
    algorithms.opd(coef=0.8, gamma=0.5), batch, logp
  )
  mask = np.asarray(batch.mask_PGT)
  adv = _np_opd(batch.teacher_logp_PGT, batch.old_logp_PGT, mask, 0.8, 0.5)
  want, want_grad = _np_ratio_pg(logp, batch.old_logp_PGT, adv, mask)
  np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
  gap = np.asarray(batch.old_logp_PGT, np.float64) - batch.teacher_logp_PGT
  np.testing.assert_allclose(
    metrics["opd_reverse_kl"], (gap * mask).sum() / mask.sum(), rtol=1e-5
  )


def test_hand_worked_case():
  # One sequence of 3 tokens, the last one padding (its values are junk).
  # teacher - old = [-0.5 - (-1.0), -2.0 - (-1.5)] = [0.5, -0.5] = A (coef 1)
  # logp - old = [0, ln 2] -> r = [1, 2]
  # loss = token mean of -A r = (-(0.5)(1) - (-0.5)(2)) / 2 = 0.5 / 2 = 0.25
  # d loss / d logp_t = -A_t r_t / 2 = [-0.25, 0.5], 0 on the padding
  # gamma = 1: A = [0.5 + (-0.5), -0.5] = [0, -0.5]
  #   loss = (0 + 1) / 2 = 0.5, gradient [0, 0.5]
  old = np.array([[[-1.0, -1.5, 7.0]]], np.float32)
  batch = rljax.Batch(
    mask_PGT=np.array([[[1.0, 1.0, 0.0]]], np.float32),
    old_logp_PGT=old,
    teacher_logp_PGT=np.array([[[-0.5, -2.0, np.nan]]], np.float32),
  )
  logp = old + np.array([0.0, np.log(2.0), 3.0], np.float32)
  _, value, _, grad = _loss_and_grad(algorithms.opd(), batch, logp)
  np.testing.assert_allclose(value, 0.25, rtol=1e-6)
  np.testing.assert_allclose(grad, [[[-0.25, 0.5, 0.0]]], rtol=1e-6)
  _, value, _, grad = _loss_and_grad(algorithms.opd(gamma=1.0), batch, logp)
  np.testing.assert_allclose(value, 0.5, rtol=1e-6)
  np.testing.assert_allclose(grad, [[[0.0, 0.5, 0.0]]], atol=1e-7)


def test_clipped_variant_equals_unclipped_on_the_first_step():
  """At logp == old (one optimizer step per batch) r = 1: PPO's clip and
  the plain importance-weighted loss give the same value and gradient."""
  batch = _batch(4)
  logp = np.asarray(batch.old_logp_PGT)
  _, v1, _, g1 = _loss_and_grad(algorithms.opd(), batch, logp)
  _, v2, _, g2 = _loss_and_grad(algorithms.opd(eps=0.2), batch, logp)
  np.testing.assert_allclose(v1, v2, rtol=1e-6)
  np.testing.assert_allclose(g1, g2, rtol=1e-6)
  assert np.any(np.asarray(g1) != 0)


def test_opd_grpo_adds_the_teacher_term_to_grpo():
  batch = _batch(5)
  logp = testing.perturbed_logp(batch)
  prepared, value, _, grad = _loss_and_grad(
    algorithms.opd_grpo(coef=2.0, eps=10.0),
    batch,
    logp,  # no clip active
  )
  mask = np.asarray(batch.mask_PGT)
  adv = _np_grpo(batch.rewards_PG)[..., None] * mask + _np_opd(
    batch.teacher_logp_PGT, batch.old_logp_PGT, mask, coef=2.0
  )
  np.testing.assert_allclose(prepared.advantages_PGT, adv, atol=1e-5)
  want, want_grad = _np_ratio_pg(logp, batch.old_logp_PGT, adv, mask)
  np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)


def test_presets_are_registered():
  for name in ("opd", "opd_grpo"):
    assert algorithms.get(name).aggregate is rljax.aggregate.token_mean


def test_trainer_sees_that_opd_needs_the_teacher():
  from rljax.training import _build  # the probe the Trainer runs

  assert _build.needs_field(algorithms.opd(), "teacher_logp_PGT")
  assert _build.needs_field(algorithms.opd_grpo(), "teacher_logp_PGT")
  assert _build.needs_field(algorithms.opd(), "old_logp_PGT")


# --------------------------------------------------------------------------
# errors


def test_missing_fields_and_bad_settings_are_clear_errors():
  batch = _batch(6)
  stage = transforms.opd_advantages()
  with pytest.raises(
    ValueError, match=r"teacher_logp_PGT.*Trainer\(config, teacher=model\)"
  ):
    stage.prepare(batch._replace(teacher_logp_PGT=None), ())
  with pytest.raises(ValueError, match="old_logp_PGT"):
    stage.prepare(batch._replace(old_logp_PGT=None), ())
  with pytest.raises(ValueError, match="coef must be >= 0"):
    transforms.opd_advantages(-1.0)
  with pytest.raises(ValueError, match="gamma must be in"):
    algorithms.opd(gamma=1.5)
  with pytest.raises(ValueError, match="eps must be > 0"):
    algorithms.opd(eps=0.0)
  with pytest.raises(ValueError, match="shapes must match"):
    transforms.opd_token_advantages(
      np.zeros((2, 3)), np.zeros((2, 4)), np.ones((2, 3))
    )
