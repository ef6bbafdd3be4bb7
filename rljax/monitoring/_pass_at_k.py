"""The unbiased pass@k estimator of Chen et al. (2021)."""

from typing import Any

import numpy as np


def pass_at_k(num_samples: Any, num_correct: Any, k: int) -> np.ndarray:
  r"""Unbiased pass@k per problem from n samples of which c are correct.

  .. math::
    \text{pass@}k = 1 - \binom{n-c}{k} / \binom{n}{k}
                  = 1 - \prod_{i=n-c+1}^{n} (1 - k / i)

  the probability that k samples drawn without replacement from the n
  include a correct one. The product form never builds the (huge) binomials;
  it is 1 exactly when n - c < k (every k-subset holds a correct sample).
  Average the result over problems for the benchmark's pass@k.

  Args:
    num_samples: n per problem (integers >= k), any shape.
    num_correct: c per problem (0 <= c <= n), broadcastable with n.
    k: the number of attempts (>= 1).

  Returns:
    float64 pass@k with the broadcast shape of n and c.

  References:
    Chen et al., "Evaluating Large Language Models Trained on Code", 2021
    (arXiv:2107.03374), Section 2.1 and its numpy implementation.
  """
  n, c = np.broadcast_arrays(*_integers(num_samples, num_correct))
  if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
    raise ValueError(f"k must be an integer >= 1; got {k!r}.")
  if np.any(c < 0) or np.any(c > n):
    raise ValueError(
      "num_correct must satisfy 0 <= num_correct <= num_samples."
    )
  if np.any(n < k):
    raise ValueError(
      f"k={k} exceeds num_samples={int(n.min())}: pass@k needs at least k "
      "samples per problem."
    )
  i = np.arange(1, int(n.max(initial=0)) + 1)
  # Factors (1 - k/i) for i in (n - c, n]; the rest of the row is 1.
  in_product = (i > (n - c)[..., None]) & (i <= n[..., None])
  fail = np.prod(np.where(in_product, 1.0 - k / i, 1.0), axis=-1)
  return np.where(n - c < k, 1.0, 1.0 - fail)


def _integers(*arrays: Any) -> list[np.ndarray]:
  """Integer arrays, or a ValueError for non-integral counts."""
  out = []
  for name, x in zip(("num_samples", "num_correct"), arrays):
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.integer) and not (
      np.issubdtype(x.dtype, np.floating) and np.all(x == np.round(x))
    ):
      raise ValueError(f"{name} must hold integer counts; got {x!r}.")
    out.append(x.astype(np.int64))
  return out
