"""The contract every token log-prob schedule implements.

A schedule is a pair of pure functions, `forward` and `backward`, over

* ``hidden_ND``: final hidden states, [N, D], float32 or bfloat16;
* ``unembed_DV``: the unembedding (LM head), [D, V], float32 or bfloat16;
* ``targets_N``: the token ids whose log-probs are wanted, [N] int, any id in
  [0, V) (masking ignored tokens is the caller's job);
* ``inv_temp``: 1 / temperature as a float32 scalar array.

With z = (hidden @ unembed) * inv_temp (the logits, accumulated in float32),
p = softmax(z):

    forward  -> Stats(target_logit = z[target], lse = logsumexp(z),
                      ez = sum_j p_j z_j),  three float32 [N] arrays
    backward -> (d_hidden, d_unembed) given cotangents a_N on
                logp = target_logit - lse and b_N on entropy = lse - ez:
        dz_j      = a (onehot(target)_j - p_j) - b p_j (z_j - ez)
        d_hidden  = (dz @ unembed^T) * inv_temp   (in hidden's dtype)
        d_unembed = (hidden^T @ dz) * inv_temp    (in unembed's dtype)

The backward recomputes z blockwise from the saved ``lse_N`` and ``ez_N``, so
no schedule but the dense reference ever holds [N, V]. N and V need not be
multiples of ``block_n`` / ``block_v``: schedules handle the ragged edge
themselves. The Pallas schedules (`_pallas_tpu`, `_pallas_gpu`) take one more
keyword, ``interpret: bool = False``, to run under the Pallas interpreter.

One `jax.custom_vjp` wrapper (`pallas_kernels._api`) turns any such pair into
differentiable functions; the schedules themselves never see autodiff.
"""

from typing import NamedTuple, Protocol

import jax


class Stats(NamedTuple):
  """Per-token softmax statistics saved by the forward pass.

  Attributes:
    target_logit: z[target], [N] float32.
    lse: logsumexp_j z_j, [N] float32.
    ez: sum_j softmax(z)_j z_j, [N] float32 (entropy = lse - ez).
  """

  target_logit: jax.Array
  lse: jax.Array
  ez: jax.Array


class Forward(Protocol):
  """forward(hidden_ND, unembed_DV, targets_N, inv_temp, *, block_n, block_v)
  -> Stats of three float32 [N] arrays."""

  def __call__(
    self,
    hidden_ND: jax.Array,
    unembed_DV: jax.Array,
    targets_N: jax.Array,
    inv_temp: jax.Array,
    *,
    block_n: int,
    block_v: int,
  ) -> Stats: ...


class Backward(Protocol):
  """backward(hidden_ND, unembed_DV, targets_N, inv_temp, lse_N, ez_N, a_N,
  b_N, *, block_n, block_v) -> (d_hidden_ND, d_unembed_DV), each in its
  input's dtype."""

  def __call__(
    self,
    hidden_ND: jax.Array,
    unembed_DV: jax.Array,
    targets_N: jax.Array,
    inv_temp: jax.Array,
    lse_N: jax.Array,
    ez_N: jax.Array,
    a_N: jax.Array,
    b_N: jax.Array,
    *,
    block_n: int,
    block_v: int,
  ) -> tuple[jax.Array, jax.Array]: ...
