"""The composition core: Batch validation, chain, Mean, Algorithm.loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import testing


def _algo(*transforms, aggregate=rljax.aggregate.token_mean):
  return rljax.Algorithm(rljax.chain(*transforms), aggregate)


def test_mean_value_and_no_normaliser_convention():
  assert float(rljax.Mean(jnp.float32(6.0), jnp.float32(3.0)).value) == 2.0
  # A zero denominator means "constant normaliser already applied".
  assert float(rljax.Mean(jnp.float32(6.0), jnp.float32(0.0)).value) == 6.0


def test_chain_threads_batch_and_state_in_order():
  def add(k):
    return rljax.Transform(
      init=lambda: jnp.int32(k),
      prepare=lambda b, s: (
        b._replace(rewards_PG=b.rewards_PG * 10 + s),
        s + 1,
      ),
      apply=lambda t, b, s: t,
    )

  chained = rljax.chain(add(1), add(2))
  batch = rljax.Batch(mask_PGT=np.ones((1, 2, 3)), rewards_PG=np.zeros((1, 2)))
  out, state = chained.prepare(batch, chained.init())
  np.testing.assert_array_equal(out.rewards_PG, [[12, 12]])  # (0*10+1)*10+2
  assert tuple(int(s) for s in state) == (2, 3)


def test_chain_rejects_non_transforms_and_foreign_state():
  with pytest.raises(TypeError, match="chain argument 1 is a function"):
    rljax.chain(rljax.transforms.dynamic_sampling(), rljax.aggregate.token_mean)
  chained = rljax.chain(rljax.transforms.dynamic_sampling())
  batch = testing.random_batch(0)
  with pytest.raises(ValueError, match="state does not belong to this chain"):
    chained.prepare(batch, ((), ()))


def test_batch_layout_errors_name_the_field():
  batch = testing.random_batch(0)
  with pytest.raises(ValueError, match=r"Batch.rewards_PG has shape \(4, 3\)"):
    rljax.algorithms.grpo().prepare(
      batch._replace(rewards_PG=np.zeros((4, 3))), ()
    )
  with pytest.raises(ValueError, match=r"Batch.mask_PGT must have rank 3"):
    rljax.algorithms.grpo().prepare(
      batch._replace(mask_PGT=np.ones((4, 6))), ()
    )


def test_missing_field_names_the_field_and_the_stage():
  batch = testing.random_batch(0)._replace(old_values_PGT=None)
  algo = rljax.algorithms.ppo()
  with pytest.raises(
    ValueError,
    match=r"gae_advantages needs Batch field\(s\) \['old_values_PGT'\]",
  ):
    algo.prepare(batch, algo.init())


def test_logp_shape_mismatch_is_caught_before_xla():
  algo = rljax.algorithms.grpo()
  batch, state = algo.prepare(testing.random_batch(0), algo.init())
  with pytest.raises(ValueError, match="shapes must match: logp_PGT"):
    algo.loss(np.zeros((4, 4, 5)), batch, state)


def test_on_policy_without_old_logp_is_reinforce():
  """With no old log-probs the ratio is exactly 1 in value and the PPO
  gradient is the REINFORCE gradient -A / N per valid token."""
  batch = testing.random_batch(4)._replace(old_logp_PGT=None)
  algo = rljax.algorithms.bnpo()
  batch, state = algo.prepare(batch, algo.init())
  logp = np.asarray(testing.random_batch(4).old_logp_PGT)
  grad = jax.jit(jax.grad(lambda l: algo.loss(l, batch, state)[0].value))(logp)
  mask = np.asarray(batch.mask_PGT)
  expected = -np.asarray(batch.advantages_PGT) * mask / mask.sum()
  np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)
  _, metrics = algo.loss(logp, batch, state)
  np.testing.assert_allclose(metrics["ratio_mean"].value, 1.0)


def test_sample_mask_removes_samples_from_loss_and_normaliser():
  batch = testing.random_batch(5)
  algo = _algo(
    rljax.transforms.group_advantages(rljax.advantages.dr_grpo),
    rljax.objectives.policy(rljax.losses.reinforce),
  )
  samples = np.ones((4, 4), np.float32)
  samples[0, 1:] = 0.0
  b, s = algo.prepare(batch._replace(sample_mask_PG=samples), algo.init())
  logp = testing.perturbed_logp(batch)
  loss, _ = algo.loss(logp, b, s)
  mask = np.asarray(batch.mask_PGT) * samples[..., None]
  np.testing.assert_allclose(loss.den, mask.sum())
  grad = jax.grad(lambda l: algo.loss(l, b, s)[0].value)(logp)
  assert np.all(grad[0, 1:] == 0)


def test_chain_merges_rescore_requests():
  hot = rljax.Rescore("hot_PGT", temperature=2.0)
  a = rljax.transforms.group_advantages(rljax.advantages.grpo)._replace(
    rescores=(hot,)
  )
  b = a._replace(rescores=(hot, rljax.Rescore("ref_PGT", model="reference")))
  algo = rljax.Algorithm(rljax.chain(a, b), rljax.aggregate.token_mean)
  assert algo.rescores == (hot, rljax.Rescore("ref_PGT", model="reference"))
  clash = a._replace(rescores=(rljax.Rescore("hot_PGT", temperature=0.5),))
  with pytest.raises(ValueError, match="different passes"):
    rljax.chain(a, clash)
  with pytest.raises(ValueError, match="must end with _PGT"):
    rljax.chain(a._replace(rescores=(rljax.Rescore("hot"),)))
  with pytest.raises(ValueError, match="Rescore.model"):
    rljax.chain(a._replace(rescores=(rljax.Rescore("x_PGT", model="critic"),)))
  with pytest.raises(ValueError, match="must end with _P "):
    rljax.chain(a._replace(rescores=(rljax.Rescore("p_PGT", span="prompt"),)))
  with pytest.raises(ValueError, match="Rescore.span"):
    rljax.chain(a._replace(rescores=(rljax.Rescore("x_PGT", span="all"),)))
  with pytest.raises(ValueError, match="temperature"):
    rljax.chain(a._replace(rescores=(rljax.Rescore("x_PGT", temperature=0),)))


def test_chain_multiplies_step_scales():
  def scaled(factor):
    return rljax.Transform(
      lambda: jnp.float32(factor),
      lambda batch, state: (batch, state),
      lambda terms, batch, state: terms,
      step_scale=lambda state: state,
    )

  plain = rljax.transforms.group_advantages(rljax.advantages.grpo)
  algo = rljax.Algorithm(
    rljax.chain(scaled(0.5), plain, scaled(3.0)), rljax.aggregate.token_mean
  )
  assert float(algo.step_scale(algo.init())) == 1.5
  none = rljax.Algorithm(plain, rljax.aggregate.token_mean)
  assert none.transform.step_scale is None
  assert float(none.step_scale(none.init())) == 1.0
  with pytest.raises(ValueError, match="model must be 'policy'"):
    rljax.chain(
      plain._replace(
        rescores=(rljax.Rescore("g_PG", span="gradient", model="teacher"),)
      )
    )
