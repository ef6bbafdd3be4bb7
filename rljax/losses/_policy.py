"""Per-token policy surrogate losses (PPO clip and its descendants).

Every loss has the signature
``f(logp_BT, old_logp_BT, adv_BT, mask_BT, *, <hyperparameters>) -> TokenLoss``:

* ``logp_BT``: log pi_theta of the sampled tokens, [..., T]. The ONLY input
  that carries gradient.
* ``old_logp_BT``: log pi_old of the same tokens (detached).
* ``adv_BT``: per-token advantage A (detached); outcome estimators broadcast a
  per-sequence scalar over T.
* ``mask_BT``: > 0 on valid tokens (detached).

Notation: d = logp - old_logp, r = exp(d), sg = stop-gradient, m = mask,
|o_i| = sum_t m_it, clip(x, a, b) = min(max(x, a), b).

`TokenLoss.loss` is the per-token loss to MINIMISE, [..., T] float32, not yet
multiplied by the mask: `rljax.aggregate` applies the mask once. At masked
positions every input is replaced by 0 before use (so r = 1 there), which keeps
values and gradients finite whatever the padding holds. Sequence-level losses
(gspo, luspo, gmpo) compute one loss per sequence and broadcast it to all its
tokens, so that `seq_mean_token_mean` aggregation is the mean over sequences.
Statistics over T are masked means. All arithmetic is float32.
"""

import math
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax._src import stats

_NAMES = ("logp_BT", "old_logp_BT", "adv_BT", "mask_BT")
# verl / OpenRLHF clamp the token log-ratio to [-20, 20] before exp.
_LOG_RATIO_CLAMP = 20.0


class TokenLoss(NamedTuple):
  """A per-token loss and where clipping limited each token's gradient.

  Attributes:
    loss: per-token loss to minimise, [..., T] float32.
    clip_low: 1.0 where the lower bound (A < 0 side, dual clip included) cut or
      limited the token's gradient, else 0.0.
    clip_high: 1.0 where the upper bound (A > 0 side) cut or limited it.
  """

  loss: jax.Array
  clip_low: jax.Array
  clip_high: jax.Array


class _Inputs(NamedTuple):
  logp: jax.Array
  old_logp: jax.Array
  adv: jax.Array
  mask: jax.Array
  valid: jax.Array


def _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT) -> _Inputs:
  """Check shapes, cast to float32, detach constants, zero padded entries."""
  if np.ndim(logp_BT) < 1:
    raise ValueError(
      f"logp_BT must have rank >= 1 ([..., T]); got shape {np.shape(logp_BT)}."
    )
  checks.same_shape(_NAMES, logp_BT, old_logp_BT, adv_BT, mask_BT)
  mask = lax.stop_gradient(stats.f32(mask_BT))
  valid = mask > 0

  def inert(x):
    return jnp.where(valid, stats.f32(x), 0.0)

  old = jnp.zeros_like(mask) if old_logp_BT is None else inert(old_logp_BT)
  return _Inputs(
    inert(logp_BT),
    lax.stop_gradient(old),
    lax.stop_gradient(inert(adv_BT)),
    mask,
    valid,
  )


def _log_ratio(x: _Inputs, clamp: float | None) -> jax.Array:
  """d = logp - old_logp, optionally clamped to [-clamp, clamp]."""
  d = x.logp - x.old_logp
  return d if clamp is None else jnp.clip(d, -clamp, clamp)


def _seq_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Masked mean over T, kept as [..., 1]."""
  return stats.masked_mean(x, mask, axis=-1, keepdims=True)


def _zeros_clip(loss: jax.Array) -> TokenLoss:
  """A TokenLoss for an objective without clipping."""
  zeros = jnp.zeros_like(loss)
  return TokenLoss(loss, zeros, zeros)


def _broadcast(out: TokenLoss, shape: tuple[int, ...]) -> TokenLoss:
  """Broadcast a per-sequence [..., 1] TokenLoss to every token."""
  return jax.tree.map(lambda a: jnp.broadcast_to(a, shape), out)


def _check_dual_clip(dual_clip: float | None) -> None:
  if dual_clip is not None and not dual_clip > 1:
    raise ValueError(
      f"dual_clip must be > 1 (or None to disable it); got {dual_clip!r}."
    )


def _check_optional_positive(**values: float | None) -> None:
  checks.positive(**{k: v for k, v in values.items() if v is not None})


def _clipped_surrogate(
  ratio: jax.Array,
  clipped_ratio: jax.Array,
  adv: jax.Array,
  dual_clip: float | None = None,
) -> TokenLoss:
  """max(-A ratio, -A clipped_ratio), then min(., -c A) where A < 0."""
  unclipped = -adv * ratio
  clipped = -adv * clipped_ratio
  loss = jnp.maximum(unclipped, clipped)
  # The clipped branch wins only on the side where the bound binds: above
  # 1 + eps_high for A > 0, below 1 - eps_low for A < 0 (verl pg_clipfrac).
  cut = clipped > unclipped
  clip_low = cut & (adv < 0)
  if dual_clip is not None:
    cap = -dual_clip * adv
    clip_low = clip_low | ((adv < 0) & (loss > cap))
    loss = jnp.where(adv < 0, jnp.minimum(loss, cap), loss)
  return TokenLoss(loss, stats.f32(clip_low), stats.f32(cut & (adv > 0)))


def ppo_clip(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  dual_clip: float | None = None,
  log_ratio_clamp: float | None = _LOG_RATIO_CLAMP,
) -> TokenLoss:
  """PPO clipped surrogate with asymmetric (clip-higher) and dual clip.

    d = clip(logp - old_logp, -clamp, clamp),  r = exp(d)
    L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
    L = min(L, -c A)  where A < 0, if dual_clip = c is set.

  Dual clip with c equals TRL's ``delta = c`` (for c >= 1 + eps_high).
  Defaults: verl `vanilla` / TRL / OpenRLHF eps 0.2; DAPO uses eps_high 0.28.
  verl always applies dual clip with c = 3; here it is off unless set (TRL,
  OpenRLHF).

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring.
    eps_low: lower clip range (> 0).
    eps_high: upper clip range (> 0).
    dual_clip: c > 1 caps the loss of A < 0 tokens at -c A; None disables.
    log_ratio_clamp: clamp of d before exp (verl, OpenRLHF: 20); None
      disables it (TRL).

  Returns:
    TokenLoss; clip_low also marks tokens capped by the dual clip.

  References:
    Schulman et al. 2017 (arXiv 1707.06347); DAPO (arXiv 2503.14476); dual clip
    Ye et al. 2019 (arXiv 1912.09729); verl `compute_policy_loss_vanilla`.
  """
  checks.positive(eps_low=eps_low, eps_high=eps_high)
  _check_optional_positive(log_ratio_clamp=log_ratio_clamp)
  _check_dual_clip(dual_clip)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  r = jnp.exp(_log_ratio(x, log_ratio_clamp))
  clipped = jnp.clip(r, 1.0 - eps_low, 1.0 + eps_high)
  return _clipped_surrogate(r, clipped, x.adv, dual_clip)


def gppo(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.28,
  dual_clip: float | None = None,
  log_ratio_clamp: float | None = _LOG_RATIO_CLAMP,
) -> TokenLoss:
  """GPPO: PPO clip whose clipped tokens keep a bounded gradient.

    lo = (1 - eps_low) r / sg(r),  hi = (1 + eps_high) r / sg(r)
    L = max(-A r, -A clip(r, lo, hi)),  then dual clip as in `ppo_clip`.

  The value equals `ppo_clip`; a token clipped at the upper bound (A > 0)
  gets gradient -A (1 + eps_high) grad logp instead of 0 (and -A (1 - eps_low)
  grad logp at the lower bound, A < 0). Defaults: eps_high 0.28 (the paper's
  clip-higher setting); the log-ratio clamp (not in Klear's code) keeps r
  finite and the values equal to `ppo_clip`'s.

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring.
    eps_low: lower clip range (> 0).
    eps_high: upper clip range (> 0).
    dual_clip: c > 1 caps the loss of A < 0 tokens at -c A; None disables.
    log_ratio_clamp: clamp of d before exp; None disables it.

  Returns:
    TokenLoss (indicators as `ppo_clip`).

  References:
    Klear-Reasoner (arXiv 2508.07629), Kwai-Klear/KlearReasoner README and
    `verl/trainer/ppo/core_algos.py`.
  """
  checks.positive(eps_low=eps_low, eps_high=eps_high)
  _check_optional_positive(log_ratio_clamp=log_ratio_clamp)
  _check_dual_clip(dual_clip)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  r = jnp.exp(_log_ratio(x, log_ratio_clamp))
  unit = r / lax.stop_gradient(r)  # value 1, gradient grad logp
  clipped = jnp.minimum(
    jnp.maximum(r, (1.0 - eps_low) * unit), (1.0 + eps_high) * unit
  )
  return _clipped_surrogate(r, clipped, x.adv, dual_clip)


def _gspo_sequence(x: _Inputs, eps_low: float, eps_high: float) -> TokenLoss:
  """GSPO's per-sequence clipped loss, [..., 1]."""
  s = jnp.exp(_seq_mean(_log_ratio(x, None), x.mask))
  clipped = jnp.clip(s, 1.0 - eps_low, 1.0 + eps_high)
  return _clipped_surrogate(s, clipped, _seq_mean(x.adv, x.mask))


def gspo(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  eps_low: float = 3e-4,
  eps_high: float = 4e-4,
) -> TokenLoss:
  """GSPO: PPO clip on the length-normalised sequence ratio.

    s_i = exp(sum_t m d / |o_i|),  A_i = sum_t m A / |o_i|
    L_i = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high))

  L_i is broadcast to every token of sequence i; aggregate with
  `seq_mean_token_mean`. No log-ratio clamp (TRL, OpenRLHF). Defaults: GSPO
  paper / TRL docs / verl example (3e-4, 4e-4).

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring.
    eps_low: lower clip range of s_i (> 0).
    eps_high: upper clip range of s_i (> 0).

  Returns:
    TokenLoss, every field constant over T within a sequence.

  References:
    Zheng et al. 2025 (arXiv 2507.18071); TRL
    ``importance_sampling_level="sequence"``; OpenRLHF ``gspo``.
  """
  checks.positive(eps_low=eps_low, eps_high=eps_high)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  return _broadcast(_gspo_sequence(x, eps_low, eps_high), x.logp.shape)


def gspo_token(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  eps_low: float = 3e-4,
  eps_high: float = 4e-4,
  max_log_ratio: float = 10.0,
) -> TokenLoss:
  """GSPO-token: the sequence ratio's value with a per-token gradient route.

    log s_it = min(logp_t - sg(logp_t) + sg(log s_i), max_log_ratio)
    L_it = max(-A_it s_it, -A_it clip(s_it, 1 - eps_low, 1 + eps_high))

  With advantages constant over T and `seq_mean_token_mean` aggregation this
  has the value and gradient of `gspo`; it also allows token-level A. As in
  verl the clamp acts on the combined log-ratio, so a sequence with
  log s_i > max_log_ratio gets no gradient.

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring.
    eps_low: lower clip range (> 0).
    eps_high: upper clip range (> 0).
    max_log_ratio: upper clamp of log s_it (verl: 10; > 0).

  Returns:
    TokenLoss (indicators per token, by the sign of A_it).

  References:
    GSPO (arXiv 2507.18071); verl `compute_policy_loss_gspo`; TRL
    `trl.experimental.gspo_token`.
  """
  checks.positive(eps_low=eps_low, eps_high=eps_high)
  checks.positive(max_log_ratio=max_log_ratio)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  log_s = lax.stop_gradient(_seq_mean(_log_ratio(x, None), x.mask))
  log_s_t = x.logp - lax.stop_gradient(x.logp) + log_s
  s = jnp.exp(jnp.minimum(log_s_t, max_log_ratio))
  clipped = jnp.clip(s, 1.0 - eps_low, 1.0 + eps_high)
  return _clipped_surrogate(s, clipped, x.adv)


def luspo(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  eps_low: float = 2e-3,
  eps_high: float = 2.5e-3,
) -> TokenLoss:
  """LUSPO: the GSPO sequence loss scaled by the sequence length.

    L_i = |o_i| * max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high))

  broadcast over T (s_i, A_i as in `gspo`); aggregate with
  `seq_mean_token_mean` for TRL's mean_i(|o_i| L_i). Defaults: paper
  (2e-3, 2.5e-3).

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring.
    eps_low: lower clip range of s_i (> 0).
    eps_high: upper clip range of s_i (> 0).

  Returns:
    TokenLoss (indicators as `gspo`).

  References:
    arXiv 2602.05261; TRL ``loss_type="luspo"``.
  """
  checks.positive(eps_low=eps_low, eps_high=eps_high)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  seq = _gspo_sequence(x, eps_low, eps_high)
  length = stats.sequence_lengths(x.mask)[..., None]
  return _broadcast(seq._replace(loss=seq.loss * length), x.logp.shape)


def sapo(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  tau_pos: float = 1.0,
  tau_neg: float = 1.05,
  log_ratio_clamp: float | None = _LOG_RATIO_CLAMP,
) -> TokenLoss:
  """SAPO: a sigmoid soft gate in place of the hard clip.

    tau = tau_pos if A > 0 else tau_neg
    L = -(4 / tau) sigmoid(tau (r - 1)) A

  dL/dlogp = -sech^2(tau (r - 1) / 2) r A: equal to REINFORCE's -A at r = 1
  and decaying smoothly off-policy. The value at r = 1 is -(2 / tau) A, not
  -A. Defaults: paper / verl / TRL (1.0, 1.05).

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring.
    tau_pos: gate temperature for A > 0 (> 0).
    tau_neg: gate temperature for A <= 0 (> 0).
    log_ratio_clamp: clamp of d before exp (verl: 20); None disables (TRL).

  Returns:
    TokenLoss with zero clip indicators (no hard clip).

  References:
    Gao et al. 2025 (arXiv 2511.20347); verl `compute_policy_loss_sapo`; TRL
    ``loss_type="sapo"``.
  """
  checks.positive(tau_pos=tau_pos, tau_neg=tau_neg)
  _check_optional_positive(log_ratio_clamp=log_ratio_clamp)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  r = jnp.exp(_log_ratio(x, log_ratio_clamp))
  tau = jnp.where(x.adv > 0, tau_pos, tau_neg)
  return _zeros_clip(-(4.0 / tau) * jax.nn.sigmoid(tau * (r - 1.0)) * x.adv)


def cispo(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  log_ratio_clamp: float | None = _LOG_RATIO_CLAMP,
) -> TokenLoss:
  """CISPO (verl): REINFORCE weighted by a detached, two-sided clipped ratio.

    L = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp

  No token loses its gradient; the clip only bounds its weight. eps_low may
  exceed 1 to disable the lower bound (verl's example uses eps_low = 10,
  eps_high = 0.2). For TRL's absolute cap use `cispo_capped`.

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring.
    eps_low: lower clip range of the weight (> 0).
    eps_high: upper clip range of the weight (> 0).
    log_ratio_clamp: clamp of d before exp (verl: 20); None disables it.

  Returns:
    TokenLoss; clip_low / clip_high mark r < 1 - eps_low / r > 1 + eps_high
    whatever the sign of A (the weight, not the loss, is clipped; verl's
    metric).

  References:
    MiniMax-M1 (arXiv 2506.13585); verl `compute_policy_loss_cispo`.
  """
  checks.positive(eps_low=eps_low, eps_high=eps_high)
  _check_optional_positive(log_ratio_clamp=log_ratio_clamp)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  r = lax.stop_gradient(jnp.exp(_log_ratio(x, log_ratio_clamp)))
  weight = jnp.clip(r, 1.0 - eps_low, 1.0 + eps_high)
  return TokenLoss(
    -weight * x.adv * x.logp,
    stats.f32(x.valid & (r < 1.0 - eps_low)),
    stats.f32(x.valid & (r > 1.0 + eps_high)),
  )


def cispo_capped(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  max_ratio: float = 5.0,
) -> TokenLoss:
  """CISPO (TRL): REINFORCE weighted by a detached ratio capped at max_ratio.

    L = -sg(min(r, max_ratio)) A logp

  ``max_ratio`` is TRL's ``epsilon_high`` with ``loss_type="cispo"``: an
  ABSOLUTE cap on r, with no lower bound and no log-ratio clamp. Default 5.0
  (ScaleRL, TRL docs).

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring.
    max_ratio: cap on the importance weight (> 0).

  Returns:
    TokenLoss; clip_high marks r > max_ratio, clip_low is 0.

  References:
    MiniMax-M1 (arXiv 2506.13585); ScaleRL (arXiv 2510.13786); TRL
    ``loss_type="cispo"``.
  """
  checks.positive(max_ratio=max_ratio)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  r = lax.stop_gradient(jnp.exp(_log_ratio(x, None)))
  loss = -jnp.minimum(r, max_ratio) * x.adv * x.logp
  capped = stats.f32(x.valid & (r > max_ratio))
  return TokenLoss(loss, jnp.zeros_like(loss), capped)


def gmpo(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  eps_low: float = 0.4,
  eps_high: float = 0.4,
) -> TokenLoss:
  """GMPO: geometric-mean sequence ratio with a one-sided log-space clip.

    d~ = clip(d, -eps_low, eps_high)
    d* = sgn(A) min(sgn(A) d, sgn(A) d~)   (min if A > 0, max if A < 0)
    L_i = -Abar_i exp(sum_t m d* / |o_i|),   Abar_i = sum_t m A / |o_i|

  broadcast over T; aggregate with `seq_mean_token_mean` (verl's mean over
  sequences). No log-ratio clamp. verl adds 1e-8 to |o_i|; masked means here
  are exact. Defaults: eps 0.4 in log space (paper, TRL GMPOConfig, verl
  examples).

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring.
    eps_low: lower log-space bound (> 0): d >= -eps_low for A < 0.
    eps_high: upper log-space bound (> 0): d <= eps_high for A > 0.

  Returns:
    TokenLoss; clip_high marks tokens with A > 0 and d > eps_high, clip_low
    those with A < 0 and d < -eps_low (their gradient is 0).

  References:
    Zhao et al. 2025 (arXiv 2507.20673); verl `compute_policy_loss_geo_mean`;
    TRL `trl.experimental.gmpo`.
  """
  checks.positive(eps_low=eps_low, eps_high=eps_high)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  d = _log_ratio(x, None)
  sgn = jnp.sign(x.adv)
  d_star = sgn * jnp.minimum(sgn * d, sgn * jnp.clip(d, -eps_low, eps_high))
  rho = jnp.exp(_seq_mean(d_star, x.mask))
  loss = jnp.broadcast_to(-_seq_mean(x.adv, x.mask) * rho, d.shape)
  return TokenLoss(
    loss,
    stats.f32((x.adv < 0) & (d < -eps_low)),
    stats.f32((x.adv > 0) & (d > eps_high)),
  )


def reinforce(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
) -> TokenLoss:
  """REINFORCE / GPG: the plain policy-gradient loss L = -A logp.

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring;
      old_logp_BT is unused (there is no importance ratio).

  Returns:
    TokenLoss with zero clip indicators.

  References:
    Williams 1992; GPG (arXiv 2504.02546); verl `compute_policy_loss_gpg`.
  """
  del old_logp_BT  # No importance ratio.
  x = _prepare(logp_BT, None, adv_BT, mask_BT)
  return _zeros_clip(-x.adv * x.logp)


def _covariance(x: _Inputs) -> jax.Array:
  """(A - mean A)(sg logp - mean sg logp), means over all valid tokens."""
  logp = lax.stop_gradient(x.logp)
  adv_c = x.adv - stats.masked_mean(x.adv, x.mask)
  return adv_c * (logp - stats.masked_mean(logp, x.mask))


def _num_selected(x: _Inputs, ratio: float) -> jax.Array:
  """k = max(floor(ratio * N_valid), 1) as a traced int32."""
  n_valid = jnp.sum(x.valid, dtype=jnp.float32)
  return jnp.maximum(jnp.floor(ratio * n_valid).astype(jnp.int32), 1)


def _top_k(priority: jax.Array, eligible: jax.Array, k: jax.Array):
  """Mask of the (at most) k eligible entries of highest priority."""
  flat = jnp.where(eligible, priority, -jnp.inf).reshape(-1)
  # Rank of each entry in descending order; the stable sort breaks ties by
  # position, so exactly min(k, #eligible) entries are chosen.
  rank = jnp.argsort(jnp.argsort(-flat, stable=True), stable=True)
  return eligible & (rank < k).reshape(priority.shape)


def _check_cov_ratio(ratio: float) -> None:
  checks.positive(ratio=ratio)
  checks.in_range("ratio", ratio, 0.0, 1.0)


def clip_cov(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  key: jax.Array,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  ratio: float = 2e-4,
  cov_lb: float = 1.0,
  cov_ub: float = 5.0,
) -> TokenLoss:
  """Clip-Cov: PPO clip, then drop a random few high-covariance tokens.

    L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))   (r unclamped)
    Cov_t = (A_t - mean A)(logp_t - mean logp)   (means over valid tokens of
      the whole input)
    candidates: valid, not clipped by PPO, cov_lb < Cov_t < cov_ub
    k = max(floor(ratio * N_valid), 1) candidates chosen uniformly at random
      (all of them if fewer) get L = 0 and no gradient.

  Defaults: verl (ratio 2e-4, bounds 1 and 5); the paper's recipe sets
  eps_low = eps_high = 1.

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring.
    key: PRNG key for the random choice (required).
    eps_low: PPO lower clip range (> 0).
    eps_high: PPO upper clip range (> 0).
    ratio: fraction of valid tokens to drop, in (0, 1].
    cov_lb: exclusive lower covariance bound of the candidates.
    cov_ub: exclusive upper covariance bound (> cov_lb).

  Returns:
    TokenLoss; the indicators mark PPO-clipped tokens plus the dropped ones,
    by the sign of A (a dropped token with A = 0 is in neither).

  References:
    Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"
    (arXiv 2505.22617); verl `compute_policy_loss_clip_cov`.
  """
  checks.positive(eps_low=eps_low, eps_high=eps_high)
  _check_cov_ratio(ratio)
  if not cov_lb < cov_ub:
    raise ValueError(
      f"cov_lb must be < cov_ub; got cov_lb={cov_lb!r}, cov_ub={cov_ub!r}."
    )
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  r = jnp.exp(_log_ratio(x, None))
  ppo = _clipped_surrogate(r, jnp.clip(r, 1.0 - eps_low, 1.0 + eps_high), x.adv)
  cov = _covariance(x)
  ppo_cut = (ppo.clip_low + ppo.clip_high) > 0
  eligible = x.valid & ~ppo_cut & (cov > cov_lb) & (cov < cov_ub)
  priority = jax.random.uniform(key, cov.shape)
  dropped = _top_k(priority, eligible, _num_selected(x, ratio))
  return TokenLoss(
    jnp.where(dropped, 0.0, ppo.loss),
    jnp.maximum(ppo.clip_low, stats.f32(dropped & (x.adv < 0))),
    jnp.maximum(ppo.clip_high, stats.f32(dropped & (x.adv > 0))),
  )


def kl_cov(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  ratio: float = 2e-4,
  kappa: float = 1.0,
) -> TokenLoss:
  """KL-Cov: unclipped surrogate plus |d| on the top-k covariance tokens.

    L = -A r + kappa |d| [t in top-k of Cov],   r = exp(d) (unclamped)
    Cov_t = (A_t - mean A)(logp_t - mean logp)   (means over valid tokens of
      the whole input), k = max(floor(ratio * N_valid), 1).

  Defaults: verl kl_cov_ratio 2e-4 (recipe 2e-3); kappa is verl's
  ppo_kl_coef, 1.0 (the code fallback and the recipe).

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring.
    ratio: fraction of valid tokens penalised, in (0, 1].
    kappa: coefficient of the |d| penalty (>= 0).

  Returns:
    TokenLoss with zero clip indicators (nothing is clipped).

  References:
    Cui et al. 2025 (arXiv 2505.22617); verl `compute_policy_loss_kl_cov`.
  """
  _check_cov_ratio(ratio)
  checks.non_negative(kappa=kappa)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  d = _log_ratio(x, None)
  top = _top_k(_covariance(x), x.valid, _num_selected(x, ratio))
  loss = -x.adv * jnp.exp(d) + jnp.where(top, kappa * jnp.abs(d), 0.0)
  return _zeros_clip(loss)


def vespo(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  k_pos: float = 2.0,
  lambda_pos: float = 3.0,
  k_neg: float = 3.0,
  lambda_neg: float = 2.0,
) -> TokenLoss:
  """VESPO: REINFORCE scaled by a detached Gamma kernel of the sequence ratio.

    log W_i = clip(sum_t m clip(d, -20, 20), ln 1e-8, 20)   (a SUM over T)
    (k, lambda) = (k_pos, lambda_pos) if A_i >= 0 else (k_neg, lambda_neg)
    phi_i = sg(W_i^k e^{lambda (1 - W_i)}),  NaN / inf -> 0,  phi(1) = 1
    L_it = -phi_i A_it logp_it

  A_i is the masked mean of A over T; lambda is floored at 1e-4 (TRL).
  Defaults: TRL (2, 3, 3, 2).

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring.
    k_pos: Gamma shape for A_i >= 0 (>= 0).
    lambda_pos: Gamma rate for A_i >= 0 (> 0).
    k_neg: Gamma shape for A_i < 0 (>= 0).
    lambda_neg: Gamma rate for A_i < 0 (> 0).

  Returns:
    TokenLoss with zero clip indicators.

  References:
    arXiv 2602.10693; TRL ``loss_type="vespo"``, `get_gamma_weights`.
  """
  checks.non_negative(k_pos=k_pos, k_neg=k_neg)
  checks.positive(lambda_pos=lambda_pos, lambda_neg=lambda_neg)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  d = lax.stop_gradient(_log_ratio(x, _LOG_RATIO_CLAMP))
  log_w = stats.masked_sum(d, x.mask, axis=-1, keepdims=True)
  log_w = jnp.clip(log_w, math.log(1e-8), 20.0)
  pos = _seq_mean(x.adv, x.mask) >= 0
  k = jnp.where(pos, k_pos, k_neg)
  lam = jnp.maximum(jnp.where(pos, lambda_pos, lambda_neg), 1e-4)
  phi = jnp.exp(lam + k * log_w - lam * jnp.exp(log_w))
  phi = jnp.where(jnp.isfinite(phi), phi, 0.0)
  return _zeros_clip(-phi * x.adv * x.logp)


def icpo_shaped(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  gamma: float = 0.1,
) -> TokenLoss:
  """ICPO's policy shaping of off-policy expert tokens:
  ``L = -A * f(pi)``, ``f(pi) = pi / (pi + gamma)``, pi = exp(logp).

  The gradient -A gamma / (pi + gamma)^2 * grad pi lifts low-probability
  expert tokens without an importance ratio (LUFFY-style shaping with
  the behaviour probability taken as 1); no clipping.

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see the module docstring;
      old_logp_BT is unused.
    gamma: the shaping constant (ICPO: 0.1).

  References:
    ICPO, arXiv 2510.26519 (catalog row 1.90). Checked against
    Celine-hxy/ICPO ``utils/core_algos.py::compute_icpo_policy_loss``:
    the expert tokens' loss -A pi / (pi + 0.1) on the current
    probability, unclipped; on-policy tokens keep the clipped ratio.
  """
  del old_logp_BT  # The shaping reads the current probability only.
  checks.positive(gamma=gamma)
  x = _prepare(logp_BT, None, adv_BT, mask_BT)
  p = jnp.exp(x.logp)
  return _zeros_clip(-x.adv * p / (p + gamma))
