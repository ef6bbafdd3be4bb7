"""Loss aggregation modes; each returns a `Mean` (numerator, denominator)."""

from rljax.aggregate._aggregate import decoupled
from rljax.aggregate._aggregate import seq_mean_token_mean
from rljax.aggregate._aggregate import seq_mean_token_sum
from rljax.aggregate._aggregate import seq_mean_token_sum_norm
from rljax.aggregate._aggregate import token_mean
from rljax.aggregate._aggregate import token_sum

__all__ = [
  "decoupled",
  "seq_mean_token_mean",
  "seq_mean_token_sum",
  "seq_mean_token_sum_norm",
  "token_mean",
  "token_sum",
]
