"""Policy surrogate losses: numpy references, hand values, gradients, clips."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.losses import _policy as P

SHAPE = (2, 3, 7)  # two leading axes: the losses are rank-polymorphic


# --------------------------------------------------------------------------
# Data. Padded positions hold garbage (d = 110 would overflow exp) to check
# that nothing leaks from them.


def _data(seed=0, d_range=1.2, shape=SHAPE, token_adv=False):
  rng = np.random.default_rng(seed)
  old = rng.uniform(-3.0, -0.1, shape)
  d = rng.uniform(-d_range, d_range, shape)
  logp = old + d
  if token_adv:
    adv = rng.normal(size=shape)
  else:
    adv = np.broadcast_to(rng.normal(size=shape[:-1])[..., None], shape)
  t = shape[-1]
  lengths = rng.integers(1, t + 1, shape[:-1])
  lengths.flat[0] = 0  # an empty sequence
  lengths.flat[1] = t  # a full one
  mask = (np.arange(t) < lengths[..., None]).astype(np.float32)
  logp = np.where(mask > 0, logp, 50.0)
  old = np.where(mask > 0, old, -60.0)
  adv = np.where(mask > 0, adv, 7.0)
  return tuple(np.asarray(a, np.float32) for a in (logp, old, adv, mask))


@functools.cache
def _compiled(fn, static, mode):
  """One jitted function per (loss, hyperparameters, mode), shared by tests.

  mode "loss": the TokenLoss; "both": (TokenLoss, d/dlogp of sum(loss *
  mask)). A PRNG key is an unhashable array, so it is passed as a
  traced keyword argument instead of being baked in.
  """

  def loss(logp, old, adv, mask, **dyn):
    return fn(logp, old, adv, mask, **dict(static), **dyn)

  def total(logp, old, adv, mask, **dyn):
    out = loss(logp, old, adv, mask, **dyn)
    return jnp.sum(out.loss * mask), out

  def both(*args, **dyn):
    (_, out), grad = jax.value_and_grad(total, has_aux=True)(*args, **dyn)
    return out, grad

  if mode == "loss":
    return jax.jit(loss)
  return jax.jit(both)


def _bind(fn, kw, mode):
  """The cached jitted function, returning numpy arrays."""
  static = tuple(sorted((k, v) for k, v in kw.items() if k != "key"))
  dyn = {k: v for k, v in kw.items() if k == "key"}
  compiled = _compiled(fn, static, mode)
  return lambda *args, **more: jax.device_get(compiled(*args, **dyn, **more))


def _jit_loss(fn, **kw):
  return _bind(fn, kw, "loss")


def _jit_both(fn, **kw):
  """Jitted (TokenLoss, d/dlogp of sum(loss * mask))."""
  return _bind(fn, kw, "both")


# A fast-compiling key for tests that do not check the default PRNG
# (threefry compiles slowly on CPU); clip_cov accepts any key.
RBG_KEY = jax.random.key(0, impl="rbg")


# --------------------------------------------------------------------------
# Independent float64 references, written token by token / sequence by
# sequence with plain loops. Values at padded positions are 0.


def _f64(*arrays):
  return tuple(np.asarray(a, np.float64) for a in arrays)


def _per_token(token_fn, logp, old, adv, mask, **kw):
  logp, old, adv, mask = _f64(logp, old, adv, mask)
  out = np.zeros_like(logp)
  for idx in np.ndindex(logp.shape):
    if mask[idx] > 0:
      out[idx] = token_fn(logp[idx], old[idx], adv[idx], **kw)
  return out


def _per_seq(seq_fn, logp, old, adv, mask, **kw):
  """seq_fn(list of (logp, old, adv) of valid tokens) -> per-token values."""
  logp, old, adv, mask = _f64(logp, old, adv, mask)
  out = np.zeros_like(logp)
  for idx in np.ndindex(logp.shape[:-1]):
    valid = [t for t in range(logp.shape[-1]) if mask[idx][t] > 0]
    toks = [(logp[idx][t], old[idx][t], adv[idx][t]) for t in valid]
    for t, v in zip(valid, seq_fn(toks, **kw), strict=False):
      out[idx][t] = v
  return out


def _clip(x, lo, hi):
  return min(max(x, lo), hi)


def _ppo_token(
  lp, olp, a, eps_low, eps_high, dual_clip=None, log_ratio_clamp=20.0
):
  clamp = log_ratio_clamp
  d = lp - olp if clamp is None else _clip(lp - olp, -clamp, clamp)
  r = math.exp(d)
  loss = max(-a * r, -a * _clip(r, 1 - eps_low, 1 + eps_high))
  if dual_clip is not None and a < 0:
    loss = min(loss, -dual_clip * a)
  return loss


def _ppo_token_grad(
  lp, olp, a, eps_low, eps_high, dual_clip=None, log_ratio_clamp=20.0
):
  d = lp - olp
  if log_ratio_clamp is not None and abs(d) > log_ratio_clamp:
    return 0.0
  r = math.exp(d)
  if a > 0 and r > 1 + eps_high:
    return 0.0
  if a < 0 and r < 1 - eps_low:
    return 0.0
  if a < 0 and dual_clip is not None and r > dual_clip:
    return 0.0
  return -a * r


def _gppo_token_grad(lp, olp, a, eps_low, eps_high, dual_clip=None):
  r = math.exp(lp - olp)
  if a < 0 and dual_clip is not None and max(r, 1 - eps_low) > dual_clip:
    return 0.0
  if a > 0 and r > 1 + eps_high:
    return -a * (1 + eps_high)
  if a < 0 and r < 1 - eps_low:
    return -a * (1 - eps_low)
  return -a * r


def _sapo_token(lp, olp, a, tau_pos, tau_neg):
  tau = tau_pos if a > 0 else tau_neg
  r = math.exp(lp - olp)
  return -(4 / tau) / (1 + math.exp(-tau * (r - 1))) * a


def _sapo_token_grad(lp, olp, a, tau_pos, tau_neg):
  # d/dlogp = -A r sech^2(tau (r - 1) / 2)
  tau = tau_pos if a > 0 else tau_neg
  r = math.exp(lp - olp)
  return -a * r / math.cosh(tau * (r - 1) / 2) ** 2


def _cispo_weight(lp, olp, eps_low, eps_high):
  return _clip(math.exp(lp - olp), 1 - eps_low, 1 + eps_high)


def _cispo_token(lp, olp, a, eps_low, eps_high):
  return -_cispo_weight(lp, olp, eps_low, eps_high) * a * lp


def _cispo_token_grad(lp, olp, a, eps_low, eps_high):
  return -_cispo_weight(lp, olp, eps_low, eps_high) * a


def _capped_token(lp, olp, a, max_ratio):
  return -min(math.exp(lp - olp), max_ratio) * a * lp


def _capped_token_grad(lp, olp, a, max_ratio):
  return -min(math.exp(lp - olp), max_ratio) * a


def _reinforce_token(lp, olp, a):
  return -a * lp


def _reinforce_token_grad(lp, olp, a):
  return -a


def _gspo_seq(toks, eps_low, eps_high, scale_by_length=False):
  n = len(toks)
  if n == 0:
    return []
  log_s = sum(lp - olp for lp, olp, _ in toks) / n
  a = sum(adv for _, _, adv in toks) / n
  s = math.exp(log_s)
  loss = max(-a * s, -a * _clip(s, 1 - eps_low, 1 + eps_high))
  return [loss * (n if scale_by_length else 1)] * n


def _luspo_seq(toks, eps_low, eps_high):
  return _gspo_seq(toks, eps_low, eps_high, scale_by_length=True)


def _gspo_token_seq(toks, eps_low, eps_high, grad=False):
  """Token A_t with the sequence ratio s_i (log clamped at 10, like verl)."""
  if not toks:
    return []
  log_s = sum(lp - olp for lp, olp, _ in toks) / len(toks)
  s = math.exp(min(log_s, 10.0))
  c = _clip(s, 1 - eps_low, 1 + eps_high)
  if not grad:
    return [max(-a * s, -a * c) for _, _, a in toks]
  # d s_it / d logp_t = s_it: the token's own route; 0 when clipped / clamped.
  live = log_s <= 10.0
  return [-a * s if live and -a * s >= -a * c else 0.0 for _, _, a in toks]


def _gspo_token_seq_grad(toks, eps_low, eps_high):
  return _gspo_token_seq(toks, eps_low, eps_high, grad=True)


def _gmpo_seq(toks, eps_low, eps_high):
  n = len(toks)
  if n == 0:
    return []
  total = 0.0
  for lp, olp, a in toks:
    d = lp - olp
    if a > 0:
      total += min(d, _clip(d, -eps_low, eps_high))
    elif a < 0:
      total += max(d, _clip(d, -eps_low, eps_high))
  a_bar = sum(a for _, _, a in toks) / n
  return [-a_bar * math.exp(total / n)] * n


def _vespo_phi(toks, k_pos, lambda_pos, k_neg, lambda_neg):
  log_w = sum(_clip(lp - olp, -20, 20) for lp, olp, _ in toks)
  log_w = _clip(log_w, math.log(1e-8), 20.0)
  a_mean = sum(a for _, _, a in toks) / len(toks)
  k, lam = (k_pos, lambda_pos) if a_mean >= 0 else (k_neg, lambda_neg)
  w = math.exp(log_w)
  return w**k * math.exp(lam * (1 - w))


def _vespo_seq(toks, **kw):
  if not toks:
    return []
  phi = _vespo_phi(toks, **kw)
  return [-phi * a * lp for lp, _, a in toks]


def _vespo_seq_grad(toks, **kw):
  if not toks:
    return []
  phi = _vespo_phi(toks, **kw)
  return [-phi * a for _, _, a in toks]


def _np_cov(logp, adv, mask):
  """Covariance over the valid tokens of the whole input (flattened)."""
  logp, adv, mask = _f64(logp, adv, mask)
  valid = mask.ravel() > 0
  a, lp = adv.ravel()[valid], logp.ravel()[valid]
  cov = np.full(mask.size, -np.inf)
  cov[valid] = (a - a.mean()) * (lp - lp.mean())
  return cov.reshape(mask.shape)


def _kl_cov_top(logp, adv, mask, ratio):
  cov = _np_cov(logp, adv, mask)
  n_valid = int((mask > 0).sum())
  k = max(int(ratio * n_valid), 1)
  order = sorted(range(cov.size), key=lambda i: -cov.ravel()[i])[:k]
  top = np.zeros(cov.size, bool)
  top[order] = True
  return top.reshape(cov.shape) & (mask > 0)


def _kl_cov_ref(logp, old, adv, mask, ratio, kappa):
  top = _kl_cov_top(logp, adv, mask, ratio)
  d = np.asarray(logp, np.float64) - old
  loss = -adv * np.exp(np.where(mask > 0, d, 0.0))
  return np.where(mask > 0, loss + np.where(top, kappa * np.abs(d), 0.0), 0.0)


def _kl_cov_grad(logp, old, adv, mask, ratio, kappa):
  top = _kl_cov_top(logp, adv, mask, ratio)
  d = np.where(mask > 0, np.asarray(logp, np.float64) - old, 0.0)
  grad = -adv * np.exp(d) + np.where(top, kappa * np.sign(d), 0.0)
  return np.where(mask > 0, grad, 0.0)


def _fd_grad(ref, logp, old, adv, mask, h=1e-6, **kw):
  """Central finite differences of sum(ref * mask) in float64."""
  logp = np.asarray(logp, np.float64)
  grad = np.zeros_like(logp)
  for idx in np.ndindex(logp.shape):
    if mask[idx] == 0:
      continue
    up, down = logp.copy(), logp.copy()
    up[idx] += h
    down[idx] -= h
    diff = ref(up, old, adv, mask, **kw) - ref(down, old, adv, mask, **kw)
    grad[idx] = np.sum(diff * mask) / (2 * h)
  return grad


def _tok(fn):
  return functools.partial(_per_token, fn)


def _seq(fn):
  return functools.partial(_per_seq, fn)


# name -> (loss fn, hyperparameters, numpy value ref, numpy gradient ref);
# a gradient ref of None means finite differences of the value ref.
CASES = {
  "ppo_clip": (
    P.ppo_clip,
    {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0},
    _tok(_ppo_token),
    _tok(_ppo_token_grad),
  ),
  "ppo_clip_clamped": (
    P.ppo_clip,
    {"eps_low": 0.2, "eps_high": 0.2, "log_ratio_clamp": 0.5},
    _tok(_ppo_token),
    _tok(_ppo_token_grad),
  ),
  "gppo": (
    P.gppo,
    {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 2.0},
    _tok(_ppo_token),
    _tok(_gppo_token_grad),
  ),
  "gspo": (
    P.gspo,
    {"eps_low": 0.2, "eps_high": 0.3},
    _seq(_gspo_seq),
    None,
  ),
  "luspo": (
    P.luspo,
    {"eps_low": 0.2, "eps_high": 0.3},
    _seq(_luspo_seq),
    None,
  ),
  "sapo": (
    P.sapo,
    {"tau_pos": 1.0, "tau_neg": 1.05},
    _tok(_sapo_token),
    _tok(_sapo_token_grad),
  ),
  "cispo": (
    P.cispo,
    {"eps_low": 0.2, "eps_high": 0.3},
    _tok(_cispo_token),
    _tok(_cispo_token_grad),
  ),
  "cispo_capped": (
    P.cispo_capped,
    {"max_ratio": 1.5},
    _tok(_capped_token),
    _tok(_capped_token_grad),
  ),
  "gmpo": (
    P.gmpo,
    {"eps_low": 0.3, "eps_high": 0.4},
    _seq(_gmpo_seq),
    None,
  ),
  "reinforce": (
    P.reinforce,
    {},
    _tok(_reinforce_token),
    _tok(_reinforce_token_grad),
  ),
  "kl_cov": (
    P.kl_cov,
    {"ratio": 0.1, "kappa": 0.7},
    _kl_cov_ref,
    _kl_cov_grad,
  ),
  "vespo": (
    P.vespo,
    {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0},
    _seq(_vespo_seq),
    _seq(_vespo_seq_grad),
  ),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("token_adv", [False, True])
def test_values_and_gradients_match_numpy_reference(name, token_adv):
  fn, kw, ref, grad_ref = CASES[name]
  # VESPO's W is the full sequence ratio: keep it near 1 so phi is not 0.
  d_range = 0.1 if name == "vespo" else 1.2
  seed = 3 if token_adv else 1  # both mix clipped and unclipped sequences
  logp, old, adv, mask = _data(seed, d_range, token_adv=token_adv)
  out, grad = _jit_both(fn, **kw)(logp, old, adv, mask)
  for field in out:
    assert field.dtype == jnp.float32 and field.shape == SHAPE
    assert np.all(np.isfinite(field))
  want = ref(logp, old, adv, mask, **kw)
  np.testing.assert_allclose(out.loss * mask, want, rtol=2e-5, atol=2e-6)
  if grad_ref is None:
    want_grad = _fd_grad(ref, logp, old, adv, mask, **kw)
  else:
    want_grad = grad_ref(logp, old, adv, mask, **kw) * mask
  assert np.all(np.isfinite(grad))
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-5)


def test_sequence_losses_mix_clipped_and_unclipped_sequences():
  # Guards the test above against data where every sequence is clipped (zero
  # gradient everywhere would make the comparison vacuous).
  for seed, token_adv in ((1, False), (3, True)):
    logp, old, adv, mask = _data(seed, token_adv=token_adv)
    out, _ = _jit_both(P.gspo, eps_low=0.2, eps_high=0.3)(logp, old, adv, mask)
    clipped = (out.clip_low + out.clip_high)[..., 0]
    valid = mask.sum(-1) > 0
    assert 0 < clipped[valid].sum() < valid.sum()


def _all_losses():
  fns = {name: (fn, kw) for name, (fn, kw, _, _) in CASES.items()}
  fns["clip_cov"] = (P.clip_cov, {"key": RBG_KEY})
  return fns


@pytest.mark.parametrize("name", list(_all_losses()))
def test_bfloat16_inputs_give_finite_float32(name):
  fn, kw = _all_losses()[name]
  logp, old, adv, mask = (jnp.asarray(a, jnp.bfloat16) for a in _data(3))
  out, grad = _jit_both(fn, **kw)(logp, old, adv, mask)
  for field in out:
    assert field.dtype == jnp.float32
    assert np.all(np.isfinite(field))
  assert np.all(np.isfinite(np.asarray(grad, np.float32)))


@pytest.mark.parametrize("name", list(_all_losses()))
def test_masked_tokens_get_zero_gradient(name):
  fn, kw = _all_losses()[name]
  logp, old, adv, mask = _data(4)
  _, grad = _jit_both(fn, **kw)(logp, old, adv, mask)
  assert np.all(np.isfinite(grad))
  assert np.all(grad[mask == 0] == 0.0)
  assert np.any(grad[mask > 0] != 0.0)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo"])
def test_rank_polymorphic(name):
  # [2, 3, T] and single [T] rows agree (a token-wise and a sequence loss).
  fn, kw = _all_losses()[name]
  data = _data(5, 0.1)
  batched, _ = _jit_both(fn, **kw)(*data)
  batched = batched.loss.reshape(-1, SHAPE[-1])
  for i in (1, 4):
    row, _ = _jit_both(fn, **kw)(*(a.reshape(-1, SHAPE[-1])[i] for a in data))
    # GSPO's sum over T in a batch of rows or one: float32 order may differ.
    np.testing.assert_allclose(batched[i], row.loss, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------
# Hand-worked numbers.


def test_ppo_clip_hand_values_and_indicators():
  # old = 0, so r = exp(logp). eps = 0.2 (clip to [0.8, 1.2]), dual clip c = 3.
  r = np.array([1.5, 0.5, 0.5, 1.5, 4.0, 2.0])
  adv = np.array([2.0, 2.0, -1.0, -1.0, -1.0, 0.0], np.float32)
  logp = np.log(r).astype(np.float32)
  old = np.zeros(6, np.float32)
  mask = np.ones(6, np.float32)
  out, grad = _jit_both(P.ppo_clip, dual_clip=3.0)(logp, old, adv, mask)
  want = [
    -2.4,  # A=2,  r=1.5: max(-3, -2 * 1.2 = -2.4) = -2.4 (clipped high)
    -1.0,  # A=2,  r=0.5: max(-1, -2 * 0.8 = -1.6) = -1.0
    0.8,  # A=-1, r=0.5: max(0.5, 0.8) = 0.8 (clipped low)
    1.5,  # A=-1, r=1.5: max(1.5, 1.2) = 1.5; min(1.5, 3) = 1.5
    3.0,  # A=-1, r=4:   max(4, 1.2) = 4; dual clip min(4, 3) = 3
    0.0,  # A=0: 0
  ]
  np.testing.assert_allclose(out.loss, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(out.clip_low, [0, 0, 1, 0, 1, 0])
  np.testing.assert_array_equal(out.clip_high, [1, 0, 0, 0, 0, 0])
  # -A r where unclipped: t2: -2 * 0.5 = -1; t4: 1 * 1.5 = 1.5; others 0.
  np.testing.assert_allclose(grad, [0, -1.0, 0, 1.5, 0, 0], rtol=1e-6)


def test_sapo_hand_values():
  # old = 0; tau = 1 for A > 0, 1.05 for A <= 0.
  r = np.array([1.0, 1.0, 2.0, 0.5])
  adv = np.array([1.0, -1.0, 2.0, -1.0], np.float32)
  logp = np.log(r).astype(np.float32)
  zeros = np.zeros(4, np.float32)
  out = _jit_loss(P.sapo)(logp, zeros, adv, np.ones(4, np.float32))
  want = [
    -2.0,  # -(4/1) sigmoid(0) * 1 = -4 * 0.5
    1.9047619,  # -(4/1.05) * 0.5 * (-1) = 2 / 1.05
    -5.8484686,  # -(4/1) sigmoid(1) * 2 = -8 * 0.73105858
    1.4159383,  # (4/1.05) sigmoid(1.05 * -0.5) = 3.8095238 * 0.37168381
  ]
  np.testing.assert_allclose(out.loss, want, rtol=1e-6)
  assert not np.any(out.clip_low) and not np.any(out.clip_high)


def test_gspo_hand_values_and_gradient():
  # eps = 0.1: s is clipped to [0.9, 1.1].
  nan = 0.0  # padding value (masked)
  d = np.array(
    [
      [math.log(2.0), 0.0, nan],  # mean = ln2/2, s = sqrt2 = 1.41421
      [0.1, -0.3, nan],  # mean = -0.1, s = e^-0.1 = 0.90483742
      [math.log(0.5)] * 3,  # s = 0.5
    ],
    np.float32,
  )
  mask = np.array([[1, 1, 0], [1, 1, 0], [1, 1, 1]], np.float32)
  adv = np.array([[1.0] * 3, [-2.0] * 3, [-1.0] * 3], np.float32)
  old = np.full((3, 3), -1.0, np.float32)
  fn = _jit_both(P.gspo, eps_low=0.1, eps_high=0.1)
  out, grad = fn(old + d, old, adv, mask)
  want = [
    -1.1,  # A=1:  max(-1.41421, -1.1) = -1.1 (clipped high)
    1.8096748,  # A=-2: max(2 * 0.90483742, 2 * 0.90483742) (inside)
    0.9,  # A=-1: max(0.5, 0.9) = 0.9 (clipped low)
  ]
  np.testing.assert_allclose(out.loss * mask, np.array(want)[:, None] * mask)
  np.testing.assert_array_equal(out.clip_high[:, 0], [1, 0, 0])
  np.testing.assert_array_equal(out.clip_low[:, 0], [0, 0, 1])
  # Sequence 2 is broadcast to its 2 tokens, so sum_t L = 2 L_2 and
  # d(2 L_2)/dlogp_t = 2 * (-A s / |o|) = 2 * 2 * 0.90483742 / 2 = 1.8096748.
  want_grad = [[0, 0, 0], [1.8096748, 1.8096748, 0], [0, 0, 0]]
  np.testing.assert_allclose(grad, want_grad, rtol=1e-6, atol=1e-7)


def test_cispo_hand_values_and_gradient():
  # eps = 0.2: weight clip(r, 0.8, 1.2), detached.
  logp = np.array([-1.0, -2.0, -0.5], np.float32)
  r = np.array([2.0, 0.5, 1.0])
  old = (logp - np.log(r)).astype(np.float32)
  adv = np.array([1.0, -1.0, 3.0], np.float32)
  mask = np.ones(3, np.float32)
  out, grad = _jit_both(P.cispo)(logp, old, adv, mask)
  want = [
    1.2,  # w = 1.2: -1.2 * 1 * (-1) = 1.2
    -1.6,  # w = 0.8: -0.8 * (-1) * (-2) = -1.6
    1.5,  # w = 1:   -1 * 3 * (-0.5) = 1.5
  ]
  np.testing.assert_allclose(out.loss, want, rtol=1e-6)
  np.testing.assert_array_equal(out.clip_high, [1, 0, 0])
  np.testing.assert_array_equal(out.clip_low, [0, 1, 0])
  # -w A: -1.2, +0.8, -3 (clipped tokens keep their gradient).
  np.testing.assert_allclose(grad, [-1.2, 0.8, -3.0], rtol=1e-6)


def test_cispo_capped_hand_values():
  # max_ratio = 5: r = 8 -> weight 5; r = 0.1 -> 0.1 (no lower bound).
  logp = np.array([-1.0, -2.0], np.float32)
  old = (logp - np.log([8.0, 0.1])).astype(np.float32)
  adv = np.array([1.0, 1.0], np.float32)
  out = _jit_loss(P.cispo_capped)(logp, old, adv, np.ones(2, np.float32))
  # -5 * 1 * (-1) = 5; -0.1 * 1 * (-2) = 0.2
  np.testing.assert_allclose(out.loss, [5.0, 0.2], rtol=1e-5)
  np.testing.assert_array_equal(out.clip_high, [1, 0])


def test_gmpo_hand_values_and_gradient():
  # eps = 0.4 in log space; two tokens per sequence.
  d = np.array([[0.6, -0.2], [-0.6, 0.2]], np.float32)
  adv = np.array([[1.0, 1.0], [-1.0, -1.0]], np.float32)
  old = np.full((2, 2), -1.0, np.float32)
  mask = np.ones((2, 2), np.float32)
  out, grad = _jit_both(P.gmpo)(old + d, old, adv, mask)
  # A>0: d* = min(d, clip(d)) = [0.4, -0.2], mean 0.1, rho = e^0.1 = 1.10517092
  #      L = -1 * 1.10517092
  # A<0: d* = max(d, clip(d)) = [-0.4, 0.2], mean -0.1, rho = e^-0.1 =
  #      0.90483742, L = +0.90483742
  want = [[-1.1051709] * 2, [0.9048374] * 2]
  np.testing.assert_allclose(out.loss, want, rtol=1e-6)
  np.testing.assert_array_equal(out.clip_high, [[1, 0], [0, 0]])
  np.testing.assert_array_equal(out.clip_low, [[0, 0], [1, 0]])
  # sum_t L_i = 2 L_i; clipped tokens get 0; the other gets
  # 2 * (-Abar rho / 2): -1.10517092 and +0.90483742.
  np.testing.assert_allclose(
    grad, [[0.0, -1.1051709], [0.0, 0.9048374]], rtol=1e-6, atol=1e-7
  )


def test_vespo_hand_values():
  # One sequence, two tokens, d = [0.2, 0.3]: log W = 0.5, W = e^0.5.
  # A_i = 1 >= 0: k = 2, lambda = 3: phi = W^2 e^{3 (1 - W)}
  #   = e^1 * e^{3 (1 - 1.64872127)} = 2.71828183 * e^{-1.94616381}
  #   = 2.71828183 * 0.14282091 = 0.38822748
  logp = np.array([-1.0, -0.5], np.float32)
  old = logp - np.array([0.2, 0.3], np.float32)
  adv = np.array([1.0, 1.0], np.float32)
  out = _jit_loss(P.vespo)(logp, old, adv, np.ones(2, np.float32))
  # L = -phi A logp = [0.38822748 * 1, 0.38822748 * 0.5]
  np.testing.assert_allclose(out.loss, [0.38822748, 0.19411374], rtol=1e-5)


def test_luspo_is_gspo_times_length():
  logp, old, adv, mask = _data(6, 0.3)
  kw = CASES["gspo"][1]
  g, _ = _jit_both(P.gspo, **kw)(logp, old, adv, mask)
  lu, _ = _jit_both(P.luspo, **kw)(logp, old, adv, mask)
  np.testing.assert_allclose(lu.loss, g.loss * mask.sum(-1, keepdims=True))


# --------------------------------------------------------------------------
# Properties named by the reference (section 7).


def _on_policy(seed=7):
  logp, _, adv, mask = _data(seed, token_adv=True)
  return logp, logp.copy(), adv, mask


@pytest.mark.parametrize(
  "name", ["ppo_clip", "gppo", "cispo", "sapo", "reinforce", "cispo_capped"]
)
def test_on_policy_gradient_is_reinforce(name):
  fn, kw, _, _ = CASES[name]
  logp, old, adv, mask = _on_policy()
  _, grad = _jit_both(fn, **kw)(logp, old, adv, mask)
  np.testing.assert_allclose(grad, -adv * mask, rtol=1e-6, atol=1e-7)


def test_sapo_gate_slope_and_value_at_ratio_one():
  # f(r) = (4/tau) sigmoid(tau (r - 1)); f(1) = 2/tau and f'(1) = 1, so the
  # on-policy loss is -(2/tau) A while the gradient is REINFORCE's -A.
  fn, kw, _, _ = CASES["sapo"]  # tau_pos = 1, tau_neg = 1.05
  logp, old, adv, mask = _on_policy()
  out, _ = _jit_both(fn, **kw)(logp, old, adv, mask)
  tau = np.where(adv > 0, 1.0, 1.05)
  np.testing.assert_allclose(
    out.loss * mask, -(2 / tau) * adv * mask, rtol=1e-6
  )
  # Slope of the gate in r by central differences through `sapo`, at
  # r = 1 -+ h for A = -1 (L = f(r; 1.05)) and A = +1 (L = -f(r; 1)):
  # (f(1 + h) - f(1 - h)) / 2h = 1 for both temperatures.
  h = 1e-3
  lp = np.log([1 - h, 1 + h, 1 - h, 1 + h]).astype(np.float32)
  a = np.array([-1.0, -1.0, 1.0, 1.0], np.float32)
  out, _ = _jit_both(fn, **kw)(lp, np.zeros(4, np.float32), a, np.ones(4))
  f = -out.loss * a
  assert f[0] < 2 / 1.05 < f[1] and f[2] < 2 / 1.0 < f[3]
  np.testing.assert_allclose((f[1] - f[0]) / (2 * h), 1, rtol=1e-3)
  np.testing.assert_allclose((f[3] - f[2]) / (2 * h), 1, rtol=1e-3)


def _seq_mean_token_mean(loss, mask):
  """sum_i (masked mean_t L) / number of sequences."""
  per_seq = jnp.sum(loss * mask, -1) / jnp.maximum(jnp.sum(mask, -1), 1.0)
  return jnp.sum(per_seq) / per_seq.size


def _gspo_data(seed):
  """Per-sequence A; token log-ratios = mu_i + zero-mean noise."""
  rng = np.random.default_rng(seed)
  _, old, adv, mask = _data(seed)
  n = np.maximum(mask.sum(-1, keepdims=True), 1)
  noise = rng.uniform(-0.5, 0.5, SHAPE) * mask
  noise = (noise - noise.sum(-1, keepdims=True) / n) * mask
  mu = rng.uniform(-0.35, 0.35, SHAPE[:-1])[..., None]
  return (old + mu + noise).astype(np.float32), old, adv, mask, mu


@pytest.mark.parametrize(
  "eps", [(0.1, 0.2), (3e-4, 4e-4)], ids=["wide", "default"]
)
def test_gspo_token_equals_gspo_after_seq_mean_token_mean(eps):
  logp, old, adv, mask, _mu = _gspo_data(8)
  kw = {"eps_low": eps[0], "eps_high": eps[1]}

  def total(fn):
    return lambda lp: _seq_mean_token_mean(
      fn(lp, old, adv, mask, **kw).loss, mask
    )

  v_seq, g_seq = jax.jit(jax.value_and_grad(total(P.gspo)))(logp)
  v_tok, g_tok = jax.jit(jax.value_and_grad(total(P.gspo_token)))(logp)
  np.testing.assert_allclose(v_tok, v_seq, rtol=1e-6)
  np.testing.assert_allclose(g_tok, g_seq, rtol=1e-5, atol=1e-8)
  # Both regimes are present: some sequences get gradient, some are clipped.
  seq_has_grad = np.any(np.abs(g_seq) > 0, axis=-1)
  valid = mask.sum(-1) > 0
  assert seq_has_grad[valid].any() and not seq_has_grad[valid].all()


def test_gspo_token_clamps_the_log_ratio_like_verl():
  # log s_i = 12 > 10: value e^10 (A < 0 keeps the unclipped branch) and, as
  # in verl's torch.clamp, no gradient.
  logp = np.array([[-1.0, -1.0]], np.float32)
  old = logp - 12.0
  adv = -np.ones((1, 2), np.float32)
  mask = np.ones((1, 2), np.float32)
  out, grad = _jit_both(P.gspo_token)(logp, old, adv, mask)
  np.testing.assert_allclose(out.loss, [[math.exp(10.0)] * 2], rtol=1e-6)
  np.testing.assert_array_equal(grad, 0.0)


def _trl_delta_loss(logp, old, adv, eps_low, eps_high, delta):
  """TRL _compute_loss with `delta`: -min(min(r, delta) A, clip(r) A)."""
  coef_1 = jnp.exp(logp - old)
  coef_2 = jnp.clip(coef_1, 1 - eps_low, 1 + eps_high)
  coef_1 = jnp.minimum(coef_1, delta)
  return -jnp.minimum(coef_1 * adv, coef_2 * adv)


def test_dual_clip_equals_trl_delta():
  # Every ratio with A > 0 (first half) and A < 0 (second half); c = 3.
  eps_low, eps_high, c = 0.2, 0.28, 3.0
  r = np.tile([0.3, 0.7, 0.9, 1.1, 1.4, 2.0, 2.9, 3.1, 5.0, 9.0], 2)
  old = np.full(r.shape, -2.0, np.float32)
  logp = (old + np.log(r)).astype(np.float32)
  adv = np.linspace(0.5, 2.0, r.size) * np.repeat([1.0, -1.0], r.size // 2)
  adv = adv.astype(np.float32)
  mask = np.ones(r.shape, np.float32)

  def ours(lp):
    return P.ppo_clip(
      lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high, dual_clip=c
    ).loss

  def trl(lp):
    return _trl_delta_loss(lp, old, adv, eps_low, eps_high, c)

  @jax.jit
  def both(lp):
    g_ours = jax.grad(lambda x: jnp.sum(ours(x)))(lp)
    g_trl = jax.grad(lambda x: jnp.sum(trl(x)))(lp)
    return ours(lp), trl(lp), g_ours, g_trl

  v_ours, v_trl, g_ours, g_trl = jax.device_get(both(logp))
  np.testing.assert_allclose(v_ours, v_trl, rtol=1e-6)
  np.testing.assert_allclose(g_ours, g_trl, rtol=1e-6)
  for half in (slice(0, 10), slice(10, 20)):
    assert np.any(g_ours[half] != 0) and np.any(g_ours[half] == 0)


def test_gppo_values_equal_ppo_clip_but_keeps_clipped_gradients():
  logp, old, adv, mask = _data(9, 3.0, shape=(4, 3, 16), token_adv=True)
  kw = {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0}
  ppo, g_ppo = _jit_both(P.ppo_clip, **kw)(logp, old, adv, mask)
  gp, g_gp = _jit_both(P.gppo, **kw)(logp, old, adv, mask)
  for a, b in zip(gp, ppo, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  r = np.exp(np.where(mask > 0, logp - old, 0.0))
  high = (mask > 0) & (adv > 0) & (r > 1.28)
  assert high.sum() >= 3
  np.testing.assert_array_equal(g_ppo[high], 0.0)
  np.testing.assert_allclose(g_gp[high], -adv[high] * 1.28, rtol=1e-6)
  low = (mask > 0) & (adv < 0) & (r < 0.8)
  assert low.sum() >= 3
  np.testing.assert_array_equal(g_ppo[low], 0.0)
  np.testing.assert_allclose(g_gp[low], -adv[low] * 0.8, rtol=1e-6)


# --------------------------------------------------------------------------
# Clip-Cov and KL-Cov.


def _cov_data(n_seq=4, t=10):
  """All tokens have covariance exactly 2 (inside (1, 5)) and r = 1.

  Half the sequences have A = 2, logp = -0.5; the others A = -2,
  logp = -2.5. Means: A 0, logp -1.5, so Cov = (+-2)(+-1) = 2.
  """
  adv = np.repeat([2.0, -2.0], n_seq // 2)[:, None] * np.ones((n_seq, t))
  logp = np.where(adv > 0, -0.5, -2.5)
  mask = np.ones((n_seq, t))
  mask[0, -1] = mask[-1, -1] = 0  # one pad on each side keeps the means
  return tuple(np.asarray(a, np.float32) for a in (logp, logp, adv, mask))


def test_clip_cov_zeroes_exactly_k_tokens_deterministically():
  logp, old, adv, mask = _cov_data()
  n_valid = int(mask.sum())  # 38
  # The default (threefry) key; one compilation serves the whole test.
  fn = _jit_both(P.clip_cov, ratio=0.1)
  out, grad = fn(logp, old, adv, mask, key=jax.random.key(3))
  dropped = (out.loss == 0) & (mask > 0)
  assert dropped.sum() == int(0.1 * n_valid) == 3
  # Unchanged elsewhere: PPO at r = 1 is -A.
  np.testing.assert_allclose(
    out.loss[~dropped & (mask > 0)], -adv[~dropped & (mask > 0)]
  )
  # Dropped tokens carry no gradient; the others the REINFORCE one.
  np.testing.assert_array_equal(grad[dropped], 0.0)
  np.testing.assert_allclose(grad[~dropped], (-adv * mask)[~dropped])
  # Indicators: dropped tokens by the sign of A.
  np.testing.assert_array_equal(out.clip_high > 0, dropped & (adv > 0))
  np.testing.assert_array_equal(out.clip_low > 0, dropped & (adv < 0))
  # Same key, same choice; other keys choose other tokens, and over many keys
  # every valid token is chosen at some point (uniform choice), never padding.
  again, _ = fn(logp, old, adv, mask, key=jax.random.key(3))
  np.testing.assert_array_equal(again.loss, out.loss)
  keys = [jax.random.key(seed) for seed in range(100, 250)]
  many = [fn(logp, old, adv, mask, key=k)[0].loss for k in keys]
  chosen = (np.asarray(many) == 0) & (mask > 0)
  assert np.all(chosen.sum((1, 2)) == 3)
  counts = chosen.sum(0)
  assert np.all(counts[mask > 0] > 0) and np.all(counts[mask == 0] == 0)
  assert np.any(np.any(chosen != chosen[:1], axis=(1, 2)))


def test_clip_cov_with_few_candidates_drops_all_of_them():
  logp, old, adv, mask = _cov_data()
  # Push some tokens' ratio outside the PPO range (not candidates) and others'
  # covariance below the bound; all stay valid.
  logp = logp.copy()
  logp[0, :3] += 0.5  # A = 2, r = e^0.5 > 1.2: PPO-clipped
  adv = adv.copy()
  adv[3, :] = -0.25  # Cov < 1 for the last sequence
  out = _jit_loss(P.clip_cov, ratio=1.0)(logp, old, adv, mask, key=RBG_KEY)
  cov = _np_cov(logp, adv, mask)
  ppo = _per_token(_ppo_token, logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
  r = np.exp(logp - old)
  cut = ((adv > 0) & (r > 1.2)) | ((adv < 0) & (r < 0.8))
  cand = (mask > 0) & ~cut & (cov > 1.0) & (cov < 5.0)
  assert 0 < cand.sum() < (mask > 0).sum()
  np.testing.assert_allclose(
    out.loss * mask, np.where(cand, 0.0, ppo), rtol=1e-6
  )
  np.testing.assert_array_equal(out.clip_high > 0, (cut | cand) & (adv > 0))


def test_kl_cov_penalises_exactly_the_top_k_tokens():
  logp, old, adv, mask = _data(10, 0.5, token_adv=True)
  ratio, kappa = 0.15, 0.5
  out = _jit_loss(P.kl_cov, ratio=ratio, kappa=kappa)(logp, old, adv, mask)
  base = -adv * np.exp(np.where(mask > 0, logp - old, 0.0))
  penalised = (np.abs(out.loss - base) > 1e-5) & (mask > 0)
  top = _kl_cov_top(logp, adv, mask, ratio)
  k = int(ratio * (mask > 0).sum())
  assert k >= 2 and top.sum() == k
  np.testing.assert_array_equal(penalised, top)
  np.testing.assert_allclose(
    (out.loss - base)[top], kappa * np.abs(logp - old)[top], rtol=1e-5
  )
  assert not np.any(out.clip_low) and not np.any(out.clip_high)


def test_cov_losses_select_at_least_one_token():
  # k = max(floor(2e-4 * 38), 1) = 1 with the default ratio.
  logp, old, adv, mask = _cov_data()
  out = _jit_loss(P.clip_cov)(logp, old, adv, mask, key=RBG_KEY)
  assert ((out.loss == 0) & (mask > 0)).sum() == 1
  logp2 = logp.copy()
  logp2[0, 0] += 0.3  # the single largest covariance; |d| = 0.3 there
  out = _jit_loss(P.kl_cov)(logp2, old, adv, mask)
  base = -adv * np.exp(logp2 - old)
  penalised = (np.abs(out.loss - base) > 1e-5) & (mask > 0)
  assert penalised.sum() == 1 and penalised[0, 0]


# --------------------------------------------------------------------------
# Validation.

BAD = [
  (P.ppo_clip, {"eps_low": 0.0}, "eps_low"),
  (P.ppo_clip, {"eps_high": -0.1}, "eps_high"),
  (P.ppo_clip, {"dual_clip": 1.0}, "dual_clip"),
  (P.ppo_clip, {"log_ratio_clamp": 0.0}, "log_ratio_clamp"),
  (P.gppo, {"dual_clip": 0.5}, "dual_clip"),
  (P.gppo, {"eps_high": 0.0}, "eps_high"),
  (P.gspo, {"eps_low": 0.0}, "eps_low"),
  (P.gspo_token, {"max_log_ratio": 0.0}, "max_log_ratio"),
  (P.gspo_token, {"eps_high": 0.0}, "eps_high"),
  (P.luspo, {"eps_high": -1.0}, "eps_high"),
  (P.sapo, {"tau_pos": 0.0}, "tau_pos"),
  (P.sapo, {"tau_neg": -1.0}, "tau_neg"),
  (P.cispo, {"eps_low": 0.0}, "eps_low"),
  (P.cispo_capped, {"max_ratio": 0.0}, "max_ratio"),
  (P.gmpo, {"eps_high": 0.0}, "eps_high"),
  (P.clip_cov, {"key": RBG_KEY, "ratio": 0.0}, "ratio"),
  (P.clip_cov, {"key": RBG_KEY, "ratio": 1.5}, "ratio"),
  (
    P.clip_cov,
    {"key": jax.random.key(0), "cov_lb": 5.0, "cov_ub": 1.0},
    "cov_lb",
  ),
  (P.clip_cov, {"key": RBG_KEY, "eps_low": 0.0}, "eps_low"),
  (P.kl_cov, {"ratio": 0.0}, "ratio"),
  (P.kl_cov, {"kappa": -1.0}, "kappa"),
  (P.vespo, {"lambda_pos": 0.0}, "lambda_pos"),
  (P.vespo, {"k_neg": -1.0}, "k_neg"),
]


@pytest.mark.parametrize(
  "fn,kw,match", BAD, ids=[f"{f.__name__}-{m}" for f, _, m in BAD]
)
def test_bad_hyperparameters_raise(fn, kw, match):
  data = _data(0)
  with pytest.raises(ValueError, match=match):
    fn(*data, **kw)


@pytest.mark.parametrize("name", list(_all_losses()))
def test_bad_shapes_raise(name):
  fn, kw = _all_losses()[name]
  logp, old, adv, mask = _data(0)
  with pytest.raises(ValueError, match="adv_BT"):
    fn(logp, old, adv[..., :-1], mask, **kw)
  with pytest.raises(ValueError, match="logp_BT"):
    fn(np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(1.0), **kw)
