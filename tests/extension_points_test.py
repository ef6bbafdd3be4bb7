"""The algorithm layer's extension points: side data in the Batch, a PRNG key
in prepare, whole-minibatch statistics (measure/observe), per-prompt tables."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import testing
from rljax.training import _build


def _recorder(field):
  """A stage whose state is the last value it saw of a [P, G] statistic."""

  def prepare(batch, state):
    return batch, batch.get(field, by="recorder")

  return rljax.Transform(
    init=lambda: jnp.zeros((4, 4)),
    prepare=prepare,
    apply=lambda terms, batch, state: terms,
  )


def test_extra_round_trips_and_names_its_layout():
  batch = testing.random_batch(0)
  with_flag = batch.with_extra(
    flag_PG=np.ones((4, 4)), bound_PGT=batch.mask_PGT
  )
  assert set(with_flag.extra) == {"flag_PG", "bound_PGT"}
  algo = rljax.Algorithm(_recorder("flag_PG"), rljax.aggregate.token_mean)
  _, state = jax.jit(algo.prepare)(with_flag, algo.init())
  np.testing.assert_array_equal(state, np.ones((4, 4)))
  with pytest.raises(ValueError, match=r"must end with its layout _P, _PG"):
    batch.with_extra(flag=np.ones((4, 4)))
  with pytest.raises(ValueError, match=r"Batch.extra\['flag_PG'\].*\(4, 4\)"):
    batch.with_extra(flag_PG=np.ones((4, 3)))
  with pytest.raises(
    ValueError, match=r"recorder needs Batch.extra\['flag_PG'"
  ):
    algo.prepare(batch, algo.init())


def test_extra_is_sliced_with_the_batch():
  batch = testing.random_batch(0).with_extra(
    rows_P=np.arange(4.0),
    rows_PGT=np.arange(4.0)[:, None, None] * np.ones((4, 6)),
  )
  half = jax.tree.map(lambda x: x[2:], batch)
  np.testing.assert_array_equal(half.extra["rows_P"], [2.0, 3.0])
  np.testing.assert_array_equal(half.extra["rows_PGT"][:, 0, 0], [2.0, 3.0])
  rljax._src.base.check_batch(half)  # consistent after slicing


def _draw(by):
  def prepare(batch, state):
    del state
    return batch, jax.random.uniform(batch.require_key(by=by))

  return rljax.Transform(lambda: jnp.zeros(()), prepare, lambda t, b, s: t)


def test_prepare_key_differs_per_stage_and_leaves_with_prepare():
  algo = rljax.Algorithm(
    rljax.chain(_draw("a"), _draw("b")), rljax.aggregate.token_mean
  )
  batch = testing.random_batch(0)
  out, (a, b) = algo.prepare(batch, algo.init(), key=jax.random.key(3))
  assert out.key is None
  assert float(a) != float(b)
  again = algo.prepare(batch, algo.init(), key=jax.random.key(3))[1]
  assert float(again[0]) == float(a)  # deterministic for a key
  with pytest.raises(ValueError, match=r"a is randomised.*key="):
    algo.prepare(batch, algo.init())


def _mean_ratio_stage():
  """measure: sum of ratios and token count; observe: store the mean; apply:
  a penalty of state * (ratio - 1) per token."""

  def measure(terms, batch, state):
    del state
    ratio = jnp.exp(terms.logp_PGT - batch.old_logp_PGT)
    return {"ratio": rljax.mean_metric(ratio, batch.loss_mask())}

  def apply(terms, batch, state):
    ratio = jnp.exp(terms.logp_PGT - batch.old_logp_PGT)
    return terms._replace(penalty_PGT=terms.penalty_PGT + state * (ratio - 1))

  return rljax.Transform(
    init=lambda: jnp.zeros(()),
    prepare=lambda batch, state: (batch, state),
    apply=apply,
    measure=measure,
    observe=lambda state, stats: stats["ratio"],
  )


def test_measure_of_halves_sums_to_the_whole_and_observe_stores_it():
  algo = rljax.Algorithm(
    rljax.chain(rljax.objectives.entropy_bonus(), _mean_ratio_stage()),
    rljax.aggregate.token_mean,
  )
  batch = testing.random_batch(1)
  logp = testing.perturbed_logp(batch)
  state = algo.init()
  measure = jax.jit(algo.measure)
  whole = measure(logp, batch, state)
  halves = [
    measure(logp[s], jax.tree.map(lambda x, s=s: x[s], batch), state)
    for s in (slice(0, 2), slice(2, 4))
  ]
  summed = jax.tree.map(jnp.add, *halves)
  assert whole[0] == {}  # the entropy bonus measures nothing
  np.testing.assert_allclose(  # float32 sums in another order: ~n*eps32 off
    summed[1]["ratio"].value, whole[1]["ratio"].value, rtol=1e-5, atol=1e-7
  )
  mask = np.asarray(batch.loss_mask())
  ratio = np.exp(np.float64(logp) - np.float64(batch.old_logp_PGT))
  want = (ratio * mask).sum() / mask.sum()
  new_state = algo.observe(state, whole)
  np.testing.assert_allclose(new_state[1], want, rtol=1e-5)
  assert new_state[0] == ()
  # Algorithms without measure/observe keep their state.
  plain = rljax.algorithms.grpo()
  assert plain.measure(logp, batch, plain.init()) == {}
  assert plain.observe(plain.init(), {}) == plain.init()


def test_needs_field_sees_stages_that_read_old_logp():
  for stage in (
    rljax.transforms.icepop(),
    rljax.transforms.token_tis(),
    rljax.transforms.sequence_tis(),
    rljax.transforms.sequence_masked_tis(),
    rljax.transforms.kl_in_reward(rljax.losses.kl_k1, coef=0.01),
    rljax.transforms.adaptive_kl_in_reward(rljax.losses.kl_k1),
    rljax.objectives.adaptive_kl_penalty(rljax.losses.kl_k3),
  ):
    algo = rljax.Algorithm(
      rljax.chain(stage, rljax.algorithms.grpo().transform),
      rljax.aggregate.token_mean,
    )
    assert _build.needs_field(algo, "old_logp_PGT")
  assert not _build.needs_field(rljax.algorithms.grpo(), "old_logp_PGT")
  assert _build.needs_field(rljax.algorithms.rloo(kl_coef=0.01), "old_logp_PGT")


def test_prompt_table_lookup_store_and_bounds():
  table = rljax.PromptTable.create(5, shape=(2,), fill=-1.0)
  ids = jnp.array([4, 0, 9, -1])
  table = jax.jit(rljax.PromptTable.store)(
    table, ids, jnp.arange(8.0).reshape(4, 2), jnp.array([1, 1, 1, 1])
  )
  values, seen = table.lookup(jnp.array([0, 4, 2, 9]))
  np.testing.assert_array_equal(
    values, [[2.0, 3.0], [0.0, 1.0], [-1.0, -1.0], [-1.0, -1.0]]
  )
  np.testing.assert_array_equal(seen, [1, 1, 0, 0])
  table = table.store(jnp.array([0, 1]), jnp.ones((2, 2)), jnp.array([0, 1]))
  np.testing.assert_array_equal(table.lookup(jnp.array([0, 1]))[1], [1, 1])
  with pytest.raises(ValueError, match="num_prompts=0"):
    rljax.PromptTable.create(0)


def test_trainer_checks_prompt_table_size():
  algo_state = (rljax.PromptTable.create(3), ())
  with pytest.raises(ValueError, match=r"table of 3 prompts.*has 10"):
    _build.check_prompt_tables(algo_state, 10)
  _build.check_prompt_tables(algo_state, 3)


def test_kl_penalty_against_old_is_zero_on_policy_and_grows_off_it():
  batch = testing.random_batch(2)
  algo = rljax.Algorithm(
    rljax.objectives.kl_penalty(rljax.losses.kl_k3, coef=1.0, against="old"),
    rljax.aggregate.token_mean,
  )

  def loss(logp, batch):
    return algo.loss(logp, batch, algo.init())[0].value

  old = jnp.asarray(batch.old_logp_PGT)
  value, grad = jax.jit(jax.value_and_grad(loss))(old, batch)
  assert float(value) == 0.0
  assert float(jnp.abs(grad).max()) == 0.0
  # On-policy without old log-probs: sg(logp), also zero.
  on = batch._replace(old_logp_PGT=None)
  assert float(jax.jit(loss)(old + 0.3, on)) == 0.0
  # Off-policy: k3 per token, token-mean, by hand on the first token.
  logp = old + 0.1
  got = float(jax.jit(loss)(logp, batch))
  mask = np.asarray(batch.loss_mask(), np.float64)
  d = -0.1  # log(old / current)
  assert got == pytest.approx(np.expm1(d) - d, rel=1e-4)
  assert mask.sum() > 0
  with pytest.raises(ValueError, match="against"):
    rljax.objectives.kl_penalty(rljax.losses.kl_k3, against="behaviour")
