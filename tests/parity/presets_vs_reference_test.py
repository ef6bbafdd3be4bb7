"""Presets against whole-algorithm numpy references of ALGORITHMS.md.

Each reference below is written from the formulas in
shared/reference/ALGORITHMS.md (sections 1, 2, 4, 5.2, 5.3) with plain numpy
loops, independently of rljax's pieces. Values must match to float32
precision and gradients (central differences in float64) to 1e-3.
"""

import jax
import numpy as np
import pytest

import rljax
from rljax import testing


def _groups(batch):
  mask = np.asarray(batch.mask_PGT, np.float64)
  return mask, mask.sum(-1), np.asarray(batch.rewards_PG, np.float64)


def _ratio(logp, batch):
  return np.exp(logp - np.asarray(batch.old_logp_PGT, np.float64))


def _ppo(r, adv, lo, hi):
  return np.maximum(-adv * r, -adv * np.clip(r, 1 - lo, 1 + hi))


def _seq_mean_token_mean(loss, mask):
  n = mask.sum(-1)
  per_seq = (loss * mask).sum(-1)[n > 0] / n[n > 0]
  return per_seq.sum() / (n > 0).sum()


def _token_mean(loss, mask):
  return (loss * mask).sum() / mask.sum()


def _std_adv(rewards, keep=None, eps=1e-6, scale=True):
  adv = np.zeros_like(rewards)
  for p in range(rewards.shape[0]):
    if keep is not None and not keep[p]:
      continue
    g = rewards[p]
    adv[p] = g - g.mean()
    if scale:
      adv[p] /= g.std(ddof=1) + eps
  return adv


def grpo_reference(logp, batch):
  mask, _, rewards = _groups(batch)
  adv = _std_adv(rewards)[..., None]
  return _seq_mean_token_mean(_ppo(_ratio(logp, batch), adv, 0.2, 0.2), mask)


def dapo_reference(logp, batch, max_length=6, buffer=2):
  mask, lengths, rewards = _groups(batch)
  # Dynamic sampling on the task reward (accuracy), before shaping.
  keep = np.array([g.max() > g.min() for g in rewards])
  # Soft overlong punishment: 0 up to L_max - buffer, then -1 per buffer.
  over = np.clip(lengths - (max_length - buffer), 0, buffer)
  rewards = rewards - over / buffer
  adv = _std_adv(rewards, keep)[..., None]
  mask = mask * keep[:, None, None]
  return _token_mean(_ppo(_ratio(logp, batch), adv, 0.2, 0.28), mask)


def dr_grpo_reference(logp, batch):
  mask, lengths, rewards = _groups(batch)
  adv = _std_adv(rewards, scale=False)[..., None]
  loss = _ppo(_ratio(logp, batch), adv, 0.2, 0.2)
  return (loss * mask).sum() / ((lengths > 0).sum() * mask.shape[-1])


def rloo_reference(logp, batch):
  mask, _, rewards = _groups(batch)
  g = rewards.shape[-1]
  adv = np.stack(
    [[r[i] - np.delete(r, i).mean() for i in range(g)] for r in rewards]
  )[..., None]
  return _token_mean(_ppo(_ratio(logp, batch), adv, 0.2, 0.2), mask)


def sapo_reference(logp, batch):
  mask, _, rewards = _groups(batch)
  adv = np.broadcast_to(_std_adv(rewards)[..., None], mask.shape)
  tau = np.where(adv > 0, 1.0, 1.05)
  gate = 4 / tau / (1 + np.exp(-tau * (_ratio(logp, batch) - 1)))
  return _seq_mean_token_mean(-gate * adv, mask)


def gspo_reference(logp, batch, lo=3e-4, hi=4e-4):
  mask, lengths, rewards = _groups(batch)
  adv = _std_adv(rewards)
  d = (logp - np.asarray(batch.old_logp_PGT, np.float64)) * mask
  s = np.exp(d.sum(-1) / lengths)
  per_seq = np.maximum(-adv * s, -adv * np.clip(s, 1 - lo, 1 + hi))
  return per_seq.mean()


def cispo_reference(logp, batch, cap=5.0):
  mask, _, rewards = _groups(batch)
  adv = _std_adv(rewards)[..., None]
  weight = np.minimum(_ratio(logp, batch), cap)  # detached in the gradient
  return _token_mean(-weight * adv * logp, mask), weight * adv


CASES = {
  "grpo": (grpo_reference, {}),
  "dapo": (dapo_reference, {"max_length": 6, "overlong_buffer": 2}),
  "dr_grpo": (dr_grpo_reference, {}),
  "rloo": (rloo_reference, {}),
  "sapo": (sapo_reference, {}),
  "gspo": (gspo_reference, {}),
}


def _rljax_loss(name, kwargs, batch):
  algo = rljax.algorithms.get(name, **kwargs)
  prepared, state = algo.prepare(batch, algo.init())
  return jax.jit(lambda l: algo.loss(l, prepared, state)[0].value)


def _central_differences(fn, x, h=1e-5):
  grad = np.zeros_like(x)
  for idx in np.ndindex(x.shape):
    up, down = x.copy(), x.copy()
    up[idx] += h
    down[idx] -= h
    grad[idx] = (fn(up) - fn(down)) / (2 * h)
  return grad


@pytest.mark.parametrize("name", CASES)
def test_value_and_gradient_match_reference(name):
  reference, kwargs = CASES[name]
  batch = testing.random_batch(7, prompts=3, samples=4, tokens=6)
  # Ratios spread enough that clipping is active on some tokens.
  logp = testing.perturbed_logp(batch, scale=0.4).astype(np.float64)
  loss = _rljax_loss(name, kwargs, batch)
  np.testing.assert_allclose(
    loss(logp.astype(np.float32)), reference(logp, batch), rtol=2e-5
  )
  grad = jax.grad(loss)(logp.astype(np.float32))
  numeric = _central_differences(lambda l: reference(l, batch), logp)
  np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-5)


def test_cispo_value_and_detached_weight_gradient():
  batch = testing.random_batch(8, prompts=3, samples=4, tokens=6)
  logp = testing.perturbed_logp(batch, scale=0.8).astype(np.float64)
  loss = _rljax_loss("cispo", {}, batch)
  value, weighted_adv = cispo_reference(logp, batch)
  np.testing.assert_allclose(loss(logp.astype(np.float32)), value, rtol=2e-5)
  # CISPO's gradient is -sg[w] A / N_tokens per token: the weight is detached.
  mask = np.asarray(batch.mask_PGT, np.float64)
  expected = -weighted_adv * mask / mask.sum()
  grad = jax.grad(loss)(logp.astype(np.float32))
  np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-7)
