"""SPO's segment advantages: SPO-chain's Monte Carlo values at cutpoints
and SPO-tree's values from a tree of segments.

Segment Policy Optimization (Guo et al., 2025, arXiv 2505.23564; official
code AIFrameResearch/SPO) cuts each response into segments at its
low-probability tokens and estimates the value of the state before each
segment by Monte Carlo (`rljax.rollouts.SegmentRollouts` samples the
continuations). The sampler hands three [P, G, T] arrays to the batch:

* ``extra["spo_cuts_PGT"]``: 1 where a segment starts, i.e. token t is a
  cutpoint and the state s = (prompt, y_<t) was valued;
* ``extra["spo_values_PGT"]``: V(s) there (the mean reward of the
  continuations sampled from s), 0 elsewhere;
* ``extra["spo_low_prob_PGT"]``: 1 where pi(y_t) < rho (the probability
  mask).

SPO-tree (`rljax.rollouts.SegmentTree`) samples each prompt's responses as
the leaves of a tree of fixed-length segments and values every node by its
subtree (`spo_tree_values_of`, `spo_tree_advantages`); it hands the batch
``extra["tree_PG"]`` (each leaf's ancestor ids), ``extra["spo_depth_PGT"]``
(the level of the node that generated each token) and the probability mask.
"""

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare
from rljax.transforms._advantages import sequence_rewards

_NORMALIZE = ("batch", "none")


def spo_chain_advantages_of(
  rewards_PG: ArrayLike,
  cuts_PGT: ArrayLike,
  values_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  low_prob_PGT: ArrayLike | None = None,
  *,
  normalize: str = "batch",
  eps: float = 1e-8,
) -> jax.Array:
  """SPO-chain's token advantages (arXiv 2505.23564, chain-based estimate).

  Let b_1 < ... < b_K be the cutpoints of a response y (tokens where
  ``cuts_PGT`` is 1, inside ``mask_PGT``), V_k the Monte Carlo value of the
  state before token b_k and V_{K+1} = R its reward (the value of the
  finished response). Segment k is the tokens b_k .. b_{k+1} - 1 and

    A_k = V_{k+1} - V_k                        (chain-based advantage)
    A_t = A_k * M_t  for t in segment k,  M_t = 1[pi(y_t) < rho]

  (the probability mask: ``low_prob_PGT`` M_t; None: every token of the
  segment, the paper's ablation without it). Tokens before b_1 get 0: they
  are all above rho (b_1 is the first low-probability token), so the mask
  removes them anyway; a response whose first token is below rho has
  b_1 = 0 and V_1 = V(prompt), the paper's V(s_0). ``normalize="batch"``
  then whitens the advantages over the masked tokens of the whole batch
  (mean and unbiased variance, ``(A - mu) / sqrt(var + eps)``; over every
  token when no token is masked in), as the official PPO trainer does
  (`whiten_advantages` with the probability mask); ``"none"`` keeps A.

  Checked against the official code (src/treetune/episode_generators/
  math_episode_generator_with_mc_advantages.py `_compute_token_advantages`
  and `_create_value_estimation_requests`, src/treetune/trainers/
  ppo_trainer.py, configs/polIter_rho1bSft2_spo_chain_*.jsonnet): cutpoints
  are the states before tokens with p < 0.9, every `cutpoint_interval`-th
  of them (5 in the released runs), a cut's value is the mean reward of its
  9 continuations (truncated ones score the unfinished penalty 0), the
  segment ending at a cut gets the value difference and the last segment
  R - V_K, tokens with p > 0.9 get advantage 0 and leave the loss. Only
  the abstract, third-party summaries and the Fig. 1 caption of the paper
  could be read here ("assigns the corresponding segment advantages
  specifically to the cutpoints instead of all tokens within a segment"),
  which agree with the code; the paper's own equations were not read.

  Args:
    rewards_PG: [P, G] sequence rewards R.
    cuts_PGT: [P, G, T] 1 where a segment starts.
    values_PGT: [P, G, T] V(s) at the cutpoints (read only there).
    mask_PGT: [P, G, T] completion tokens (0 for padding and invalid
      samples).
    low_prob_PGT: [P, G, T] the probability mask M_t, or None.
    normalize: "batch" or "none".
    eps: added to the variance of the whitening.

  Returns:
    [P, G, T] float32 advantages, 0 outside ``mask_PGT * low_prob_PGT``.
  """
  checks.one_of("normalize", normalize, _NORMALIZE)
  checks.non_negative(eps=eps)
  checks.rank("rewards_PG", rewards_PG, 2, "[P, G]")
  checks.rank("mask_PGT", mask_PGT, 3, "[P, G, T]")
  checks.leading_shape("mask_PGT", mask_PGT, np.shape(rewards_PG), "rewards_PG")
  names = ["mask_PGT", "cuts_PGT", "values_PGT"]
  arrays = [mask_PGT, cuts_PGT, values_PGT]
  if low_prob_PGT is not None:
    names.append("low_prob_PGT")
    arrays.append(low_prob_PGT)
  checks.same_shape(names, *arrays)
  mask = stats.f32(mask_PGT) > 0
  adv = _segment_differences(
    stats.f32(rewards_PG), (jnp.asarray(cuts_PGT) > 0) & mask, values_PGT
  )
  keep = mask
  if low_prob_PGT is not None:
    keep = keep & (jnp.asarray(low_prob_PGT) > 0)
  adv = jnp.where(keep, adv, 0.0)
  if normalize == "batch":
    # Statistics over the kept tokens; the code falls back to every token.
    weight = jnp.where(jnp.any(keep), keep, mask)
    adv = _whiten(adv, keep, weight, eps)
  return adv


def _whiten(adv, keep, weight, eps: float) -> jax.Array:
  """(A - mu) / sqrt(var + eps) on the kept tokens (mu and unbiased var
  weighted by `weight`), 0 elsewhere."""
  mean = stats.masked_mean(adv, weight)
  var = stats.masked_var(adv, weight)
  return jnp.where(keep, (adv - mean) * jax.lax.rsqrt(var + eps), 0.0)


def _segment_differences(r_PG, cuts_PGT, values_PGT) -> jax.Array:
  """[P, G, T] V(next cut, or R at the end) - V(this segment's cut); 0
  before the first cut."""
  t = cuts_PGT.shape[-1]
  pos = jnp.arange(t, dtype=jnp.int32)
  values = stats.f32(values_PGT)
  # The latest cut at or before t (-1: none yet).
  start = jax.lax.cummax(jnp.where(cuts_PGT, pos, -1), axis=2)
  # The earliest cut strictly after t (t: none, the response's end).
  after = jax.lax.cummin(jnp.where(cuts_PGT, pos, t), axis=2, reverse=True)
  after = jnp.concatenate(
    [after[..., 1:], jnp.full_like(after[..., :1], t)], -1
  )
  v_start = jnp.take_along_axis(values, jnp.maximum(start, 0), axis=2)
  v_next = jnp.take_along_axis(values, jnp.minimum(after, t - 1), axis=2)
  v_next = jnp.where(after < t, v_next, r_PG[..., None])
  return jnp.where(start >= 0, v_next - v_start, 0.0)


def spo_chain_advantages(
  *,
  cuts: str = "spo_cuts_PGT",
  values: str = "spo_values_PGT",
  low_prob: str = "spo_low_prob_PGT",
  probability_mask: bool = True,
  normalize: str = "batch",
  eps: float = 1e-8,
) -> Transform:
  """SPO-chain (arXiv 2505.23564): `spo_chain_advantages_of` on the batch.

  Reads the sequence rewards and the sampler's ``Batch.extra`` arrays
  (`rljax.rollouts.SegmentRollouts`), writes ``advantages_PGT``. With
  ``probability_mask=True`` (the paper's SPO-chain and the official code)
  only the low-probability tokens carry their segment's advantage, and
  ``mask_PGT`` is multiplied by the probability mask so the other tokens
  leave the loss and its token mean (the code's action mask
  ``exp(old_logp) < 0.9``); False gives every token of a segment its
  advantage and keeps the mask (the paper's ablation).
  """
  checks.one_of("normalize", normalize, _NORMALIZE)
  checks.non_negative(eps=eps)

  def fn(batch: Batch) -> Batch:
    by = "spo_chain_advantages"
    low = batch.get(low_prob, by=by) if probability_mask else None
    adv = spo_chain_advantages_of(
      sequence_rewards(batch),
      batch.get(cuts, by=by),
      batch.get(values, by=by),
      batch.loss_mask(),
      low,
      normalize=normalize,
      eps=eps,
    )
    if low is None:
      return batch._replace(advantages_PGT=adv)
    mask = stats.f32(batch.mask_PGT) * stats.f32(jnp.asarray(low) > 0)
    return batch._replace(advantages_PGT=adv, mask_PGT=mask)

  return stateless_prepare(fn)


# ---------------------------------------------------------------------------
# SPO-tree: segment values from the tree itself.
# ---------------------------------------------------------------------------

_TREE_VALUES = ("children", "leaves")


def _check_tree_ids(rewards_PG, tree_PGD) -> None:
  checks.rank("rewards_PG", rewards_PG, 2, "[P, G]")
  checks.rank("tree_PGD", tree_PGD, 3, "[P, G, D]")
  checks.leading_shape("tree_PGD", tree_PGD, np.shape(rewards_PG), "rewards_PG")
  if not jnp.issubdtype(jnp.result_type(tree_PGD), jnp.integer):
    raise ValueError(
      "tree_PGD must hold integer node ids (-1 below a leaf), got dtype"
      f" {jnp.result_type(tree_PGD)}; pass the sampler's int32 tree"
      " (Batch.extra['tree_PG'] of rljax.rollouts.SegmentTree)."
    )


def _tree_levels(r_PG, tree_PGD, valid_PG):
  """Per leaf and level l = 0 (the root) .. D of its ancestor node:

  * same [P, G, G, 1 + D]: leaves i and j (both valid) share the node;
  * first [P, G, 1 + D]: i is the first valid leaf below its node (the
    node's owner in depth-first order);
  * children [P, G, 1 + D]: how many child nodes i's node has.
  """
  root = jnp.zeros(tree_PGD.shape[:-1] + (1,), tree_PGD.dtype)
  ids = jnp.concatenate([root, tree_PGD], axis=-1)
  # A row with no level-1 node (an unused sample) belongs to no node.
  in_tree = (valid_PG > 0) & (tree_PGD[..., 0] >= 0)
  inside = (ids >= 0) & in_tree[..., None]
  same = ids[:, :, None, :] == ids[:, None, :, :]
  same = same & inside[:, :, None, :] & inside[:, None, :, :]
  g = r_PG.shape[-1]
  earlier = jnp.tril(jnp.ones((g, g), bool), k=-1)  # [i, j]: j < i
  first = inside & ~jnp.any(same & earlier[None, :, :, None], axis=2)
  # A node's children are the distinct level-(l + 1) nodes below it.
  below = jnp.concatenate(
    [first[..., 1:], jnp.zeros_like(first[..., :1])], axis=-1
  )
  children = jnp.sum(same & below[:, None, :, :], axis=2)
  return same, first, children


def spo_tree_values_of(
  rewards_PG: ArrayLike,
  tree_PGD: ArrayLike,
  sample_mask_PG: ArrayLike | None = None,
  *,
  value: str = "children",
) -> jax.Array:
  """SPO-tree's node values (arXiv 2505.23564, tree-based estimate).

  Each prompt's samples are the leaves of a tree of segments
  (`rljax.rollouts.SegmentTree`); ``tree_PGD[p, g, l - 1]`` is the id of
  leaf g's ancestor at level l = 1..D (-1 below the leaf's own level L_g).
  The value of a node n is

    V(n) = R_g                                  n is leaf g
    V(n) = 1/|Ch(n)| sum_{c in Ch(n)} V(c)      otherwise (``"children"``)

  the mean of its children's values (the tree-based panel of the official
  README's advantage-estimation figure: V(Pa(n)) = (1 + 2/3 + 0)/3 = 5/9,
  and the official code's `HybridInferenceStrategy._construct_tree`,
  ``node["reward"] = np.mean(child_rewards)``), i.e. the chance of success
  of a uniform random walk down the tree from n. ``"leaves"`` takes the mean reward of the
  leaves below n instead; the two agree where every branch reaches the
  last level and differ where some ended early.

  Args:
    rewards_PG: [P, G] leaf rewards R.
    tree_PGD: [P, G, D] integer ancestor ids, -1 below a leaf.
    sample_mask_PG: [P, G] validity (default: all valid); invalid leaves
      and rows without a level-1 id belong to no node.
    value: "children" or "leaves".

  Returns:
    [P, G, 1 + D] float32: column l is V of leaf g's level-l ancestor
    (column 0 the root, the prompt state), 0 below the leaf and for invalid
    leaves.
  """
  checks.one_of("value", value, _TREE_VALUES)
  _check_tree_ids(rewards_PG, tree_PGD)
  valid = _tree_validity(rewards_PG, sample_mask_PG)
  r = jnp.where(valid > 0, stats.f32(rewards_PG), 0.0)
  same, _, children = _tree_levels(r, jnp.asarray(tree_PGD), valid)
  return _node_values(r, same, children, value)


def _tree_validity(rewards_PG, sample_mask_PG) -> jax.Array:
  if sample_mask_PG is None:
    return jnp.ones(np.shape(rewards_PG), jnp.float32)
  checks.same_shape(
    ["rewards_PG", "sample_mask_PG"], rewards_PG, sample_mask_PG
  )
  return stats.f32(jnp.asarray(sample_mask_PG) != 0)


def _node_values(r_PG, same, children, value) -> jax.Array:
  """[P, G, 1 + D] V of each leaf's ancestors (see `spo_tree_values_of`)."""
  weight = stats.f32(same)
  if value == "children":
    # Leaf j's share of the level-l node above it: the chance that a uniform
    # walk down from there reaches j, prod_{k >= l} 1 / |Ch(level-k node)|.
    step = jnp.where(children > 0, 1.0 / jnp.maximum(children, 1), 1.0)
    walk = jnp.flip(jnp.cumprod(jnp.flip(step, -1), axis=-1), -1)
    weight = weight * walk[:, None, :, :]
  total = jnp.sum(weight * r_PG[:, None, :, None], axis=2)
  return stats.safe_div(total, jnp.sum(weight, axis=2))


def spo_tree_advantages_of(
  rewards_PG: ArrayLike,
  tree_PGD: ArrayLike,
  depth_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  low_prob_PGT: ArrayLike | None = None,
  sample_mask_PG: ArrayLike | None = None,
  *,
  value: str = "children",
  sibling_std: bool = False,
  drop_zero: bool = True,
  normalize: str = "batch",
  eps: float = 1e-8,
) -> tuple[jax.Array, jax.Array]:
  """SPO-tree's token advantages and the tokens they train (2505.23564).

  Every node n below the root is one segment: the tokens its leaf-ward path
  added to its parent's prefix. With V from `spo_tree_values_of`,

    A(n) = V(n) - V(Pa(n))                      (tree-based advantage)
    A(n) = (V(n) - V(Pa(n))) / (std_{c in Ch(Pa(n))} V(c) + eps)

  the second with ``sibling_std`` (the official code's
  ``adv_method="grpo"``; std over the siblings' values, population form).
  Each segment is trained once: a leaf carries the advantage of its level-l
  ancestor on the tokens that ancestor generated (``depth_PGT == l``) only
  if it is the first valid leaf below that node (the leaves of a prompt
  are in depth-first order), so the loss sees every segment once, on its
  own tokens, conditioned on the prompt and its ancestors' segments: the
  official code's edges (parent text -> node text) laid out on the leaves.
  ``drop_zero`` leaves out segments with A(n) == 0 (the code's default
  ``only_adv_greater_than_zero``, which keeps every edge with a nonzero
  advantage); the probability mask ``low_prob_PGT`` (1 where
  pi(y_t) < rho; None: no mask) keeps only the low-probability tokens of
  each trained segment. ``normalize="batch"`` whitens the advantages over
  the kept tokens of the batch (mean, unbiased variance,
  ``(A - mu) / sqrt(var + eps)``), as the official PPO trainer does
  (`whiten_advantages` with `use_prob_mask`); ``"none"`` keeps A.

  What was checked: the official code (AIFrameResearch/SPO
  src/treetune/inference_strategies/hybrid_inference_strategy.py
  `_construct_tree`: children of a node are `branch_factor` continuations
  of M tokens from its text, the last level runs to the end, a node's
  reward is the mean of its children's; episode_generators/
  tree_episode_generator.py `extract_edges_from_tree`: one training
  episode per non-root node, query = the parent's full text, response =
  the node's text, advantage child - parent ("rloo", the SPO-tree runs) or
  divided by the parent's children std + 1e-8 ("grpo"), edges kept where
  A + BoK(V(n)) - BoK(V(Pa(n))) != 0, i.e. A != 0 as BoK(v) = 1 - (1 -
  v)^4 increases; hybrid_episode_generator.py: every token of an edge
  gets its advantage; trainers/ppo_trainer.py: whitening and the p < 0.9
  mask as in SPO-chain) and the README's advantage-estimation figure
  (V(Pa(n)) = the mean of the children's values, A(n) = V(n) - V(Pa(n))).
  The paper's text and equations beyond its abstract could not be read
  here. Not built: the code's replay buffer (at most 32 edges
  per question per iteration, the rest kept for up to 8 iterations); here
  every segment of the step trains in the step.

  Args:
    rewards_PG: [P, G] leaf rewards R.
    tree_PGD: [P, G, D] integer ancestor ids, -1 below a leaf.
    depth_PGT: [P, G, T] integer level (1..D) of the node that generated
      each completion token, 0 on padding.
    mask_PGT: [P, G, T] completion tokens.
    low_prob_PGT: [P, G, T] the probability mask, or None.
    sample_mask_PG: [P, G] validity (default: all valid).
    value: how a node is valued, "children" or "leaves".
    sibling_std: divide A(n) by the std of its siblings' values + eps.
    drop_zero: leave segments with A(n) == 0 out of the loss.
    normalize: "batch" or "none".
    eps: added to the sibling std and to the whitening variance.

  Returns:
    (advantages [P, G, T] float32, 0 off the kept tokens; kept [P, G, T]
    float32, 1 on the tokens that train: the new loss mask).
  """
  checks.one_of("value", value, _TREE_VALUES)
  checks.one_of("normalize", normalize, _NORMALIZE)
  checks.non_negative(eps=eps)
  _check_tree_tokens(rewards_PG, tree_PGD, depth_PGT, mask_PGT, low_prob_PGT)
  valid = _tree_validity(rewards_PG, sample_mask_PG)
  r = jnp.where(valid > 0, stats.f32(rewards_PG), 0.0)
  same, first, children = _tree_levels(r, jnp.asarray(tree_PGD), valid)
  v = _node_values(r, same, children, value)
  adv_PGL, owner = _node_advantages(v, same, first, value)
  if sibling_std:
    adv_PGL = adv_PGL / (_sibling_std(v, same, first) + eps)
  adv, keep = _segment_tokens(
    adv_PGL, owner, depth_PGT, mask_PGT, low_prob_PGT, valid, drop_zero
  )
  if normalize == "batch":
    adv = _whiten(adv, keep, keep, eps)
  return adv, stats.f32(keep)


def _check_tree_tokens(
  rewards_PG, tree_PGD, depth_PGT, mask_PGT, low_prob_PGT
) -> None:
  """Check `spo_tree_advantages_of`'s tree and per-token arrays."""
  _check_tree_ids(rewards_PG, tree_PGD)
  checks.rank("mask_PGT", mask_PGT, 3, "[P, G, T]")
  checks.leading_shape("mask_PGT", mask_PGT, np.shape(rewards_PG), "rewards_PG")
  checks.same_shape(
    ["mask_PGT", "depth_PGT", "low_prob_PGT"], mask_PGT, depth_PGT, low_prob_PGT
  )
  if not jnp.issubdtype(jnp.result_type(depth_PGT), jnp.integer):
    raise ValueError(
      f"depth_PGT must hold integer levels, got dtype"
      f" {jnp.result_type(depth_PGT)}; pass Batch.extra['spo_depth_PGT']."
    )


def _segment_tokens(
  adv_PGL, owner, depth_PGT, mask_PGT, low_prob_PGT, valid, drop_zero: bool
) -> tuple[jax.Array, jax.Array]:
  """(advantages, kept) [P, G, T]: each token takes the advantage of the
  level-l node that generated it, kept where this leaf trains that node's
  segment (and, with the probability mask, where the token is unlikely)."""
  depth = jnp.clip(jnp.asarray(depth_PGT), 0, adv_PGL.shape[-1] - 1)
  adv = jnp.take_along_axis(adv_PGL, depth, axis=2)
  train = jnp.take_along_axis(owner, depth, axis=2) & (depth > 0)
  train = train & (stats.f32(mask_PGT) > 0) & (valid[..., None] > 0)
  if drop_zero:
    train = train & (adv != 0)
  keep = train
  if low_prob_PGT is not None:
    keep = keep & (jnp.asarray(low_prob_PGT) > 0)
  return jnp.where(keep, adv, 0.0), keep


def _siblings(same, first) -> jax.Array:
  """[P, G, G, 1 + D]: leaf j is the first leaf of a sibling of leaf i's
  level-l node (the two nodes share their level-(l - 1) parent); none at
  the root."""
  parent = jnp.concatenate(
    [jnp.zeros_like(same[..., :1]), same[..., :-1]], axis=-1
  )
  return parent & first[:, None, :, :]


def _node_advantages(v, same, first, value):
  """[P, G, 1 + D] A of each leaf's level-l ancestor (0 at the root and
  below the leaf) and whether the leaf owns that node's segment.

  V(n) - V(Pa(n)) as a weighted mean of V(n) - V(c) over the siblings c:
  exactly 0 when all siblings have the same value."""
  weight = stats.f32(_siblings(same, first))
  if value == "leaves":  # V(Pa(n)) weighs each child by its leaves
    weight = weight * jnp.sum(stats.f32(same), axis=2)[:, None, :, :]
  diff = v[:, :, None, :] - v[:, None, :, :]  # V(n_i) - V(c_j)
  adv = stats.safe_div(jnp.sum(weight * diff, axis=2), jnp.sum(weight, axis=2))
  below_root = (jnp.arange(v.shape[-1]) > 0)[None, None, :]
  trained = jnp.any(same, axis=2) & below_root
  return jnp.where(trained, adv, 0.0), first & trained


def _sibling_std(v, same, first) -> jax.Array:
  """[P, G, 1 + D] population std of the values of the level-l node and
  its siblings; 0 at the root."""
  weight = stats.f32(_siblings(same, first))
  n = jnp.sum(weight, axis=2)
  mean = stats.safe_div(jnp.sum(weight * v[:, None, :, :], axis=2), n)
  sq = jnp.square(v[:, None, :, :] - mean[:, :, None, :])
  return stats.safe_sqrt(stats.safe_div(jnp.sum(weight * sq, axis=2), n))


def spo_tree_advantages(
  *,
  tree: str = "tree_PG",
  depth: str = "spo_depth_PGT",
  low_prob: str = "spo_low_prob_PGT",
  probability_mask: bool = True,
  value: str = "children",
  sibling_std: bool = False,
  drop_zero: bool = True,
  normalize: str = "batch",
  eps: float = 1e-8,
) -> Transform:
  """SPO-tree (arXiv 2505.23564): `spo_tree_advantages_of` on the batch.

  Reads the sequence rewards, the validity of the samples and the
  sampler's ``Batch.extra`` arrays (`rljax.rollouts.SegmentTree`: the
  tree, [P, G, D] ancestor ids (a [P, G] array is one level), each token's
  level and the probability mask), writes
  ``advantages_PGT`` and replaces ``mask_PGT`` by the tokens that train:
  each segment once (on the first leaf below its node), without the
  segments whose advantage is 0 (``drop_zero``) and, with
  ``probability_mask=True`` (the official SPO-tree runs inherit
  `use_prob_mask` from SPO-chain), only its tokens with pi(y_t) < rho.
  """
  checks.one_of("value", value, _TREE_VALUES)
  checks.one_of("normalize", normalize, _NORMALIZE)
  checks.non_negative(eps=eps)

  def fn(batch: Batch) -> Batch:
    by = "spo_tree_advantages"
    tree_PGD = jnp.asarray(batch.get(tree, by=by))
    if tree_PGD.ndim == 2:  # [P, G]: one level
      tree_PGD = tree_PGD[..., None]
    adv, keep = spo_tree_advantages_of(
      sequence_rewards(batch),
      tree_PGD,
      jnp.asarray(batch.get(depth, by=by)),
      batch.mask_PGT,
      batch.get(low_prob, by=by) if probability_mask else None,
      batch.samples(),
      value=value,
      sibling_std=sibling_std,
      drop_zero=drop_zero,
      normalize=normalize,
      eps=eps,
    )
    mask = stats.f32(batch.mask_PGT) * keep
    return batch._replace(advantages_PGT=adv, mask_PGT=mask)

  return stateless_prepare(fn)
