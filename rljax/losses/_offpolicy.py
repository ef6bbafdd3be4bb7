"""Off-policy REINFORCE family and regression / pairwise / discriminative
policy losses: REC / REP / RED, Kimi k1.5 OPMD, Reg-GRPO, P3O, DisCO, and the
MDPO proximity term.

The per-token losses share the signature of `rljax.losses._policy`
(``f(logp_BT, old_logp_BT, adv_BT, mask_BT, **hyper) -> TokenLoss``) and plug
into `rljax.objectives.policy`; the notation is the same (d = logp - old_logp,
r = exp(d), sg = stop-gradient, m = mask, |o_i| = sum_t m_it). Sequence-level
losses compute one value per sequence and broadcast it to its tokens, so that
`seq_mean_token_mean` aggregation is the mean over sequences. Losses that read
the group (Reg-GRPO, P3O, DisCO) take inputs [..., G, T]: the second-to-last
axis is the group of samples of one prompt; a sequence with no valid token
(a filtered or padded sample) is not a member of its group.
"""

import jax
from jax import lax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax._src import stats
from rljax.losses._policy import TokenLoss
from rljax.losses._policy import _broadcast
from rljax.losses._policy import _clipped_surrogate
from rljax.losses._policy import _log_ratio
from rljax.losses._policy import _prepare
from rljax.losses._policy import _seq_mean
from rljax.losses._policy import _zeros_clip

_LOG_RATIO_CLAMP = 20.0
REC_CLIP_MODES = ("none", "one_side", "two_side", "ring")
REC_WEIGHTS = ("none", "importance_sampling", "advantage")
REC_REGULARIZERS = ("none", "k2", "forward_kl")


# --------------------------------------------------------------------------
# REC / REP / RED (arXiv 2509.24203)


def _rec_in_range(r, adv, clip_mode, eps_low, eps_high, ring_low, ring_high):
  """1[token keeps its gradient] for each clip-as-mask mode."""
  two_side = (r >= 1.0 - eps_low) & (r <= 1.0 + eps_high)
  if clip_mode == "none":
    return jnp.ones_like(r, dtype=bool)
  if clip_mode == "one_side":
    return ((adv >= 0) & (r <= 1.0 + eps_high)) | (
      (adv <= 0) & (r >= 1.0 - eps_low)
    )
  if clip_mode == "two_side":
    return two_side
  return (
    two_side
    | ((adv >= 0) & (r <= 1.0 - ring_low))
    | ((adv <= 0) & (r >= 1.0 + ring_high))
  )


def _check_rec(clip_mode, weight, regularizer, **hyper) -> None:
  checks.one_of("clip_mode", clip_mode, REC_CLIP_MODES)
  checks.one_of("weight", weight, REC_WEIGHTS)
  checks.one_of("regularizer", regularizer, REC_REGULARIZERS)
  checks.positive(
    eps_low=hyper["eps_low"],
    eps_high=hyper["eps_high"],
    eps_low_ring=hyper["eps_low_ring"],
    eps_high_ring=hyper["eps_high_ring"],
    temperature=hyper["temperature"],
  )
  checks.in_range("eps_low", hyper["eps_low"], 0.0, 1.0)
  checks.in_range("eps_low_ring", hyper["eps_low_ring"], 0.0, 1.0)
  checks.non_negative(coef=hyper["coef"])


def rec(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  clip_mode: str = "none",
  weight: str = "none",
  regularizer: str = "none",
  coef: float = 0.0,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  eps_low_ring: float = 0.6,
  eps_high_ring: float = 2.0,
  temperature: float = 1.0,
) -> TokenLoss:
  """REC / REP / RED: one configurable off-policy REINFORCE loss.

    r = sg(exp(d))                                   (detached ratio)
    w = 1 | r (importance_sampling) | exp(A / T) (advantage, RED-Weight)
    L = -A w logp 1[in range]  +  c (logp - old_logp)^2   (regularizer k2)
                               |  - c logp                (forward_kl)

  Clipping is a mask on the REINFORCE term ("clipping as masking"):

  * ``none``: every token.
  * ``one_side`` (REC-OneSide; GRPO's clip): (A >= 0 and r <= 1 + eps_high)
    or (A <= 0 and r >= 1 - eps_low).
  * ``two_side``: 1 - eps_low <= r <= 1 + eps_high.
  * ``ring``: two_side, or (A >= 0 and r <= 1 - eps_low_ring), or
    (A <= 0 and r >= 1 + eps_high_ring).

  Named members of the family: REC-OneSide-IS (``one_side`` +
  ``importance_sampling``) has exactly the gradient of `ppo_clip` (GRPO's
  surrogate) with the same eps, -A r grad logp on unclipped tokens;
  REC-OneSide-NoIS drops the weight; REP-OPMD is ``regularizer="k2"``
  (Trinity-RFT's OPMD, c = 0.1; the 1/2 of Kimi's form folded into c);
  REP-AsymRE is ``regularizer="forward_kl"``; RED-Weight is
  ``weight="advantage"``. The paper trains with group-mean advantages
  without std scaling (`advantages.dr_grpo`) and token-mean aggregation.

  Defaults: Trinity-RFT ``RECPolicyLossFn.default_args`` (clip_mode none,
  weight none, no regulariser, eps 0.2 / 0.2, ring eps 0.6 / 2.0, T = 1).
  Mode names use underscores (Trinity: ``one-side``, ``forward-kl``,
  ``importance_sampling``). No log-ratio clamp (Trinity has none); r is
  detached, so only the mask and weight depend on it.

  Checked: against Trinity-RFT ``trinity/algorithm/policy_loss_fn/
  rec_policy_loss.py`` (the paper's official code) line by line: masks with
  inclusive A >= 0 / A <= 0, unnormalised exp(A/T) weight, k2 without 1/2,
  forward-kl as -c logp. Trinity's experimental ``gspo-one-side`` mode is not
  implemented. The paper text beyond its abstract was not read.

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see `rljax.losses.ppo_clip`.
    clip_mode: one of ``none``, ``one_side``, ``two_side``, ``ring``.
    weight: one of ``none``, ``importance_sampling``, ``advantage``.
    regularizer: ``none``, ``k2`` (REP-OPMD) or ``forward_kl`` (REP-AsymRE).
    coef: regulariser coefficient c (>= 0).
    eps_low: lower range, in (0, 1].
    eps_high: upper range (> 0).
    eps_low_ring: ring's outer lower bound, in (0, 1].
    eps_high_ring: ring's outer upper bound (> 0).
    temperature: T of the RED-Weight exp(A / T) (> 0).

  Returns:
    TokenLoss; clip_high marks masked tokens with r > 1, clip_low masked
    tokens with r <= 1.

  References:
    Yao et al. 2025, "Group-Relative REINFORCE Is Secretly an Off-Policy
    Algorithm" (arXiv 2509.24203); Trinity-RFT `RECPolicyLossFn`.
  """
  _check_rec(
    clip_mode,
    weight,
    regularizer,
    coef=coef,
    eps_low=eps_low,
    eps_high=eps_high,
    eps_low_ring=eps_low_ring,
    eps_high_ring=eps_high_ring,
    temperature=temperature,
  )
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  d = _log_ratio(x, None)
  r = lax.stop_gradient(jnp.exp(d))
  keep = _rec_in_range(
    r, x.adv, clip_mode, eps_low, eps_high, eps_low_ring, eps_high_ring
  )
  loss = -_rec_weighted(x.adv, r, weight, temperature) * x.logp
  loss = _rec_regularized(loss * stats.f32(keep), d, x.logp, regularizer, coef)
  return TokenLoss(loss, *_rec_dropped(x.valid & ~keep, r))


def _rec_weighted(adv, r, weight, temperature):
  """A w: w = 1, the detached ratio r, or RED-Weight's exp(A / T)."""
  if weight == "importance_sampling":
    return adv * r
  if weight == "advantage":
    return adv * jnp.exp(adv / temperature)
  return adv


def _rec_regularized(loss, d, logp, regularizer, coef):
  """`loss` plus REP's c d^2 (k2) or - c logp (forward_kl)."""
  if regularizer == "k2":
    return loss + coef * jnp.square(d)
  if regularizer == "forward_kl":
    return loss - coef * logp
  return loss


def _rec_dropped(dropped, r):
  """clip_low / clip_high: the masked-out tokens with r <= 1 / r > 1."""
  return stats.f32(dropped & (r <= 1.0)), stats.f32(dropped & (r > 1.0))


# --------------------------------------------------------------------------
# Kimi k1.5 OPMD (arXiv 2501.12599)


def kimi_opmd(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  tau: float = 0.2,
  normalize: bool = False,
) -> TokenLoss:
  """Kimi k1.5 online policy mirror descent: a sequence-level squared loss.

    D_i = sum_t m (logp - old_logp)         (sequence log pi_theta / pi_old)
    L_i = (A_i - tau D_i)^2,   A_i = masked mean of A over T

  broadcast to every token of sequence i; aggregate with
  `seq_mean_token_mean` for the paper's mean over samples. A_i should be
  r_i - mean_group r (tau log Z estimated by the group's mean reward, Kimi
  k1.5 Sec. 2.3.2): `advantages.dr_grpo`.

  Gradient: dL_i = -2 tau (A_i - tau D_i) grad D_i. As tau -> 0 it vanishes
  like -2 tau A_i grad D_i; ``normalize=True`` divides L_i by 2 tau, whose
  gradient -(A_i - tau D_i) grad D_i is the paper's stated gradient
  (REINFORCE -A_i grad log pi(y_i) minus (tau / 2) grad D_i^2) and tends to
  sequence-level REINFORCE as tau -> 0, for any D_i.

  Defaults: tau = 0.2, so that the normalised loss's (tau / 2) D^2 matches
  Trinity-RFT's OPMD coefficient 0.1 (the paper does not state tau;
  Trinity's REP-OPMD regularises per token, `rec(regularizer="k2")`).

  Checked: not against the paper text (not found); the formula and the
  gradient are from secondary notes of Kimi k1.5 (SEED_PAPERS 4.3), and the
  gradient identity above is verified by the tests.

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see `rljax.losses.ppo_clip`.
    tau: KL-regularisation strength of the mirror-descent step (> 0).
    normalize: divide by 2 tau (REINFORCE-scaled gradient).

  Returns:
    TokenLoss with zero clip indicators, constant over T per sequence.

  References:
    Kimi Team 2025, "Kimi k1.5" (arXiv 2501.12599), Sec. 2.3.2.
  """
  checks.positive(tau=tau)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  seq_log_ratio = stats.masked_sum(
    _log_ratio(x, None), x.mask, axis=-1, keepdims=True
  )
  loss = jnp.square(_seq_mean(x.adv, x.mask) - tau * seq_log_ratio)
  if normalize:
    loss = loss / (2.0 * tau)
  return _broadcast(_zeros_clip(loss), x.logp.shape)


# --------------------------------------------------------------------------
# Group helpers ([..., G, T] inputs)


def _check_group(name: str, x: ArrayLike, size: int | None = None) -> None:
  if np.ndim(x) < 2:
    raise ValueError(
      f"{name} must have rank >= 2 ([..., G, T], the group of samples of one"
      f" prompt on the second-to-last axis); got shape {np.shape(x)}."
    )
  if size is not None and np.shape(x)[-2] != size:
    raise ValueError(
      f"{name} has shape {np.shape(x)}: this loss compares pairs and needs"
      f" exactly {size} samples per prompt (G = {size}); sample G = {size}"
      " completions per prompt."
    )


def _members(mask: jax.Array) -> jax.Array:
  """[..., G] 1.0 for sequences with at least one valid token."""
  return stats.f32(stats.sequence_lengths(mask) > 0)


# --------------------------------------------------------------------------
# Reg-GRPO (DeepVideo-R1, arXiv 2506.07464)


def reg_grpo(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  beta: float = 1.0,
  standardize: str = "mean_std",
  length_normalize: bool = False,
  eps: float = 1e-6,
) -> TokenLoss:
  """Reg-GRPO: regress the group-standardised sequence log-ratio onto A.

    rho_i = (1 / beta) D_i,  D_i = sum_t m (logp - old_logp)
            (mean over T instead of the sum if ``length_normalize``)
    rho~_i = (rho_i - mean_g rho) / (std_g rho + eps)   (``mean_std``)
           |  rho_i - mean_g rho                         (``mean``)
    L_i = (rho~_i - A_i)^2,   A_i = masked mean of A over T

  over the group axis (-2), members only; broadcast to the tokens of
  sequence i. Aggregate with `seq_mean_token_mean` (the paper sums over the
  group; the mean over sequences differs by the constant factor G). The
  group mean and std are differentiated (the regression target is the whole
  standardised vector). With ``mean_std`` the 1/beta cancels (up to eps);
  it matters only with ``mean``. Groups with fewer than 2 members give 0.

  Defaults: beta = 1, ``mean_std`` (SEED_PAPERS 4.30), eps 1e-6 (as
  `advantages.grpo`).

  Checked: not verified: the paper's equation could not be read (only the
  abstract and summaries were found). The formula is the catalog's
  reconstruction; the normalisation (sum vs mean over tokens, mean / std,
  where beta enters) is exposed as options for that reason.

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: [..., G, T]; see
      `rljax.losses.ppo_clip`.
    beta: temperature of the log-ratio (> 0).
    standardize: ``mean_std`` or ``mean``.
    length_normalize: mean instead of sum over tokens.
    eps: added to the std (>= 0).

  Returns:
    TokenLoss with zero clip indicators.

  References:
    Park et al. 2025, "DeepVideo-R1" (arXiv 2506.07464).
  """
  checks.positive(beta=beta)
  checks.non_negative(eps=eps)
  checks.one_of("standardize", standardize, ("mean_std", "mean"))
  _check_group("logp_BT", logp_BT)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  d = _log_ratio(x, None)
  reduce = stats.masked_mean if length_normalize else stats.masked_sum
  rho = reduce(d, x.mask, axis=-1) / beta  # [..., G]
  member = _members(x.mask)
  n = jnp.sum(member, axis=-1, keepdims=True)
  centred = rho - stats.masked_mean(rho, member, axis=-1, keepdims=True)
  if standardize == "mean_std":
    std = stats.masked_std(rho, member, axis=-1, keepdims=True)
    centred = centred / (std + eps)
  adv = stats.masked_mean(x.adv, x.mask, axis=-1)
  loss = jnp.where((member > 0) & (n >= 2), jnp.square(centred - adv), 0.0)
  return _broadcast(_zeros_clip(loss[..., None]), x.logp.shape)


# --------------------------------------------------------------------------
# P3O (arXiv 2310.00212)


def p3o(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  clip: str = "separate",
  eps: float = 0.2,
) -> TokenLoss:
  """P3O: pairwise trajectory-wise policy gradient on the reward difference.

  For the pair (y_1, y_2) of a prompt (G = 2, axis -2), with
  A_1 = (R_1 - R_2) / 2 = -A_2 (`advantages.dr_grpo` at G = 2) and the
  sequence ratios rho_i = exp(D_i), D_i = sum_t m (logp - old_logp):

  * ``none``: L_i = -A_i rho_i; its on-policy gradient is the P3O gradient
    -((R_1 - R_2) / 2) grad (log pi(y_1) - log pi(y_2)).
  * ``separate``: each response clipped, PPO-style,
    L_i = max(-A_i rho_i, -A_i clip(rho_i, 1 - eps, 1 + eps)).
  * ``joint``: the pair's ratio rho_12 = rho_1 / rho_2 clipped,
    L_pair = max(-A_1 rho_12, -A_1 clip(rho_12, 1 - eps, 1 + eps)),
    half of it on each response.

  L_i is broadcast over the tokens of response i; aggregate with
  `seq_mean_token_mean` (mean over responses). Unclipped and on-policy the
  gradient equals `dr_grpo` advantages + `reinforce` +
  `seq_mean_token_sum` (tested). Sequence log-ratios are clamped to
  [-20, 20] before exp.

  Defaults: ``separate``, eps 0.2 (PPO's).

  Checked: not verified: the paper's clipped objectives were not found in
  the reference corpus; the forms above follow the catalog (SEED_PAPERS
  4.20: "per-response or joint ratio clipping") and the usual PPO clip.
  The unclipped gradient identity is verified by the tests. A second
  search (issue 15) reached only the abstract and the opening of the
  authors' BAIR blog post ("stability is enforced with clipping variants
  ... on paired trajectories", a review's summary): consistent with the
  two clipped forms named here, the equations still not read.

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: [..., 2, T]; see
      `rljax.losses.ppo_clip`.
    clip: one of ``none``, ``separate``, ``joint``.
    eps: clip range (> 0).

  Returns:
    TokenLoss; the indicators mark responses whose clipped branch won.

  References:
    Wu et al. 2023, "Pairwise Proximal Policy Optimization" (arXiv
    2310.00212).
  """
  checks.one_of("clip", clip, ("none", "separate", "joint"))
  checks.positive(eps=eps)
  _check_group("logp_BT", logp_BT, size=2)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  seq_d = stats.masked_sum(_log_ratio(x, None), x.mask, axis=-1)  # [..., 2]
  seq_d = jnp.clip(seq_d, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
  adv = stats.masked_mean(x.adv, x.mask, axis=-1)
  if clip == "joint":
    joint = jnp.exp(
      jnp.clip(
        seq_d[..., :1] - seq_d[..., 1:], -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP
      )
    )
    out = _clipped_surrogate(
      joint, jnp.clip(joint, 1.0 - eps, 1.0 + eps), adv[..., :1]
    )
    out = jax.tree.map(lambda a: jnp.concatenate([a, a], axis=-1), out)
    out = out._replace(loss=0.5 * out.loss)
  else:
    rho = jnp.exp(seq_d)
    hi = jnp.inf if clip == "none" else 1.0 + eps
    lo = -jnp.inf if clip == "none" else 1.0 - eps
    out = _clipped_surrogate(rho, jnp.clip(rho, lo, hi), adv)
  out = jax.tree.map(lambda a: a[..., None], out)
  return _broadcast(out, x.logp.shape)


# --------------------------------------------------------------------------
# DisCO (arXiv 2505.12366)

DISCO_SCORES = ("log_likelihood", "likelihood_ratio")
DISCO_VARIANTS = ("dro", "basic")


def disco_scores(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  score: str = "log_likelihood",
) -> jax.Array:
  """DisCO's per-sequence score s_i, [...] (gradient through logp).

  ``log_likelihood`` (DisCO "log-L"): s = mean_t logp.
  ``likelihood_ratio`` (DisCO "L-ratio"): s = mean_t exp(logp - old_logp)
  (unclamped, as the official code). Means over valid tokens.
  """
  checks.one_of("score", score, DISCO_SCORES)
  x = _prepare(logp_BT, old_logp_BT, logp_BT, mask_BT)
  token = x.logp if score == "log_likelihood" else jnp.exp(x.logp - x.old_logp)
  return stats.masked_mean(token, x.mask, axis=-1)


def disco(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  rewards_BG: ArrayLike,
  mask_BT: ArrayLike,
  *,
  score: str = "log_likelihood",
  tau: float = 10.0,
  variant: str = "dro",
  threshold: float = 0.5,
) -> TokenLoss:
  """DisCO's discriminative objective of each group, as a per-token loss.

  With s_i from `disco_scores`, positives P_q = {i: R_i > threshold} and
  negatives N_q = {i: R_i <= threshold} among the group's members (axis -2):

    dro:   J_q = mean_{i in P_q} s_i - tau log mean_{j in N_q} exp(s_j / tau)
    basic: J_q = mean_{i in P_q} s_i - mean_{j in N_q} s_j       (DisCO-b)

  and J_q = 0 for groups without both a positive and a negative (the code
  drops them but still counts them in the number of questions). The loss
  -J_q is put on every token of every member of the group, so that with
  `seq_mean_token_mean` aggregation the loss is sum_q G_q (-J_q) / sum_q G_q,
  the official code's -sum_q J_q / (number of questions) when every group
  has G members.

  The official code computes the dro term's value as s/sg(s) (value 1,
  gradient of the log-sum-exp); here the value is the log-mean-exp itself,
  so logged values differ and gradients agree (log-mean-exp and the code's
  log-sum-exp differ by the constant tau log |N_q|).

  Defaults: tau = 10 for ``log_likelihood`` (the paper / verl docs; use
  tau = 1 with ``likelihood_ratio``), ``dro`` (DisCO; ``basic`` is DisCO-b),
  threshold 0.5 (binary 0/1 rewards, as the code's ``== 1`` / ``== 0``).

  Checked: against Optimization-AI/DisCO
  ``verl/verl/trainer/ppo/core_algos.py`` (``compute_policy_loss_disco_logL``
  / ``_Lratio`` / ``discob_*``): scores, grouping, dropping of one-sided
  groups, normalisation by the number of questions.

  Args:
    logp_BT, old_logp_BT, mask_BT: [..., G, T]; see `rljax.losses.ppo_clip`.
    rewards_BG: [..., G] sequence rewards (detached).
    score: ``log_likelihood`` or ``likelihood_ratio``.
    tau: DRO temperature (> 0).
    variant: ``dro`` (DisCO) or ``basic`` (DisCO-b).
    threshold: rewards above it are positives.

  Returns:
    TokenLoss with zero clip indicators.

  References:
    Li et al. 2025, "DisCO" (arXiv 2505.12366); verl ``recipe/disco``.
  """
  checks.positive(tau=tau)
  checks.one_of("variant", variant, DISCO_VARIANTS)
  _check_group("logp_BT", logp_BT)
  checks.leading_shape(
    "rewards_BG", rewards_BG, np.shape(logp_BT)[:-1], "logp_BT[..., :-1]"
  )
  checks.rank("rewards_BG", rewards_BG, np.ndim(logp_BT) - 1, "[..., G]")
  s = disco_scores(logp_BT, old_logp_BT, mask_BT, score=score)
  member = _members(stats.f32(mask_BT)) > 0
  rewards = lax.stop_gradient(stats.f32(rewards_BG))
  pos = member & (rewards > threshold)
  neg = member & (rewards <= threshold)
  both = jnp.any(pos, axis=-1) & jnp.any(neg, axis=-1)
  pos_mean = stats.masked_mean(s, pos, axis=-1)
  if variant == "basic":
    neg_term = stats.masked_mean(s, neg, axis=-1)
  else:
    n_neg = jnp.maximum(jnp.sum(neg, axis=-1), 1.0)
    # Groups without negatives get finite dummy logits (no NaN gradient).
    logits = jnp.where(neg, s / tau, -jnp.inf)
    logits = jnp.where(jnp.any(neg, axis=-1, keepdims=True), logits, 0.0)
    lse = jax.nn.logsumexp(logits, axis=-1)
    neg_term = tau * (lse - jnp.log(n_neg))
  j = jnp.where(both, pos_mean - neg_term, 0.0)
  shape = np.shape(logp_BT)
  loss = jnp.broadcast_to(-j[..., None, None], shape)
  return _zeros_clip(loss)


# --------------------------------------------------------------------------
# KL(pi || pi_old) from samples of pi_old (MDPO's proximity term)


def kl_reverse_old(logp_BT: ArrayLike, old_logp_BT: ArrayLike) -> jax.Array:
  """Per-token estimate of KL(pi || pi_old) from tokens sampled by pi_old.

    k = r log r - r + 1,   r = exp(logp - old_logp)   (log-ratio clamped to
    [-20, 20])

  Unbiased (E_old[r log r] = KL(pi || pi_old), E_old[r - 1] = 0) and >= 0 per
  token; gradient r log r grad logp, 0 on-policy, curvature 1 there (as k2).

  Args:
    logp_BT: policy log-probs of the sampled tokens, [..., T] (differentiated).
    old_logp_BT: behaviour-policy log-probs, same shape (constant).

  Returns:
    Per-token estimate, [..., T] float32.
  """
  checks.same_shape(["logp_BT", "old_logp_BT"], logp_BT, old_logp_BT)
  d = stats.f32(logp_BT) - lax.stop_gradient(stats.f32(old_logp_BT))
  d = jnp.clip(d, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
  r = jnp.exp(d)
  return r * d - r + 1.0


def ratio_pg(
  logp_BT: ArrayLike,
  old_logp_BT: ArrayLike,
  adv_BT: ArrayLike,
  mask_BT: ArrayLike,
  *,
  log_ratio_clamp: float | None = _LOG_RATIO_CLAMP,
) -> TokenLoss:
  """The unclipped importance-sampled surrogate L = -A r (MDPO, TRPO).

  Args:
    logp_BT, old_logp_BT, adv_BT, mask_BT: see `rljax.losses.ppo_clip`.
    log_ratio_clamp: clamp of d before exp (20); None disables it.

  Returns:
    TokenLoss with zero clip indicators.
  """
  if log_ratio_clamp is not None:
    checks.positive(log_ratio_clamp=log_ratio_clamp)
  x = _prepare(logp_BT, old_logp_BT, adv_BT, mask_BT)
  return _zeros_clip(-x.adv * jnp.exp(_log_ratio(x, log_ratio_clamp)))


def mdpo_step_size(step: ArrayLike, total: int) -> jax.Array:
  """MDPO's annealed step size t_k = 1 - k / K, k = min(step, K - 1).

  ``step`` counts from 0; the smallest value, 1 / K, holds after step K - 1
  (the official code: 1 - (iteration - 1) / n_updates, iterations from 1).
  """
  checks.positive(total=total)
  k = jnp.clip(jnp.asarray(step, jnp.float32), 0.0, total - 1.0)
  return 1.0 - k / total
