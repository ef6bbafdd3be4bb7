"""Distillation losses over the full vocabulary: GKD's generalized JSD and
the forward and reverse KL between a student and a frozen teacher.

Inputs are logits [..., V] (vocabulary last; any leading axes, typically
[B, T, V]) of the student and the teacher on the SAME token sequence
(teacher forcing). The student's logits carry the gradient; the teacher's
are constants (stop_gradient). Both are divided by `temperature` and
normalised with log-softmax in float32, whatever the input dtype. Every
function returns an unreduced per-token value [...] float32 (the logits'
shape without V); ``mask`` (shape [...], > 0 on tokens that count) zeroes
the other positions, whose logits are replaced by 0 first so that padding
holding inf or NaN cannot leak into values or gradients. Reduce with
`rljax.aggregate.token_mean` (TRL's ``batchmean`` over completion tokens).

Notation: S = softmax(student / tau), T = softmax(teacher / tau), KL(P || Q)
= sum_v P_v (log P_v - log Q_v). A vocabulary entry with probability 0
(a logit of -inf, e.g. padded vocabulary rows) adds 0 to any KL it is the
first argument of.
"""

import math
from typing import Optional

import jax
from jax import lax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Mean
from rljax._src.base import mean_metric


def _check(student_logits, teacher_logits, mask, temperature) -> None:
  """Shapes of the logits and mask, and the temperature, before any math."""
  if np.ndim(student_logits) < 1 or np.shape(student_logits)[-1] < 1:
    raise ValueError(
      "student_logits must have a vocabulary axis last ([..., V], V >= 1);"
      f" got shape {np.shape(student_logits)}."
    )
  if np.shape(student_logits) != np.shape(teacher_logits):
    raise ValueError(
      f"student_logits {np.shape(student_logits)} and teacher_logits"
      f" {np.shape(teacher_logits)} must have the same shape: score the same"
      " tokens with both models, and slice a padded vocabulary to the shared"
      " tokenizer's size (logits[..., :vocab_size]) first."
    )
  if mask is not None and np.shape(mask) != np.shape(student_logits)[:-1]:
    raise ValueError(
      f"mask has shape {np.shape(mask)}; it must be the logits' shape without"
      f" the vocabulary axis, {np.shape(student_logits)[:-1]}."
    )
  checks.positive(temperature=temperature)


def _log_probs(student_logits, teacher_logits, mask, temperature):
  """(log S, sg(log T), valid) in float32; masked rows' logits set to 0."""
  _check(student_logits, teacher_logits, mask, temperature)
  if mask is None:
    valid = jnp.ones(np.shape(student_logits)[:-1], bool)
  else:
    valid = lax.stop_gradient(stats.f32(mask)) > 0

  def log_softmax(logits):
    x = jnp.where(valid[..., None], stats.f32(logits), 0.0)
    return jax.nn.log_softmax(x / temperature, axis=-1)

  teacher = lax.stop_gradient(log_softmax(teacher_logits))
  return log_softmax(student_logits), teacher, valid


def _kl(logp: jax.Array, logq: jax.Array) -> jax.Array:
  """KL(P || Q) over the last axis from log-probabilities.

  Entries with P = 0 add exactly 0 (the double `where` keeps their
  gradient 0 too, instead of 0 * inf = NaN).
  """
  p = jnp.exp(logp)
  support = p > 0
  diff = jnp.where(support, logp, 0.0) - jnp.where(support, logq, 0.0)
  return jnp.sum(jnp.where(support, p * diff, 0.0), axis=-1)


def token_forward_kl(
  student_logits: ArrayLike,
  teacher_logits: ArrayLike,
  mask: Optional[ArrayLike] = None,
  *,
  temperature: float = 1.0,
) -> jax.Array:
  """Per-token forward KL(T || S) over the vocabulary (mode-covering).

  The loss of supervised KD (Hinton et al. 2015) and of GKD at beta = 0.

  Args:
    student_logits: [..., V] student logits (differentiated).
    teacher_logits: [..., V] teacher logits, same shape (constant).
    mask: [...] > 0 on tokens that count, or None for all.
    temperature: tau > 0, dividing both logits.

  Returns:
    [...] float32, 0 where the mask is 0.
  """
  logs, logt, valid = _log_probs(
    student_logits, teacher_logits, mask, temperature
  )
  return jnp.where(valid, _kl(logt, logs), 0.0)


def token_reverse_kl(
  student_logits: ArrayLike,
  teacher_logits: ArrayLike,
  mask: Optional[ArrayLike] = None,
  *,
  temperature: float = 1.0,
) -> jax.Array:
  """Per-token reverse KL(S || T) over the vocabulary (mode-seeking).

  The exact per-token divergence whose sampled-token estimate, log S(y_t)
  - log T(y_t), is on-policy distillation's signal
  (`rljax.transforms.opd_advantages`); GKD at beta = 1.

  Args:
    student_logits: [..., V] student logits (differentiated).
    teacher_logits: [..., V] teacher logits, same shape (constant).
    mask: [...] > 0 on tokens that count, or None for all.
    temperature: tau > 0, dividing both logits.

  Returns:
    [...] float32, 0 where the mask is 0 (inf where the student puts mass
    on a token the teacher gives probability 0).
  """
  logs, logt, valid = _log_probs(
    student_logits, teacher_logits, mask, temperature
  )
  return jnp.where(valid, _kl(logs, logt), 0.0)


def generalized_jsd(
  student_logits: ArrayLike,
  teacher_logits: ArrayLike,
  mask: Optional[ArrayLike] = None,
  *,
  beta: float = 0.5,
  temperature: float = 1.0,
) -> jax.Array:
  """GKD's generalized Jensen-Shannon divergence per token, [...] float32.

    M = beta T + (1 - beta) S
    JSD(beta) = beta KL(T || M) + (1 - beta) KL(S || M),   0 < beta < 1
    JSD(0) = KL(T || S) (forward),   JSD(1) = KL(S || T) (reverse)

  The interior is Eq. (1) of the paper with P = T (teacher) and Q = S
  (student); log M = logaddexp(log T + log beta, log S + log(1 - beta)), so
  the mixture is taken over probabilities, in log space. At the two ends
  the formula itself is 0 (M equals one side), so beta = 0 and 1 are
  defined, as in TRL, by the limits lim JSD(beta) / beta = KL(T || S)
  (beta -> 0) and lim JSD(beta) / (1 - beta) = KL(S || T) (beta -> 1).
  Mind the scale: near an end the interior value is about beta KL(T || S)
  (or (1 - beta) KL(S || T)), so beta = 0.01 trains ~100 times more weakly
  than beta = 0; beta = 0.5 is the symmetric JSD (at most log 2).

  `beta` is a Python float (the endpoints are chosen at trace time).

  Args:
    student_logits: [..., V] student logits (differentiated).
    teacher_logits: [..., V] teacher logits, same shape (constant).
    mask: [...] > 0 on tokens that count, or None for all.
    beta: in [0, 1]; the weight of the teacher in the mixture (TRL and the
      paper: 0.5 default; 1 with on-policy data is on-policy reverse KL).
    temperature: tau > 0, dividing both logits (TRL's default 1).

  Returns:
    [...] float32, 0 where the mask is 0.

  Example:
    >>> import numpy as np
    >>> from rljax import losses
    >>> student = np.zeros(2, np.float32)  # S = [1/2, 1/2]
    >>> teacher = np.log(np.array([3.0, 1.0], np.float32))  # T = [3/4, 1/4]
    >>> [round(float(losses.generalized_jsd(student, teacher, beta=b)), 4)
    ...  for b in (0.0, 0.5, 1.0)]
    [0.1308, 0.0338, 0.1438]

  References: Agarwal et al., "On-Policy Distillation of Language Models:
  Learning from Self-Generated Mistakes" (GKD), arXiv 2306.13649, Eq. (1);
  Huszar, arXiv 1511.05101 (the limits); TRL
  `GKDTrainer.generalized_jsd_loss`.

  Checked: against TRL's `generalized_jsd_loss` (trl/experimental/gkd, read
  2026-07): the same mixture (teacher weight beta, log-space logsumexp),
  the same weights of the two KLs, forward KL at beta = 0 and reverse KL at
  beta = 1 (TRL PR #3043 fixed the mixture to the paper's Eq. (1)); tests
  check both ends and the beta -> 0 and beta -> 1 limits of the rescaled
  interior against numpy. Not verified: the equation in the paper's own
  text (only its abstract was reachable; Eq. (1) as quoted by TRL's
  docstring and verl's GKD recipe). ms-swift proposed swapping the two
  weights (continuous at the ends); that is not the paper's Eq. (1) and is
  not offered.
  """
  checks.in_range("beta", beta, 0.0, 1.0)
  logs, logt, valid = _log_probs(
    student_logits, teacher_logits, mask, temperature
  )
  if beta == 0:
    jsd = _kl(logt, logs)
  elif beta == 1:
    jsd = _kl(logs, logt)
  else:
    logm = jnp.logaddexp(logt + math.log(beta), logs + math.log1p(-beta))
    jsd = beta * _kl(logt, logm) + (1.0 - beta) * _kl(logs, logm)
  return jnp.where(valid, jsd, 0.0)


def gkd_loss(
  student_logits_BTV: ArrayLike,
  teacher_logits_BTV: ArrayLike,
  mask_BT: ArrayLike,
  *,
  beta: float = 0.5,
  temperature: float = 1.0,
) -> tuple[jax.Array, dict[str, Mean]]:
  """GKD's per-token loss on one batch of sequences, and its metrics.

  loss_BT = `generalized_jsd`(student, teacher, mask_BT; beta, temperature);
  its `rljax.aggregate.token_mean` under ``mask_BT`` is TRL's
  ``batchmean`` (sum over completion tokens / their number).

  How a run mixes data (GKD's lambda, the student data fraction, TRL
  ``lmbda``): at each step, with probability lambda the batch's completions
  are sampled from the current student (on-policy; no gradient through
  the sampling), otherwise they are the dataset's output sequences (or,
  TRL's ``seq_kd``, sampled from the teacher). Either way both models then
  score the same prompt + completion tokens and this loss compares their
  next-token distributions at every completion position. lambda = 1 with
  beta = 1 is on-policy reverse-KL distillation; lambda = 0 with beta = 0
  is supervised KD. The mixing is a run-level setting (the trainer draws
  the source per step), not part of this function.

  Args:
    student_logits_BTV: [..., T, V] student logits (differentiated).
    teacher_logits_BTV: [..., T, V] teacher logits (constant).
    mask_BT: [..., T] > 0 on completion tokens.
    beta: see `generalized_jsd`.
    temperature: see `generalized_jsd`.

  Returns:
    (loss_BT [..., T] float32, metrics) with `rljax.Mean` metrics
    ``gkd_jsd`` (the token mean of the loss, detached) and
    ``gkd_top1_agreement`` (fraction of tokens where the two models' most
    likely next token is the same).

  References: Agarwal et al., arXiv 2306.13649 (Algorithm 1); TRL
  `GKDTrainer` (``lmbda``, ``beta``, ``seq_kd``).
  """
  if np.ndim(student_logits_BTV) < 2:
    raise ValueError(
      "student_logits_BTV must have rank >= 2 ([..., T, V]); got shape"
      f" {np.shape(student_logits_BTV)}."
    )
  loss = generalized_jsd(
    student_logits_BTV,
    teacher_logits_BTV,
    mask_BT,
    beta=beta,
    temperature=temperature,
  )
  mask = lax.stop_gradient(stats.f32(mask_BT))
  agree = jnp.argmax(student_logits_BTV, -1) == jnp.argmax(
    teacher_logits_BTV, -1
  )
  metrics = {
    "gkd_jsd": mean_metric(lax.stop_gradient(loss), mask),
    "gkd_top1_agreement": mean_metric(agree, mask),
  }
  return loss, metrics
