"""Token-selection masks: hand values, numpy quantiles, detachment."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import masks
from rljax.masks._tokens import _masked_quantile
from rljax.masks._tokens import _quantile_index


def _jit(fn, **kw):
  return jax.jit(functools.partial(fn, **kw))


# ----------------------------------------------------------------------------
# top_entropy_mask


# Valid entropies are 0.1 .. 0.9 (n = 9); the 9.0 is padding.
H = np.array([[0.1, 0.9, 0.5, 0.3, 0.7], [0.2, 0.8, 0.4, 0.6, 9.0]], np.float32)
HM = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], np.float32)


def _np_top_entropy(h, mask, keep_fraction):
  """TRL: tau = torch.quantile(valid entropies, 1 - rho); keep H >= tau."""
  valid = mask > 0
  if not valid.any():
    return np.zeros(h.shape)
  tau = np.quantile(h[valid].astype(np.float64), 1.0 - keep_fraction)
  # The comparison happens in float32, like TRL's.
  return ((h >= np.float32(tau)) & valid).astype(np.float64) * mask


@pytest.mark.parametrize(
  "keep_fraction,expected",
  [
    # q = 0.8, position 0.8 * (9 - 1) = 6.4 -> tau = 0.7 + 0.4 * 0.1 = 0.74:
    # keep 0.8 and 0.9.
    (0.2, [[0, 1, 0, 0, 0], [0, 1, 0, 0, 0]]),
    # q = 0.5, position 4 -> tau = sorted[4] = 0.5: keep 0.5 .. 0.9.
    (0.5, [[0, 1, 1, 0, 1], [0, 1, 0, 1, 0]]),
    # q = 0 -> tau = min = 0.1: every valid token.
    (1.0, [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]),
  ],
)
def test_top_entropy_hand_values(keep_fraction, expected):
  got = _jit(masks.top_entropy_mask, keep_fraction=keep_fraction)(H, HM)
  np.testing.assert_array_equal(got, np.asarray(expected, np.float32))


def test_masked_quantile_hand_value():
  # Valid entries 0.1 .. 0.9 sorted; position 0.8 * 8 = 6.4 -> 0.74.
  got = jax.jit(functools.partial(_masked_quantile, q=0.8))(H, HM > 0)
  np.testing.assert_allclose(got, 0.74, rtol=1e-6)


@pytest.mark.parametrize("q", [0.8, 0.5, 0.3, 0.0, 1.0, 0.123])
def test_masked_quantile_matches_numpy(q):
  fn = jax.jit(functools.partial(_masked_quantile, q=q))
  rng = np.random.default_rng(0)
  # Different valid counts: 1, 2, 3, 8, 11, 17, 30, 36 of 36.
  for count in [1, 2, 3, 8, 11, 17, 30, 36]:
    x = rng.gamma(2.0, 1.0, (4, 9)).astype(np.float32)
    valid = np.zeros(36, bool)
    valid[rng.choice(36, count, replace=False)] = True
    valid = valid.reshape(4, 9)
    expected = np.quantile(x[valid].astype(np.float64), q)
    np.testing.assert_allclose(fn(x, valid), expected, rtol=1e-6)


@pytest.mark.parametrize("keep_fraction", [0.2, 0.5, 0.7, 1.0])
def test_top_entropy_matches_numpy(keep_fraction):
  fn = _jit(masks.top_entropy_mask, keep_fraction=keep_fraction)
  rng = np.random.default_rng(100)
  shape = (3, 4, 8)
  for density in [0.05, 0.3, 0.5, 0.9, 1.0]:
    h = rng.gamma(1.5, 1.0, shape).astype(np.float32)
    mask = (rng.uniform(size=shape) < density).astype(np.float32)
    expected = _np_top_entropy(h, mask, keep_fraction)
    np.testing.assert_array_equal(fn(h, mask), expected)


def test_top_entropy_keeps_the_expected_fraction():
  # 100 distinct values, keep 20%: position 0.8 * 99 = 79.2 -> keep 80..99.
  h = np.random.default_rng(0).permutation(100).astype(np.float32)
  got = np.asarray(jax.jit(masks.top_entropy_mask)(h, np.ones(100)))
  assert got.sum() == 20
  np.testing.assert_array_equal(got, (h >= 80).astype(np.float32))


def test_top_entropy_ties_and_degenerate_counts():
  fn = _jit(masks.top_entropy_mask, keep_fraction=0.2)
  # All equal entropies: tau equals them, every valid token is kept.
  ones = np.ones((2, 3), np.float32)
  np.testing.assert_array_equal(fn(ones * 0.7, ones), ones)
  # One valid token: it is its own quantile.
  one = np.array([[0.0, 1.0, 0.0]], np.float32)
  np.testing.assert_array_equal(fn(np.array([[5.0, 0.3, 9.0]]), one), one)
  # No valid token: nothing kept, no NaN.
  got = fn(np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32))
  np.testing.assert_array_equal(got, np.zeros((2, 3)))


def test_top_entropy_integer_positions_are_exact():
  # q = 0.7, n = 11: position 0.7 * 10 = 7 -> tau = sorted[7] = 7, so the
  # tokens 7, 8, 9, 10 are kept (tau must not land a hair above 7).
  h = np.arange(11, dtype=np.float32)
  got = _jit(masks.top_entropy_mask, keep_fraction=0.3)(h, np.ones(11))
  np.testing.assert_array_equal(got, (h >= 7).astype(np.float32))


def test_quantile_index_is_exact_for_large_counts():
  # 0.8 * 30_000_001 = 24_000_000.8; float32 would round m to 3e7 and give
  # position 24_000_000.0.
  lo, frac = jax.jit(functools.partial(_quantile_index, 0.8))(30_000_001)
  assert int(lo) == 24_000_000
  np.testing.assert_allclose(frac, 0.8, rtol=1e-6)
  # 0.7 * 10 = 7 exactly: fraction 0.
  lo, frac = jax.jit(functools.partial(_quantile_index, 0.7))(10)
  assert (int(lo), float(frac)) == (7, 0.0)


def test_top_entropy_is_detached():
  rng = np.random.default_rng(1)
  h = rng.gamma(1.5, 1.0, (3, 5)).astype(np.float32)
  mask = np.ones_like(h)
  loss = lambda x: jnp.sum(masks.top_entropy_mask(x, mask) * x)  # noqa: E731
  grad = jax.jit(jax.grad(loss))(h)
  # d/dx [keep * x] = keep: the mask itself contributes nothing.
  np.testing.assert_array_equal(grad, _np_top_entropy(h, mask, 0.2))


def test_top_entropy_bfloat16():
  rng = np.random.default_rng(2)
  h = jnp.asarray(rng.gamma(1.5, 1.0, (4, 6)), jnp.bfloat16)
  mask = jnp.asarray(rng.uniform(size=(4, 6)) < 0.8, jnp.bfloat16)
  got = jax.jit(masks.top_entropy_mask)(h, mask)
  assert got.dtype == jnp.float32
  expected = _np_top_entropy(
    np.asarray(h, np.float32), np.asarray(mask, np.float32), 0.2
  )
  np.testing.assert_array_equal(got, expected)


def test_top_entropy_quantile_is_global_across_shards():
  rng = np.random.default_rng(3)
  h = rng.gamma(1.5, 1.0, (8, 2, 6)).astype(np.float32)
  mask = (rng.uniform(size=h.shape) < 0.7).astype(np.float32)
  mesh = jax.make_mesh((8,), ("data",))
  sharding = jax.sharding.NamedSharding(
    mesh, jax.sharding.PartitionSpec("data")
  )
  put = lambda x: jax.device_put(x, sharding)  # noqa: E731
  got = jax.jit(masks.top_entropy_mask)(put(h), put(mask))
  np.testing.assert_array_equal(got, _np_top_entropy(h, mask, 0.2))


@pytest.mark.parametrize("keep_fraction", [0.0, -0.2, 1.5])
def test_top_entropy_bad_keep_fraction_raises(keep_fraction):
  with pytest.raises(ValueError, match="keep_fraction"):
    masks.top_entropy_mask(H, HM, keep_fraction=keep_fraction)


def test_top_entropy_shape_mismatch_raises():
  with pytest.raises(ValueError, match="mask_BT"):
    masks.top_entropy_mask(H, HM[:, :3])


# ----------------------------------------------------------------------------
# off_policy_sequence_mask

# Rows (logp = -1 on valid tokens; the third token is padding with garbage):
#   0: A = +1, KL = 2.0           -> keep (A >= 0)
#   1: A = -1, KL = 0.3           -> keep (KL <= 0.5)
#   2: A = -1, KL = 1.0           -> drop
#   3: A = -1, KL = 0.5 exactly   -> keep (<=)
#   4: A = mean(-1, 0.5) = -0.25, KL = 1.0 -> drop
#   5: A = mean(-1, 1.5) = +0.25, KL = 1.0 -> keep
LOGP = np.array([[-1.0, -1.0, 7.0]] * 6, np.float32)
SAMPLER = LOGP + np.array(
  [[2.0, 2.0, 99], [0.3, 0.3, 99], [1.0, 1.0, 99]]
  + [[0.5, 0.5, 99], [1.0, 1.0, 99], [1.0, 1.0, 99]],
  np.float32,
)
ADV = np.array(
  [[1, 1, -50], [-1, -1, 50], [-1, -1, 50]]
  + [[-1, -1, 50], [-1, 0.5, 50], [-1, 1.5, -50]],
  np.float32,
)
OM = np.array([[1, 1, 0]] * 6, np.float32)


def _np_off_policy(logp, sampler, adv, mask, delta=0.5):
  out = np.zeros(logp.shape)
  for row in np.ndindex(logp.shape[:-1]):
    valid = [t for t in range(logp.shape[-1]) if mask[row][t] > 0]
    n = float(sum(mask[row][t] for t in valid))
    if not n:
      continue
    kl = sum(
      (float(sampler[row][t]) - float(logp[row][t])) * mask[row][t]
      for t in valid
    )
    a = sum(float(adv[row][t]) * mask[row][t] for t in valid)
    if a / n >= 0 or kl / n <= delta:
      out[row] = mask[row]
  return out


def test_off_policy_hand_values():
  got = jax.jit(masks.off_policy_sequence_mask)(LOGP, SAMPLER, ADV, OM)
  keep = np.array([1, 1, 0, 1, 0, 1], np.float32)
  np.testing.assert_array_equal(got, keep[:, None] * OM)
  # delta = 2.0: every KL <= 2, so every sequence is kept.
  got = _jit(masks.off_policy_sequence_mask, delta=2.0)(LOGP, SAMPLER, ADV, OM)
  np.testing.assert_array_equal(got, OM)


@pytest.mark.parametrize("delta", [0.1, 0.5])
def test_off_policy_matches_numpy(delta):
  fn = _jit(masks.off_policy_sequence_mask, delta=delta)
  rng = np.random.default_rng(0)
  shape = (2, 5, 6)
  for _ in range(3):
    logp = rng.normal(-1.0, 0.5, shape).astype(np.float32)
    sampler = (logp + rng.normal(0.3, 0.5, shape)).astype(np.float32)
    adv = np.broadcast_to(rng.normal(size=shape[:-1])[..., None], shape)
    adv = adv.astype(np.float32)
    mask = (rng.uniform(size=shape) < 0.7).astype(np.float32)
    expected = _np_off_policy(logp, sampler, adv, mask, delta)
    np.testing.assert_array_equal(fn(logp, sampler, adv, mask), expected)


def test_off_policy_is_detached():
  fn = masks.off_policy_sequence_mask
  loss = lambda lp, s: jnp.sum(fn(lp, s, ADV, OM) * lp)  # noqa: E731
  g_logp, g_sampler = jax.jit(jax.grad(loss, argnums=(0, 1)))(LOGP, SAMPLER)
  np.testing.assert_array_equal(g_logp, _np_off_policy(LOGP, SAMPLER, ADV, OM))
  np.testing.assert_array_equal(g_sampler, np.zeros_like(SAMPLER))


def test_off_policy_bfloat16():
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  got = jax.jit(masks.off_policy_sequence_mask)(
    bf(LOGP), bf(SAMPLER), bf(ADV), bf(OM)
  )
  assert got.dtype == jnp.float32
  ref = _np_off_policy(
    *(np.asarray(bf(x), np.float32) for x in (LOGP, SAMPLER, ADV, OM))
  )
  np.testing.assert_array_equal(got, ref)


def test_off_policy_shape_mismatch_raises():
  with pytest.raises(ValueError, match="adv_BT"):
    masks.off_policy_sequence_mask(LOGP, SAMPLER, ADV[:, :2], OM)


# ----------------------------------------------------------------------------
# truncated_mask


def test_truncated_mask_hand_values():
  mask = np.array([[[1, 1, 0], [1, 0, 0]], [[1, 1, 1], [0, 0, 0]]], np.float32)
  truncated = np.array([[True, False], [False, True]])
  # Row (0, 0) and (1, 1) are truncated: their whole mask becomes 0.
  expected = np.array(
    [[[0, 0, 0], [1, 0, 0]], [[1, 1, 1], [0, 0, 0]]], np.float32
  )
  got = jax.jit(masks.truncated_mask)(truncated, mask)
  np.testing.assert_array_equal(got, expected)
  # 0/1 floats behave like bools.
  got = jax.jit(masks.truncated_mask)(truncated.astype(np.float32), mask)
  np.testing.assert_array_equal(got, expected)


def test_truncated_mask_keeps_weights_and_is_detached():
  mask = np.array([[0.5, 2.0], [1.0, 1.0]], np.float32)
  trunc = np.array([0.0, 1.0], np.float32)
  loss = lambda m: jnp.sum(masks.truncated_mask(trunc, m))  # noqa: E731
  value, grad = jax.jit(jax.value_and_grad(loss))(mask)
  np.testing.assert_allclose(value, 2.5)  # only row 0: 0.5 + 2.0
  np.testing.assert_array_equal(grad, np.zeros_like(mask))


def test_truncated_mask_bfloat16():
  mask = jnp.ones((2, 3), jnp.bfloat16)
  got = jax.jit(masks.truncated_mask)(jnp.array([1, 0], jnp.bfloat16), mask)
  assert got.dtype == jnp.float32
  np.testing.assert_array_equal(got, [[0, 0, 0], [1, 1, 1]])


def test_truncated_mask_bad_shape_raises():
  with pytest.raises(ValueError, match="truncated_B"):
    masks.truncated_mask(np.zeros((2, 3)), np.ones((2, 3)))
  with pytest.raises(ValueError, match="truncated_B"):
    masks.truncated_mask(np.zeros((3,)), np.ones((2, 4)))
