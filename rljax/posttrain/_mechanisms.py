"""Preference mechanisms that are not a pair loss: pair choice, momentum, data.

The seed preference papers are mostly loops (sample, score, pair, DPO, repeat)
around a standard loss. What is a mechanism on our side lives here, as pure
functions: which samples of a group form the (chosen, rejected) pair (online
DPO, VerIPO, DNO), DNO's win-rate rewards, APO's extrapolated iterate,
CodeDPO's mutual code/test scores, C3PO's scoped objective, and the direct
advantage actor loss. Shapes: P prompts, G samples per prompt, N codes,
M tests, S steps.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax._src import stats


class PairChoice(NamedTuple):
  """One (chosen, rejected) pair per prompt, [P] each.

  Attributes:
    chosen: index in the group of the chosen sample (int32).
    rejected: index of the rejected sample (int32).
    keep: 1.0 where the pair is used, else 0.0 (use it as a weight).
    margin: reward(chosen) - reward(rejected) (0 where not kept).
  """

  chosen: jax.Array
  rejected: jax.Array
  keep: jax.Array
  margin: jax.Array


def best_worst_pairs(
  rewards_PG: ArrayLike,
  valid_PG: ArrayLike | None = None,
  *,
  min_margin: float = 0.0,
) -> PairChoice:
  """Per prompt, the highest- against the lowest-reward valid sample.

  chosen = argmax_g r, rejected = argmin_g r over the valid samples (first
  index on ties). A pair is kept where at least two samples are valid and
  r_chosen - r_rejected >= min_margin and > 0 (a tie expresses no
  preference). This is the pair choice of online/iterative DPO on a reward
  function, of VerIPO (its verifier's scores as rewards) and, with
  `dno_win_rates` and a margin, of DNO. jit-able: no boolean indexing;
  gather the pairs with `jnp.take_along_axis` and weight by ``keep``.

  Args:
    rewards_PG: reward (or score) of each sample, [P, G].
    valid_PG: 1 for samples that may be paired, same shape (default all).
    min_margin: smallest kept margin, >= 0.

  Returns:
    `PairChoice`, every field [P].
  """
  checks.rank("rewards_PG", rewards_PG, 2, "[P, G]")
  checks.group_size("rewards_PG", rewards_PG)
  checks.same_shape(["rewards_PG", "valid_PG"], rewards_PG, valid_PG)
  checks.non_negative(min_margin=min_margin)
  r = stats.f32(rewards_PG)
  valid = jnp.ones_like(r, bool) if valid_PG is None else valid_PG > 0
  chosen = jnp.argmax(jnp.where(valid, r, -jnp.inf), axis=-1)
  rejected = jnp.argmin(jnp.where(valid, r, jnp.inf), axis=-1)
  pick = lambda i: jnp.take_along_axis(r, i[:, None], axis=-1)[:, 0]
  margin = pick(chosen) - pick(rejected)
  enough = jnp.sum(valid, axis=-1) >= 2
  keep = enough & (margin >= min_margin) & (margin > 0)
  return PairChoice(
    chosen.astype(jnp.int32),
    rejected.astype(jnp.int32),
    keep.astype(jnp.float32),
    jnp.where(keep, margin, 0.0),
  )


def dno_win_rates(
  prefs_PGG: ArrayLike, valid_PG: ArrayLike | None = None
) -> jax.Array:
  """DNO's reward: each sample's expected win rate against the others.

  r(x, y_i) = mean_{j != i, valid} P(y_i > y_j | x), with prefs_PGG[p, i, j]
  = P(y_i > y_j) from a preference oracle (a judge). DNO (Algorithm 1)
  defines r_t(x, y) = E_{y' ~ pi_t} P(y > y' | x) and its practical
  version (DNO-Prct) trains DPO on the best- against the worst-scored
  sample of each prompt, keeping only large-margin pairs, with the
  previous iterate as the reference: `best_worst_pairs(dno_win_rates(P),
  min_margin=...)` then `losses.dpo` with ref = pi_t. Samples with no valid
  opponent get 0.

  Checked: from the catalog (SEED_PAPERS 4.19, tagged SEC) and our reading
  of the abstract and secondary reviews (arXiv 2404.03715): "batched
  on-policy", "large-margin preference pairs", "student vs teacher" pairs.
  The margin threshold and the judge's scale are not verified; the paper's
  gold/teacher response is one more sample of the group (data).

  Args:
    prefs_PGG: P(y_i > y_j) in [0, 1], [P, G, G] (the diagonal is ignored).
    valid_PG: 1 for valid samples, [P, G] (default all).

  Returns:
    Win rates, [P, G] float32.
  """
  checks.rank("prefs_PGG", prefs_PGG, 3, "[P, G, G]")
  p, g, g2 = np.shape(prefs_PGG)
  if g != g2:
    raise ValueError(
      f"prefs_PGG must be square in its last two axes; got {(p, g, g2)}."
    )
  checks.same_shape(["valid_PG"], valid_PG)
  if valid_PG is not None:
    checks.leading_shape("valid_PG", valid_PG, (p, g), "prefs_PGG[..., 0]")
  valid = jnp.ones((p, g)) if valid_PG is None else stats.f32(valid_PG)
  opponents = valid[:, None, :] * (1.0 - jnp.eye(g))[None]
  return stats.masked_mean(stats.f32(prefs_PGG), opponents, axis=-1)


def apo_extrapolate(new_params, old_params, alpha: float):
  """APO's Nesterov step on the policy: theta + alpha (theta - theta_old).

  APO views iterative DPO as a proximal-point method: iteration t solves
  DPO with reference pi_hat_t on pairs sampled from pi_hat_t, giving
  pi_{t+1}; then it extrapolates pi_hat_{t+1} proportional to
  pi_{t+1} (pi_{t+1} / pi_t)^alpha, which becomes BOTH the next reference
  and the next sampler. What is extrapolated is the policy iterate, not the
  DPO loss. `apo_extrapolate_logits` is that distribution-space step per
  token; this function is its parameter-space form (exact for a
  log-linear policy, an approximation for a network), applied leaf by leaf
  to any pytree of parameters. alpha = 0 is iterative DPO.

  Checked: arXiv 2410.06293 (He, Yuan, Gu 2024) through its abstract
  ("iterative preference optimization ... as a proximal point method ...
  Nesterov's momentum") and the catalog's [REC] formula; the paper's
  algorithm box, its alpha and whether its experiments extrapolate
  parameters or log-probs were not read (not verified).

  Args:
    new_params: parameters of pi_{t+1} (pytree of arrays).
    old_params: parameters of pi_t, the same structure.
    alpha: momentum, >= 0.

  Returns:
    Parameters of pi_hat_{t+1}, the structure and dtypes of new_params.
  """
  checks.non_negative(alpha=alpha)
  if jax.tree.structure(new_params) != jax.tree.structure(old_params):
    raise ValueError(
      "new_params and old_params must have the same tree structure; got"
      f" {jax.tree.structure(new_params)} and"
      f" {jax.tree.structure(old_params)}."
    )

  def step(new, old):
    if np.shape(new) != np.shape(old):
      raise ValueError(
        f"parameter shapes differ: {np.shape(new)} vs {np.shape(old)}."
      )
    new32 = stats.f32(new)
    return (new32 + alpha * (new32 - stats.f32(old))).astype(
      jnp.asarray(new).dtype
    )

  return jax.tree.map(step, new_params, old_params)


def apo_extrapolate_logits(
  new_logits: ArrayLike, old_logits: ArrayLike, alpha: float
) -> jax.Array:
  """Per-token log pi_hat = log_softmax((1 + alpha) l_new - alpha l_old).

  The distribution-space APO step pi_new (pi_new / pi_old)^alpha,
  normalised per token over the vocabulary (last axis). For a sequence this
  differs from the sequence-level normalisation Z(x) of the paper's
  formula; use it to sample from or score with the extrapolated policy
  without materialising its parameters.

  Returns:
    Log-probabilities, the shape of new_logits, float32.
  """
  checks.non_negative(alpha=alpha)
  checks.same_shape(["new_logits", "old_logits"], new_logits, old_logits)
  mixed = (1.0 + alpha) * stats.f32(new_logits) - alpha * stats.f32(old_logits)
  return jax.nn.log_softmax(mixed, axis=-1)


class CodeTestScores(NamedTuple):
  """CodeDPO self-validation scores.

  Attributes:
    code: score of each code, [..., N] float32.
    test: score of each test, [..., M] float32.
  """

  code: jax.Array
  test: jax.Array


def codedpo_scores(
  passes_NM: ArrayLike, *, damping: float = 0.85, iterations: int = 10
) -> CodeTestScores:
  """CodeDPO's PageRank-style mutual validation of codes and tests.

  With X[n, m] = 1 when code n passes test m, all scores start at 1 and
  each iteration updates both sides from the other's previous scores
  (simultaneously):
    code_n <- (1 - d) code_n + d sum_m X[n, m] test_m
    test_m <- (1 - d) test_m + d sum_n X[n, m] code_n
  A code passed by trusted tests, and a test passed by trusted codes, score
  high. Pairs for DPO: high-score code as chosen, low-score as rejected
  (e.g. `best_worst_pairs` over the code scores). The update is linear in
  the joint vector (code, test), so after each step both are divided by ONE
  common scalar (their joint max): the scores stay bounded and every ratio
  (hence every ranking) equals the unscaled recursion's.

  Checked: arXiv 2410.05605 (Zhang et al., ACL 2025) through its abstract
  and a review quoting "Score_t(c_i) = (1 - d) Score_{t-1}(c_i) + d sum_j
  ..." with all scores initialised to 1 and a fixed number of iterations;
  the rest of that sum (whether the test scores are normalised, the value
  of d) and the test-side update are not verified (catalog [REC]).

  Args:
    passes_NM: pass matrix, [..., N, M] (1 = code n passes test m).
    damping: d in (0, 1].
    iterations: number of updates, >= 1.

  Returns:
    `CodeTestScores`.
  """
  if np.ndim(passes_NM) < 2:
    raise ValueError(
      "passes_NM must have rank >= 2 ([..., N codes, M tests]); got shape"
      f" {np.shape(passes_NM)}."
    )
  if not 0.0 < damping <= 1.0:
    raise ValueError(f"damping must be in (0, 1]; got {damping!r}.")
  if not (isinstance(iterations, int) and iterations >= 1):
    raise ValueError(f"iterations must be an int >= 1; got {iterations!r}.")
  x = stats.f32(passes_NM)
  code = jnp.ones(x.shape[:-1])
  test = jnp.ones(x.shape[:-2] + x.shape[-1:])
  for _ in range(iterations):
    new_code = (1 - damping) * code + damping * jnp.einsum(
      "...nm,...m->...n", x, test
    )
    new_test = (1 - damping) * test + damping * jnp.einsum(
      "...nm,...n->...m", x, code
    )
    top = jnp.maximum(
      jnp.max(new_code, axis=-1, keepdims=True),
      jnp.max(new_test, axis=-1, keepdims=True),
    )
    top = jnp.where(top > 0, top, 1.0)  # d = 1 and no passes: all zero
    code, test = new_code / top, new_test / top
  return CodeTestScores(code, test)


class C3POLoss(NamedTuple):
  """C3PO's scalar objective and its three parts (float32 scalars).

  Attributes:
    loss: dpo + lambda_near sft_near + lambda_out sft_out.
    dpo: mean preference loss over the in-scope examples.
    sft_near: mean NLL over the near-scope examples.
    sft_out: mean NLL over the out-of-scope examples.
  """

  loss: jax.Array
  dpo: jax.Array
  sft_near: jax.Array
  sft_out: jax.Array


def c3po_loss(
  pref_loss_B: ArrayLike,
  nll_B: ArrayLike,
  in_scope_B: ArrayLike,
  near_scope_B: ArrayLike,
  out_scope_B: ArrayLike,
  *,
  lambda_near: float = 1.0,
  lambda_out: float = 1.0,
) -> C3POLoss:
  """C3PO: preference loss in scope, SFT toward the original model outside.

    L = E_in[L_DPO] + lambda_1 E_near[-log pi(y_orig | x)]
        + lambda_2 E_out[-log pi(y_orig | x)]
  where y_orig is the ORIGINAL model's own response to a near- or
  out-of-scope prompt (the constraint that prevents overgeneralising one
  piece of verbal feedback). Each expectation is a mean over the examples
  of its scope in the batch (0 if none). The mechanism is this weighting;
  the rest is data: a strong model turns the feedback into in-scope
  prompts with (revised, original) response pairs and into near- and
  out-of-scope prompts answered by the original model.

  Checked: arXiv 2402.10893 (Stephan et al., ICML 2024) through its
  abstract and project page ("DPO on the generated in-scope data ... SCD
  losses on the out-of-scope and near-scope data, which regularizes model
  behavior towards the original model"); the lambda values (defaults here
  1.0) are not verified.

  Args:
    pref_loss_B: per-example preference loss (e.g. `losses.dpo(...).loss`),
      [B]; ignored where not in scope.
    nll_B: per-example NLL of y_orig (e.g. -`sequence_logp(...,
      average=True)`), [B]; ignored where not near/out of scope.
    in_scope_B, near_scope_B, out_scope_B: 0/1 masks, [B].
    lambda_near: lambda_1, >= 0.
    lambda_out: lambda_2, >= 0.

  Returns:
    `C3POLoss`.
  """
  names = ["pref_loss_B", "nll_B", "in_scope_B", "near_scope_B"]
  checks.same_shape(
    names + ["out_scope_B"],
    pref_loss_B,
    nll_B,
    in_scope_B,
    near_scope_B,
    out_scope_B,
  )
  checks.non_negative(lambda_near=lambda_near, lambda_out=lambda_out)
  dpo = stats.masked_mean(pref_loss_B, in_scope_B)
  near = stats.masked_mean(nll_B, near_scope_B)
  out = stats.masked_mean(nll_B, out_scope_B)
  return C3POLoss(dpo + lambda_near * near + lambda_out * out, dpo, near, out)


def step_advantages(values_BS: ArrayLike, mask_BS: ArrayLike) -> jax.Array:
  """A_k = V(s_{k+1}) - V(s_k) for the steps of a reasoning trace.

  values_BS[..., k] is the step critic's value of the state BEFORE step k;
  the value after the last valid step is the value at the next index (put
  the outcome reward there, e.g. V = 1 for a correct final answer). So for
  S steps pass S + 1 values; the mask marks the S valid steps. Masked steps
  get 0.

  Args:
    values_BS: critic values, [..., S + 1].
    mask_BS: 1 on valid steps, [..., S].

  Returns:
    Step advantages, [..., S] float32.
  """
  v = stats.f32(values_BS)
  if np.shape(v)[:-1] != np.shape(mask_BS)[:-1] or (
    np.shape(v)[-1] != np.shape(mask_BS)[-1] + 1
  ):
    raise ValueError(
      "values_BS must be [..., S + 1] (one value per state, the final one"
      f" after the last step) for mask_BS [..., S]; got {np.shape(v)} and"
      f" {np.shape(mask_BS)}."
    )
  return (v[..., 1:] - v[..., :-1]) * stats.f32(mask_BS)


def direct_advantage_loss(
  logp_BS: ArrayLike,
  ref_logp_BS: ArrayLike,
  adv_BS: ArrayLike,
  mask_BS: ArrayLike,
  *,
  beta: float = 0.1,
) -> jax.Array:
  """Direct Advantage Policy Optimization's step-level actor loss.

    L_k = (log pi(a_k | s_k) - log pi_ref(a_k | s_k) - A(s_k, a_k) / beta)^2
  per step k (a_k = the step's tokens, log-probs summed over them), masked.
  The minimiser is log pi / pi_ref = A / beta, the KL-regularised optimum
  pi* ~ pi_ref exp(A / beta) up to its normaliser (which the regression
  drops). Advantages come from a separately trained step critic
  (`step_advantages`) and are constants; the reference is constant.
  Reduce with a masked mean over steps.

  Checked: arXiv 2412.18279 (Liu et al. 2024, "DAPO", not ByteDance's)
  through its abstract and a summary ("a quadratic loss that aligns scaled
  advantages with log-policy ratios", actor and critic trained
  separately); the exact scaling (A / beta vs beta-scaled ratios), any
  per-state normaliser and the default beta are not verified.

  Args:
    logp_BS: policy log-prob of each step, [..., S].
    ref_logp_BS: reference log-prob of each step, [..., S].
    adv_BS: step advantages, [..., S].
    mask_BS: 1 on valid steps, [..., S].
    beta: KL strength, > 0.

  Returns:
    Per-step loss, [..., S] float32 (0 on masked steps).
  """
  checks.positive(beta=beta)
  names = ["logp_BS", "ref_logp_BS", "adv_BS", "mask_BS"]
  checks.same_shape(names, logp_BS, ref_logp_BS, adv_BS, mask_BS)
  sg = jax.lax.stop_gradient
  ratio = stats.f32(logp_BS) - sg(stats.f32(ref_logp_BS))
  err = ratio - sg(stats.f32(adv_BS)) / beta
  return jnp.square(err) * sg(stats.f32(mask_BS))
