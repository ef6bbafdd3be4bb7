"""PORTool: fork-relative advantages on tool-call trees.

Conventions (turn ids, action mask, [P, G, N] turn arrays) as in
`rljax.transforms._tooluse`, whose helpers and THOR step reward this module
shares.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax import advantages
from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare
from rljax.transforms._advantages import _need_group
from rljax.transforms._advantages import sequence_rewards
from rljax.transforms._tooluse import _check_int
from rljax.transforms._tooluse import _check_turns
from rljax.transforms._tooluse import _turn_array
from rljax.transforms._tooluse import _valid
from rljax.transforms._tooluse import _with_step_advantages
from rljax.transforms._tooluse import thor_step_rewards_of
from rljax.transforms._variants import correctness

_PORTOOL_NORMALIZE = ("std", "mean")
_DESCENDANTS = ("any", "mean")


def _tree_parts(tree_PGN, valid_PG):
  """(on, same node, same parent) for every (sample, sample', turn):
  on [P, G, N]; the others [P, G, G, N], restricted to steps that exist."""
  ids = jnp.asarray(tree_PGN)
  on = (ids >= 0) & (valid_PG[..., None] > 0)
  root = jnp.zeros_like(ids[..., :1])
  parents = jnp.concatenate([root, ids[..., :-1]], axis=-1)
  both = on[:, :, None, :] & on[:, None, :, :]
  node = both & (ids[:, :, None, :] == ids[:, None, :, :])
  parent = both & (parents[:, :, None, :] == parents[:, None, :, :])
  return on, node, parent


def _check_tree(tree_PGN, rewards_PG) -> None:
  _check_turns("tree_PGN", tree_PGN, rewards_PG)
  _check_int("tree_PGN", tree_PGN)


def portool_step_rewards_of(
  correct_PG: ArrayLike,
  tree_PGN: ArrayLike,
  tool_ok_PGN: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  tool_weight: float = 0.1,
  descendants: str = "any",
) -> jax.Array:
  """PORTool's step reward on a tool-call tree.

      R(s) = C(s) + tool_weight * 1[s's tool calls succeeded]

  C(s) is the correctness of the trajectories through node s:
  ``descendants="any"``, 1 if any of them answered correctly (the
  correctness-dominant "can a descendant reach a correct answer"), or
  ``"mean"``, the fraction that did. A node shared by several samples gets
  one reward.

  Not verified: the form is our reading of the abstracts (v1: "rewards
  ... based on its ability to produce a correct answer and make successful
  tool calls"; v2: "a correctness-dominant signal ... plus an auxiliary
  term"); the paper's exact R and weight could not be read here.

  Args:
    correct_PG: [P, G] 1 for a correct final answer (0/1 or a score).
    tree_PGN: [P, G, N] int node id of each step (see `portool_advantages_of`).
    tool_ok_PGN: [P, G, N] 1 where the step's tool calls succeeded.
    sample_mask_PG: [P, G] validity (default all).
    tool_weight: weight of the tool-success term (a choice).
    descendants: "any" or "mean".

  Returns:
    [P, G, N] float32, 0 past each episode and for invalid samples.
  """
  checks.rank("correct_PG", correct_PG, 2, "[P, G]")
  _check_tree(tree_PGN, correct_PG)
  checks.same_shape(["tree_PGN", "tool_ok_PGN"], tree_PGN, tool_ok_PGN)
  checks.one_of("descendants", descendants, _DESCENDANTS)
  checks.non_negative(tool_weight=tool_weight)
  valid = _valid(correct_PG, sample_mask_PG, "correct_PG")
  on, node, _ = _tree_parts(tree_PGN, valid)
  c = stats.f32(correct_PG)
  through = stats.f32(node)  # [P, G, G', N]: g' passes through g's node
  if descendants == "any":
    reach = jnp.max(through * c[:, None, :, None], axis=2)
  else:
    reach = stats.safe_div(
      jnp.sum(through * c[:, None, :, None], axis=2), jnp.sum(through, axis=2)
    )
  ok = stats.safe_div(
    jnp.sum(through * stats.f32(tool_ok_PGN)[:, None, :, :], axis=2),
    jnp.sum(through, axis=2),
  )
  return jnp.where(on, reach + tool_weight * ok, 0.0)


def portool_advantages_of(
  rewards_PG: ArrayLike,
  step_rewards_PGN: ArrayLike,
  tree_PGN: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  normalize: str = "std",
  eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array]:
  """PORTool's trajectory-relative and fork-relative advantages.

      A_traj_i   = (R_i - mean_G R) / (std_G R + eps)
      A_fork(s)  = (R(s) - mean_{s' in C(parent(s))} R(s'))
                   / (std_{s' in C(parent(s))} R(s') + eps)

  over the distinct sibling nodes s' of step s (the children of the node
  it forks from; each counted once however many samples share it).
  ``normalize="mean"`` leaves out the std. A step without siblings gets 0.
  The token advantage is A_traj_i + coef A_fork on step k's action tokens
  (`portool_advantages`).

  The tree: ``tree_PGN[p, g, k]`` is the id of the node that is sample g's
  step k (equal ids: the same shared step, sampled once; ids unique within
  (prompt, step)), -1 past the episode. Step k's parent is its step k - 1
  node; every first step is a child of the root.

  Not verified: A = A_traj + lambda (r_step - mean_siblings r_step) is the
  catalog's reconstruction from the abstract (trajectory-relative "blended
  with" fork-relative advantages); whether the paper divides by the
  siblings' std and how it weights the two terms could not be read here,
  so both are options (std by default, as GRPO does per group).

  Args:
    rewards_PG: [P, G] trajectory rewards.
    step_rewards_PGN: [P, G, N] step rewards R(s)
      (`portool_step_rewards_of`); the mean over a node's samples is used.
    tree_PGN: [P, G, N] int node ids (above).
    sample_mask_PG: [P, G] validity (default all).
    normalize: "std" or "mean".
    eps: added to the stds.

  Returns:
    (A_traj_PG, A_fork_PGN), float32, 0 for invalid samples and past the
    episode.
  """
  checks.rank("rewards_PG", rewards_PG, 2, "[P, G]")
  _check_tree(tree_PGN, rewards_PG)
  checks.same_shape(
    ["tree_PGN", "step_rewards_PGN"], tree_PGN, step_rewards_PGN
  )
  checks.one_of("normalize", normalize, _PORTOOL_NORMALIZE)
  checks.non_negative(eps=eps)
  valid = _valid(rewards_PG, sample_mask_PG)
  a_traj = advantages.grpo(rewards_PG, valid, eps=eps)
  on, node, parent = _tree_parts(tree_PGN, valid)
  node, parent = stats.f32(node), stats.f32(parent)
  r = jnp.where(on, stats.f32(step_rewards_PGN), 0.0)
  size = jnp.sum(node, axis=2)  # samples sharing each step's node
  r = stats.safe_div(jnp.sum(node * r[:, None, :, :], axis=2), size)
  # Sibling g' weighs 1 / size(g') so that each node counts once.
  w = parent * stats.safe_div(1.0, size)[:, None, :, :]
  count = jnp.sum(w, axis=2)
  diff = r[:, None, :, :] - r[:, :, None, :]  # R(g') - R(g)
  shift = stats.safe_div(jnp.sum(w * diff, axis=2), count)  # mean - R(g)
  sq = jnp.square(diff - shift[:, :, None, :])
  var = stats.safe_div(jnp.sum(w * sq, axis=2), count - 1.0)
  fork = -shift
  if normalize == "std":
    fork = fork / (stats.safe_sqrt(var) + eps)
  # Rounding of the 1 / size weights: a fork of one node counts ~1.
  fork = jnp.where(on & (count > 1.5), fork, 0.0)
  return a_traj, fork


def portool_advantages(
  *,
  tree: str = "node_ids_PG",
  step_rewards: Optional[str] = None,
  coef: float = 1.0,
  tool_weight: float = 0.1,
  descendants: str = "any",
  normalize: str = "std",
  eps: float = 1e-6,
) -> Transform:
  """PORTool: A_traj + coef A_fork on each step's action tokens.

  Reads the tree ``Batch.extra[tree]`` ([P, G, N] node ids, written by the
  episode runner for trees of episodes, `rljax.envs.portool_episodes`) and
  the step rewards ``Batch.extra[step_rewards]`` or, by default,
  `portool_step_rewards_of` from the episode correctness (``correct_PG``,
  reward column 0 or ``rewards_PG > 0``) and the tool successes of
  ``tool_calls_PG`` / ``tool_errors_PG``. Writes ``advantages_PGT`` (see
  `portool_advantages_of`).
  """
  checks.one_of("normalize", normalize, _PORTOOL_NORMALIZE)
  checks.one_of("descendants", descendants, _DESCENDANTS)
  checks.non_negative(coef=coef, tool_weight=tool_weight, eps=eps)
  by = "portool_advantages"

  def fn(batch: Batch) -> Batch:
    _need_group(batch, by)
    ids = _turn_array(batch, tree, by)
    if step_rewards is None:
      r_ok, _ = thor_step_rewards_of(
        _turn_array(batch, "tool_calls_PG", by),
        _turn_array(batch, "tool_errors_PG", by),
      )
      r_step = portool_step_rewards_of(
        stats.f32(correctness(batch)),
        ids,
        r_ok,
        batch.samples(),
        tool_weight=tool_weight,
        descendants=descendants,
      )
    else:
      r_step = _turn_array(batch, step_rewards, by)
    a_traj, a_fork = portool_advantages_of(
      sequence_rewards(batch),
      r_step,
      ids,
      batch.samples(),
      normalize=normalize,
      eps=eps,
    )
    return _with_step_advantages(batch, a_traj, a_fork, coef, by)

  return stateless_prepare(fn)
