"""Token-level returns and advantages: hand values, numpy references."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
import numpy as np
import pytest

from rljax import advantages

# ---------------------------------------------------------------------------
# Independent float64 references, written as loops over sequences.
# ---------------------------------------------------------------------------


def np_outcome_to_token(rewards, mask):
  mask = np.asarray(mask)
  out = np.zeros(mask.shape)
  for idx in np.ndindex(mask.shape[:-1]):
    valid = np.nonzero(mask[idx])[0]
    if len(valid):
      out[idx + (valid[-1],)] = rewards[idx]
  return out


def np_discounted(rewards, mask, gamma=1.0):
  """Reward-to-go; the discount exponent counts valid tokens only."""
  out = np.zeros(mask.shape)
  for idx in np.ndindex(mask.shape[:-1]):
    valid = [t for t in range(mask.shape[-1]) if mask[idx + (t,)]]
    for i, t in enumerate(valid):
      out[idx + (t,)] = sum(
        gamma ** (j - i) * rewards[idx + (k,)]
        for j, k in enumerate(valid)
        if j >= i
      )
  return out


def np_whiten(x, mask, eps=1e-8, shift_mean=True):
  values = np.asarray(x, np.float64)[np.asarray(mask) != 0]
  mean = values.mean() if values.size else 0.0
  var = np.var(values, ddof=1) if values.size >= 2 else 0.0
  y = (x - mean) / np.sqrt(var + eps) + (0.0 if shift_mean else mean)
  return y * mask


def np_reinforce_pp(rewards, mask, gamma=1.0):
  return np_whiten(np_discounted(rewards, mask, gamma), mask)


def np_reinforce_pp_baseline(rewards, mask, sample_mask):
  adv = np.zeros(np.shape(rewards))
  token_mask = np.zeros(np.shape(mask))
  for idx in np.ndindex(np.shape(rewards)[:-1]):
    keep = np.nonzero(sample_mask[idx])[0]
    if len(keep) < 2:
      continue
    group = [rewards[idx + (i,)] for i in keep]
    for i in keep:
      adv[idx + (i,)] = rewards[idx + (i,)] - np.mean(group)
      token_mask[idx + (i,)] = mask[idx + (i,)]
  return np_whiten(adv[..., None] * np.ones(np.shape(mask)), token_mask)


def np_gae(rewards, values, mask, gamma=1.0, lam=1.0):
  """verl `compute_gae_advantage_return`, loop for loop (without whitening)."""
  adv = np.zeros(mask.shape)
  for idx in np.ndindex(mask.shape[:-1]):
    nextvalues, lastgaelam = 0.0, 0.0
    for t in reversed(range(mask.shape[-1])):
      r, v, m = rewards[idx + (t,)], values[idx + (t,)], mask[idx + (t,)]
      delta = r + gamma * nextvalues - v
      new = delta + gamma * lam * lastgaelam
      nextvalues = v * m + (1 - m) * nextvalues
      lastgaelam = new * m + (1 - m) * lastgaelam
      adv[idx + (t,)] = lastgaelam
  return adv * mask, (adv + values) * mask


def _numpy_gradient(fn, x, step=1e-6):
  """Central finite differences of a scalar float64 numpy function."""
  grad = np.zeros_like(x)
  for idx in np.ndindex(x.shape):
    up, down = x.copy(), x.copy()
    up[idx] += step
    down[idx] -= step
    grad[idx] = (fn(up) - fn(down)) / (2 * step)
  return grad


# ---------------------------------------------------------------------------
# Shared data: [P, G, T] = [2, 3, 5] masks with holes, an empty sequence and
# an invalid sample.
# ---------------------------------------------------------------------------


def _data(seed=0):
  rng = np.random.default_rng(seed)
  shape = (2, 3, 5)
  token_rewards = rng.normal(size=shape).astype(np.float32)
  values = rng.normal(size=shape).astype(np.float32)
  rewards = rng.normal(size=shape[:2]).astype(np.float32)
  mask = (rng.uniform(size=shape) < 0.75).astype(np.float32)
  mask[0, 0] = [1, 1, 1, 0, 0]  # right padded
  mask[0, 1] = [1, 0, 1, 1, 0]  # a hole (multi-turn observation)
  mask[1, 2] = 0.0  # an empty sequence
  sample_mask = np.ones(shape[:2], np.float32)
  sample_mask[1, 0] = 0.0  # an invalid sample
  return token_rewards, values, rewards, mask, sample_mask


GAMMA, LAM = 0.9, 0.8

gae_jit = jax.jit(functools.partial(advantages.gae, gamma=GAMMA, lam=LAM))
discounted_jit = jax.jit(
  functools.partial(advantages.discounted_returns, gamma=GAMMA)
)
outcome_jit = jax.jit(advantages.outcome_to_token_rewards)
whiten_jit = jax.jit(advantages.whiten, static_argnames="shift_mean")
rpp_jit = jax.jit(functools.partial(advantages.reinforce_pp, gamma=GAMMA))
rppb_jit = jax.jit(advantages.reinforce_pp_baseline)

# ---------------------------------------------------------------------------
# Hand-worked values.
# ---------------------------------------------------------------------------


def test_gae_hand_worked_three_tokens():
  # gamma = 0.9, lam = 0.8, gamma * lam = 0.72; r = [0, 0, 1],
  # V = [0.5, 0.4, 0.3].
  # t=2: delta = 1 + 0.9 * 0 - 0.3 = 0.7;          A2 = 0.7
  # t=1: delta = 0 + 0.9 * 0.3 - 0.4 = -0.13;      A1 = -0.13 + 0.72 * 0.7
  #                                                    = 0.374
  # t=0: delta = 0 + 0.9 * 0.4 - 0.5 = -0.14;      A0 = -0.14 + 0.72 * 0.374
  #                                                    = 0.12928
  # returns = A + V = [0.62928, 0.774, 1.0]
  adv, ret = gae_jit(
    np.array([0.0, 0.0, 1.0]), np.array([0.5, 0.4, 0.3]), np.ones(3)
  )
  np.testing.assert_allclose(adv, [0.12928, 0.374, 0.7], rtol=1e-6)
  np.testing.assert_allclose(ret, [0.62928, 0.774, 1.0], rtol=1e-6)


def test_gae_hand_worked_skips_a_masked_token():
  # Token 1 is masked: its reward 5 and value 9 are ignored, and V' and A'
  # carry over it. t=2: A2 = 1 - 0.3 = 0.7.
  # t=0: delta = 0 + 0.9 * 0.3 - 0.5 = -0.23; A0 = -0.23 + 0.72 * 0.7 = 0.274.
  # returns = [0.274 + 0.5, 0 (masked), 0.7 + 0.3].
  adv, ret = gae_jit(
    np.array([0.0, 5.0, 1.0]),
    np.array([0.5, 9.0, 0.3]),
    np.array([1.0, 0.0, 1.0]),
  )
  np.testing.assert_allclose(adv, [0.274, 0.0, 0.7], rtol=1e-6)
  np.testing.assert_allclose(ret, [0.774, 0.0, 1.0], rtol=1e-6)


def test_outcome_to_token_rewards_hand_worked():
  # Last valid tokens: index 1, index 2 (after a hole), none.
  mask = np.array([[1, 1, 0], [1, 0, 1], [0, 0, 0]], np.float32)
  got = outcome_jit(np.array([2.0, 3.0, 4.0]), mask)
  np.testing.assert_array_equal(got, [[0, 2, 0], [0, 0, 3], [0, 0, 0]])


def test_discounted_returns_hand_worked():
  # gamma = 0.9. Row 0: G1 = 2, G0 = 1 + 0.9 * 2 = 2.8; token 2 is padding
  # (its reward 3 is ignored). Row 1: token 1 is a hole, skipped (neither
  # its reward 2 nor a discount step counts); G2 = 4, G0 = 1 + 0.9 * 4 = 4.6.
  rewards = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 4.0]])
  mask = np.array([[1, 1, 0], [1, 0, 1]], np.float32)
  got = discounted_jit(rewards, mask)
  np.testing.assert_allclose(got, [[2.8, 2.0, 0.0], [4.6, 0.0, 4.0]])


def test_whiten_hand_worked():
  # Valid [1, 2, 3]: mean 2, unbiased var 1; the 9 is masked out.
  x = np.array([1.0, 2.0, 3.0, 9.0])
  mask = np.array([1.0, 1.0, 1.0, 0.0])
  scale = 1.0 / np.sqrt(1.0 + 1e-8)
  np.testing.assert_allclose(
    whiten_jit(x, mask), [-scale, 0.0, scale, 0.0], rtol=1e-6
  )
  # Without the shift: (x - 2) / 1 + 2 = x on valid entries.
  np.testing.assert_allclose(
    whiten_jit(x, mask, shift_mean=False), [1.0, 2.0, 3.0, 0.0], rtol=1e-6
  )


def test_reinforce_pp_hand_worked():
  # gamma = 1: returns [[1, 1, 1], [2, 2, -]]; over the 5 valid tokens
  # mean 1.4, unbiased var (3 * 0.16 + 2 * 0.36) / 4 = 0.3, std 0.5477226;
  # A = -0.4 / 0.5477226 = -0.7302967 and 0.6 / 0.5477226 = 1.0954451.
  rewards = np.array([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
  mask = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
  got = jax.jit(advantages.reinforce_pp)(rewards, mask)
  low, high = -0.7302967, 1.0954451
  np.testing.assert_allclose(
    got, [[low, low, low], [high, high, 0.0]], rtol=1e-6
  )


def test_reinforce_pp_baseline_hand_worked():
  # One group R = [1, 0, 0]: A = R - 1/3 = [2/3, -1/3, -1/3]; sample 0 has 2
  # tokens, the others 1: values [2/3, 2/3, -1/3, -1/3], mean 1/6,
  # deviations +-0.5, unbiased var 4 * 0.25 / 3 = 1/3;
  # whitened = +-0.5 / sqrt(1/3) = +-0.8660254.
  mask = np.array([[[1, 1], [1, 0], [1, 0]]], np.float32)
  got = rppb_jit(np.array([[1.0, 0.0, 0.0]]), mask)
  a = 0.8660254
  np.testing.assert_allclose(got, [[[a, a], [-a, 0.0], [-a, 0.0]]], rtol=1e-6)


# ---------------------------------------------------------------------------
# Numpy references on random data.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_values_match_numpy(seed):
  token_rewards, values, rewards, mask, sample_mask = _data(seed)
  tol = dict(rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    outcome_jit(rewards, mask), np_outcome_to_token(rewards, mask), **tol
  )
  np.testing.assert_allclose(
    discounted_jit(token_rewards, mask),
    np_discounted(token_rewards, mask, GAMMA),
    **tol,
  )
  for shift in (True, False):
    np.testing.assert_allclose(
      whiten_jit(token_rewards, mask, shift_mean=shift),
      np_whiten(token_rewards, mask, shift_mean=shift),
      **tol,
    )
  np.testing.assert_allclose(
    rpp_jit(token_rewards, mask),
    np_reinforce_pp(token_rewards, mask, GAMMA),
    **tol,
  )
  np.testing.assert_allclose(
    rppb_jit(rewards, mask, sample_mask),
    np_reinforce_pp_baseline(rewards, mask, sample_mask),
    **tol,
  )
  adv, ret = gae_jit(token_rewards, values, mask)
  np_adv, np_ret = np_gae(token_rewards, values, mask, GAMMA, LAM)
  np.testing.assert_allclose(adv, np_adv, **tol)
  np.testing.assert_allclose(ret, np_ret, **tol)


def test_outputs_are_zero_at_masked_tokens():
  token_rewards, values, rewards, mask, sample_mask = _data(2)
  outputs = [
    outcome_jit(rewards, mask),
    discounted_jit(token_rewards, mask),
    whiten_jit(token_rewards, mask, shift_mean=False),
    rpp_jit(token_rewards, mask),
    rppb_jit(rewards, mask, sample_mask),
    *gae_jit(token_rewards, values, mask),
  ]
  for out in outputs:
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out)[mask == 0], 0.0)
  # The invalid sample is excluded entirely.
  np.testing.assert_array_equal(outputs[4][1, 0], 0.0)


def test_gae_identities_at_lambda_one_and_zero():
  token_rewards, values, _, _, _ = _data(3)
  ones = np.ones_like(values)
  # lam = 1: A_t = discounted return - V_t.
  adv, ret = advantages.gae(token_rewards, values, ones, gamma=GAMMA, lam=1.0)
  returns = np_discounted(token_rewards, ones, GAMMA)
  np.testing.assert_allclose(adv, returns - values, atol=1e-5)
  np.testing.assert_allclose(ret, returns, atol=1e-5)
  # lam = 0: A_t = delta_t = r_t + gamma V_{t+1} - V_t.
  adv, _ = advantages.gae(token_rewards, values, ones, gamma=GAMMA, lam=0.0)
  next_values = np.concatenate([values[..., 1:], 0 * values[..., :1]], -1)
  delta = token_rewards + GAMMA * next_values - values
  np.testing.assert_allclose(adv, delta, atol=1e-5)


def test_gae_with_zero_values_and_lambda_one_is_discounted_returns():
  # Both skip masked tokens the same way (the masks here have holes).
  token_rewards, values, _, mask, _ = _data(3)
  adv, _ = advantages.gae(token_rewards, 0 * values, mask, gamma=0.7, lam=1.0)
  returns = advantages.discounted_returns(token_rewards, mask, gamma=0.7)
  np.testing.assert_allclose(adv, returns, atol=1e-6)
  assert mask[0, 1].tolist() == [1, 0, 1, 1, 0]  # has a hole


def test_whiten_gives_zero_mean_unit_variance_on_valid_entries():
  token_rewards, _, _, mask, _ = _data(4)
  y = np.asarray(whiten_jit(3.0 * token_rewards + 7.0, mask))[mask != 0]
  np.testing.assert_allclose(y.mean(), 0.0, atol=1e-5)
  np.testing.assert_allclose(np.var(y, ddof=1), 1.0, rtol=1e-5)


def test_reinforce_pp_baseline_skips_groups_without_a_baseline():
  _, _, rewards, mask, _ = _data(5)
  sample_mask = np.ones_like(rewards)
  sample_mask[1, 1:] = 0.0  # group 1 keeps a single valid sample
  got = rppb_jit(rewards, mask, sample_mask)
  np.testing.assert_array_equal(got[1], 0.0)
  # Group 1 stays out of the whitening statistics too: group 0 alone gives
  # the same values.
  alone = rppb_jit(rewards[:1], mask[:1], sample_mask[:1])
  # Whitening statistics over a larger (masked) batch: float32 sums in
  # another order, ~n*eps32 off.
  np.testing.assert_allclose(got[0], alone[0], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Gradients against finite differences of the numpy references.
# ---------------------------------------------------------------------------


def _check_gradient(jax_fn, np_fn, x, *, cotangent_shape):
  cotangent = np.random.default_rng(0).normal(size=cotangent_shape)
  got = jax.jit(jax.grad(lambda v: jnp.sum(cotangent * jax_fn(v))))(x)
  expected = _numpy_gradient(
    lambda v: np.sum(cotangent * np_fn(v)), x.astype(np.float64)
  )
  np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)
  assert np.any(np.abs(expected) > 0.1)


def test_gradients_match_finite_differences():
  token_rewards, values, rewards, mask, sample_mask = _data(6)
  shape = mask.shape
  _check_gradient(
    lambda r: advantages.outcome_to_token_rewards(r, mask),
    lambda r: np_outcome_to_token(r, mask),
    rewards,
    cotangent_shape=shape,
  )
  _check_gradient(
    lambda r: advantages.discounted_returns(r, mask, gamma=GAMMA),
    lambda r: np_discounted(r, mask, GAMMA),
    token_rewards,
    cotangent_shape=shape,
  )
  _check_gradient(
    lambda x: advantages.whiten(x, mask),
    lambda x: np_whiten(x, mask),
    token_rewards,
    cotangent_shape=shape,
  )
  _check_gradient(
    lambda r: advantages.reinforce_pp(r, mask, gamma=GAMMA),
    lambda r: np_reinforce_pp(r, mask, GAMMA),
    token_rewards,
    cotangent_shape=shape,
  )
  _check_gradient(
    lambda r: advantages.reinforce_pp_baseline(r, mask, sample_mask),
    lambda r: np_reinforce_pp_baseline(r, mask, sample_mask),
    rewards,
    cotangent_shape=shape,
  )


def test_gae_gradients_match_finite_differences():
  token_rewards, values, _, mask, _ = _data(7)
  both = np.stack([token_rewards, values])

  def jax_gae(rv):
    adv, ret = advantages.gae(rv[0], rv[1], mask, gamma=GAMMA, lam=LAM)
    return jnp.stack([adv, ret])

  def np_gae_both(rv):
    return np.stack(np_gae(rv[0], rv[1], mask, GAMMA, LAM))

  _check_gradient(jax_gae, np_gae_both, both, cotangent_shape=both.shape)


# ---------------------------------------------------------------------------
# vmap, bfloat16, sharding.
# ---------------------------------------------------------------------------


def test_vmap_over_a_leading_axis():
  token_rewards, values, rewards, mask, sample_mask = _data(8)
  # Per-sequence functions: vmap equals the batched call.
  for fn, args in [
    (gae_jit, (token_rewards, values, mask)),
    (discounted_jit, (token_rewards, mask)),
    (outcome_jit, (rewards, mask)),
  ]:
    mapped = jax.vmap(fn)(*args)
    np.testing.assert_allclose(
      np.asarray(mapped), np.asarray(fn(*args)), atol=1e-6
    )
  # Batch-whitened ones: vmap equals one call per slice.
  for fn, args in [
    (rpp_jit, (token_rewards, mask)),
    (rppb_jit, (rewards, mask, sample_mask)),
  ]:
    mapped = jax.vmap(fn)(*args)
    each = np.stack([fn(*(a[i] for a in args)) for i in range(2)])
    # Batch mean and std under vmap or per slice: float32 sums reordered.
    np.testing.assert_allclose(mapped, each, atol=1e-5)


def test_bfloat16_inputs_give_finite_float32():
  token_rewards, values, rewards, mask, sample_mask = _data(9)
  low = [jnp.asarray(a, jnp.bfloat16) for a in _data(9)]
  t_low, v_low, r_low, m_low, s_low = low
  outputs = [
    outcome_jit(r_low, m_low),
    discounted_jit(t_low, m_low),
    whiten_jit(t_low, m_low),
    rpp_jit(t_low, m_low),
    rppb_jit(r_low, m_low, s_low),
    *gae_jit(t_low, v_low, m_low),
  ]
  for out in outputs:
    assert out.dtype == jnp.float32
    assert np.all(np.isfinite(out))
  expected = gae_jit(np.asarray(t_low, np.float32), values, mask)[0]
  np.testing.assert_allclose(outputs[5], expected, atol=0.1)


def test_sharded_over_prompts_on_eight_devices():
  rng = np.random.default_rng(10)
  token_rewards = rng.normal(size=(8, 2, 4)).astype(np.float32)
  values = rng.normal(size=(8, 2, 4)).astype(np.float32)
  rewards = rng.normal(size=(8, 2)).astype(np.float32)
  mask = (rng.uniform(size=(8, 2, 4)) < 0.7).astype(np.float32)
  with jax.set_mesh(jax.make_mesh((8,), ("data",))):
    spec = PartitionSpec("data")
    t, v, r, m = (
      jax.device_put(a, spec) for a in (token_rewards, values, rewards, mask)
    )
    adv, _ = gae_jit(t, v, m)
    rpp = rpp_jit(t, m)
    rppb = rppb_jit(r, m)
    assert jax.typeof(adv).sharding.spec[0] == "data"
  np_adv, _ = np_gae(token_rewards, values, mask, GAMMA, LAM)
  np.testing.assert_allclose(adv, np_adv, atol=1e-5)
  np.testing.assert_allclose(
    rpp, np_reinforce_pp(token_rewards, mask, GAMMA), atol=1e-5
  )
  ones = np.ones_like(rewards)
  np.testing.assert_allclose(
    rppb, np_reinforce_pp_baseline(rewards, mask, ones), atol=1e-5
  )


# ---------------------------------------------------------------------------
# Errors.
# ---------------------------------------------------------------------------


def test_bad_hyperparameters_raise_naming_them():
  x, m = np.ones((2, 3)), np.ones((2, 3))
  for gamma in (-0.1, 1.5):
    with pytest.raises(ValueError, match="gamma must be in"):
      advantages.gae(x, x, m, gamma=gamma)
    with pytest.raises(ValueError, match="gamma must be in"):
      advantages.discounted_returns(x, m, gamma=gamma)
    with pytest.raises(ValueError, match="gamma must be in"):
      advantages.reinforce_pp(x, m, gamma=gamma)
  with pytest.raises(ValueError, match="lam must be in"):
    advantages.gae(x, x, m, lam=1.01)
  with pytest.raises(ValueError, match="eps must be > 0"):
    advantages.whiten(x, m, eps=0.0)


def test_bad_shapes_raise_naming_the_argument():
  x = np.ones((2, 3))
  with pytest.raises(ValueError, match="values_PGT"):
    advantages.gae(x, np.ones((2, 4)), x)
  with pytest.raises(ValueError, match="mask_PGT"):
    advantages.discounted_returns(x, np.ones((2, 4)))
  with pytest.raises(ValueError, match="mask"):
    advantages.whiten(x, np.ones(3))
  with pytest.raises(ValueError, match="mask_PGT"):
    advantages.outcome_to_token_rewards(np.ones(2), np.ones((3, 4)))
  with pytest.raises(ValueError, match="mask_PGT"):
    advantages.outcome_to_token_rewards(np.ones(2), np.ones(4))
  with pytest.raises(ValueError, match="mask_PGT"):
    advantages.reinforce_pp_baseline(x, np.ones((2, 4, 5)))
  with pytest.raises(ValueError, match=r"rewards_PG has shape \(2, 1\)"):
    advantages.reinforce_pp_baseline(np.ones((2, 1)), np.ones((2, 1, 5)))
