"""Group advantage estimators: hand values, numpy references, properties."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
import numpy as np
import pytest

from rljax import advantages

# ---------------------------------------------------------------------------
# Independent float64 references: loops over ragged groups.
# ---------------------------------------------------------------------------


def _ragged(rewards, mask):
  """Rows of the flattened [N, G] arrays as lists of valid values."""
  r = np.asarray(rewards, np.float64).reshape(-1, np.shape(rewards)[-1])
  m = np.asarray(mask).reshape(r.shape) != 0
  return [row[keep] for row, keep in zip(r, m, strict=True)], m


def _unragged(values, m, shape):
  out = np.zeros(m.shape)
  for i, v in enumerate(values):
    out[i, m[i]] = v
  return out.reshape(shape)


def _np_centred(g):
  return g - g.mean() if len(g) >= 2 else np.zeros(len(g))


def np_grpo(rewards, mask, eps=1e-6):
  groups, m = _ragged(rewards, mask)
  out = []
  for g in groups:
    if len(g) < 2:
      out.append(np.zeros(len(g)))
    else:
      out.append((g - g.mean()) / (np.std(g, ddof=1) + eps))
  return _unragged(out, m, np.shape(rewards))


def np_dr_grpo(rewards, mask):
  groups, m = _ragged(rewards, mask)
  return _unragged([_np_centred(g) for g in groups], m, np.shape(rewards))


def np_batch_std(rewards, mask, eps=1e-4):
  groups, m = _ragged(rewards, mask)
  std = np.std(np.concatenate(groups), ddof=1)
  out = [_np_centred(g) / (std + eps) for g in groups]
  return _unragged(out, m, np.shape(rewards))


def np_rloo(rewards, mask):
  groups, m = _ragged(rewards, mask)
  out = []
  for g in groups:
    adv = np.zeros(len(g))
    if len(g) >= 2:
      for i in range(len(g)):
        adv[i] = g[i] - np.mean(np.delete(g, i))
    out.append(adv)
  return _unragged(out, m, np.shape(rewards))


def np_opo(rewards, lengths, mask):
  groups, m = _ragged(rewards, mask)
  lens, _ = _ragged(lengths, mask)
  out = []
  for g, n in zip(groups, lens, strict=True):
    if len(g) < 2:
      out.append(np.zeros(len(g)))
    else:
      out.append(g - (n * g).sum() / n.sum())
  return _unragged(out, m, np.shape(rewards))


def np_gpg(rewards, mask):
  groups, m = _ragged(rewards, mask)
  flat = np.concatenate(groups)
  alpha = len(flat) / max(np.count_nonzero(flat), 1)
  out = [alpha * _np_centred(g) for g in groups]
  return _unragged(out, m, np.shape(rewards))


def np_pass_at_k(rewards, mask, normalize=True, eps=1e-6):
  groups, m = _ragged(rewards, mask)
  out = []
  for g in groups:
    adv = np.zeros(len(g))
    if len(g) >= 2:
      best = int(np.argmax(g))  # numpy's argmax also returns the first
      gap = g[best] - max(g[j] for j in range(len(g)) if j != best)
      adv[best] = gap / (np.std(g, ddof=1) + eps) if normalize else gap
    out.append(adv)
  return _unragged(out, m, np.shape(rewards))


def np_remax(rewards, baseline, mask):
  r = np.asarray(rewards, np.float64)
  b = np.asarray(baseline, np.float64)[..., None]
  return np.where(np.asarray(mask) != 0, r - b, 0.0)


def np_gdpo(rewards_pgk, mask, weights=None, eps=1e-4):
  r = np.asarray(rewards_pgk, np.float64)
  k = r.shape[-1]
  w = np.ones(k) if weights is None else np.asarray(weights, np.float64)
  s = sum(w[j] * np_grpo(r[..., j], mask, eps) for j in range(k))
  groups, m = _ragged(s, mask)
  scored = np.concatenate([g for g in groups if len(g) >= 2])
  mean, std = scored.mean(), np.std(scored, ddof=1)
  out = [(g - mean) / (std + eps) if len(g) >= 2 else 0 * g for g in groups]
  return _unragged(out, m, s.shape)


# ---------------------------------------------------------------------------
# Uniform calling convention: fn(rewards, mask) for every estimator. The
# extra inputs of opo (lengths), remax (baseline) and gdpo (K rewards) are
# derived from the valid rewards only, so padding cannot change them.
# ---------------------------------------------------------------------------


def _lengths(r, xp=jnp):
  return 1.0 + xp.abs(xp.round(3.0 * r))


def _k_rewards(r, xp=jnp):
  return xp.stack([r, xp.sin(3.0 * r), r * r], axis=-1)


def _baseline(r, m, xp=jnp):
  valid = xp.asarray(m if m is not None else xp.ones_like(r)) != 0
  total = xp.sum(xp.where(valid, r, 0.0), axis=-1)
  return 0.5 * total / xp.maximum(xp.sum(valid, axis=-1), 1) + 0.1


W = np.array([1.0, 0.5, 2.0])

JAX = {
  "grpo": advantages.grpo,
  "dr_grpo": advantages.dr_grpo,
  "batch_std": advantages.batch_std,
  "rloo": advantages.rloo,
  "opo": lambda r, m: advantages.opo(r, _lengths(r), m),
  "gpg": advantages.gpg,
  "pass_at_k": advantages.pass_at_k,
  "remax": lambda r, m: advantages.remax(r, _baseline(r, m), m),
  "gdpo": lambda r, m: advantages.gdpo(_k_rewards(r), m, weights=W),
}


@jax.jit
def _all_estimators(rewards, mask):
  return {name: fn(rewards, mask) for name, fn in JAX.items()}


def _one(name):
  return lambda rewards, mask: _all_estimators(rewards, mask)[name]


# Every estimator in one jitted function: each input signature compiles once
# for all of them, which keeps this file fast.
JIT = {name: _one(name) for name in JAX}

NUMPY = {
  "grpo": np_grpo,
  "dr_grpo": np_dr_grpo,
  "batch_std": np_batch_std,
  "rloo": np_rloo,
  "opo": lambda r, m: np_opo(r, _lengths(r, np), m),
  "gpg": np_gpg,
  "pass_at_k": np_pass_at_k,
  "remax": lambda r, m: np_remax(r, _baseline(r, m, np), m),
  "gdpo": lambda r, m: np_gdpo(_k_rewards(r, np), m, weights=W),
}

BATCH_COUPLED = {"batch_std", "gpg", "gdpo"}
PER_GROUP = sorted(set(JAX) - BATCH_COUPLED)

# Valid samples per group of a [7, 7] batch: full, empty, singleton and
# ragged groups (few exact sizes, so that "alone" compiles little); the last
# group is full and constant (zero variance).
SIZES = (7, 0, 1, 3, 2, 3, 7)


def _mixed_batch(seed):
  """[7, 7] random rewards and a mask of SIZES valid samples, holes anywhere."""
  rng = np.random.default_rng(seed)
  rewards = rng.normal(size=(len(SIZES), 7)).astype(np.float32)
  rewards[0, :2] = 0.0  # exact zeros matter to gpg
  rewards[-1] = 1.0
  mask = np.zeros_like(rewards)
  for p, n in enumerate(SIZES):
    mask[p, rng.permutation(7)[:n]] = 1.0
  return rewards, mask


def _stacked_batch():
  """[3, 7, 7]: three `_mixed_batch`es along a leading axis."""
  batches = [_mixed_batch(seed) for seed in range(3)]
  return np.stack([b[0] for b in batches]), np.stack([b[1] for b in batches])


# ---------------------------------------------------------------------------
# Hand-worked values.
# ---------------------------------------------------------------------------

# Group [1, 0, 0, 1]: mean 0.5; unbiased var = 4 * 0.25 / 3 = 1/3.
R = np.array([[1.0, 0.0, 0.0, 1.0]], np.float32)
SIGN = np.array([[1.0, -1.0, -1.0, 1.0]])


def test_hand_values_grpo_rloo_dr_grpo():
  # grpo: +-0.5 / (sqrt(1/3) + 1e-6) = +-0.5 / 0.5773513 = +-0.8660239
  np.testing.assert_allclose(
    jax.jit(advantages.grpo)(R), 0.8660239 * SIGN, rtol=1e-6
  )
  # dr_grpo: 1 - 0.5 = 0.5, 0 - 0.5 = -0.5
  np.testing.assert_allclose(jax.jit(advantages.dr_grpo)(R), 0.5 * SIGN)
  # rloo: 1 - (0 + 0 + 1) / 3 = 2/3; 0 - (1 + 0 + 1) / 3 = -2/3
  np.testing.assert_allclose(
    jax.jit(advantages.rloo)(R), 2.0 / 3.0 * SIGN, rtol=1e-6
  )


def test_hand_values_other_estimators():
  rewards = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
  # gpg: alpha = 8 samples / 2 non-zero = 4; A = 4 * (+-0.5) = +-2; the
  # all-zero group has R - mean = 0.
  np.testing.assert_allclose(
    jax.jit(advantages.gpg)(rewards), [[2.0, -2.0, -2.0, 2.0], [0.0] * 4]
  )
  # batch_std: batch mean 2/8 = 0.25; unbiased var over the 8 rewards =
  # (2 * 0.75^2 + 6 * 0.25^2) / 7 = 1.5 / 7; std = 0.4629100;
  # A = +-0.5 / (0.4629100 + 1e-4) = +-0.5 / 0.4630100 = +-1.0798902.
  np.testing.assert_allclose(
    jax.jit(advantages.batch_std)(rewards),
    [[1.0798902, -1.0798902, -1.0798902, 1.0798902], [0.0] * 4],
    rtol=1e-6,
  )
  # opo: b = (3 * 1 + 1 * 0) / (3 + 1) = 0.75; A = [1 - 0.75, 0 - 0.75].
  np.testing.assert_allclose(
    jax.jit(advantages.opo)(np.array([1.0, 0.0]), np.array([3.0, 1.0])),
    [0.25, -0.75],
  )
  # remax: greedy reward 0.25 is the baseline: [1 - 0.25, 0 - 0.25].
  np.testing.assert_allclose(
    jax.jit(advantages.remax)(np.array([[1.0, 0.0]]), np.array([0.25])),
    [[0.75, -0.25]],
  )


def test_hand_values_pass_at_k():
  # Best is index 1 (0.9), second best 0.5: gap 0.4; only index 1 gets it.
  rewards = np.array([0.2, 0.9, 0.5, 0.1], np.float32)
  raw = jax.jit(lambda r: advantages.pass_at_k(r, normalize=False))(rewards)
  np.testing.assert_allclose(raw, [0.0, 0.4, 0.0, 0.0], rtol=1e-6)
  # mean 0.425; unbiased var = (0.225^2 + 0.475^2 + 0.075^2 + 0.325^2) / 3
  # = (0.050625 + 0.225625 + 0.005625 + 0.105625) / 3 = 0.3875 / 3
  # = 0.1291667; std = 0.3593976; 0.4 / (0.3593976 + 1e-6) = 1.1129701.
  normed = jax.jit(advantages.pass_at_k)(rewards)
  np.testing.assert_allclose(normed, [0.0, 1.1129701, 0.0, 0.0], rtol=1e-6)
  # Tie at the top: the first maximum gets R_max - R_2nd = 0, all get 0.
  np.testing.assert_array_equal(
    jax.jit(advantages.pass_at_k)(R), np.zeros((1, 4))
  )


def test_hand_values_gdpo():
  # K = 2 rewards in one group, eps = 0 so that the arithmetic is exact.
  # z_1 = (+-0.5) / sqrt(1/3) = +-a with a = sqrt(3)/2;
  # r_2 = [0, 0, 0, 1]: mean 0.25, var (3 * 0.0625 + 0.5625) / 3 = 0.25,
  # z_2 = [-0.5, -0.5, -0.5, 1.5]. S = [a - .5, -a - .5, -a - .5, a + 1.5],
  # mean 0; sum S^2 = (1 - a) + 2 (1 + a) + (3 + 3a) = 6 + 4a;
  # std = sqrt((6 + 4a) / 3) = 1.7761477.
  a = np.sqrt(3.0) / 2.0
  rewards = np.array([[[1, 0], [0, 0], [0, 0], [1, 1]]], np.float32)
  s = np.array([a - 0.5, -a - 0.5, -a - 0.5, a + 1.5])
  gdpo = jax.jit(functools.partial(advantages.gdpo, eps=0.0))
  got = gdpo(rewards, weights=np.ones(2))
  np.testing.assert_allclose(got, [s / 1.7761477], rtol=1e-6)
  # Weights scale each z before the sum: w = [0, 1] leaves z_2 alone, whose
  # z-score over the batch is z_2 / std(z_2) = z_2 / 1.
  got = gdpo(rewards, weights=np.array([0.0, 1.0]))
  np.testing.assert_allclose(got, [[-0.5, -0.5, -0.5, 1.5]], rtol=1e-6)


# ---------------------------------------------------------------------------
# Numpy references, masks of mixed group sizes, gradients.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", JAX)
def test_values_match_numpy(name):
  rewards, mask = _stacked_batch()
  got = JIT[name](rewards, mask)
  assert got.dtype == jnp.float32
  expected = NUMPY[name](rewards, mask)
  np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)
  # Invalid samples and groups with < 2 valid samples (remax: < 1) get 0.
  minimum = 1 if name == "remax" else 2
  dropped = (mask == 0) | (mask.sum(-1, keepdims=True) < minimum)
  np.testing.assert_array_equal(np.asarray(got)[dropped], 0.0)


def test_pass_at_k_without_normalisation_matches_numpy():
  rewards, mask = _stacked_batch()
  got = jax.jit(functools.partial(advantages.pass_at_k, normalize=False))
  expected = np_pass_at_k(rewards, mask, normalize=False)
  np.testing.assert_allclose(got(rewards, mask), expected, atol=1e-6)


# The None path is shared (a mask of ones); a few estimators suffice.
@pytest.mark.parametrize("name", ["grpo", "gdpo"])
def test_values_match_numpy_without_mask(name):
  rewards, _ = _stacked_batch()
  got = jax.jit(JAX[name])(rewards, None)
  expected = NUMPY[name](rewards, np.ones_like(rewards))
  np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)


@jax.jit
def _per_group_estimators(rewards):
  return {name: JAX[name](rewards, None) for name in PER_GROUP}


def _alone(name, rewards, mask):
  """Each group computed alone at its exact size, then re-padded."""
  size = rewards.shape[-1]
  flat_r, flat_m = rewards.reshape(-1, size), mask.reshape(-1, size) != 0
  out = np.zeros(flat_r.shape, np.float32)
  counts = flat_m.sum(-1)
  for n in np.unique(counts):
    if n < (1 if name == "remax" else 2):
      continue
    rows = np.nonzero(counts == n)[0]
    exact = np.stack([flat_r[i][flat_m[i]] for i in rows])  # [groups, n]
    if n == 1:  # remax only
      adv = jax.jit(JAX[name])(exact, None)
    else:
      adv = _per_group_estimators(exact)[name]
    for j, i in enumerate(rows):
      out[i, flat_m[i]] = adv[j]
  return out.reshape(rewards.shape)


@pytest.mark.parametrize("name", PER_GROUP)
def test_mixed_sizes_equal_each_group_alone(name):
  rewards, mask = _stacked_batch()
  got = JIT[name](rewards, mask)
  # Each group in a batch or alone: group reductions of G float32 values
  # (|adv| <= ~3) in another order can differ by ~G * eps32 * |adv| ~ 3e-6.
  np.testing.assert_allclose(got, _alone(name, rewards, mask), atol=1e-5)


def test_mixed_sizes_batch_coupled_estimators():
  # Group parts computed alone at exact size, batch statistics from the
  # concatenation of the valid samples.
  rewards, mask = _stacked_batch()
  valid = rewards[mask != 0]
  centred = _alone("dr_grpo", rewards, mask)
  std = np.std(valid.astype(np.float64), ddof=1)
  np.testing.assert_allclose(
    JIT["batch_std"](rewards, mask), centred / (std + 1e-4), atol=1e-5
  )
  alpha = valid.size / max(np.count_nonzero(valid), 1)
  np.testing.assert_allclose(
    JIT["gpg"](rewards, mask), alpha * centred, atol=1e-5
  )
  # gdpo with grpo's default eps (1e-6), so that z_k = grpo(r_k).
  k_rewards = np.asarray(_k_rewards(rewards))
  s = sum(W[k] * _alone("grpo", k_rewards[..., k], mask) for k in range(3))
  gdpo = jax.jit(functools.partial(advantages.gdpo, weights=W, eps=1e-6))
  got = gdpo(k_rewards, mask)
  scored = (mask != 0) & (mask.sum(-1, keepdims=True) >= 2)
  mean, std = s[scored].mean(), np.std(s[scored].astype(np.float64), ddof=1)
  expected = np.where(scored, (s - mean) / (std + 1e-6), 0.0)
  np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("name", JAX)
def test_padding_values_never_leak(name):
  rewards, mask = _stacked_batch()
  for pad in (np.nan, np.inf, 1e30):
    poisoned = np.where(mask != 0, rewards, pad).astype(np.float32)
    if name in ("opo", "gdpo") and not np.isfinite(pad):
      continue  # their derived inputs (lengths, K rewards) would carry it
    got = JIT[name](poisoned, mask)
    np.testing.assert_allclose(got, JIT[name](rewards, mask), atol=1e-6)


def _numpy_gradient(fn, x, step=1e-6):
  """Central finite differences of a scalar float64 numpy function."""
  grad = np.zeros_like(x)
  for idx in np.ndindex(x.shape):
    up, down = x.copy(), x.copy()
    up[idx] += step
    down[idx] -= step
    grad[idx] = (fn(up) - fn(down)) / (2 * step)
  return grad


@jax.jit
def _all_gradients(rewards, mask, cotangent):
  """d/dR sum(cotangent * A(R)) for every estimator."""
  return {
    name: jax.grad(lambda r, fn=fn: jnp.sum(cotangent * fn(r, mask)))(rewards)
    for name, fn in JAX.items()
  }


@pytest.mark.parametrize("name", JAX)
def test_gradients_match_numpy_finite_differences(name):
  rewards, mask = _mixed_batch(7)
  # Distinct rewards (no ties for pass@k), except in the constant group.
  rewards[:-1] += np.arange(rewards[:-1].size).reshape(-1, 7) * 1e-2
  rewards[0, :2] = 0.0  # exact zeros: gpg's alpha jumps when they move
  cotangent = np.random.default_rng(1).normal(size=rewards.shape)

  got = _all_gradients(rewards, mask, cotangent)[name]
  # Finite (not NaN) also at the zero-variance, singleton and empty groups.
  assert np.all(np.isfinite(got))
  # Where the estimator is differentiable: away from the fixed zeros and the
  # constant group (at zero variance grpo and pass@k have kinks).
  moved = np.ones_like(mask, bool)
  moved[0, :2] = False
  moved[-1] = False
  x = rewards.astype(np.float64)
  expected = _numpy_gradient(
    lambda r: np.sum(cotangent * NUMPY[name](r, mask)), x
  )
  np.testing.assert_allclose(got[moved], expected[moved], atol=1e-3, rtol=1e-3)
  assert np.any(np.abs(expected) > 0.1)


def test_grpo_gradient_of_sum_is_finite_and_zero():
  # z-scores of a group sum to zero whatever the rewards, so d/dR sum = 0,
  # also for a zero-variance group.
  rewards = np.array([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 1.0]])
  grad = jax.jit(jax.grad(lambda r: jnp.sum(advantages.grpo(r))))(rewards)
  np.testing.assert_allclose(grad, np.zeros_like(rewards), atol=1e-5)


# ---------------------------------------------------------------------------
# Properties.
# ---------------------------------------------------------------------------


def test_grpo_is_shift_and_scale_invariant_within_a_group():
  rewards, mask = _stacked_batch()
  rng = np.random.default_rng(0)
  scale = rng.uniform(0.1, 10.0, size=rewards.shape[:-1] + (1,))
  shift = rng.normal(size=rewards.shape[:-1] + (1,)) * 5.0
  moved = (scale * rewards + shift).astype(np.float32)
  f = jax.jit(lambda r: advantages.grpo(r, mask, eps=0.0))
  np.testing.assert_allclose(f(moved), f(rewards), atol=2e-5)
  assert np.any(np.abs(f(rewards)) > 0.5)


@pytest.mark.parametrize("name", sorted(set(JAX) - {"remax"}))
def test_constant_groups_get_exactly_zero(name):
  # float32 means of e.g. seven 0.7s are not exactly 0.7; without care the
  # rounding error is divided by std + eps ~ 1e-6 and becomes O(0.05).
  _, mask = _stacked_batch()
  for value in (0.7, 0.1, 1.0 / 3.0):
    rewards = np.full(mask.shape, value, np.float32)
    np.testing.assert_array_equal(JIT[name](rewards, mask), 0.0)


@pytest.mark.parametrize("name", ["dr_grpo", "rloo"])
def test_centred_estimators_sum_to_zero_per_group(name):
  rewards, mask = _stacked_batch()
  adv = JIT[name](rewards, mask)
  np.testing.assert_allclose(jnp.sum(adv * mask, -1), 0.0, atol=1e-5)
  assert np.any(np.abs(adv) > 0.1)  # not trivially zero


def test_rloo_is_dr_grpo_scaled_by_n_over_n_minus_1():
  rewards, mask = _stacked_batch()
  n = mask.sum(-1, keepdims=True)
  ratio = np.where(n >= 2, n / np.maximum(n - 1, 1), 0.0)
  np.testing.assert_allclose(
    JIT["rloo"](rewards, mask),
    ratio * JIT["dr_grpo"](rewards, mask),
    atol=1e-6,
  )


_vmapped_estimators = jax.jit(jax.vmap(_all_estimators))


@pytest.mark.parametrize("name", JAX)
def test_vmap_over_a_leading_axis(name):
  rewards, mask = _stacked_batch()
  mapped = _vmapped_estimators(rewards, mask)[name]
  if name in BATCH_COUPLED:  # batch statistics are per call
    each = [NUMPY[name](rewards[i], mask[i]) for i in range(len(rewards))]
    np.testing.assert_allclose(mapped, np.stack(each), atol=2e-5)
  else:
    # vmap vs one batched call: the same float32 group reductions, maybe
    # ordered differently (~G * eps32 * |adv|).
    np.testing.assert_allclose(mapped, JIT[name](rewards, mask), atol=1e-5)


@pytest.mark.parametrize("name", JAX)
def test_bfloat16_inputs_give_finite_float32(name):
  rewards, mask = _stacked_batch()
  low = jnp.asarray(rewards, jnp.bfloat16)
  got = JIT[name](low, jnp.asarray(mask, jnp.bfloat16))
  assert got.dtype == jnp.float32
  assert np.all(np.isfinite(got))
  # Derived inputs (lengths, K rewards) are computed in bfloat16 too.
  expected = JIT[name](np.asarray(low, np.float32), mask)
  np.testing.assert_allclose(got, expected, atol=5e-2)


@pytest.mark.parametrize("name", JAX)
def test_sharded_over_prompts_on_eight_devices(name):
  rewards = np.concatenate([_mixed_batch(0)[0], _mixed_batch(1)[0][:1]])
  mask = np.concatenate([_mixed_batch(0)[1], _mixed_batch(1)[1][:1]])
  with jax.set_mesh(jax.make_mesh((8,), ("data",))):
    spec = PartitionSpec("data")
    r, m = jax.device_put(rewards, spec), jax.device_put(mask, spec)
    got = JIT[name](r, m)
    assert jax.typeof(got).sharding.spec[0] == "data"
  np.testing.assert_allclose(got, NUMPY[name](rewards, mask), atol=2e-5)


# ---------------------------------------------------------------------------
# Errors.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(set(JAX) - {"remax", "gdpo"}))
def test_static_group_of_one_raises_naming_the_argument(name):
  with pytest.raises(ValueError, match=r"rewards_PG has shape \(3, 1\)"):
    JAX[name](np.ones((3, 1), np.float32), None)


def test_gdpo_group_of_one_raises_and_remax_allows_it():
  with pytest.raises(ValueError, match=r"rewards_PGK\[..., 0\].*\(3, 1\)"):
    advantages.gdpo(np.ones((3, 1, 2), np.float32))
  got = advantages.remax(np.array([[2.0], [1.0]]), np.array([1.0, 1.0]))
  np.testing.assert_allclose(got, [[1.0], [0.0]])


def test_bad_inputs_raise_naming_the_argument():
  r = np.ones((2, 4), np.float32)
  with pytest.raises(ValueError, match="sample_mask_PG"):
    advantages.grpo(r, np.ones((2, 3)))
  with pytest.raises(ValueError, match="eps must be >= 0"):
    advantages.grpo(r, eps=-1.0)
  with pytest.raises(ValueError, match="eps must be >= 0"):
    advantages.batch_std(r, eps=-1.0)
  with pytest.raises(ValueError, match="lengths_PG"):
    advantages.opo(r, np.ones((2, 3)))
  with pytest.raises(ValueError, match="baseline_P"):
    advantages.remax(r, np.ones((3,)))
  with pytest.raises(ValueError, match="baseline_P"):
    advantages.remax(r, np.ones((2, 4)))
  with pytest.raises(ValueError, match="weights"):
    advantages.gdpo(np.ones((2, 4, 3)), weights=[1.0, 2.0])
  with pytest.raises(ValueError, match="rewards_PGK"):
    advantages.gdpo(np.ones((4,)))
  with pytest.raises(ValueError, match="sample_mask_PG"):
    advantages.gdpo(np.ones((2, 4, 3)), np.ones((2, 4, 3)))
