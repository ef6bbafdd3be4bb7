"""TreePO's tree advantage: group-relative terms over ancestor subtrees.

TreePO (Li et al., 2025, arXiv 2508.17445; official code
multimodal-art-projection/TreePO) samples each prompt's responses as a tree of
fixed-length segments; the leaves are the complete responses. The sampler
hands the tree to the batch as ``Batch.extra["tree_PG"]``, int32 [P, G, D]:
``tree_PG[p, g, d]`` is the id (unique within prompt p and depth d) of leaf
g's ancestor node at depth d + 1, -1 once the leaf has ended.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare
from rljax.transforms._advantages import _need_group
from rljax.transforms._advantages import _per_token
from rljax.transforms._advantages import sequence_rewards
from rljax.transforms._segments import _tree_validity

_WEIGHTINGS = ("average", "group_size")
_NORMALIZE = ("batch", "subtree", "none")


def _check_tree(rewards_PG: ArrayLike, tree_PGD: ArrayLike) -> None:
  checks.rank("tree_PGD", tree_PGD, np.ndim(rewards_PG) + 1, "[P, G, D]")
  checks.leading_shape("tree_PGD", tree_PGD, np.shape(rewards_PG), "rewards_PG")
  if not jnp.issubdtype(jnp.result_type(tree_PGD), jnp.integer):
    raise ValueError(
      "tree_PGD must hold integer node ids (-1 where a leaf has ended), got"
      f" dtype {jnp.result_type(tree_PGD)}; pass the sampler's int32 tree."
    )


def _subtree_terms(
  r: jax.Array, valid: jax.Array, tree: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Per leaf and subtree level (root first): R_i - mean, std, size, member.

  Each is [P, G, 1 + D]; column 0 is the root (the whole valid group).
  """
  root = jnp.zeros(tree.shape[:-1] + (1,), tree.dtype)
  ids = jnp.concatenate([root, tree], axis=-1)  # [P, G, 1 + D]
  inside = (ids >= 0) & (valid[..., None] > 0)  # leaf i is in a subtree
  # same[p, i, j, d]: leaves i and j (j valid) share the subtree at level d.
  same = (ids[:, :, None, :] == ids[:, None, :, :]) & inside[:, None, :, :]
  same = stats.f32(same & inside[:, :, None, :])
  n = jnp.sum(same, axis=2)  # [P, G, 1 + D]
  # mean - R_i as a mean of differences: exactly 0 for a constant subtree.
  diff = r[:, None, :, None] - r[:, :, None, None]  # R_j - R_i
  shift = stats.safe_div(jnp.sum(same * diff, axis=2), n)
  sq = jnp.square(diff - shift[:, :, None, :])
  var = stats.safe_div(jnp.sum(same * sq, axis=2), n - 1.0)
  return -shift, stats.safe_sqrt(var), n, stats.f32(inside)


def treepo_advantages_of(
  rewards_PG: ArrayLike,
  tree_PGD: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  weighting: str = "average",
  normalize: str = "batch",
  skip_constant_subtrees: bool = False,
  max_depth: Optional[int] = None,
  lengths_PG: Optional[ArrayLike] = None,
  eps: Optional[float] = None,
) -> jax.Array:
  """TreePO's tree-based advantage of each leaf (arXiv 2508.17445).

  For leaf i let G_0(i) be all valid leaves of its prompt (the root q) and
  G_j(i), j = 1..d_i, the valid leaves under its ancestor at depth j:

    a_i = sum_{j in S_i} w_j (R_i - mean R_{G_j(i)}) / sum_{j in S_i} w_j

  S_i holds the root and every deeper subtree with at least 2 valid leaves
  (a subtree of one leaf compares nothing); ``weighting="average"`` takes
  w_j = 1 (the paper's Fig. 3: "averagely aggregated sub-group advantages",
  and the official run), ``"group_size"`` w_j = |G_j(i)| (the code's
  function default). Then ``normalize``:

  * ``"batch"`` (the official `tree_reinforce_plus_plus_baseline`):
    A_i = (a_i - mu) / sqrt(var + eps), mu and unbiased var over the valid
    leaves of the whole batch, each weighted by ``lengths_PG`` (its token
    count: verl's `masked_whiten` over tokens; default 1 each). eps 1e-8.
  * ``"subtree"`` (the catalog's reading, GRPO per subtree): each term is
    divided by std R_{G_j(i)} + eps (unbiased; eps 1e-6) before averaging.
  * ``"none"``: A_i = a_i.

  What was checked: the official code (`compute_tree_reinforce_plus_plus_
  baseline_outcome_advantage` in verl/trainer/ppo/core_algos.py and
  recipe/treepo/run_treepo_train.sh): subgroups are the path prefixes of each
  leaf (root always counted, deeper singletons skipped), the mean of each
  subgroup is subtracted with no per-subgroup std, the terms are averaged
  ("average" in the run), and the result is whitened over every response
  token of the batch; `subtree_std_ds` (here ``skip_constant_subtrees``,
  off in the run) drops deeper subgroups whose rewards are all equal. The
  paper's equation itself could not be read (only its abstract and the
  Fig. 3 caption, through third-party pages), so the per-subtree sigma of
  the catalog is kept as the option ``"subtree"``, not the default.

  Leaves that ended early (-1 from some depth on) belong to no deeper subtree
  and average over fewer terms. Differences from the code: a prompt with
  fewer than 2 valid leaves gets 0 and stays out of the batch statistics
  (the code uses mean 0 there, A = R), as in `advantages.reinforce_pp_baseline`.
  With no shared subtree (D = 0 or all ids -1) "subtree" is
  `advantages.grpo`, "none" `advantages.dr_grpo` and "batch" (token
  lengths) `advantages.reinforce_pp_baseline`.

  Args:
    rewards_PG: [P, G] leaf rewards.
    tree_PGD: [P, G, D] integer ancestor ids, -1 below a leaf's end.
    sample_mask_PG: [P, G] validity (default: all valid); invalid leaves get
      0 and count in no statistic.
    weighting: "average" or "group_size".
    normalize: "batch", "subtree" or "none".
    skip_constant_subtrees: leave out subtrees below the root whose rewards
      are all equal (the code's `subtree_std_ds`).
    max_depth: use only the first ``max_depth`` levels (the code's
      `tree_subgroup_opt`); default all D.
    lengths_PG: [P, G] weights of the batch whitening (token counts).
    eps: added to the variance ("batch", 1e-8) or the std ("subtree", 1e-6).

  Returns:
    [P, G] float32 advantages, 0 for invalid leaves and for prompts with
    fewer than 2 valid leaves.
  """
  tree, eps = _treepo_options(
    rewards_PG, tree_PGD, weighting, normalize, max_depth, eps
  )
  valid = _tree_validity(rewards_PG, sample_mask_PG)
  r = jnp.where(valid > 0, stats.f32(rewards_PG), 0.0)
  adv, counted = _subtree_average(
    r,
    valid,
    tree,
    weighting=weighting,
    per_subtree_std=normalize == "subtree",
    skip_constant_subtrees=skip_constant_subtrees,
    eps=eps,
  )
  scored = valid * counted[..., 0]  # a valid leaf of a group of >= 2
  if normalize == "batch":
    adv = _batch_whiten(adv, scored, rewards_PG, lengths_PG, eps)
  return jnp.where(scored > 0, adv, 0.0)


def _treepo_options(rewards_PG, tree_PGD, weighting, normalize, max_depth, eps):
  """Check `treepo_advantages_of`'s options; (the tree cut to `max_depth`
  levels, eps with its default for `normalize`)."""
  checks.one_of("weighting", weighting, _WEIGHTINGS)
  checks.one_of("normalize", normalize, _NORMALIZE)
  checks.rank("rewards_PG", rewards_PG, 2, "[P, G]")
  checks.group_size("rewards_PG", rewards_PG)
  _check_tree(rewards_PG, tree_PGD)
  tree = jnp.asarray(tree_PGD)
  if max_depth is not None:
    checks.non_negative(max_depth=max_depth)
    tree = tree[..., :max_depth]
  if eps is None:
    eps = 1e-8 if normalize == "batch" else 1e-6
  checks.non_negative(eps=eps)
  return tree, eps


def _subtree_average(
  r,
  valid,
  tree,
  *,
  weighting: str,
  per_subtree_std: bool,
  skip_constant_subtrees: bool,
  eps: float,
) -> tuple[jax.Array, jax.Array]:
  """(a [P, G], counted [P, G, 1 + D]): the weighted mean of each leaf's
  subtree terms over the subtrees it counts in."""
  term, std, n, inside = _subtree_terms(r, valid, tree)
  counted = inside * stats.f32(n >= 2)
  if skip_constant_subtrees:  # never the root: the code always keeps it
    deeper = (jnp.arange(n.shape[-1]) > 0)[None, None, :]
    counted = counted * stats.f32(~(deeper & (std <= 0)))
  if per_subtree_std:
    term = stats.safe_div(term, std + eps)
  w = counted * (n if weighting == "group_size" else 1.0)
  return stats.safe_div(jnp.sum(w * term, -1), jnp.sum(w, -1)), counted


def _batch_whiten(adv, scored, rewards_PG, lengths_PG, eps: float):
  """(a - mu) / sqrt(var + eps) over the scored leaves, length-weighted."""
  weight = scored
  if lengths_PG is not None:
    checks.same_shape(["rewards_PG", "lengths_PG"], rewards_PG, lengths_PG)
    weight = weight * stats.f32(lengths_PG)
  mean = stats.masked_mean(adv, weight)
  var = stats.masked_var(adv, weight)
  return (adv - mean) * jax.lax.rsqrt(var + eps)


def treepo_advantages(
  *,
  tree: str = "tree_PG",
  weighting: str = "average",
  normalize: str = "batch",
  skip_constant_subtrees: bool = False,
  max_depth: Optional[int] = None,
  eps: Optional[float] = None,
) -> Transform:
  """TreePO (arXiv 2508.17445): `treepo_advantages_of` on the batch.

  Reads the sequence rewards and the sampler's tree ``Batch.extra[tree]``
  ([P, G, D] ancestor ids; a [P, G] array is one level), writes
  ``advantages_PGT`` (A_i on every
  completion token). With ``normalize="batch"`` (the official code) the
  whitening weighs each leaf by its completion-token count, i.e. verl's
  `masked_whiten` over all tokens of the batch.
  """
  checks.one_of("weighting", weighting, _WEIGHTINGS)
  checks.one_of("normalize", normalize, _NORMALIZE)

  def fn(batch: Batch) -> Batch:
    _need_group(batch, "treepo_advantages")
    tree_PGD = jnp.asarray(batch.get(tree, by="treepo_advantages"))
    if tree_PGD.ndim == 2:  # [P, G]: one level of subtrees
      tree_PGD = tree_PGD[..., None]
    lengths = stats.sequence_lengths(batch.loss_mask())
    adv = treepo_advantages_of(
      sequence_rewards(batch),
      tree_PGD,
      batch.samples(),
      weighting=weighting,
      normalize=normalize,
      skip_constant_subtrees=skip_constant_subtrees,
      max_depth=max_depth,
      lengths_PG=lengths if normalize == "batch" else None,
      eps=eps,
    )
    return _per_token(batch, adv)

  return stateless_prepare(fn)
