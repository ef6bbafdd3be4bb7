"""pass@k: hand-computed values, brute force over subsets, stability."""

import itertools
import math

import numpy as np
import pytest

from rljax.monitoring import pass_at_k


def test_hand_computed_values():
  # n=5, c=2, k=1: 1 - C(3,1)/C(5,1) = 1 - 3/5 = 0.4 (= c/n).
  assert pass_at_k(5, 2, 1) == pytest.approx(0.4, abs=1e-15)
  # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7.
  assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-15)
  # c=0: no subset holds a correct sample.
  assert pass_at_k(5, 0, 3) == 0.0
  # n-c=1 < k=2: every pair holds a correct sample -> exactly 1.
  assert pass_at_k(5, 4, 2) == 1.0
  # n=k: pass@n is 1 as soon as one sample is correct.
  assert pass_at_k(4, 1, 4) == 1.0


def _brute_force(n, c, k):
  """The fraction of k-subsets of n samples (c correct) with a correct one."""
  samples = [True] * c + [False] * (n - c)
  subsets = list(itertools.combinations(range(n), k))
  return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_matches_brute_force_enumeration_vectorized():
  cases = [
    (n, c, k)
    for n in range(1, 8)
    for c in range(n + 1)
    for k in range(1, n + 1)
  ]
  for k in range(1, 8):
    ns = np.asarray([n for n, _, kk in cases if kk == k])
    cs = np.asarray([c for _, c, kk in cases if kk == k])
    got = pass_at_k(ns, cs, k)
    expected = [_brute_force(n, c, k) for n, c in zip(ns, cs)]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_broadcasts_and_keeps_shape():
  got = pass_at_k(10, np.asarray([[0, 1], [5, 10]]), 3)
  assert got.shape == (2, 2) and got.dtype == np.float64
  assert got[0, 0] == 0.0 and got[1, 1] == 1.0
  assert got[0, 1] == pytest.approx(3 / 10)  # 1 - C(9,3)/C(10,3) = k/n


def test_large_n_is_stable():
  # C(1000, 100) overflows float64; the product form stays exact to 1e-12.
  n, c, k = 1000, 7, 100
  exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # exact integer ratio
  assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="k=6 exceeds num_samples=5"):
    pass_at_k(5, 2, 6)
  with pytest.raises(ValueError, match="k must be an integer >= 1"):
    pass_at_k(5, 2, 0)
  with pytest.raises(ValueError, match="num_correct must satisfy"):
    pass_at_k(5, 6, 1)
  with pytest.raises(ValueError, match="num_samples must hold integer"):
    pass_at_k(5.5, 2, 1)
