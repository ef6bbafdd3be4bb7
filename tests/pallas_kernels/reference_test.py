"""The dense reference (the oracle) against float64 numpy and autodiff."""

import jax
import jax.numpy as jnp
from jax.test_util import check_grads
import numpy as np

from pallas_kernels import _reference

N, D, V = 37, 16, 300
INV_TEMP = 1.0 / 0.7


def _data(seed=0):
  rng = np.random.default_rng(seed)
  hidden = rng.normal(size=(N, D)).astype(np.float32)
  unembed = (0.5 * rng.normal(size=(D, V))).astype(np.float32)
  targets = rng.integers(0, V, N).astype(np.int32)
  return hidden, unembed, targets


def _numpy_logprob_entropy(hidden, unembed, targets, inv_temp):
  """Plain float64 loops: log-softmax of each row, then -sum p log p."""
  h, w = hidden.astype(np.float64), unembed.astype(np.float64)
  logp, entropy = [], []
  for n in range(h.shape[0]):
    z = [
      inv_temp * sum(h[n, d] * w[d, v] for d in range(h.shape[1]))
      for v in range(w.shape[1])
    ]
    z = np.array(z)
    lse = z.max() + np.log(np.sum(np.exp(z - z.max())))
    logq = z - lse
    logp.append(logq[targets[n]])
    entropy.append(-np.sum(np.exp(logq) * logq))
  return np.array(logp), np.array(entropy)


def test_dense_matches_float64_numpy():
  hidden, unembed, targets = _data()
  fn = jax.jit(_reference.logprob_entropy)
  logp, entropy = fn(hidden, unembed, targets, INV_TEMP)
  want_logp, want_entropy = _numpy_logprob_entropy(
    hidden[:5], unembed, targets[:5], INV_TEMP
  )
  np.testing.assert_allclose(logp[:5], want_logp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(entropy[:5], want_entropy, rtol=1e-5, atol=1e-5)
  assert logp.dtype == entropy.dtype == jnp.float32


def test_hand_computed_tiny_case():
  # h = 1, unembed = [0, ln(3)/2], temperature 0.5 -> z = [0, ln 3],
  # p = [1/4, 3/4], lse = ln 4. Target 1: logp = ln(3/4) = -0.2876821;
  # entropy = 0.25 ln 4 + 0.75 ln(4/3) = 0.3465736 + 0.2157616 = 0.5623351.
  # d logp / dz = onehot - p = [-1/4, 1/4]; d/dunembed = h dz / T =
  # [-0.5, 0.5]; d/dh = sum_j dz_j W_j / T = (1/4)(ln(3)/2) / 0.5 = 0.2746531.
  hidden = jnp.array([[1.0]])
  unembed = jnp.array([[0.0, 0.5493061]])
  targets = jnp.array([1])
  logp, entropy = _reference.logprob_entropy(hidden, unembed, targets, 2.0)
  np.testing.assert_allclose(logp, [-0.2876821], rtol=1e-6)
  np.testing.assert_allclose(entropy, [0.5623351], rtol=1e-6)
  grad = jax.jit(
    jax.grad(
      lambda h, w: _reference.logprob_entropy(h, w, targets, 2.0)[0].sum(),
      (0, 1),
    )
  )(hidden, unembed)
  np.testing.assert_allclose(grad[0], [[0.2746531]], rtol=1e-6)
  np.testing.assert_allclose(grad[1], [[-0.5, 0.5]], rtol=1e-6)


def test_dense_check_grads():
  hidden, unembed, targets = _data(1)
  hidden, unembed, targets = hidden[:4, :6], unembed[:6, :20], targets[:4] % 20
  weights = jnp.linspace(0.5, 1.5, 4)

  def f(h, w):
    logp, entropy = _reference.logprob_entropy(h, w, targets, INV_TEMP)
    return jnp.sum(logp * weights) + jnp.sum(entropy * weights[::-1])

  check_grads(
    jax.jit(f), (hidden, unembed), order=1, modes=["rev"], eps=1e-3, rtol=1e-2
  )


def test_contract_pair_matches_dense_autodiff():
  hidden, unembed, targets = _data(2)
  a, b = np.random.default_rng(3).normal(size=(2, N)).astype(np.float32)

  def run(h, w):
    stats = _reference.forward(h, w, targets, INV_TEMP)
    grads = _reference.backward(
      h, w, targets, INV_TEMP, stats.lse, stats.ez, a, b
    )
    out, vjp = jax.vjp(
      lambda h, w: _reference.logprob_entropy(h, w, targets, INV_TEMP), h, w
    )
    return stats, grads, out, vjp((a, b))

  stats, got, (logp, entropy), want = jax.jit(run)(hidden, unembed)
  np.testing.assert_allclose(stats.target_logit - stats.lse, logp, atol=1e-5)
  np.testing.assert_allclose(stats.lse - stats.ez, entropy, atol=1e-5)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())
