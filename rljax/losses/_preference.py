"""Offline preference losses on (chosen, rejected) pairs: DPO, IPO, SimPO.

Inputs are per-sequence log-probabilities [...] (any leading axes, one entry
per pair), already reduced over tokens with `sequence_logp`. The policy's
log-probs carry the gradient; reference log-probs are constants. Every loss
is per pair and unreduced (take the mean over pairs, as TRL and OpenRLHF do),
and returns the implicit rewards (detached) and the pairwise accuracy for
logging.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats


class PreferenceLoss(NamedTuple):
  """Per-pair preference loss and its diagnostics, all [...] float32.

  Attributes:
    loss: the loss of each pair (to be minimised).
    chosen_reward: implicit reward of the chosen response (detached).
    rejected_reward: implicit reward of the rejected response (detached).
    accuracy: 1.0 where chosen_reward > rejected_reward, else 0.0.
  """

  loss: jax.Array
  chosen_reward: jax.Array
  rejected_reward: jax.Array
  accuracy: jax.Array


def sequence_logp(
  logp_BT: ArrayLike, mask_BT: ArrayLike, *, average: bool = False
) -> jax.Array:
  """Sum (or mean) of token log-probs over the valid tokens of each sequence.

  log pi(y|x) = sum_t m_t log pi(y_t | x, y_<t); with ``average=True`` it is
  divided by sum_t m_t (0 for an empty sequence), the length-normalised form
  used by SimPO and by TRL's IPO.

  Args:
    logp_BT: token log-probs of the response, [..., T].
    mask_BT: 1 on response tokens, 0 on padding, same shape.
    average: divide by the number of valid tokens.

  Returns:
    Per-sequence log-probs, [...] float32.

  References: TRL `DPOTrainer.concatenated_forward`, OpenRLHF `_get_batch_logps`.
  """
  checks.same_shape(["logp_BT", "mask_BT"], logp_BT, mask_BT)
  if average:
    return stats.masked_mean(logp_BT, mask_BT, axis=-1)
  return stats.masked_sum(logp_BT, mask_BT, axis=-1)


def _check_label_smoothing(label_smoothing: float) -> None:
  """Raise unless 0 <= label_smoothing < 0.5."""
  if not 0.0 <= label_smoothing < 0.5:
    raise ValueError(
      "label_smoothing must be in [0, 0.5) (the probability that a label is"
      f" flipped; 0.5 makes the loss constant); got {label_smoothing!r}."
    )


def _smoothed_logistic(z: jax.Array, label_smoothing: float) -> jax.Array:
  """-(1 - eps) log sigma(z) - eps log sigma(-z), stable for large |z|."""
  eps = label_smoothing
  return -(1.0 - eps) * jax.nn.log_sigmoid(z) - eps * jax.nn.log_sigmoid(-z)


def _result(loss, chosen_reward, rejected_reward) -> PreferenceLoss:
  """Detach the implicit rewards and add the accuracy."""
  chosen = jax.lax.stop_gradient(chosen_reward)
  rejected = jax.lax.stop_gradient(rejected_reward)
  accuracy = (chosen > rejected).astype(jnp.float32)
  return PreferenceLoss(loss, chosen, rejected, accuracy)


def _log_ratios(chosen, rejected, ref_chosen, ref_rejected):
  """(pi_c - sg(ref_c), pi_r - sg(ref_r)) in float32, after a shape check."""
  names = [
    "chosen_logp",
    "rejected_logp",
    "ref_chosen_logp",
    "ref_rejected_logp",
  ]
  checks.same_shape(names, chosen, rejected, ref_chosen, ref_rejected)
  sg = jax.lax.stop_gradient
  chosen_ratio = stats.f32(chosen) - sg(stats.f32(ref_chosen))
  rejected_ratio = stats.f32(rejected) - sg(stats.f32(ref_rejected))
  return chosen_ratio, rejected_ratio


def dpo(
  chosen_logp: ArrayLike,
  rejected_logp: ArrayLike,
  ref_chosen_logp: ArrayLike,
  ref_rejected_logp: ArrayLike,
  *,
  beta: float = 0.1,
  label_smoothing: float = 0.0,
) -> PreferenceLoss:
  """Direct Preference Optimization, with conservative label smoothing.

  h = (log pi(y_c) - log pi_ref(y_c)) - (log pi(y_r) - log pi_ref(y_r))
  L = -(1 - eps) log sigma(beta h) - eps log sigma(-beta h)

  eps = 0 is the DPO loss; eps > 0 (cDPO) assumes each label is flipped with
  probability eps. dL/d log pi(y_c) = -beta ((1 - eps) sigma(-beta h) - eps
  sigma(beta h)). Implicit rewards: beta (log pi - log pi_ref).

  Args:
    chosen_logp: policy sequence log-prob of the chosen response, [...].
    rejected_logp: policy sequence log-prob of the rejected response, [...].
    ref_chosen_logp: reference sequence log-prob of the chosen response.
    ref_rejected_logp: reference sequence log-prob of the rejected response.
    beta: inverse temperature of the implicit reward, > 0 (TRL, OpenRLHF 0.1).
    label_smoothing: eps in [0, 0.5) (TRL `label_smoothing`, default 0).

  Returns:
    `PreferenceLoss`, every field [...] float32.

  References: Rafailov et al. 2023 (arXiv 2305.18290); Mitchell, "A note on
  DPO with noisy preferences" (cDPO); TRL `DPOTrainer` `loss_type="sigmoid"`,
  OpenRLHF `DPOLoss`.
  """
  checks.positive(beta=beta)
  _check_label_smoothing(label_smoothing)
  chosen, rejected = _log_ratios(
    chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp
  )
  loss = _smoothed_logistic(beta * (chosen - rejected), label_smoothing)
  return _result(loss, beta * chosen, beta * rejected)


def ipo(
  chosen_logp: ArrayLike,
  rejected_logp: ArrayLike,
  ref_chosen_logp: ArrayLike,
  ref_rejected_logp: ArrayLike,
  *,
  beta: float = 0.1,
) -> PreferenceLoss:
  """Identity Preference Optimization: regress h onto the margin 1/(2 beta).

  h = (log pi(y_c) - log pi_ref(y_c)) - (log pi(y_r) - log pi_ref(y_r))
  L = (h - 1 / (2 beta))^2          (minimum 0 at h = 1/(2 beta))

  beta is the paper's tau. TRL's `ipo` feeds log-probs AVERAGED over the
  response tokens; pass ``sequence_logp(..., average=True)`` for TRL parity,
  or the summed log-probs for the paper's (and OpenRLHF's) form. Implicit
  rewards: beta (log pi - log pi_ref), as in TRL.

  Args:
    chosen_logp: policy log-prob of the chosen response, [...].
    rejected_logp: policy log-prob of the rejected response, [...].
    ref_chosen_logp: reference log-prob of the chosen response.
    ref_rejected_logp: reference log-prob of the rejected response.
    beta: regularisation strength tau, > 0 (TRL and OpenRLHF `beta` 0.1).

  Returns:
    `PreferenceLoss`, every field [...] float32.

  References: Azar et al. 2023 (arXiv 2310.12036), Eq. 17; TRL `DPOTrainer`
  `loss_type="ipo"`; OpenRLHF `DPOLoss(ipo=True)`.
  """
  checks.positive(beta=beta)
  chosen, rejected = _log_ratios(
    chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp
  )
  loss = jnp.square(chosen - rejected - 1.0 / (2.0 * beta))
  return _result(loss, beta * chosen, beta * rejected)


def simpo(
  chosen_logp: ArrayLike,
  rejected_logp: ArrayLike,
  chosen_length: ArrayLike,
  rejected_length: ArrayLike,
  *,
  beta: float = 0.1,
  gamma: float = 0.5,
  label_smoothing: float = 0.0,
) -> PreferenceLoss:
  """SimPO: reference-free, length-normalised DPO with a target margin.

  Delta = log pi(y_c) / |y_c| - log pi(y_r) / |y_r|
  L = -(1 - eps) log sigma(beta Delta - gamma)
      - eps log sigma(-(beta Delta - gamma))

  Implicit rewards: beta log pi(y) / |y| (TRL `CPOTrainer`). A zero length
  gives an average log-prob of 0. Defaults are TRL `CPOConfig`'s (beta 0.1,
  `simpo_gamma` 0.5); the paper's reproduction config in the TRL docs is
  beta = 2.5, gamma = 1.375.

  Args:
    chosen_logp: policy SUMMED log-prob of the chosen response, [...].
    rejected_logp: policy summed log-prob of the rejected response, [...].
    chosen_length: number of tokens of the chosen response, [...] (constant).
    rejected_length: number of tokens of the rejected response, [...].
    beta: reward scale, > 0.
    gamma: target reward margin, >= 0.
    label_smoothing: eps in [0, 0.5).

  Returns:
    `PreferenceLoss`, every field [...] float32.

  References: Meng et al. 2024 (arXiv 2405.14734); TRL `CPOTrainer`
  `loss_type="simpo"` with `cpo_alpha=0`.
  """
  checks.positive(beta=beta)
  checks.non_negative(gamma=gamma)
  _check_label_smoothing(label_smoothing)
  names = ["chosen_logp", "rejected_logp", "chosen_length", "rejected_length"]
  checks.same_shape(
    names, chosen_logp, rejected_logp, chosen_length, rejected_length
  )
  sg = jax.lax.stop_gradient
  chosen = stats.safe_div(chosen_logp, sg(stats.f32(chosen_length)))
  rejected = stats.safe_div(rejected_logp, sg(stats.f32(rejected_length)))
  z = beta * (chosen - rejected) - gamma
  return _result(
    _smoothed_logistic(z, label_smoothing), beta * chosen, beta * rejected
  )
