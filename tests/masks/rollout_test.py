"""Rollout-mismatch weights: hand values, numpy references, detachment."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import masks

LN = math.log

# One sequence, rollout_logp = 0, so lr = old_logp; the last token is padding
# and holds garbage that must not leak.
OLD = np.array([[0.0, LN(3.0), LN(0.25), 50.0]], np.float32)
ROLL = np.zeros_like(OLD)
MASK = np.array([[1.0, 1.0, 1.0, 0.0]], np.float32)

ROLLOUT_FNS = {
  "token_tis": masks.token_tis,
  "sequence_tis": masks.sequence_tis,
  "icepop": masks.icepop,
  "sequence_masked_tis": masks.sequence_masked_tis,
}


def _jit(fn, **kw):
  return jax.jit(functools.partial(fn, **kw))


# ----------------------------------------------------------------------------
# Independent float64 numpy references, written with loops.


def _np_lr(old, roll):
  return old.astype(np.float64) - roll.astype(np.float64)


def _np_token_tis(old, roll, mask, threshold=2.0):
  lr = _np_lr(old, roll)
  out = np.zeros(lr.shape)
  for idx in np.ndindex(lr.shape):
    if mask[idx] > 0:
      out[idx] = (
        min(math.exp(min(max(lr[idx], -20), 20)), threshold) * mask[idx]
      )
  return out


def _np_sequence_tis(old, roll, mask, threshold=2.0):
  lr = _np_lr(old, roll)
  out = np.zeros(lr.shape)
  for row in np.ndindex(lr.shape[:-1]):
    s = sum(
      lr[row][t] * mask[row][t] for t in range(lr.shape[-1]) if mask[row][t]
    )
    w = min(math.exp(min(max(s, -20), 20)), threshold)
    out[row] = w * mask[row]
  return out


def _np_icepop(old, roll, mask, low=0.5, high=5.0):
  lr = _np_lr(old, roll)
  out = np.zeros(lr.shape)
  for idx in np.ndindex(lr.shape):
    rho = math.exp(lr[idx])
    if mask[idx] > 0 and low <= rho <= high:
      out[idx] = rho * mask[idx]
  return out


def _np_sequence_masked_tis(old, roll, mask, low=0.5, high=5.0):
  lr = _np_lr(old, roll)
  out = np.zeros(lr.shape)
  for row in np.ndindex(lr.shape[:-1]):
    valid = [t for t in range(lr.shape[-1]) if mask[row][t] > 0]
    n = sum(mask[row][t] for t in valid)
    mean = sum(lr[row][t] * mask[row][t] for t in valid) / n if n else 0.0
    if low <= math.exp(mean) <= high:
      for t in valid:
        out[row][t] = math.exp(lr[row][t]) * mask[row][t]
  return out


def _np_normalize(w, mask):
  w = np.where(mask > 0, w.astype(np.float64), 0.0)
  mean = (w * mask).sum() / mask.sum()
  return (w / mean if mean > 1e-8 else w) * mask


NP_REFS = {
  "token_tis": _np_token_tis,
  "sequence_tis": _np_sequence_tis,
  "icepop": _np_icepop,
  "sequence_masked_tis": _np_sequence_masked_tis,
}


def _random_case(seed, shape=(3, 4, 7), scale=0.8):
  rng = np.random.default_rng(seed)
  old = rng.normal(-1.0, 1.0, shape).astype(np.float32)
  roll = (old + rng.normal(0.0, scale, shape)).astype(np.float32)
  mask = (rng.uniform(size=shape) < 0.7).astype(np.float32)
  mask[0, 0] = 0.0  # an empty sequence
  return old, roll, mask


# ----------------------------------------------------------------------------
# Hand-worked values.


def test_token_tis_hand_values():
  # rho = [1, 3, 0.25, pad] -> min(rho, 2) = [1, 2, 0.25], pad -> 0.
  got = _jit(masks.token_tis)(OLD, ROLL, MASK)
  np.testing.assert_allclose(got, [[1.0, 2.0, 0.25, 0.0]], rtol=1e-6)


def test_sequence_tis_hand_values():
  # sum lr = 0 + ln 3 + ln 0.25 = ln 0.75 -> w = min(0.75, 2) on every token.
  got = _jit(masks.sequence_tis)(OLD, ROLL, MASK)
  np.testing.assert_allclose(got, [[0.75, 0.75, 0.75, 0.0]], rtol=1e-6)
  # With threshold 0.5 the weight is truncated to 0.5.
  got = _jit(masks.sequence_tis, threshold=0.5)(OLD, ROLL, MASK)
  np.testing.assert_allclose(got, [[0.5, 0.5, 0.5, 0.0]], rtol=1e-6)


def test_icepop_hand_values():
  # rho = [1, 3, 0.25]: 0.25 < 0.5 is dropped, 3 is kept untruncated.
  got = _jit(masks.icepop)(OLD, ROLL, MASK)
  np.testing.assert_allclose(got, [[1.0, 3.0, 0.0, 0.0]], rtol=1e-6)
  # [low, high] = [0.2, 2]: now 3 is dropped and 0.25 kept.
  got = _jit(masks.icepop, low=0.2, high=2.0)(OLD, ROLL, MASK)
  np.testing.assert_allclose(got, [[1.0, 0.0, 0.25, 0.0]], rtol=1e-6)


def test_sequence_masked_tis_hand_values():
  # Row 0: mean lr = ln(0.75) / 3 -> g = 0.75^(1/3) = 0.909 in [0.5, 5]:
  #   keep the untruncated token ratios [1, 3, 0.25].
  # Row 1: lr = [ln 8, ln 8] -> g = 8 > 5: the whole sequence is dropped.
  old = np.concatenate([OLD, [[LN(8.0), LN(8.0), 0.0, 0.0]]]).astype(np.float32)
  mask = np.concatenate([MASK, [[1.0, 1.0, 0.0, 0.0]]]).astype(np.float32)
  got = _jit(masks.sequence_masked_tis)(old, np.zeros_like(old), mask)
  expected = [[1.0, 3.0, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]]
  np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_normalize_weights_hand_values():
  # Valid weights [1, 2, 0.25], mean 3.25 / 3 -> w * 3 / 3.25 = w * 12 / 13.
  w = np.array([[1.0, 2.0, 0.25, 7.0]], np.float32)
  got = jax.jit(masks.normalize_weights)(w, MASK)
  np.testing.assert_allclose(got, [[12 / 13, 24 / 13, 3 / 13, 0.0]], rtol=1e-6)
  # All-zero weights: mean 0 <= 1e-8, left unchanged (verl).
  got = jax.jit(masks.normalize_weights)(np.zeros_like(w), MASK)
  np.testing.assert_array_equal(got, np.zeros_like(w))


# ----------------------------------------------------------------------------
# Random cases against the numpy references.


@pytest.mark.parametrize("name", ROLLOUT_FNS)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_values_match_numpy(name, seed):
  old, roll, mask = _random_case(seed)
  got = _jit(ROLLOUT_FNS[name])(old, roll, mask)
  np.testing.assert_allclose(
    got, NP_REFS[name](old, roll, mask), rtol=1e-5, atol=1e-7
  )


@pytest.mark.parametrize(
  "name,kw",
  [
    ("token_tis", {"threshold": 1.3}),
    ("sequence_tis", {"threshold": 5.0}),
    ("icepop", {"low": 0.8, "high": 1.25}),
    ("sequence_masked_tis", {"low": 0.9, "high": 1.1}),
  ],
)
def test_hyperparameters_match_numpy(name, kw):
  old, roll, mask = _random_case(2, scale=0.3)
  got = _jit(ROLLOUT_FNS[name], **kw)(old, roll, mask)
  expected = NP_REFS[name](old, roll, mask, **kw)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_normalize_weights_matches_numpy():
  old, roll, mask = _random_case(3)
  w = _np_token_tis(old, roll, mask).astype(np.float32)
  got = jax.jit(masks.normalize_weights)(w, mask)
  np.testing.assert_allclose(got, _np_normalize(w, mask), rtol=1e-5)
  np.testing.assert_allclose((got * mask).sum() / mask.sum(), 1.0, rtol=1e-5)


def test_icepop_keeps_exactly_the_tokens_inside_the_band():
  # verl token_k1-style rejection: the kept set is {t : low <= rho_t <= high}.
  old, roll, mask = _random_case(4, shape=(16, 32), scale=1.5)
  mask = np.ones_like(mask)
  rho = np.exp(_np_lr(old, roll))
  inside = (rho >= 0.5) & (rho <= 5.0)
  assert 0 < inside.sum() < inside.size  # the case exercises both sides
  got = np.asarray(_jit(masks.icepop)(old, roll, mask))
  np.testing.assert_array_equal(got > 0, inside)
  np.testing.assert_allclose(got[inside], rho[inside], rtol=1e-5)


def test_icepop_band_is_inclusive():
  # rho = exp(0) = 1 exactly; both bounds are inclusive.
  zero = np.zeros((1, 2), np.float32)
  ones = np.ones((1, 2), np.float32)
  got = _jit(masks.icepop, low=1.0)(zero, zero, ones)
  np.testing.assert_array_equal(got, ones)
  got = _jit(masks.icepop, low=0.5, high=1.0)(zero, zero, ones)
  np.testing.assert_array_equal(got, ones)
  got = _jit(masks.sequence_masked_tis, low=1.0, high=2.0)(zero, zero, ones)
  np.testing.assert_array_equal(got, ones)


# ----------------------------------------------------------------------------
# Properties shared by every weight function.


@pytest.mark.parametrize("name", ROLLOUT_FNS)
def test_weights_are_detached(name):
  old, roll, mask = _random_case(5, scale=0.3)
  fn = ROLLOUT_FNS[name]
  w = NP_REFS[name](old, roll, mask)
  assert np.any(w > 0)
  loss = lambda o, r: jnp.sum(fn(o, r, mask) * o)  # noqa: E731
  g_old, g_roll = jax.jit(jax.grad(loss, argnums=(0, 1)))(old, roll)
  # Only the explicit `* o` factor carries a gradient: d/do = w exactly.
  np.testing.assert_allclose(g_old, w, rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(g_roll, np.zeros_like(roll))


def test_normalize_weights_is_detached():
  w = np.array([[1.0, 2.0, 0.5]], np.float32)
  m = np.ones_like(w)
  loss = lambda x: jnp.sum(masks.normalize_weights(x, m))  # noqa: E731
  grad = jax.jit(jax.grad(loss))(w)
  np.testing.assert_array_equal(grad, np.zeros_like(w))


@pytest.mark.parametrize("name", ROLLOUT_FNS)
def test_zero_where_mask_is_zero_even_with_garbage(name):
  old, roll, mask = _random_case(6)
  old = np.where(mask > 0, old, np.nan).astype(np.float32)
  roll = np.where(mask > 0, roll, np.inf).astype(np.float32)
  got = np.asarray(_jit(ROLLOUT_FNS[name])(old, roll, mask))
  assert np.all(np.isfinite(got))
  np.testing.assert_array_equal(got[mask == 0], 0.0)


@pytest.mark.parametrize("name", ROLLOUT_FNS)
def test_extreme_log_ratios_stay_finite(name):
  # A single token with lr = 100 inside a long sequence whose mean lr is small.
  old = np.zeros((2, 64), np.float32)
  old[:, 0] = 100.0
  old[1, 1] = -100.0
  got = np.asarray(
    _jit(ROLLOUT_FNS[name])(old, np.zeros_like(old), np.ones_like(old))
  )
  assert np.all(np.isfinite(got))


@pytest.mark.parametrize("name", ROLLOUT_FNS)
def test_bfloat16_inputs_give_float32(name):
  old, roll, mask = _random_case(7, scale=0.3)
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  got = _jit(ROLLOUT_FNS[name])(bf(old), bf(roll), bf(mask))
  assert got.dtype == jnp.float32
  assert np.all(np.isfinite(np.asarray(got)))
  ref = NP_REFS[name](
    np.asarray(bf(old), np.float32), np.asarray(bf(roll), np.float32), mask
  )
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
  w = jax.jit(masks.normalize_weights)(bf(got), bf(mask))
  assert w.dtype == jnp.float32


@pytest.mark.parametrize("name", ROLLOUT_FNS)
def test_rank_polymorphic(name):
  old, roll, mask = _random_case(8, shape=(2, 3, 5))
  fn = jax.jit(ROLLOUT_FNS[name])
  got = fn(old, roll, mask)
  flat = fn(old.reshape(6, 5), roll.reshape(6, 5), mask.reshape(6, 5))
  np.testing.assert_allclose(got.reshape(6, 5), flat, rtol=1e-6)
  one = fn(old[1, 2], roll[1, 2], mask[1, 2])
  np.testing.assert_allclose(one, got[1, 2], rtol=1e-6)


def test_sharded_over_prompts_equals_single_device():
  old, roll, mask = _random_case(9, shape=(8, 2, 6))
  mesh = jax.make_mesh((8,), ("data",))
  sharding = jax.sharding.NamedSharding(
    mesh, jax.sharding.PartitionSpec("data")
  )
  put = lambda x: jax.device_put(x, sharding)  # noqa: E731
  for name, fn in ROLLOUT_FNS.items():
    got = jax.jit(fn)(put(old), put(roll), put(mask))
    ref = NP_REFS[name](old, roll, mask)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7, err_msg=name)
  w = _np_token_tis(old, roll, mask).astype(np.float32)
  np.testing.assert_allclose(
    jax.jit(masks.normalize_weights)(put(w), put(mask)),
    _np_normalize(w, mask),
    rtol=1e-5,
  )


# ----------------------------------------------------------------------------
# Argument checks.


@pytest.mark.parametrize("fn", [masks.token_tis, masks.sequence_tis])
@pytest.mark.parametrize("threshold", [0.0, -1.0])
def test_bad_threshold_raises(fn, threshold):
  with pytest.raises(ValueError, match="threshold"):
    fn(OLD, ROLL, MASK, threshold=threshold)


@pytest.mark.parametrize("fn", [masks.icepop, masks.sequence_masked_tis])
def test_bad_band_raises(fn):
  with pytest.raises(ValueError, match="low"):
    fn(OLD, ROLL, MASK, low=-0.1)
  with pytest.raises(ValueError, match="high"):
    fn(OLD, ROLL, MASK, low=2.0, high=2.0)
  with pytest.raises(ValueError, match="high"):
    fn(OLD, ROLL, MASK, low=2.0, high=1.0)


@pytest.mark.parametrize("name", ROLLOUT_FNS)
def test_shape_mismatch_raises(name):
  with pytest.raises(ValueError, match="rollout_logp_BT"):
    ROLLOUT_FNS[name](OLD, ROLL[:, :3], MASK)
  with pytest.raises(ValueError, match="mask_BT"):
    masks.normalize_weights(OLD, MASK[:, :3])
