"""Per-token KL estimators between the policy and the reference model.

Each estimator takes the log-probabilities of the SAMPLED tokens under the
policy and the reference, `logp_BT` and `ref_logp_BT` ([..., T], any leading
axes), and returns a per-token estimate of KL(pi || pi_ref) in float32, with
x = logp - ref_logp. `logp_BT` carries the gradient; `ref_logp_BT` is a
constant (stop_gradient). Masks are applied later, by the aggregation.

Which estimator to use depends on where the KL goes. As a reward (no gradient)
k1 is the unbiased estimate of KL(pi || pi_ref). As a LOSS, what matters is the
expected gradient on-policy (y ~ pi):

* k1: E[grad k1] = E[grad log pi] = 0, so k1 as a loss does nothing on average;
* k2: E[grad k2] = grad KL(pi || pi_ref), the KL that is being estimated;
* k3: E[grad k3] = grad KL(pi_ref || pi), the KL in the other direction.

`straight_through` keeps an estimator's value but gives it k2's gradient.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats

Estimator = Callable[..., jax.Array]

# verl clamps the log-ratio before exp so that e^{-x} cannot overflow.
_LOG_RATIO_CLAMP = 20.0


def _log_ratio(logp_BT: ArrayLike, ref_logp_BT: ArrayLike) -> jax.Array:
  """x = logp - sg(ref_logp) in float32, after a shape check."""
  checks.same_shape(["logp_BT", "ref_logp_BT"], logp_BT, ref_logp_BT)
  ref = jax.lax.stop_gradient(stats.f32(ref_logp_BT))
  return stats.f32(logp_BT) - ref


def kl_k1(logp_BT: ArrayLike, ref_logp_BT: ArrayLike) -> jax.Array:
  """k1 = x = log pi - log pi_ref at the sampled token.

  Unbiased for KL(pi || pi_ref) on-policy, but can be negative per token and
  its expected gradient on-policy is zero: use it in the reward, not the loss.
  No clamp (verl); OpenRLHF clips to [-10, 10].

  Args:
    logp_BT: policy log-probs of the sampled tokens, [..., T] (differentiated).
    ref_logp_BT: reference log-probs, same shape (constant).

  Returns:
    Per-token k1, [..., T] float32. Gradient w.r.t. logp: 1.

  References: Schulman, "Approximating KL divergence" (2020); verl `kl`/`k1`,
  OpenRLHF `compute_approx_kl` `k1`.
  """
  return _log_ratio(logp_BT, ref_logp_BT)


def kl_k2(logp_BT: ArrayLike, ref_logp_BT: ArrayLike) -> jax.Array:
  """k2 = x^2 / 2.

  Biased but non-negative; as a loss its expected on-policy gradient is the
  exact gradient of KL(pi || pi_ref).

  Args:
    logp_BT: policy log-probs of the sampled tokens, [..., T] (differentiated).
    ref_logp_BT: reference log-probs, same shape (constant).

  Returns:
    Per-token k2, [..., T] float32. Gradient w.r.t. logp: x.

  References: Schulman (2020); verl `mse`/`k2`, OpenRLHF `k2`.
  """
  x = _log_ratio(logp_BT, ref_logp_BT)
  return 0.5 * jnp.square(x)


def kl_k3(
  logp_BT: ArrayLike,
  ref_logp_BT: ArrayLike,
  *,
  clamp: float | None = 10.0,
) -> jax.Array:
  """k3 = e^{-x} - 1 + x = pi_ref/pi - log(pi_ref/pi) - 1 (low variance).

  Unbiased for KL(pi || pi_ref) on-policy and non-negative per token. verl's
  safety clamps (defaults here): -x is clipped to [-20, 20] before the exp,
  and the result to [-clamp, clamp]; a token whose k3 exceeds `clamp` gets no
  gradient. ``clamp=None`` disables both clips (TRL GRPO's form).

  Args:
    logp_BT: policy log-probs of the sampled tokens, [..., T] (differentiated).
    ref_logp_BT: reference log-probs, same shape (constant).
    clamp: bound on the result (verl and OpenRLHF: 10), or None.

  Returns:
    Per-token k3, [..., T] float32. Gradient w.r.t. logp: 1 - e^{-x} (0 where
    a clip is active).

  References: Schulman (2020); verl `low_var_kl`/`k3` (`kl_penalty_forward`),
  TRL GRPO `beta`, OpenRLHF `k3`.
  """
  neg_x = -_log_ratio(logp_BT, ref_logp_BT)
  if clamp is None:
    return jnp.exp(neg_x) - 1.0 - neg_x
  checks.positive(clamp=clamp)
  neg_x = jnp.clip(neg_x, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
  return jnp.clip(jnp.exp(neg_x) - 1.0 - neg_x, -clamp, clamp)


def kl_abs(logp_BT: ArrayLike, ref_logp_BT: ArrayLike) -> jax.Array:
  """|x| = |log pi - log pi_ref|.

  Args:
    logp_BT: policy log-probs of the sampled tokens, [..., T] (differentiated).
    ref_logp_BT: reference log-probs, same shape (constant).

  Returns:
    Per-token |x|, [..., T] float32. Gradient w.r.t. logp: sign(x) (0 at
    x = 0, as in torch).

  References: verl `kl_penalty_forward` `abs`.
  """
  x = _log_ratio(logp_BT, ref_logp_BT)
  # jnp.abs has derivative 1 at 0; torch (verl) uses sign(x) = 0 there, and
  # x == 0 is the common case (policy == reference at the first step).
  return x * jnp.sign(x)


def kl_k3_importance_corrected(
  logp_BT: ArrayLike,
  ref_logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  *,
  clamp: float | None = 10.0,
) -> jax.Array:
  """k3 * r, r = pi / pi_old: k3 made unbiased for samples from pi_old.

  The ratio r = exp(logp - old_logp) is NOT detached (DeepSeek-V3.2, TRL), so
  the gradient is r (1 - e^{-x}) + r k3. `old_logp_BT` is a constant. Like
  TRL, the log-ratio of r is not clamped.

  Args:
    logp_BT: policy log-probs of the sampled tokens, [..., T] (differentiated).
    ref_logp_BT: reference log-probs, same shape (constant).
    old_logp_BT: log-probs of the sampling policy, same shape (constant).
    clamp: passed to `kl_k3` (None disables its clips; TRL uses none).

  Returns:
    Per-token importance-corrected k3, [..., T] float32.

  References: DeepSeek-V3.2 (arXiv 2512.02556); TRL GRPO
  `use_bias_correction_kl`.
  """
  checks.same_shape(["logp_BT", "old_logp_BT"], logp_BT, old_logp_BT)
  old = jax.lax.stop_gradient(stats.f32(old_logp_BT))
  ratio = jnp.exp(stats.f32(logp_BT) - old)
  return kl_k3(logp_BT, ref_logp_BT, clamp=clamp) * ratio


def _name(fn: Estimator) -> str:
  """The name of a function, looking inside functools.partial objects."""
  while not hasattr(fn, "__name__") and hasattr(fn, "func"):
    fn = fn.func
  return getattr(fn, "__name__", type(fn).__name__)


def straight_through(estimator: Estimator) -> Estimator:
  """An estimator with the value of `estimator` and the gradient of k2.

  out = k2 - sg(k2) + sg(estimator(...)). The reported KL (and its value in
  the loss) is the wrapped estimator's, while the gradient is x, whose
  on-policy expectation is the exact gradient of KL(pi || pi_ref). This is
  verl's documented "k1+" / "k3+", which raise at run time in verl.

  Args:
    estimator: a KL estimator (logp_BT, ref_logp_BT, ...) -> [..., T]; extra
      positional and keyword arguments are passed through to it.

  Returns:
    The wrapped estimator, named e.g. ``kl_k3_straight_through`` for logging.

  References: verl `kl_penalty` ("+" suffix, `core_algos.py`).
  """
  if not callable(estimator):
    raise TypeError(
      f"estimator must be a KL estimator function such as kl_k3; got"
      f" {estimator!r}."
    )

  def wrapped(logp_BT, ref_logp_BT, *args, **kwargs) -> jax.Array:
    k2 = kl_k2(logp_BT, ref_logp_BT)
    value = stats.f32(estimator(logp_BT, ref_logp_BT, *args, **kwargs))
    sg = jax.lax.stop_gradient
    return k2 - sg(k2) + sg(value)

  name = f"{_name(estimator)}_straight_through"
  wrapped.__name__ = wrapped.__qualname__ = name
  wrapped.__doc__ = (
    f"Value of {_name(estimator)}, gradient of kl_k2 (straight-through)."
  )
  return wrapped
