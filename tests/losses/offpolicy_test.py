"""Off-policy family losses: float64 numpy references, hand values, gradient
identities (REC vs PPO, P3O vs REINFORCE, Kimi OPMD as tau -> 0)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import aggregate
from rljax.losses import _offpolicy as O
from rljax.losses import _policy as P

SHAPE = (3, 4, 6)  # [P, G, T]


def _data(seed=0, shape=SHAPE, d_range=0.6, token_adv=True):
  rng = np.random.default_rng(seed)
  old = rng.uniform(-3.0, -0.1, shape)
  logp = old + rng.uniform(-d_range, d_range, shape)
  if token_adv:
    adv = rng.normal(size=shape)
  else:
    adv = np.broadcast_to(rng.normal(size=shape[:-1])[..., None], shape)
  t = shape[-1]
  lengths = rng.integers(1, t + 1, shape[:-1])
  mask = (np.arange(t) < lengths[..., None]).astype(np.float32)
  # Garbage at padded positions must not leak.
  logp = np.where(mask > 0, logp, 50.0)
  old = np.where(mask > 0, old, -60.0)
  adv = np.where(mask > 0, adv, 7.0)
  return tuple(np.asarray(a, np.float32) for a in (logp, old, adv, mask))


@functools.cache
def _jit(fn, static):
  """Jitted (per-token loss, d/dlogp of sum(loss * mask))."""

  def total(logp, old, adv, mask):
    out = fn(logp, old, adv, mask, **dict(static))
    return jnp.sum(out.loss * mask), out

  return jax.jit(jax.value_and_grad(total, has_aux=True))


def _run(fn, *args, **kw):
  (_, out), grad = _jit(fn, tuple(sorted(kw.items())))(*args)
  return jax.device_get(out), np.asarray(grad)


def _f64(*a):
  return tuple(np.asarray(x, np.float64) for x in a)


def _fd_grad(f, logp, mask, h=1e-6):
  """Central differences of a float64 numpy scalar f(logp) at valid tokens."""
  g = np.zeros_like(logp)
  for idx in zip(*np.nonzero(mask > 0), strict=True):
    up, dn = logp.copy(), logp.copy()
    up[idx] += h
    dn[idx] -= h
    g[idx] = (f(up) - f(dn)) / (2 * h)
  return g


# --------------------------------------------------------------------------
# REC / REP / RED


def _rec_ref(logp, old, adv, mask, clip_mode, weight, regularizer, coef, T):
  """Per-token numpy loss and its analytic gradient (r detached)."""
  logp, old, adv, mask = _f64(logp, old, adv, mask)
  el, eh, rl, rh = 0.2, 0.2, 0.6, 2.0
  loss, grad = np.zeros_like(logp), np.zeros_like(logp)
  for idx in zip(*np.nonzero(mask > 0), strict=True):
    lp, d, a = logp[idx], logp[idx] - old[idx], adv[idx]
    r = math.exp(d)
    two = 1 - el <= r <= 1 + eh
    keep = {
      "none": True,
      "one_side": (a >= 0 and r <= 1 + eh) or (a <= 0 and r >= 1 - el),
      "two_side": two,
      "ring": two or (a >= 0 and r <= 1 - rl) or (a <= 0 and r >= 1 + rh),
    }[clip_mode]
    w = {"none": 1.0, "importance_sampling": r, "advantage": math.exp(a / T)}
    aw = a * w[weight]
    loss[idx] = -aw * lp * keep
    grad[idx] = -aw * keep
    if regularizer == "k2":
      loss[idx] += coef * d * d
      grad[idx] += 2 * coef * d
    elif regularizer == "forward_kl":
      loss[idx] -= coef * lp
      grad[idx] -= coef
  return loss, grad


@pytest.mark.parametrize("clip_mode", O.REC_CLIP_MODES)
@pytest.mark.parametrize(
  "weight,regularizer",
  [
    ("none", "none"),
    ("importance_sampling", "k2"),
    ("advantage", "forward_kl"),
  ],
)
def test_rec_matches_float64_reference(clip_mode, weight, regularizer):
  # d in [-1.5, 1.5] reaches every mask region, the ring's outer ones too.
  args = _data(1, d_range=1.5)
  kw = dict(clip_mode=clip_mode, weight=weight, regularizer=regularizer)
  out, grad = _run(O.rec, *args, coef=0.1, temperature=0.7, **kw)
  loss, g = _rec_ref(*args, coef=0.1, T=0.7, **kw)
  mask = args[3]
  np.testing.assert_allclose(out.loss * mask, loss, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(grad, g, rtol=1e-5, atol=1e-5)


def test_rec_by_hand():
  # Token 1: d = 0.2, r = e^0.2 = 1.2214 > 1.2 and A = 2 > 0: one-side
  #   masks it; k2 adds 0.1 * 0.2^2 = 0.004.
  # Token 2: r = 1 in range, A = -1: -(-1)(1)(-0.5) = -0.5.
  logp = np.array([[-1.0, -0.5]], np.float32)
  old = np.array([[-1.2, -0.5]], np.float32)
  adv = np.array([[2.0, -1.0]], np.float32)
  mask = np.ones_like(logp)
  out, grad = _run(
    O.rec,
    logp,
    old,
    adv,
    mask,
    clip_mode="one_side",
    regularizer="k2",
    coef=0.1,
  )
  np.testing.assert_allclose(out.loss, [[0.004, -0.5]], rtol=1e-4)
  # Gradients: 2 * 0.1 * 0.2 = 0.04, and -A = 1.
  np.testing.assert_allclose(grad, [[0.04, 1.0]], rtol=1e-4)
  np.testing.assert_array_equal(out.clip_high, [[1.0, 0.0]])


def test_rec_one_side_is_has_the_gradient_of_ppo_clip():
  """The paper's reading of GRPO: REC-OneSide-IS == PPO clip (same eps)."""
  for eps_low, eps_high in [(0.2, 0.2), (0.1, 0.28)]:
    args = _data(2, d_range=0.8)
    _, g_rec = _run(
      O.rec,
      *args,
      clip_mode="one_side",
      weight="importance_sampling",
      eps_low=eps_low,
      eps_high=eps_high,
    )
    _, g_ppo = _run(P.ppo_clip, *args, eps_low=eps_low, eps_high=eps_high)
    assert np.mean(g_ppo == 0) > 0.05  # some tokens are clipped
    np.testing.assert_allclose(g_rec, g_ppo, rtol=1e-5, atol=1e-6)


def test_rec_ring_keeps_tokens_that_two_side_drops():
  # A > 0 and r = 0.3 <= 1 - 0.6: two-side drops it, ring keeps it.
  logp, old = np.log([[0.3]]), np.zeros((1, 1))
  args = [np.asarray(a, np.float32) for a in (logp, old, [[1.0]], [[1.0]])]
  _, g_two = _run(O.rec, *args, clip_mode="two_side")
  _, g_ring = _run(O.rec, *args, clip_mode="ring")
  assert g_two[0, 0] == 0 and g_ring[0, 0] == -1.0


def test_rec_bad_arguments_are_clear_errors():
  args = _data(0)
  with pytest.raises(ValueError, match="clip_mode must be one of"):
    O.rec(*args, clip_mode="one-side")
  with pytest.raises(ValueError, match="eps_low must be in"):
    O.rec(*args, eps_low=1.5)
  with pytest.raises(ValueError, match="coef must be >= 0"):
    O.rec(*args, coef=-0.1)


# --------------------------------------------------------------------------
# Kimi OPMD


def _kimi_ref(logp, old, adv, mask, tau):
  logp, old, adv, mask = _f64(logp, old, adv, mask)
  loss, grad = np.zeros_like(logp), np.zeros_like(logp)
  for idx in np.ndindex(logp.shape[:-1]):
    m = mask[idx] > 0
    if not m.any():
      continue
    big_d = np.sum((logp[idx] - old[idx])[m])
    a = np.mean(adv[idx][m])
    loss[idx][m] = (a - tau * big_d) ** 2
    grad[idx][m] = -2 * tau * (a - tau * big_d)
  return loss, grad


def test_kimi_opmd_matches_float64_reference():
  args = _data(3, token_adv=False)
  out, _ = _run(O.kimi_opmd, *args, tau=0.3)
  loss, grad = _kimi_ref(*args, tau=0.3)
  mask = args[3]
  np.testing.assert_allclose(out.loss * mask, loss, rtol=1e-5, atol=1e-6)
  # Per-token gradient of the per-sequence loss L_i (not of its broadcast).
  seq = jax.jit(
    jax.grad(
      lambda lp: jnp.sum(O.kimi_opmd(lp, *args[1:], tau=0.3).loss[..., 0])
    )
  )(args[0])
  np.testing.assert_allclose(seq, grad, rtol=1e-4, atol=1e-5)


def test_kimi_opmd_by_hand():
  # D = 0.1 + 0.2 = 0.3, A = 1, tau = 0.5: (1 - 0.15)^2 = 0.7225.
  logp = np.array([[0.1, 0.2, 9.0]], np.float32)
  args = (logp, np.zeros_like(logp), np.ones_like(logp), [[1.0, 1.0, 0.0]])
  out = O.kimi_opmd(*(np.asarray(a, np.float32) for a in args), tau=0.5)
  np.testing.assert_allclose(out.loss[0, :2], [0.7225, 0.7225], rtol=1e-5)


def test_kimi_opmd_gradient_tends_to_reinforce_as_tau_goes_to_zero():
  """dL/dlogp = -2 tau (A - tau D): 0 as tau -> 0; normalised by 2 tau it
  tends to REINFORCE's -A (sequence level), whatever the log-ratio D."""
  args = _data(4, token_adv=False)
  mask = args[3]
  seq_loss = (
    lambda lp, **kw: jnp.sum(  # noqa: E731
      O.kimi_opmd(lp, *args[1:], **kw).loss[..., 0]
    )
  )
  _, reinforce = _run(P.reinforce, *args)
  for tau in (1e-1, 1e-2, 1e-3):
    raw = np.asarray(jax.grad(seq_loss)(args[0], tau=tau))
    norm = np.asarray(jax.grad(seq_loss)(args[0], tau=tau, normalize=True))
    assert np.max(np.abs(raw)) < 2 * tau * (np.max(np.abs(args[2])) + 1)
    np.testing.assert_allclose(norm, reinforce * mask, atol=20 * tau)
  np.testing.assert_allclose(norm, reinforce * mask, atol=2e-2)


# --------------------------------------------------------------------------
# Reg-GRPO


def _reg_grpo_ref(logp, old, adv, mask, beta, standardize, eps=1e-6):
  """Total loss sum_i L_i (float64) of a [P, G, T] batch."""
  total = 0.0
  for p in range(logp.shape[0]):
    m = mask[p] > 0
    member = m.any(-1)
    if member.sum() < 2:
      continue
    rho = np.array([np.sum((logp[p, g] - old[p, g])[m[g]]) for g in range(4)])
    rho = rho[member] / beta
    a = np.array([np.mean(adv[p, g][m[g]]) for g in np.nonzero(member)[0]])
    c = rho - rho.mean()
    if standardize == "mean_std":
      c = c / (np.std(rho, ddof=1) + eps)
    total += np.sum((c - a) ** 2)
  return total


@pytest.mark.parametrize("standardize", ["mean_std", "mean"])
def test_reg_grpo_matches_float64_reference(standardize):
  logp, old, adv, mask = _data(5, token_adv=False)
  mask[0, 1] = 0.0  # a filtered sample: not a member of its group
  mask[1, 1:] = 0.0  # a group with one member: no loss
  kw = dict(beta=0.5, standardize=standardize)
  lp64, old64, adv64, m64 = _f64(logp, old, adv, mask)
  ref = lambda lp: _reg_grpo_ref(lp, old64, adv64, m64, **kw)  # noqa: E731
  fn = jax.jit(
    jax.value_and_grad(
      lambda lp: jnp.sum(O.reg_grpo(lp, old, adv, mask, **kw).loss[..., 0])
    )
  )
  value, grad = fn(logp)
  np.testing.assert_allclose(value, ref(lp64), rtol=1e-5)
  np.testing.assert_allclose(
    grad, _fd_grad(ref, lp64, m64), rtol=1e-4, atol=1e-5
  )
  assert np.all(np.asarray(grad)[1] == 0)


def test_reg_grpo_by_hand_and_beta_cancels_under_std():
  # G = 2, D = [1, -1]: mean 0, unbiased std sqrt(2), rho~ = +-1/sqrt(2);
  # A = [1, -1]: L_i = (1/sqrt(2) - 1)^2 = 0.085786...
  logp = np.array([[[1.0], [-1.0]]], np.float32)
  adv = np.array([[[1.0], [-1.0]]], np.float32)
  args = (logp, np.zeros_like(logp), adv, np.ones_like(logp))
  for beta in (1.0, 0.1):
    out = O.reg_grpo(*args, beta=beta, eps=0.0)
    np.testing.assert_allclose(out.loss[0, :, 0], [0.0857864] * 2, rtol=1e-5)
  # Without std, beta scales rho: (1/0.5 * 1 - 1)^2 = 1.
  out = O.reg_grpo(*args, beta=0.5, standardize="mean")
  np.testing.assert_allclose(out.loss[0, :, 0], [1.0, 1.0], rtol=1e-6)


# --------------------------------------------------------------------------
# P3O


def _p3o_ref(logp, old, adv, mask, clip, eps):
  total = 0.0
  for p in range(logp.shape[0]):
    m = mask[p] > 0
    d = [np.sum((logp[p, g] - old[p, g])[m[g]]) for g in range(2)]
    a = [np.mean(adv[p, g][m[g]]) for g in range(2)]
    if clip == "joint":
      rho = math.exp(d[0] - d[1])
      cl = min(max(rho, 1 - eps), 1 + eps)
      total += max(-a[0] * rho, -a[0] * cl)  # 2 halves of the pair's loss
      continue
    for g in range(2):
      rho = math.exp(d[g])
      cl = rho if clip == "none" else min(max(rho, 1 - eps), 1 + eps)
      total += max(-a[g] * rho, -a[g] * cl)
  return total


@pytest.mark.parametrize("clip", ["none", "separate", "joint"])
def test_p3o_matches_float64_reference(clip):
  logp, old, adv, mask = _data(6, shape=(5, 2, 4), d_range=0.2)
  adv = np.where(mask > 0, adv[:, :1, :1] * np.array([[[1.0], [-1.0]]]), 0)
  adv = np.asarray(adv, np.float32)
  lp64, old64, adv64, m64 = _f64(logp, old, adv, mask)
  ref = lambda lp: _p3o_ref(lp, old64, adv64, m64, clip, 0.2)  # noqa: E731
  fn = jax.jit(
    jax.value_and_grad(
      lambda lp: jnp.sum(
        O.p3o(lp, old, adv, mask, clip=clip, eps=0.2).loss[..., 0]
      )
    )
  )
  value, grad = fn(logp)
  np.testing.assert_allclose(value, ref(lp64), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    grad, _fd_grad(ref, lp64, m64), rtol=1e-4, atol=1e-5
  )


def test_p3o_by_hand():
  # D_1 = ln 1.5, D_2 = 0; A_1 = 0.5 = -A_2. Separate: response 1 is
  # clipped at 1.2: max(-0.75, -0.6) = -0.6; response 2: -(-0.5)(1) = 0.5.
  logp = np.array([[[math.log(1.5)], [0.0]]], np.float32)
  adv = np.array([[[0.5], [-0.5]]], np.float32)
  args = (logp, np.zeros_like(logp), adv, np.ones_like(logp))
  out = O.p3o(*args, clip="separate")
  np.testing.assert_allclose(out.loss[0, :, 0], [-0.6, 0.5], rtol=1e-6)
  np.testing.assert_array_equal(out.clip_high[0, :, 0], [1.0, 0.0])
  # Joint: rho_12 = 1.5 -> 1.2: max(-0.75, -0.6) / 2 on each response.
  out = O.p3o(*args, clip="joint")
  np.testing.assert_allclose(out.loss[0, :, 0], [-0.3, -0.3], rtol=1e-6)


def test_p3o_unclipped_is_dr_grpo_reinforce_seq_mean_token_sum_at_g2():
  """Unclipped on-policy P3O (mean over responses) has exactly the gradient
  of dr_grpo advantages + reinforce + seq_mean_token_sum at G = 2."""
  logp, _, _, mask = _data(7, shape=(4, 2, 5))
  rewards = np.random.default_rng(7).normal(size=(4, 2))
  adv = rewards - rewards.mean(-1, keepdims=True)  # (r1 - r2) / 2, -(...)
  adv = np.broadcast_to(adv[..., None], logp.shape).astype(np.float32)

  def p3o_loss(lp):
    out = O.p3o(lp, jax.lax.stop_gradient(lp), adv, mask, clip="none")
    return aggregate.seq_mean_token_mean(out.loss, mask).value

  def reinforce_loss(lp):
    out = P.reinforce(lp, None, adv, mask)
    return aggregate.seq_mean_token_sum(out.loss, mask).value

  g1 = jax.jit(jax.grad(p3o_loss))(logp)
  g2 = jax.jit(jax.grad(reinforce_loss))(logp)
  np.testing.assert_allclose(g1, g2, rtol=1e-6, atol=1e-7)
  assert np.any(np.asarray(g1) != 0)


def test_p3o_needs_pairs():
  with pytest.raises(ValueError, match="exactly 2 samples per prompt"):
    O.p3o(*_data(0))


# --------------------------------------------------------------------------
# DisCO


def _disco_ref(logp, old, rewards, mask, score, tau, variant):
  """-sum_q J_q (float64) over a [P, G, T] batch."""
  total = 0.0
  for p in range(logp.shape[0]):
    s, pos, neg = [], [], []
    for g in range(logp.shape[1]):
      m = mask[p, g] > 0
      if not m.any():
        continue
      tok = logp[p, g][m]
      if score == "likelihood_ratio":
        tok = np.exp(tok - old[p, g][m])
      s.append(np.mean(tok))
      (pos if rewards[p, g] > 0.5 else neg).append(s[-1])
    if not pos or not neg:
      continue
    if variant == "basic":
      j = np.mean(pos) - np.mean(neg)
    else:
      j = np.mean(pos) - tau * np.log(np.mean(np.exp(np.array(neg) / tau)))
    total -= j
  return total


@pytest.mark.parametrize(
  "score,tau,variant",
  [
    ("log_likelihood", 10.0, "dro"),
    ("likelihood_ratio", 1.0, "dro"),
    ("log_likelihood", 0.5, "basic"),
  ],
)
def test_disco_matches_float64_reference(score, tau, variant):
  logp, old, _, mask = _data(8)
  rewards = np.array(
    [[1, 0, 0, 1], [1, 1, 1, 1], [0, 1, 0, 0]], np.float32
  )  # the all-correct group has no loss
  mask[2, 1] = 0.0  # the only positive of group 2 is filtered: no loss
  kw = dict(score=score, tau=tau, variant=variant)
  lp64, old64, r64, m64 = _f64(logp, old, rewards, mask)
  ref = lambda lp: _disco_ref(lp, old64, r64, m64, **kw)  # noqa: E731

  def per_group(lp):  # the loss is broadcast: read it once per group
    return jnp.sum(O.disco(lp, old, rewards, mask, **kw).loss[:, 0, 0])

  value, grad = jax.jit(jax.value_and_grad(per_group))(logp)
  np.testing.assert_allclose(value, ref(lp64), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    grad, _fd_grad(ref, lp64, m64), rtol=1e-4, atol=1e-6
  )
  assert np.all(np.asarray(grad)[1:] == 0)


def test_disco_by_hand():
  # One group: scores s = mean logp = [-1, -2, -3], rewards [1, 0, 0],
  # tau = 1: J = -1 - log((e^-2 + e^-3) / 2) = -1 + 2.3799 = 1.3799.
  logp = np.array([[[-1.0], [-2.0], [-3.0]]], np.float32)
  rewards = np.array([[1.0, 0.0, 0.0]], np.float32)
  out = O.disco(logp, logp, rewards, np.ones_like(logp), tau=1.0)
  expected = -(-1.0 - math.log((math.exp(-2) + math.exp(-3)) / 2))
  np.testing.assert_allclose(out.loss[0, :, 0], [expected] * 3, rtol=1e-6)


def test_disco_dro_tends_to_max_and_mean_of_negatives():
  """tau log mean exp(s/tau): the mean of the negatives' scores as
  tau -> inf (DisCO-b) and their max as tau -> 0 (up to tau log n)."""
  logp, old, _, mask = _data(9)
  rewards = np.array([[1, 0, 0, 0]] * 3, np.float32)
  basic = O.disco(logp, old, rewards, mask, variant="basic").loss
  large = O.disco(logp, old, rewards, mask, tau=1e4).loss
  np.testing.assert_allclose(large, basic, atol=1e-3)
  s = np.asarray(O.disco_scores(logp, old, mask))
  small = O.disco(logp, old, rewards, mask, tau=1e-3).loss
  expected = -(s[:, 0] - s[:, 1:].max(-1))
  np.testing.assert_allclose(small[:, 0, 0], expected, atol=5e-3)


def test_bfloat16_inputs_give_finite_float32():
  logp, old, adv, mask = (jnp.asarray(a, jnp.bfloat16) for a in _data(10))
  pair = lambda x: x[:, :2]  # noqa: E731
  outs = [
    O.rec(logp, old, adv, mask, clip_mode="ring", weight="advantage"),
    O.kimi_opmd(logp, old, adv, mask),
    O.reg_grpo(logp, old, adv, mask),
    O.p3o(pair(logp), pair(old), pair(adv), pair(mask)),
    O.disco(logp, old, (adv[..., 0] > 0), mask),
    O.ratio_pg(logp, old, adv, mask),
  ]
  for out in outs:
    assert out.loss.dtype == jnp.float32
    assert np.all(np.isfinite(out.loss))
  kl = O.kl_reverse_old(logp, old)
  assert kl.dtype == jnp.float32 and np.all(np.isfinite(kl))


def test_kl_reverse_old_is_unbiased_and_nonnegative():
  # Categorical pi_old, pi over 4 tokens: E_old[r log r - r + 1] = KL(pi||old).
  old = np.log([0.1, 0.2, 0.3, 0.4])
  new = np.log([0.25, 0.25, 0.2, 0.3])
  k = np.asarray(O.kl_reverse_old(new, old), np.float64)
  exact = np.sum(np.exp(new) * (new - old))
  np.testing.assert_allclose(np.sum(np.exp(old) * k), exact, rtol=1e-5)
  assert np.all(k >= 0)


def test_group_losses_need_a_group_axis():
  x = np.zeros((5,), np.float32)
  with pytest.raises(ValueError, match=r"rank >= 2 \(\[..., G, T\]"):
    O.reg_grpo(x, x, x, x)
  with pytest.raises(ValueError, match="rewards_BG"):
    logp, old, _, mask = _data(0)
    O.disco(logp, old, np.zeros((3, 5)), mask)
