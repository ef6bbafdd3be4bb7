"""Offline preference losses: DPO and its variants, ORPO, CPO, KTO, TGDPO.

Inputs are per-sequence log-probabilities [...] (any leading axes, one entry
per pair), already reduced over tokens with `sequence_logp`; KTO takes
unpaired completions with labels, TGDPO per-token log-probs with masks. The policy's
log-probs carry the gradient; reference log-probs are constants. Every loss
is per pair and unreduced (take the mean over pairs, as TRL and OpenRLHF do),
and returns the implicit rewards (detached) and the pairwise accuracy for
logging.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

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


# --------------------------------------------------------------------------
# Robust DPO (arXiv 2403.00409)


def robust_dpo(
  chosen_logp: ArrayLike,
  rejected_logp: ArrayLike,
  ref_chosen_logp: ArrayLike,
  ref_rejected_logp: ArrayLike,
  *,
  label_smoothing: float,
  beta: float = 0.1,
) -> PreferenceLoss:
  """Robust DPO: the unbiased DPO loss under labels flipped with rate eps.

  With h as in `dpo` and l(z) = -log sigma(z),
    L = ((1 - eps) l(beta h) - eps l(-beta h)) / (1 - 2 eps).
  Its expectation over the label noise equals the clean DPO loss; unlike
  cDPO (`dpo` with label_smoothing) the flipped term enters with a MINUS
  sign, so L can be negative: dL/dz = -((1 - eps) sigma(-z) + eps
  sigma(z)) / (1 - 2 eps) < 0 everywhere and tends to -eps / (1 - 2 eps) as
  z = beta h -> inf (cDPO's gradient changes sign at a finite margin).
  eps = 0 is `dpo`. Implicit rewards beta (log pi - log pi_ref).

  Checked: TRL `DPOTrainer` `loss_type="robust"` (the same formula; TRL
  reads eps from `label_smoothing`). The paper's Eq. (rDPO, "unbiased loss
  l_hat") was seen only through its abstract and TRL's citation.

  Args:
    chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp: as in
      `dpo`, [...].
    label_smoothing: eps, the assumed flip rate, in [0, 0.5) (required: the
      paper assumes it known).
    beta: inverse temperature, > 0.

  Returns:
    `PreferenceLoss`, every field [...] float32.

  References: Chowdhury, Kini, Natarajan 2024, "Provably Robust DPO"
  (arXiv 2403.00409); TRL `loss_type="robust"`.
  """
  checks.positive(beta=beta)
  _check_label_smoothing(label_smoothing)
  chosen, rejected = _log_ratios(
    chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp
  )
  z = beta * (chosen - rejected)
  eps = label_smoothing
  loss = (
    -(1.0 - eps) * jax.nn.log_sigmoid(z) + eps * jax.nn.log_sigmoid(-z)
  ) / (1.0 - 2.0 * eps)
  return _result(loss, beta * chosen, beta * rejected)


# --------------------------------------------------------------------------
# ORPO (arXiv 2403.07691)

# exp(0) = 1 has infinite odds; clamp the average log-prob just below 0.
_MAX_MEAN_LOGP = -1e-6


def log_odds(mean_logp: ArrayLike) -> jax.Array:
  """log(p / (1 - p)) for p = exp(mean_logp), stable for p near 0 and 1.

  log(1 - p) is log(-expm1(x)) for x > -log 2 and log1p(-exp(x)) below
  (Maechler's log1mexp); x is clamped to <= -1e-6, so p = 1 gives a large
  finite value rather than inf.
  """
  x = jnp.minimum(stats.f32(mean_logp), _MAX_MEAN_LOGP)
  log1mexp = jnp.where(
    x > -jnp.log(2.0),
    jnp.log(-jnp.expm1(x)),
    jnp.log1p(-jnp.exp(jnp.minimum(x, -jnp.log(2.0)))),
  )
  return x - log1mexp


def orpo(
  chosen_mean_logp: ArrayLike,
  rejected_mean_logp: ArrayLike,
  *,
  lam: float = 0.1,
) -> PreferenceLoss:
  """ORPO: NLL of the chosen response plus lambda times the odds-ratio loss.

  With the length-averaged log-likelihoods x_c, x_r (`sequence_logp(...,
  average=True)`) and odds(y) = p / (1 - p), p = exp(x):
    L_OR = -log sigma(log odds(y_c) - log odds(y_r))
    L = -x_c + lam L_OR
  Reference-free. dL_OR/dx = -sigma(-u) / (1 - p) for the chosen (u the
  log odds ratio), the paper's Eq. 10 factor. Rewards (TRL): lam * x.

  Checked: TRL `ORPOTrainer.odds_ratio_loss` (lam = TRL `beta`, default 0.1;
  TRL's NLL is a token mean over the batch, ours the per-pair mean over the
  chosen tokens, equal for equal lengths); paper Eqs. 6-8 as summarised in
  the catalog, not read in full.

  Args:
    chosen_mean_logp: policy AVERAGE token log-prob of the chosen, [...].
    rejected_mean_logp: the same for the rejected, [...].
    lam: weight of the odds-ratio term, > 0 (paper and TRL 0.1).

  Returns:
    `PreferenceLoss`, every field [...] float32.

  References: Hong, Lee, Thorne 2024 (arXiv 2403.07691); TRL `ORPOTrainer`.
  """
  checks.positive(lam=lam)
  checks.same_shape(
    ["chosen_mean_logp", "rejected_mean_logp"],
    chosen_mean_logp,
    rejected_mean_logp,
  )
  chosen = stats.f32(chosen_mean_logp)
  rejected = stats.f32(rejected_mean_logp)
  ratio = log_odds(chosen) - log_odds(rejected)
  loss = -chosen - lam * jax.nn.log_sigmoid(ratio)
  return _result(loss, lam * chosen, lam * rejected)


# --------------------------------------------------------------------------
# CPO (arXiv 2401.08417)


def cpo(
  chosen_logp: ArrayLike,
  rejected_logp: ArrayLike,
  *,
  beta: float = 0.1,
  alpha: float = 1.0,
  label_smoothing: float = 0.0,
  chosen_length: ArrayLike | None = None,
) -> PreferenceLoss:
  """Contrastive Preference Optimization: reference-free DPO + NLL(chosen).

    L = -(1 - eps) log sigma(beta (log pi(y_c) - log pi(y_r)))
        - eps log sigma(-beta (...)) - alpha log pi(y_c) [/ |y_c|]

  The NLL term is divided by ``chosen_length`` when given (TRL's
  cross-entropy is a token mean; the paper writes the summed log-likelihood).
  Rewards beta log pi(y) (TRL `CPOTrainer`).

  Checked: TRL `CPOTrainer` `loss_type="sigmoid"` (`cpo_alpha` = alpha,
  default 1.0); the paper's Eq. (L_prefer + L_NLL, alpha = 1) through the
  catalog and TRL's docs.

  Args:
    chosen_logp: policy SUMMED log-prob of the chosen response, [...].
    rejected_logp: policy summed log-prob of the rejected response, [...].
    beta: inverse temperature, > 0.
    alpha: weight of the NLL term, >= 0 (0 gives reference-free DPO).
    label_smoothing: eps in [0, 0.5).
    chosen_length: optional token count of the chosen, [...] (constant).

  Returns:
    `PreferenceLoss`, every field [...] float32.

  References: Xu et al. 2024 (arXiv 2401.08417); TRL `CPOTrainer`.
  """
  checks.positive(beta=beta)
  checks.non_negative(alpha=alpha)
  _check_label_smoothing(label_smoothing)
  checks.same_shape(
    ["chosen_logp", "rejected_logp", "chosen_length"],
    chosen_logp,
    rejected_logp,
    chosen_length,
  )
  chosen, rejected = stats.f32(chosen_logp), stats.f32(rejected_logp)
  nll = -chosen
  if chosen_length is not None:
    length = jax.lax.stop_gradient(stats.f32(chosen_length))
    nll = stats.safe_div(nll, length)
  z = beta * (chosen - rejected)
  loss = _smoothed_logistic(z, label_smoothing) + alpha * nll
  return _result(loss, beta * chosen, beta * rejected)


# --------------------------------------------------------------------------
# KTO (arXiv 2402.01306)


class KTOLoss(NamedTuple):
  """Per-example KTO loss and its diagnostics, all [...] float32.

  Attributes:
    loss: lambda_y - v(x, y), the loss of each example (to be minimised).
    reward: implicit reward beta (log pi - log pi_ref) (detached).
    accuracy: 1.0 where the example lies on its label's side of the
      reference point (desirable: reward > beta z0; undesirable: <).
  """

  loss: jax.Array
  reward: jax.Array
  accuracy: jax.Array


def kto_reference_point(
  kl_logp: ArrayLike,
  ref_kl_logp: ArrayLike,
  where: ArrayLike | None = None,
) -> jax.Array:
  """KTO's reference point z0 = max(0, mean(log pi - log pi_ref)), detached.

  The inputs are sequence log-probs of MISMATCHED (prompt, completion)
  pairs, e.g. prompt i with completion i + 1 of the batch (TRL builds them
  by rotating the completions). The mean runs over all entries (or those
  where ``where`` > 0), a biased but low-variance estimate of
  KL(pi || pi_ref); no gradient flows through it. Under data parallelism
  take the mean over the global batch (TRL all-gathers it).

  Returns:
    A scalar float32.
  """
  checks.same_shape(
    ["kl_logp", "ref_kl_logp", "where"], kl_logp, ref_kl_logp, where
  )
  diff = stats.f32(kl_logp) - stats.f32(ref_kl_logp)
  mask = jnp.ones_like(diff) if where is None else where
  kl = stats.masked_mean(diff, mask)
  return jax.lax.stop_gradient(jnp.maximum(kl, 0.0))


def kto(
  logp: ArrayLike,
  ref_logp: ArrayLike,
  desirable: ArrayLike,
  reference_point: ArrayLike,
  *,
  beta: float = 0.1,
  desirable_weight: float = 1.0,
  undesirable_weight: float = 1.0,
) -> KTOLoss:
  """Kahneman-Tversky Optimization on unpaired, labelled completions.

  r = log pi(y|x) - log pi_ref(y|x), z0 = `kto_reference_point` (detached):
    desirable:   L = lambda_D (1 - sigma(beta (r - z0)))
    undesirable: L = lambda_U (1 - sigma(beta (z0 - r)))
  (the paper's lambda_y - v(x, y)). Unreduced: average over examples.

  Weights: the paper and TRL's docs advise choosing them so that
  lambda_D n_D / (lambda_U n_U) lies in [1, 4/3], where n_D and n_U count
  the desirable and undesirable examples; e.g. with 3 desirable to 1
  undesirable, lambda_D = 1 and lambda_U in [2.25, 3]
  (TRL `desirable_weight`, `undesirable_weight`).

  Checked: TRL `KTOTrainer.kto_loss` (the same formula, the KL estimate
  clamped at 0 and detached, rewards beta r); the paper's Eq. 8 through the
  catalog and TRL.

  Args:
    logp: policy sequence log-probs of the completions, [...].
    ref_logp: reference sequence log-probs, [...] (constant).
    desirable: 1 for desirable (chosen) examples, 0 for undesirable, [...].
    reference_point: z0, a scalar (or broadcastable [...]); detached here.
    beta: inverse temperature, > 0 (TRL 0.1).
    desirable_weight: lambda_D, > 0.
    undesirable_weight: lambda_U, > 0.

  Returns:
    `KTOLoss`, every field [...] float32.

  References: Ethayarajh et al. 2024 (arXiv 2402.01306); TRL `KTOTrainer`.
  """
  checks.positive(
    beta=beta,
    desirable_weight=desirable_weight,
    undesirable_weight=undesirable_weight,
  )
  checks.same_shape(
    ["logp", "ref_logp", "desirable"], logp, ref_logp, desirable
  )
  if np.ndim(reference_point) not in (0, np.ndim(logp)):
    raise ValueError(
      "reference_point must be a scalar (kto_reference_point) or have the"
      f" rank of logp {np.shape(logp)}; got shape"
      f" {np.shape(reference_point)}."
    )
  sg = jax.lax.stop_gradient
  r = stats.f32(logp) - sg(stats.f32(ref_logp))
  z0 = sg(stats.f32(reference_point))
  good = stats.f32(desirable) > 0
  signed = jnp.where(good, r - z0, z0 - r)
  weight = jnp.where(good, desirable_weight, undesirable_weight)
  loss = weight * (1.0 - jax.nn.sigmoid(beta * signed))
  reward = sg(beta * r)
  return KTOLoss(loss, reward, (sg(signed) > 0).astype(jnp.float32))


# --------------------------------------------------------------------------
# TGDPO (arXiv 2506.14574)


def tgdpo(
  chosen_logp_BT: ArrayLike,
  rejected_logp_BT: ArrayLike,
  ref_chosen_logp_BT: ArrayLike,
  ref_rejected_logp_BT: ArrayLike,
  rm_chosen_logp_BT: ArrayLike,
  rm_rejected_logp_BT: ArrayLike,
  chosen_mask_BT: ArrayLike,
  rejected_mask_BT: ArrayLike,
  *,
  beta: float = 0.1,
  alpha: float = 0.5,
) -> PreferenceLoss:
  """TGDPO: DPO with per-token weights from a token-level reward model.

  Per token, Delta_t = log pi(y_t) - log pi_ref(y_t) and the token reward
  r_t = log pi_RM(y_t) - log pi_ref(y_t) (pi_RM: a DPO-trained policy,
  frozen). With m_t the masks,
    s_c = sum_t m_t beta (1 + alpha beta r_t) Delta_t     over y_c
    s_r = sum_t m_t beta (1 - alpha beta r_t) Delta_t     over y_r
    L = -log sigma(s_c - s_r)
  Chosen tokens the RM likes get larger weights, rejected tokens it
  dislikes (r_t < 0) too. alpha = 0 is `dpo` on summed log-probs. Rewards
  s_c, s_r (detached, the code's summed token rewards).

  Checked: the official code, dvlab-research/TGDPO
  `src/llamafactory/train/tgdpo/trainer.py` (`dpo_loss`, sigmoid branch;
  per-token log-probs zeroed on padding) and
  `examples/llama3_8b_instruct_tgdpo.yaml` (beta 0.1, tgdpo_alpha 0.5): the
  formula above is the code's. The paper's equation could not be read (only
  its abstract was reachable); the code's r_hat = beta log(pi_RM/pi_ref)
  inside 1 +- alpha r_hat is how we read the paper's f(r_hat).

  Args:
    chosen_logp_BT, rejected_logp_BT: policy token log-probs, [..., T].
    ref_chosen_logp_BT, ref_rejected_logp_BT: reference token log-probs
      (constant).
    rm_chosen_logp_BT, rm_rejected_logp_BT: token log-probs of the reward
      policy pi_RM (constant).
    chosen_mask_BT, rejected_mask_BT: 1 on response tokens, 0 on padding.
    beta: inverse temperature, > 0.
    alpha: strength of the token guidance, >= 0.

  Returns:
    `PreferenceLoss`, every field [...] float32 (T reduced).

  References: Zhu et al. 2025, ICML (arXiv 2506.14574).
  """
  checks.positive(beta=beta)
  checks.non_negative(alpha=alpha)
  chosen = [chosen_logp_BT, ref_chosen_logp_BT, rm_chosen_logp_BT]
  rejected = [rejected_logp_BT, ref_rejected_logp_BT, rm_rejected_logp_BT]
  checks.same_shape(
    ["chosen_logp_BT", "ref_chosen_logp_BT", "rm_chosen_logp_BT"]
    + ["chosen_mask_BT"],
    *chosen,
    chosen_mask_BT,
  )
  checks.same_shape(
    ["rejected_logp_BT", "ref_rejected_logp_BT", "rm_rejected_logp_BT"]
    + ["rejected_mask_BT"],
    *rejected,
    rejected_mask_BT,
  )
  checks.leading_shape(
    "rejected_logp_BT",
    rejected_logp_BT,
    np.shape(chosen_logp_BT)[:-1],
    "chosen_logp_BT without its token axis",
  )
  s_c = _tgdpo_score(*chosen, chosen_mask_BT, beta, alpha)
  s_r = _tgdpo_score(*rejected, rejected_mask_BT, beta, -alpha)
  return _result(-jax.nn.log_sigmoid(s_c - s_r), s_c, s_r)


def _tgdpo_score(logp, ref, rm, mask, beta, alpha):
  """sum_t m_t beta (1 + alpha beta r_t) Delta_t, references detached."""
  sg = jax.lax.stop_gradient
  ref = sg(stats.f32(ref))
  delta = stats.f32(logp) - ref
  token_reward = sg(stats.f32(rm)) - ref
  weight = beta * (1.0 + alpha * beta * token_reward)
  return stats.masked_sum(weight * delta, sg(stats.f32(mask)), axis=-1)
