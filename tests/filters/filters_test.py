"""Group filters: hand values, numpy references, sharding, errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import filters


def _jit(fn, **kw):
  return jax.jit(functools.partial(fn, **kw))


def _valid_rewards(rewards, mask, idx):
  m = np.ones(rewards.shape[-1]) if mask is None else mask[idx]
  return [float(r) for r, v in zip(rewards[idx], m, strict=True) if v > 0]


def _random_groups(seed, shape=(3, 5, 4)):
  rng = np.random.default_rng(seed)
  # Binary rewards make constant groups common.
  rewards = rng.integers(0, 2, shape).astype(np.float32)
  mask = (rng.uniform(size=shape) < 0.75).astype(np.float32)
  # Views onto the first two groups: one continuous, one empty.
  rewards.reshape(-1, shape[-1])[0] = rng.normal(size=shape[-1])
  mask.reshape(-1, shape[-1])[1] = 0.0
  return rewards, mask


# ----------------------------------------------------------------------------
# dynamic_sampling


def _np_dynamic_sampling(rewards, mask=None):
  out = np.zeros(rewards.shape[:-1])
  for idx in np.ndindex(out.shape):
    vals = _valid_rewards(rewards, mask, idx)
    out[idx] = float(len(vals) >= 2 and np.std(vals) > 0)
  return out


def test_dynamic_sampling_hand_values():
  rewards = np.array(
    [[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1], [0.5, 0.7, 0, 0]],
    np.float32,
  )
  mask = np.array(
    [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 1], [1, 0, 0, 0]],
    np.float32,
  )
  # Without a mask only row 1, row 3 (1, 0, 1, 1) and row 4 vary.
  got = jax.jit(filters.dynamic_sampling)(rewards)
  np.testing.assert_array_equal(got, [0, 1, 0, 1, 1])
  # Masked: row 3's valid rewards are all 1; row 4 has one valid sample.
  got = jax.jit(filters.dynamic_sampling)(rewards, mask)
  np.testing.assert_array_equal(got, [0, 1, 0, 0, 0])


@pytest.mark.parametrize("seed", [0, 1])
def test_dynamic_sampling_matches_numpy(seed):
  rewards, mask = _random_groups(seed)
  fn = jax.jit(filters.dynamic_sampling)
  np.testing.assert_array_equal(
    fn(rewards, mask), _np_dynamic_sampling(rewards, mask)
  )
  np.testing.assert_array_equal(fn(rewards), _np_dynamic_sampling(rewards))


# ----------------------------------------------------------------------------
# reward_range_filter


def _np_reward_range(rewards, mask=None, low=0.0, high=1.0):
  out = np.zeros(rewards.shape[:-1])
  for idx in np.ndindex(out.shape):
    vals = _valid_rewards(rewards, mask, idx)
    out[idx] = float(bool(vals) and low < sum(vals) / len(vals) < high)
  return out


def test_reward_range_hand_values():
  rewards = np.array(
    [[0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0], [1, 1, 1, 0]], np.float32
  )
  # Means 0, 1, 0.25, 0.75: the bounds are exclusive.
  got = jax.jit(filters.reward_range_filter)(rewards)
  np.testing.assert_array_equal(got, [0, 0, 1, 1])
  # (0.2, 0.5): only 0.25.
  fn = _jit(filters.reward_range_filter, low=0.2, high=0.5)
  np.testing.assert_array_equal(fn(rewards), [0, 0, 1, 0])
  # Masking row 2's only 1 makes its mean 0; row 3 keeps mean 1 of [1, 1, 1].
  mask = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 1], [1, 1, 1, 0]])
  got = jax.jit(filters.reward_range_filter)(rewards, mask)
  np.testing.assert_array_equal(got, [0, 0, 0, 0])


def test_reward_range_drops_empty_groups():
  rewards = np.zeros((2, 3), np.float32)
  mask = np.array([[1, 1, 1], [0, 0, 0]], np.float32)
  fn = _jit(filters.reward_range_filter, low=-1.0, high=1.0)
  np.testing.assert_array_equal(fn(rewards, mask), [1, 0])


@pytest.mark.parametrize("seed", [0, 1])
def test_reward_range_matches_numpy(seed):
  rewards, mask = _random_groups(seed)
  fn = _jit(filters.reward_range_filter, low=0.1, high=0.9)
  expected = _np_reward_range(rewards, mask, 0.1, 0.9)
  np.testing.assert_array_equal(fn(rewards, mask), expected)


# ----------------------------------------------------------------------------
# informative_groups


def _np_informative(rewards, mask, num_keep):
  scores = []
  for p in range(rewards.shape[0]):
    vals = _valid_rewards(rewards, mask, (p,))
    scores.append(np.var(vals) if vals else -1.0)  # population variance
  order = sorted(range(len(scores)), key=lambda p: (-scores[p], p))
  out = np.zeros(len(scores))
  out[order[:num_keep]] = 1.0
  return out


def test_informative_groups_hand_values():
  rewards = np.array(
    [[0, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0], [0, 1, 0, 1], [0, 0, 1, 1]],
    np.float32,
  )
  # Population variances: 0.25, 0, 3/16 = 0.1875, 0.25, 0.25.
  # num_keep 2: the three 0.25 groups tie -> lower indices 0 and 3.
  fn = _jit(filters.informative_groups, num_keep=2)
  np.testing.assert_array_equal(fn(rewards), [1, 0, 0, 1, 0])
  # num_keep 4: 0, 3, 4 (0.25) then 2 (0.1875).
  fn = _jit(filters.informative_groups, num_keep=4)
  np.testing.assert_array_equal(fn(rewards), [1, 0, 1, 1, 1])


def test_informative_groups_empty_groups_rank_last():
  # Variances [0, (empty), 0]: the empty group loses to constant groups.
  rewards = np.array([[1, 1], [5, 0], [0, 0]], np.float32)
  mask = np.array([[1, 1], [0, 0], [1, 1]], np.float32)
  fn = _jit(filters.informative_groups, num_keep=2)
  np.testing.assert_array_equal(fn(rewards, mask), [1, 0, 1])


def test_informative_groups_uses_population_variance():
  # Group 0: valid [0, 1] -> population var 0.25 (sample var 0.5).
  # Group 1: [0, 0, 1, 1.2], mean 0.55 -> population var
  #   (0.3025 + 0.3025 + 0.2025 + 0.4225) / 4 = 0.3075 (sample var 0.41).
  # Population variance prefers group 1; the sample variance would not.
  rewards = np.array([[0, 1, 9, 9], [0, 0, 1, 1.2]], np.float32)
  mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], np.float32)
  fn = _jit(filters.informative_groups, num_keep=1)
  np.testing.assert_array_equal(fn(rewards, mask), [0, 1])


@pytest.mark.parametrize("num_keep", [1, 5, 12])
def test_informative_groups_matches_numpy(num_keep):
  rng = np.random.default_rng(num_keep)
  rewards = rng.normal(size=(12, 6)).astype(np.float32)
  rewards[3] = rewards[7] = rewards[9]  # exact ties
  mask = (rng.uniform(size=(12, 6)) < 0.8).astype(np.float32)
  mask[3] = mask[7] = mask[9]
  mask[5] = 0.0
  got = _jit(filters.informative_groups, num_keep=num_keep)(rewards, mask)
  np.testing.assert_array_equal(got, _np_informative(rewards, mask, num_keep))
  assert np.asarray(got).sum() == num_keep


# ----------------------------------------------------------------------------
# Shared properties.

FILTERS = {
  "dynamic_sampling": filters.dynamic_sampling,
  "reward_range_filter": filters.reward_range_filter,
  "informative_groups": functools.partial(
    filters.informative_groups, num_keep=3
  ),
}


@pytest.mark.parametrize("name", FILTERS)
def test_keep_masks_have_no_gradient(name):
  rewards, mask = _random_groups(2, shape=(8, 4))
  rewards = rewards + np.linspace(0, 0.5, 32, dtype=np.float32).reshape(8, 4)
  fn = FILTERS[name]
  grad = jax.jit(jax.grad(lambda r: jnp.sum(fn(r, mask) * 3.0)))(rewards)
  np.testing.assert_array_equal(grad, np.zeros_like(rewards))


@pytest.mark.parametrize("name", FILTERS)
def test_bfloat16_inputs_give_float32(name):
  rewards, mask = _random_groups(3, shape=(8, 4))
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  got = jax.jit(FILTERS[name])(bf(rewards), bf(mask))
  assert got.dtype == jnp.float32
  np.testing.assert_array_equal(got, jax.jit(FILTERS[name])(rewards, mask))


def test_rank_polymorphic_filters():
  rewards, mask = _random_groups(4, shape=(2, 3, 4))
  for fn in (filters.dynamic_sampling, filters.reward_range_filter):
    got = jax.jit(fn)(rewards, mask)
    assert got.shape == (2, 3)
    flat = jax.jit(fn)(rewards.reshape(6, 4), mask.reshape(6, 4))
    np.testing.assert_array_equal(np.asarray(got).reshape(6), flat)


def test_sharded_over_prompts_equals_numpy():
  rewards, mask = _random_groups(5, shape=(8, 4))
  rewards[2] = [0.0, 1.0, 2.0, 3.0]  # the largest variance
  mask[2] = 1.0
  mesh = jax.make_mesh((8,), ("data",))
  sharding = jax.sharding.NamedSharding(
    mesh, jax.sharding.PartitionSpec("data")
  )
  put = lambda x: jax.device_put(x, sharding)  # noqa: E731
  r, m = put(rewards), put(mask)
  np.testing.assert_array_equal(
    jax.jit(filters.dynamic_sampling)(r, m), _np_dynamic_sampling(rewards, mask)
  )
  np.testing.assert_array_equal(
    jax.jit(filters.reward_range_filter)(r, m), _np_reward_range(rewards, mask)
  )
  got = _jit(filters.informative_groups, num_keep=3)(r, m)
  np.testing.assert_array_equal(got, _np_informative(rewards, mask, 3))


# ----------------------------------------------------------------------------
# Argument checks.


def test_bad_arguments_raise():
  rewards = np.zeros((4, 3), np.float32)
  with pytest.raises(ValueError, match="sample_mask_PG"):
    filters.dynamic_sampling(rewards, np.ones((4, 2)))
  with pytest.raises(ValueError, match="rewards_PG"):
    filters.dynamic_sampling(np.float32(1.0))
  with pytest.raises(ValueError, match="high"):
    filters.reward_range_filter(rewards, low=1.0, high=0.5)
  for num_keep in (0, 5, 2.0):
    with pytest.raises(ValueError, match="num_keep"):
      filters.informative_groups(rewards, num_keep=num_keep)
  with pytest.raises(ValueError, match="rewards_PG"):
    filters.informative_groups(np.zeros((2, 4, 3)), num_keep=1)
