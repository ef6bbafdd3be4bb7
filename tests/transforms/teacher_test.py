"""Batch stages fed by extra scoring passes: RTO token rewards, DCPO-dist
mixing, VCPO ESS / optimal baseline, AEPO stream advantages; their presets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import testing
from rljax import transforms
from rljax.algorithms import _teacher as presets
from rljax.transforms import _teacher as T

SHAPE = (2, 3, 5)


def _mask(shape=SHAPE, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, shape[-1] + 1, shape[:-1])
  lengths.flat[0] = shape[-1]
  return (np.arange(shape[-1]) < lengths[..., None]).astype(np.float32)


def _garbage(x, mask, value=80.0):
  """Padded positions hold garbage that must not leak."""
  return np.where(mask > 0, x, value).astype(np.float32)


def _last_token(mask):
  """[..., T] one-hot of the last valid token (numpy)."""
  lengths = mask.sum(-1).astype(int)
  t = np.arange(mask.shape[-1])
  return ((t == (lengths[..., None] - 1)) & (lengths[..., None] > 0)) * 1.0


# --------------------------------------------------------------------------
# RTO


def _rto_ref(teacher, ref, old, rewards, mask, b1, b2, b3, dclip, rclip):
  teacher, ref, old = (np.asarray(a, np.float64) for a in (teacher, ref, old))
  dpo = b1 * (teacher - ref)
  if dclip is not None:
    dpo = np.clip(dpo, -dclip, dclip)
  r = np.asarray(rewards, np.float64)
  if rclip is not None:
    r = np.clip(r, -rclip, rclip)
  out = (dpo - b2 * (old - ref)) * mask + b3 * r[..., None] * _last_token(mask)
  return np.where(mask > 0, out, 0.0)


def _rto_data(seed=0):
  rng = np.random.default_rng(seed)
  mask = _mask(seed=seed)
  ref = rng.uniform(-3, -0.1, SHAPE)
  teacher = ref + rng.normal(0, 1.5, SHAPE)
  old = ref + rng.normal(0, 0.5, SHAPE)
  rewards = rng.normal(0, 8.0, SHAPE[:-1])
  return (
    _garbage(teacher, mask),
    _garbage(ref, mask, -90.0),
    _garbage(old, mask),
    rewards.astype(np.float32),
    mask,
  )


@pytest.mark.parametrize(
  "hyper",
  [
    dict(),
    dict(beta1=0.3, beta2=0.1, beta3=2.0, dpo_clip=None, reward_clip=None),
  ],
)
def test_rto_token_rewards_match_numpy_values_and_gradients(hyper):
  teacher, ref, old, rewards, mask = _rto_data()
  full = dict(
    beta1=0.05, beta2=0.01, beta3=1.0, dpo_clip=0.05, reward_clip=10.0
  )
  full.update(hyper)
  fn = jax.jit(lambda *a: T.rto_token_rewards(*a, **full))
  got = fn(teacher, ref, old, rewards, mask)
  want = _rto_ref(teacher, ref, old, rewards, mask, *full.values())
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # Gradients w.r.t. the teacher and old log-probs: beta1 inside the clip
  # (0 outside), -beta2; 0 on padded tokens.
  weights = np.random.default_rng(1).normal(size=SHAPE)

  def total(t, o):
    return jnp.sum(
      T.rto_token_rewards(t, ref, o, rewards, mask, **full) * weights
    )

  g_t, g_o = jax.jit(jax.grad(total, argnums=(0, 1)))(teacher, old)
  inside = np.ones(SHAPE)
  if full["dpo_clip"] is not None:
    d = full["beta1"] * (teacher.astype(np.float64) - ref)
    inside = np.abs(d) < full["dpo_clip"]
  np.testing.assert_allclose(
    g_t, full["beta1"] * inside * weights * mask, rtol=1e-5, atol=1e-7
  )
  np.testing.assert_allclose(
    g_o, -full["beta2"] * weights * mask, rtol=1e-5, atol=1e-7
  )


def test_rto_by_hand():
  mask = np.array([[1.0, 1.0, 0.0]])
  teacher = np.array([[-1.0, -2.0, 5.0]])
  ref = np.array([[-1.5, -1.0, 5.0]])
  old = np.array([[-1.2, -1.4, 5.0]])
  r = T.rto_token_rewards(teacher, ref, old, np.array([2.0]), mask)
  # dpo: 0.05*0.5 = 0.025; 0.05*(-1.0) = -0.05 (at the clip)
  # kl:  0.01*(-1.2+1.5) = 0.003; 0.01*(-1.4+1.0) = -0.004
  # t0: 0.025 - 0.003 = 0.022;  t1: -0.05 + 0.004 + 2 = 1.954;  t2: padded
  np.testing.assert_allclose(r, [[0.022, 1.954, 0.0]], rtol=1e-5, atol=1e-7)


def test_rto_stage_feeds_gae_exactly_rto_rewards():
  batch = testing.random_batch(3)
  stage = transforms.rto_rewards(beta1=0.2, beta2=0.05, beta3=0.5)
  prepared, _ = jax.jit(stage.prepare)(batch, stage.init())
  got = transforms.token_rewards(prepared)
  want = T.rto_token_rewards(
    batch.teacher_logp_PGT,
    batch.ref_logp_PGT,
    batch.old_logp_PGT,
    batch.rewards_PG,
    batch.mask_PGT,
    beta1=0.2,
    beta2=0.05,
    beta3=0.5,
  )
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_rto_without_dpo_and_kl_is_the_sparse_reward():
  """beta1 = beta2 = 0: PPO's sparse reward on the last token only; a
  teacher preferring the token more than the reference raises its reward."""
  teacher, ref, old, rewards, mask = _rto_data(2)
  sparse = T.rto_token_rewards(
    teacher, ref, old, rewards, mask, beta1=0.0, beta2=0.0, reward_clip=None
  )
  np.testing.assert_allclose(
    sparse, rewards[..., None] * _last_token(mask), atol=1e-6
  )
  base = T.rto_token_rewards(teacher, ref, old, rewards, mask, dpo_clip=None)
  up = T.rto_token_rewards(
    teacher + 0.5, ref, old, rewards, mask, dpo_clip=None
  )
  assert np.all(np.asarray(up - base)[mask > 0] > 0)


def test_rto_bfloat16_inputs_give_finite_float32():
  teacher, ref, old, rewards, mask = _rto_data()
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  out = T.rto_token_rewards(bf(teacher), bf(ref), bf(old), bf(rewards), mask)
  assert out.dtype == jnp.float32 and np.all(np.isfinite(out))


# --------------------------------------------------------------------------
# DCPO-dist


def _dcpo_batch(seed=0, shift=0.0):
  batch = testing.random_batch(seed, prompts=3, samples=4, tokens=5)
  rng = np.random.default_rng(seed + 10)
  old = np.asarray(batch.old_logp_PGT)
  high = old + rng.normal(0, 0.3, batch.shape)
  low = old + rng.normal(0, 0.3, batch.shape)
  sample_mask = np.ones(batch.shape[:2], np.float32)
  sample_mask[0, 1] = 0.0
  return batch._replace(
    old_logp_PGT=np.asarray(batch.old_logp_PGT) + shift,
    sample_mask_PG=sample_mask,
  ).with_extra(
    old_logp_t_high_PGT=high.astype(np.float32),
    old_logp_t_low_PGT=low.astype(np.float32),
  )


def _dcpo_ref(batch, h_base=0.5, cap=0.1, thr=0.05):
  mask = (
    np.asarray(batch.mask_PGT, np.float64) * batch.sample_mask_PG[..., None]
  )
  old = np.asarray(batch.old_logp_PGT, np.float64)
  h = (-old * mask).sum() / mask.sum()
  samples = np.asarray(batch.sample_mask_PG, np.float64)
  b = (np.asarray(batch.rewards_PG) > thr) * samples
  p = b.sum() / samples.sum()
  a = min(abs(h_base - h), cap) / p
  alpha = a / (1 + a)
  # The GRPO advantage of the chain: unbiased std over valid samples.
  r = np.asarray(batch.rewards_PG, np.float64)
  adv = np.zeros_like(r)
  for i in range(r.shape[0]):
    v = samples[i] > 0
    mu, sd = r[i, v].mean(), r[i, v].std(ddof=1)
    adv[i] = (r[i] - mu) / (sd + 1e-6)
  # T* = 1.2 (the high pass) when H <= h_base, else 0.8 (the low pass).
  tstar = batch.extra[
    "old_logp_t_high_PGT" if h <= h_base else "old_logp_t_low_PGT"
  ]
  rho = np.exp(np.asarray(tstar, np.float64) - old)
  out = (1 - alpha) * adv[..., None] + alpha * b[..., None] * rho
  return np.where(mask > 0, out, 0.0), h, alpha


@pytest.mark.parametrize("shift", [0.0, 0.6, -0.7])
def test_dcpo_dist_stage_matches_numpy(shift):
  batch = _dcpo_batch(1, shift)
  algo = rljax.Algorithm(
    rljax.chain(
      transforms.group_advantages(rljax.advantages.grpo),
      transforms.dcpo_dist_advantages(),
    ),
    rljax.aggregate.token_mean,
  )
  prepared, _ = jax.jit(algo.prepare)(batch, algo.init())
  want, h, alpha = _dcpo_ref(batch)
  assert 0 < alpha < 1
  np.testing.assert_allclose(
    prepared.advantages_PGT, want, rtol=1e-4, atol=1e-5
  )
  h_got = T.dcpo_dist_entropy(batch)
  np.testing.assert_allclose(h_got, h, rtol=1e-5)
  assert float(T.dcpo_dist_temperature(h_got)) == pytest.approx(
    1.2 if h <= 0.5 else 0.8
  )


def test_dcpo_dist_by_hand():
  # H = 0.45: gap 0.05, p = 0.25 -> a = 0.2 -> alpha = 0.2 / 1.2 = 1/6.
  np.testing.assert_allclose(T.dcpo_dist_alpha(0.45, 0.25), 1 / 6, rtol=1e-6)
  # H = 0.1: gap min(0.4, 0.1) = 0.1, p = 0.5 -> a = 0.2 -> 1/6 again.
  np.testing.assert_allclose(T.dcpo_dist_alpha(0.1, 0.5), 1 / 6, rtol=1e-6)
  assert float(T.dcpo_dist_alpha(0.3, 0.0)) == 0.0  # no correct sample
  assert float(T.dcpo_dist_temperature(0.5)) == pytest.approx(1.2)
  assert float(T.dcpo_dist_temperature(0.51)) == pytest.approx(0.8)
  # A' = (1 - 1/6) * 0.6 + 1/6 * 1 * exp(0.3 - 0.1) for a correct sample.
  out = T.dcpo_dist_mix(
    np.array([[0.6, 0.6]]),
    np.array([1.0]),
    np.array([[-0.1, -1.0]]),
    np.array([[0.2, 7.0]]),
    np.array([[1.0, 0.0]]),
    1 / 6,
  )
  np.testing.assert_allclose(
    out, [[5 / 6 * 0.6 + np.exp(0.3) / 6, 0.0]], rtol=1e-6
  )


def test_dcpo_dist_mix_gradient_and_properties():
  rng = np.random.default_rng(4)
  mask = _mask()
  adv = rng.normal(size=SHAPE).astype(np.float32)
  old = rng.uniform(-3, -0.1, SHAPE).astype(np.float32)
  tstar = (old + rng.normal(0, 0.4, SHAPE)).astype(np.float32)
  correct = (rng.uniform(size=SHAPE[:-1]) > 0.5).astype(np.float32)
  alpha = 0.3
  w = rng.normal(size=SHAPE)

  def total(ts):
    return jnp.sum(T.dcpo_dist_mix(adv, correct, old, ts, mask, alpha) * w)

  g = jax.jit(jax.grad(total))(tstar)
  rho = np.exp(tstar.astype(np.float64) - old)
  np.testing.assert_allclose(
    g, alpha * correct[..., None] * rho * w * mask, rtol=1e-5, atol=1e-7
  )
  # alpha = 0 (H at the target): the advantages are unchanged.
  same = T.dcpo_dist_mix(adv, correct, old, tstar, mask, 0.0)
  np.testing.assert_allclose(same, adv * mask, rtol=1e-6)
  # Incorrect samples are only shrunk toward 0.
  out = np.asarray(T.dcpo_dist_mix(adv, correct, old, tstar, mask, alpha))
  wrong = (correct[..., None] == 0) & (mask > 0)
  np.testing.assert_allclose(out[wrong], 0.7 * adv[wrong], rtol=1e-6)
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  out16 = T.dcpo_dist_mix(bf(adv), correct, bf(old), bf(tstar), mask, alpha)
  assert out16.dtype == jnp.float32 and np.all(np.isfinite(out16))


def test_dcpo_dist_asks_the_trainer_for_both_temperature_passes():
  batch = testing.random_batch(0)._replace(advantages_PGT=np.zeros((4, 4, 6)))
  stage = transforms.dcpo_dist_advantages(t_high=1.3, t_low=0.7)
  assert stage.rescores == (
    rljax.Rescore("old_logp_t_high_PGT", temperature=1.3),
    rljax.Rescore("old_logp_t_low_PGT", temperature=0.7),
  )
  algo = rljax.algorithms.get("dcpo_dist")
  assert [r.name for r in algo.rescores] == [
    "old_logp_t_high_PGT",
    "old_logp_t_low_PGT",
  ]
  with pytest.raises(ValueError, match="old_logp_t_high_PGT"):
    stage.prepare(batch, stage.init())
  with pytest.raises(ValueError, match="entropy must be one of"):
    transforms.dcpo_dist_advantages(entropy="true")


# --------------------------------------------------------------------------
# VCPO


def test_vcpo_ess_and_lr_scale_by_hand():
  # w = [1, 3]: (1 + 3)^2 / (2 * (1 + 9)) = 16 / 20 = 0.8
  np.testing.assert_allclose(T.vcpo_ess_ratio(np.array([1.0, 3.0])), 0.8)
  np.testing.assert_allclose(T.vcpo_lr_scale(0.8), np.sqrt(0.8), rtol=1e-6)
  np.testing.assert_allclose(T.vcpo_lr_scale(0.8, rule="linear"), 0.8)
  assert float(T.vcpo_lr_scale(0.8, base_ess_ratio=0.5)) == 1.0  # capped
  # A masked sample does not count: w = [1, 3, 100 (masked)].
  np.testing.assert_allclose(
    T.vcpo_ess_ratio(np.array([1.0, 3.0, 100.0]), np.array([1, 1, 0.0])), 0.8
  )
  # Baseline: R = [1, 0], w = [1, 2], |g|^2 = [1, 1]: weights [1, 4], b = 0.2
  b = T.vcpo_optimal_baseline(
    np.array([[1.0, 0.0]]), np.array([[1.0, 2.0]]), np.array([[1.0, 1.0]])
  )
  np.testing.assert_allclose(b, [0.2], rtol=1e-6)
  # Population std 0.5: A = [(1 - 0.2) / 0.5, (0 - 0.2) / 0.5] = [1.6, -0.4]
  adv = T.vcpo_baseline_advantages(
    np.array([[1.0, 0.0]]), np.array([[1.0, 2.0]]), np.array([[1.0, 1.0]])
  )
  np.testing.assert_allclose(adv, [[1.6, -0.4]], rtol=1e-6)


def test_vcpo_functions_match_numpy_values_and_gradients():
  rng = np.random.default_rng(5)
  mask = _mask()
  old = rng.uniform(-3, -0.1, SHAPE)
  rollout = old + rng.normal(0, 0.2, SHAPE)
  w = np.exp(((old - rollout) * mask).sum(-1))
  got_w = jax.jit(T.vcpo_sequence_weights)(
    _garbage(old, mask), _garbage(rollout, mask, -70.0), mask
  )
  np.testing.assert_allclose(got_w, w, rtol=1e-5)
  np.testing.assert_allclose(
    jax.jit(T.vcpo_ess_ratio)(got_w),
    w.sum() ** 2 / (w.size * (w**2).sum()),
    rtol=1e-5,
  )
  rewards = rng.uniform(0, 1, SHAPE[:-1])
  g2 = rng.uniform(0.5, 2.0, SHAPE[:-1])
  sm = np.ones(SHAPE[:-1])
  sm[0, 0] = 0
  weight = w**2 * g2 * sm
  b = (weight * rewards).sum(-1) / weight.sum(-1)
  fn = jax.jit(T.vcpo_optimal_baseline)
  np.testing.assert_allclose(fn(rewards, w, g2, sm), b, rtol=1e-5)
  # d b / d R_i = weight_i / sum weight.
  grad = jax.jit(
    jax.grad(lambda r: jnp.sum(T.vcpo_optimal_baseline(r, w, g2, sm)))
  )(rewards.astype(np.float32))
  np.testing.assert_allclose(
    grad, weight / weight.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7
  )
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  out = T.vcpo_baseline_advantages(bf(rewards), bf(w), bf(g2), sm)
  assert out.dtype == jnp.float32 and np.all(np.isfinite(out))


def test_vcpo_properties():
  """On-policy (w = 1) the ESS ratio is 1 and, with equal gradient norms,
  b* is the group mean; one dominant weight drives the ESS toward 1/B."""
  np.testing.assert_allclose(T.vcpo_ess_ratio(np.ones(8)), 1.0)
  w = np.ones(8)
  w[0] = 1e4
  assert float(T.vcpo_ess_ratio(w)) < 0.13
  r = np.array([[1.0, 0.0, 0.0, 1.0, 1.0]])
  b = T.vcpo_optimal_baseline(r, np.ones_like(r), np.ones_like(r))
  np.testing.assert_allclose(b, [0.6], rtol=1e-6)


def test_vcpo_stage_reads_grad_norms_and_needs_them():
  batch = testing.random_batch(2)
  rng = np.random.default_rng(0)
  g2 = rng.uniform(0.5, 2, batch.shape[:2]).astype(np.float32)
  stage = transforms.vcpo_advantages()
  with pytest.raises(ValueError, match="grad_sq_norm_PG"):
    stage.prepare(batch, stage.init())
  out, _ = jax.jit(stage.prepare)(batch.with_extra(grad_sq_norm_PG=g2), ())
  mask = np.asarray(batch.loss_mask())
  w = T.vcpo_sequence_weights(batch.old_logp_PGT, batch.rollout_logp_PGT, mask)
  want = T.vcpo_baseline_advantages(batch.rewards_PG, w, g2)
  np.testing.assert_allclose(
    out.advantages_PGT, np.asarray(want)[..., None] * mask, rtol=1e-5
  )
  uniform = transforms.vcpo_advantages(
    grad_norms="uniform", use_is_weights=False
  )
  out, _ = uniform.prepare(batch, ())
  r = np.asarray(batch.rewards_PG, np.float64)
  sd = r.std(-1, keepdims=True)
  centred = r - r.mean(-1, keepdims=True)
  z = np.where(sd > 1e-8, centred / np.where(sd > 0, sd, 1.0), centred)
  np.testing.assert_allclose(out.advantages_PGT, z[..., None] * mask, atol=1e-5)


# --------------------------------------------------------------------------
# AEPO


def _aepo_batch(seed=0, shift=0.0):
  batch = testing.random_batch(seed, prompts=2, samples=6, tokens=4)
  stream = np.zeros(batch.shape[:2], np.float32)
  stream[:, 3:] = 1.0
  return batch._replace(
    old_logp_PGT=np.asarray(batch.old_logp_PGT) + shift
  ).with_extra(from_stream_PG=stream)


def _grpo_np(r, m):
  out = np.zeros_like(r)
  for i in range(r.shape[0]):
    v = m[i] > 0
    out[i, v] = (r[i, v] - r[i, v].mean()) / (r[i, v].std(ddof=1) + 1e-6)
  return out


@pytest.mark.parametrize("target", ["paper", "code"])
def test_aepo_advantages_and_controller(target):
  stage = transforms.aepo_stream_advantages(alpha=0.4, target=target)
  state = stage.init()
  assert float(state.temperature) == pytest.approx(1.2)  # starts high
  prepare = jax.jit(stage.prepare)
  # Low entropy (log-probs near 0): the next stream is sampled at 1.2.
  batch = _aepo_batch(0, shift=+10.0)
  batch = batch._replace(old_logp_PGT=np.minimum(batch.old_logp_PGT, -0.01))
  out, state = prepare(batch, state)
  assert float(state.temperature) == pytest.approx(1.2)
  r = np.asarray(batch.rewards_PG, np.float64)
  stream = np.asarray(batch.extra["from_stream_PG"])
  main = _grpo_np(r, 1 - stream) * (1 - stream)
  if target == "paper":
    extra = r * stream
  else:
    extra = (_grpo_np(r, stream) > 0.05) * stream
  want = (main + 0.4 * extra)[..., None] * np.asarray(batch.loss_mask())
  np.testing.assert_allclose(out.advantages_PGT, want, rtol=1e-5, atol=1e-6)
  # High entropy: the next stream at 0.8, and this batch's stream (sampled
  # at 1.2) still weighs alpha; the following one weighs alpha / 2.
  hot = _aepo_batch(0, shift=-5.0)
  out, state = prepare(hot, state)
  assert float(state.temperature) == pytest.approx(0.8)
  # (same rewards and masks as `batch`: only the log-probs moved)
  np.testing.assert_allclose(out.advantages_PGT, want, rtol=1e-5, atol=1e-6)
  out, state = prepare(hot, state)
  want_half = (main + 0.2 * extra)[..., None] * np.asarray(hot.loss_mask())
  np.testing.assert_allclose(
    out.advantages_PGT, want_half, rtol=1e-5, atol=1e-6
  )


def test_aepo_by_hand():
  # One group: main rewards [1, 0], stream rewards [1, 1], alpha 0.5.
  # GRPO on the main pair: mean 0.5, unbiased std 0.7071 -> +-0.7071.
  # Stream (paper): 0.5 * R = 0.5 each.
  batch = rljax.Batch(
    mask_PGT=np.ones((1, 4, 2), np.float32),
    rewards_PG=np.array([[1.0, 0.0, 1.0, 1.0]], np.float32),
    old_logp_PGT=-np.ones((1, 4, 2), np.float32),
  ).with_extra(from_stream_PG=np.array([[0, 0, 1, 1]], np.float32))
  stage = transforms.aepo_stream_advantages(alpha=0.5)
  out, state = stage.prepare(batch, stage.init())
  s = 1 / np.sqrt(2)
  np.testing.assert_allclose(
    out.advantages_PGT[0, :, 0], [s, -s, 0.5, 0.5], rtol=1e-5
  )
  # H = 1 > 0.5: the next stream is sampled cold.
  assert float(state.temperature) == pytest.approx(0.8)


def test_aepo_needs_the_stream_marks():
  batch = testing.random_batch(0)
  stage = transforms.aepo_stream_advantages()
  with pytest.raises(ValueError, match="from_stream_PG"):
    stage.prepare(batch, stage.init())
  with pytest.raises(ValueError, match="target must be one of"):
    transforms.aepo_stream_advantages(target="other")


# --------------------------------------------------------------------------
# Presets


def _preset_batch(name, seed):
  batch = testing.random_batch(seed)
  rng = np.random.default_rng(seed)
  if name == "dcpo_dist":
    old = np.asarray(batch.old_logp_PGT)
    batch = batch.with_extra(
      old_logp_t_high_PGT=(old * 0.9).astype(np.float32),
      old_logp_t_low_PGT=(old * 1.1).astype(np.float32),
    )
  if name == "vcpo":
    g2 = rng.uniform(0.5, 2.0, size=batch.shape[:2]).astype(np.float32)
    batch = batch.with_extra(grad_sq_norm_PG=g2)
  if name == "aepo_arbitrary":
    stream = (rng.uniform(size=batch.shape[:2]) > 0.5).astype(np.float32)
    batch = batch.with_extra(from_stream_PG=stream)
  return batch


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_preset_jits_with_finite_loss_and_gradient(name):
  algo = presets.PRESETS[name]()
  batch = _preset_batch(name, 0)
  logp = testing.perturbed_logp(batch)
  batch, state = jax.jit(algo.prepare)(batch, algo.init())

  def loss(lp):
    return algo.loss(lp, batch, state)[0].value

  value, grad = jax.jit(jax.value_and_grad(loss))(logp)
  assert value.dtype == jnp.float32 and np.isfinite(value)
  assert np.all(np.isfinite(grad)) and np.any(np.asarray(grad) != 0)
  assert np.all(np.asarray(grad)[np.asarray(batch.loss_mask()) == 0] == 0)


def test_presets_are_registered_names():
  # aepo_arbitrary reads rljax.rollouts.TemperatureStream's second stream.
  assert set(presets.PRESETS) == {
    "aepo_arbitrary",
    "dcpo_dist",
    "rto",
    "kepo",
    "vcpo",
  }
  assert all(k == k.lower() and " " not in k for k in presets.PRESETS)
