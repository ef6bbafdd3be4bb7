"""Answer-cluster variants over [..., G] groups: the answer-distribution
entropy, COPO, the polychromic set-level advantage and SEED-GRPO.

Conventions and the answer cluster ids ``answer_ids_PG`` as in
`rljax.advantages._variants`, whose helpers this module shares.
"""

from collections.abc import Callable
import itertools
import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax._src import stats
from rljax.advantages import _group
from rljax.advantages._variants import _masked_max
from rljax.advantages._variants import _same
from rljax.advantages._variants import _valid

# ---------------------------------------------------------------------------
# Answer cluster ids.
# ---------------------------------------------------------------------------


def _check_ids(name: str, ids: ArrayLike) -> jax.Array:
  ids = jnp.asarray(ids)
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise ValueError(
      f"{name} must hold integer answer cluster ids; got dtype {ids.dtype}."
      " Build them with rljax.rewards.cluster_answers (a negative id means"
      " 'no answer')."
    )
  return ids


def _same_cluster(ids: jax.Array, valid: jax.Array) -> jax.Array:
  """[..., G, G] 1.0 where j is a valid sample in the cluster of i."""
  g = ids.shape[-1]
  same = (ids[..., :, None] == ids[..., None, :]) & (ids[..., :, None] >= 0)
  same = same | jnp.broadcast_to(jnp.eye(g, dtype=bool), same.shape)
  return stats.f32(same) * valid[..., None, :]


# ---------------------------------------------------------------------------
# Answer-distribution entropies (COPO 1.105, SEED-GRPO 2.31).
# ---------------------------------------------------------------------------


def answer_entropy(
  answer_ids_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  weights_PG: Optional[ArrayLike] = None,
  base: float = math.e,
  estimator: str = "plugin",
) -> jax.Array:
  """Entropy of the answer-cluster distribution of each group, [...].

  p(C) = sum_{i in C} w_i / sum_i w_i over the valid samples (w = 1 by
  default: empirical frequencies). ``estimator``:

  * "plugin": H = -sum_C p(C) log p(C)  (COPO; <= log n);
  * "mean_log": SE = -(1/K) sum_C log p(C), K = number of clusters
    (SEED-GRPO's Monte-Carlo estimate of semantic entropy).

  Groups without a valid sample get 0.
  """
  checks.one_of("estimator", estimator, ("plugin", "mean_log"))
  checks.positive(base=base)
  ids = _check_ids("answer_ids_PG", answer_ids_PG)
  checks.group_size("answer_ids_PG", ids, 1)
  valid = _valid("answer_ids_PG", ids, sample_mask_PG)
  w = valid
  if weights_PG is not None:
    _same("answer_ids_PG", ids, weights_PG)
    w = valid * jnp.where(valid > 0, stats.f32(weights_PG), 0.0)
  same = _same_cluster(ids, valid)
  mass = jnp.sum(same * w[..., None, :], -1)  # cluster mass of i's cluster
  p = stats.safe_div(mass, jnp.sum(w, -1, keepdims=True))
  log_p = jnp.log(jnp.where(p > 0, p, 1.0))
  # Each cluster once: weight 1/count_i spreads one unit over its members.
  count = jnp.sum(same, -1)
  per_cluster = valid * stats.safe_div(1.0, count)
  if estimator == "plugin":
    h = -jnp.sum(per_cluster * p * log_p, -1)
  else:
    k = jnp.sum(per_cluster, -1)
    h = -stats.safe_div(jnp.sum(per_cluster * log_p, -1), k)
  return h / math.log(base)


# ---------------------------------------------------------------------------
# 1.105 COPO.
# ---------------------------------------------------------------------------


def copo_global_advantages(
  rewards_PG: ArrayLike,
  answer_ids_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array]:
  """COPO's consistency-aware global advantage, and the answer entropy.

    H_q = entropy (base 2) of the answer distribution of group q,
    lambda_q = (1 - 1/n_q) / log2 n_q,  n_q valid samples,
    R^glob_q = mean_q(R) * (1 - lambda_q H_q),
    A^glob_i = (R^glob_q(i) - mean R^glob) / (std R^glob + eps),

  the batch mean and unbiased std taken over every valid sample of groups
  with n_q >= 2 (each response counts once, as in the verl code, so a
  group weighs by its size). A group where every answer agrees keeps its
  whole mean reward (H = 0); fully scattered answers keep 1/n of it.

  Args:
    rewards_PG: [..., G] rewards (the global reward is meant for 0/1).
    answer_ids_PG: [..., G] int answer cluster ids.
    sample_mask_PG: [..., G] validity (default: all valid).
    eps: added to the batch std (>= 0).

  Returns:
    (A^glob [..., G] float32, 0 for invalid samples and groups with n < 2;
    H [...] float32 in bits).

  References:
    Han et al. 2025, COPO: Consistency-Aware Policy Optimization, arXiv
    2508.04138; code hijih/copo-code `compute_score_global`.
    Checked: the catalog's reading of the official code (not re-read here:
    no snapshot was reachable) and the paper's abstract; batch statistics
    over responses is our reading of "batch z-score".
  """
  checks.non_negative(eps=eps)
  _same("rewards_PG", rewards_PG, answer_ids_PG)
  r, valid = _group._prepare(rewards_PG, sample_mask_PG)
  h = answer_entropy(answer_ids_PG, valid, base=2.0)
  n = jnp.sum(valid, -1)
  log2n = jnp.log2(jnp.maximum(n, 2.0))
  lam = (1.0 - stats.safe_div(1.0, n)) / log2n
  mean_r = stats.masked_mean(r, valid, axis=-1)
  r_glob = mean_r * (1.0 - lam * h)
  scored = stats.f32(_group._scorable(valid, n[..., None]))
  r_glob_pg = jnp.broadcast_to(r_glob[..., None], r.shape)
  mu = stats.masked_mean(r_glob_pg, scored)
  sd = stats.masked_std(r_glob_pg, scored)
  adv = stats.safe_div(r_glob_pg - mu, sd + eps)
  return jnp.where(scored > 0, adv, 0.0), h


def copo_weights(
  entropy_P: ArrayLike, *, k: float = 1.0, b: float = 0.5
) -> jax.Array:
  """COPO's blend weight of the LOCAL loss, w_q = sigmoid(k (H_q - b)).

  Diverse answers (high entropy) favour the local GRPO advantage; a
  consistent group (H near 0) leans on the global one. Defaults k = 1,
  b = 0.5 (hijih/copo-code, per the catalog).
  """
  checks.positive(k=k)
  return jax.nn.sigmoid(k * (stats.f32(entropy_P) - b))


# ---------------------------------------------------------------------------
# 2.26 Polychromic set-level advantage.
# ---------------------------------------------------------------------------

_MAX_SETS = 200_000


def _subsets(g: int, n: int) -> np.ndarray:
  count = math.comb(g, n)
  if count > _MAX_SETS:
    raise ValueError(
      f"set_size={n} with G={g} gives {count} subsets (more than"
      f" {_MAX_SETS}); use a smaller set_size."
    )
  return np.asarray(list(itertools.combinations(range(g), n)), np.int32)


def distinct_fraction(ids_PSN: jax.Array) -> jax.Array:
  """Number of distinct answers in each set / set size, [..., S].

  A negative id (no answer) is distinct from everything, itself included.
  """
  n = ids_PSN.shape[-1]
  same = ids_PSN[..., :, None] == ids_PSN[..., None, :]
  same = same & (ids_PSN[..., :, None] >= 0)
  earlier = jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool), k=-1), same.shape)
  repeated = jnp.any(same & earlier, axis=-1)
  return jnp.sum(~repeated, axis=-1) / n


def polychromic(
  rewards_PG: ArrayLike,
  answer_ids_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  set_size: int = 4,
  diversity: Callable[[jax.Array], jax.Array] = distinct_fraction,
) -> jax.Array:
  """Polychromic set-level advantage over all size-n subsets of the group.

    f(S) = mean_{i in S} R_i * d(S),   d(S) = diversity of the answers in S,
    A(tau) = mean_{S contains tau} f(S) - mean_S f(S),

  the means over every subset of ``set_size`` valid samples of the group
  (exact enumeration; subsets with an invalid sample are left out). A failed
  but novel answer can get A > 0 when it makes sets more diverse.

  Args:
    rewards_PG: [..., G] rewards.
    answer_ids_PG: [..., G] int answer cluster ids.
    sample_mask_PG: [..., G] validity (default: all valid).
    set_size: n, 2 <= n <= G. Default 4 (the paper's n = 4 sets, per the
      catalog; not verified).
    diversity: maps ids [..., S, n] to d(S) [..., S]; default the fraction
      of distinct answers.

  Returns:
    [..., G] float32; 0 for invalid samples and groups with fewer than n
    valid samples.

  References:
    Hamid et al. 2025, Polychromic Objectives for Reinforcement Learning,
    arXiv 2509.25424. Checked: abstract and author's visualisation page
    (marginal set advantage = expected score of sets containing y minus the
    mean score of all sets); f = mean reward x diversity per the catalog
    [REC]. Vine sampling is rollout structure (not here).
  """
  ids = _check_ids("answer_ids_PG", answer_ids_PG)
  _same("rewards_PG", rewards_PG, ids)
  g = np.shape(rewards_PG)[-1] if np.ndim(rewards_PG) else 0
  if not 2 <= set_size <= g:
    raise ValueError(
      f"set_size must be in [2, G] with G = {g} samples per group; got"
      f" {set_size!r}."
    )
  r, valid = _group._prepare(rewards_PG, sample_mask_PG)
  idx = _subsets(g, set_size)  # [S, n]
  member = np.zeros((idx.shape[0], g), np.float32)
  np.put_along_axis(member, idx, 1.0, axis=1)
  set_ok = jnp.prod(valid[..., idx], axis=-1)  # [..., S]
  f = jnp.mean(r[..., idx], axis=-1) * diversity(ids[..., idx])
  f = f * set_ok
  member = jnp.asarray(member)
  mean_all = stats.safe_div(jnp.sum(f, -1), jnp.sum(set_ok, -1))[..., None]
  with_i = jnp.einsum("...s,sg->...g", f, member)
  count_i = jnp.einsum("...s,sg->...g", set_ok, member)
  adv = stats.safe_div(with_i, count_i) - mean_all
  return jnp.where((count_i > 0) & (valid > 0), adv, 0.0)


# ---------------------------------------------------------------------------
# 2.31 SEED-GRPO.
# ---------------------------------------------------------------------------

_SEED_F = {
  "linear": lambda x, gamma: jnp.maximum(1.0 - x, 0.0),
  "exponential": lambda x, gamma: jnp.exp(-x),
  "focal": lambda x, gamma: jnp.maximum(1.0 - x, 0.0) ** gamma,
}


def seed_grpo(
  adv_PG: ArrayLike,
  answer_ids_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  logp_PG: Optional[ArrayLike] = None,
  alpha: float = 1.0,
  f: str = "linear",
  gamma: float = 2.0,
) -> jax.Array:
  """SEED-GRPO: advantages scaled down by the prompt's semantic entropy.

    p(C) = sum_{i in C} pi_old(o_i) / sum_i pi_old(o_i)   (softmax of logp
      over the valid samples; uniform when ``logp_PG`` is None),
    SE(q) = -(1/K) sum_C log p(C),   SE_max = log n  (n valid samples),
    A'_i = A_i * f(alpha SE(q) / SE_max),
    f: linear 1 - x, exponential e^-x, focal (1 - x)^gamma, floored at 0.

  Args:
    adv_PG: [..., G] advantages (the paper: A_i = r_i - mean r).
    answer_ids_PG: [..., G] int answer cluster ids.
    sample_mask_PG: [..., G] validity (default: all valid).
    logp_PG: [..., G] log pi_old of each completion (sequence log-prob);
      None weighs every sample equally (discrete semantic entropy).
    alpha: sensitivity (>= 0). Default 1.0 (a choice).
    f: "linear" (default), "exponential" or "focal".
    gamma: focal exponent (> 0).

  Returns:
    [..., G] float32; 0 for invalid samples.

  References:
    Chen et al. 2025, SEED-GRPO, arXiv 2505.12346, Sec. 3 (SE estimate and
    the modulated advantage). Checked: the SE estimator, p(C) as the
    pi_old mass of a cluster and A' = A f(alpha SE/SE_max) against a
    review of the paper; the exact f family, alpha default and SE_max
    (taken as log n, the entropy of n singleton clusters) were not
    verified. With uneven pi_old mass SE can exceed log n; x is not
    clipped, f is floored at 0.
  """
  checks.non_negative(alpha=alpha)
  checks.positive(gamma=gamma)
  checks.one_of("f", f, tuple(_SEED_F))
  _same("adv_PG", adv_PG, answer_ids_PG)
  valid = _valid("adv_PG", adv_PG, sample_mask_PG)
  weights = None
  if logp_PG is not None:
    _same("adv_PG", adv_PG, logp_PG)
    logp = jnp.where(valid > 0, stats.f32(logp_PG), -jnp.inf)
    top = jax.lax.stop_gradient(_masked_max(logp, valid))
    weights = jnp.where(valid > 0, jnp.exp(logp - top), 0.0)
  se = answer_entropy(
    answer_ids_PG, valid, weights_PG=weights, estimator="mean_log"
  )
  n = jnp.sum(valid, -1)
  se_max = jnp.log(jnp.maximum(n, 1.0))
  x = alpha * stats.safe_div(se, se_max)
  scale = _SEED_F[f](x, gamma)[..., None]
  return jnp.where(valid > 0, stats.f32(adv_PG) * scale, 0.0)
