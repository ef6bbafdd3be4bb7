"""Tool-use credit on agent episodes: OTC, THOR and ToolPO.

InfoPO (`_tooluse_infopo`) and PORTool (`_tooluse_portool`) live in sibling
modules that share this module's turn helpers and conventions.

The stages read the episode runner's side arrays (`rljax.envs`): a completion
is action 0, observation 0, action 1, ... and

* ``Batch.extra["turn_ids_PGT"]``: the turn k of each completion token
  (action k and the observation that answers it), -1 on padding;
* ``Batch.mask_PGT``: 1 on action tokens only (the Trainer multiplies it by
  ``loss_mask_PGT``), so action k's tokens are ``mask & (turn_ids == k)``
  and observation k's are ``(turn_ids == k) & ~mask``;
* ``[P, G, N]`` turn arrays (N = the environment's max_turns):
  ``tool_calls_PG``, ``tool_errors_PG`` (calls that failed),
  ``turn_rewards_PG``; 0 past the episode.

A turn-level advantage ``adv_PGN`` reaches the tokens of its action through
`rljax.advantages.turns_to_tokens` (times the action mask). Each mechanism
is an array function (``*_of``, jittable, [P, G] / [P, G, N] in) and a
`Transform` factory.
"""

import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax import advantages
from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import stateless_prepare
from rljax.transforms._advantages import _need_group
from rljax.transforms._advantages import sequence_rewards

# ---------------------------------------------------------------------------
# Turns and tokens.
# ---------------------------------------------------------------------------


def _on_actions(values_PGN, turn_ids_PGT, mask_PGT) -> jax.Array:
  """[P, G, T] each token's turn value (`advantages.turns_to_tokens`) on
  the tokens of `mask`."""
  out = advantages.turns_to_tokens(values_PGN, turn_ids_PGT)
  return out * stats.f32(mask_PGT)


def _with_step_advantages(
  batch: Batch, a_traj_PG, a_step_PGN, coef, by: str
) -> Batch:
  """``advantages_PGT`` = A_traj on every action token + coef A_step on the
  tokens of action k (THOR, PORTool)."""
  mask = batch.loss_mask()
  turn_ids = batch.get("turn_ids_PGT", by=by)
  adv = a_traj_PG[..., None] * mask + coef * _on_actions(
    a_step_PGN, turn_ids, mask
  )
  return batch._replace(advantages_PGT=adv)


def _check_int(name: str, x: ArrayLike) -> None:
  if not jnp.issubdtype(jnp.result_type(x), jnp.integer):
    raise ValueError(
      f"{name} must hold integer ids (-1 for none); got dtype"
      f" {jnp.result_type(x)}. Pass the episode runner's int32 array."
    )


def _turn_counts(turn_ids_PGT, mask_PGT, n: int) -> jax.Array:
  """[P, G, N] number of `mask` tokens of each turn."""
  return advantages.per_turn_sum(mask_PGT, turn_ids_PGT, mask_PGT, n)


def _turn_array(batch: Batch, name: str, by: str) -> jax.Array:
  """``Batch.extra[name]`` as [P, G, N] (a [P, G] array is one turn)."""
  x = jnp.asarray(batch.get(name, by=by))
  if x.ndim == 2:
    x = x[..., None]
  checks.rank(f"Batch.extra[{name!r}]", x, 3, "[P, G, N] one value per turn")
  return x


def _valid(
  values_PG: ArrayLike, sample_mask_PG, name: str = "rewards_PG"
) -> jax.Array:
  """[P, G] float32 validity, checked against `values_PG`'s shape."""
  if sample_mask_PG is None:
    return jnp.ones(np.shape(values_PG), jnp.float32)
  checks.same_shape([name, "sample_mask_PG"], values_PG, sample_mask_PG)
  return stats.f32(jnp.asarray(sample_mask_PG) != 0)


def _check_turns(name: str, x: ArrayLike, rewards_PG: ArrayLike) -> None:
  checks.rank(name, x, 3, "[P, G, N] one value per turn")
  checks.leading_shape(name, x, np.shape(rewards_PG), "rewards_PG")


# ---------------------------------------------------------------------------
# OTC (arXiv 2504.14870): tool-productivity reward.
# ---------------------------------------------------------------------------

_OTC_VARIANTS = ("grpo", "ppo")
_OTC_AMONG = ("correct", "all")


def otc_tool_reward(
  calls: ArrayLike, optimal: ArrayLike, *, c: float = 1.0
) -> jax.Array:
  """OTC's tool reward r_tool of m tool calls against an optimum of n.

  With the mapping f(m, n) = 0 if m = n = 0, m if n = 0, 2nm / (m + n)
  otherwise (so f = n exactly at m = n, f -> 2n as m grows):

      r_tool = 1                       if f(m, n) = n = 0,
               cos(m pi / (2m + c))    if n = 0,
               sin(f(m, n) pi / (2n))  otherwise.

  It peaks at 1 where m = n and decays towards 0 with more calls (and, for
  n > 0, with fewer). OTC-PPO has no n and uses the cosine branch for every
  m (``optimal=0``). Arrays broadcast; counts must be >= 0.

  Args:
    calls: m, the tool calls of each trajectory.
    optimal: n, the (estimated) optimal number of calls.
    c: the smoothing constant of the cosine branch (> 0); larger c decays
      slower.

  Returns:
    float32 r_tool in [0, 1].

  References:
    Wang et al., "OTC: Optimal Tool Calls via Reinforcement Learning" /
    "Acting Less is Reasoning More", arXiv 2504.14870, Sec. 3 (OTC-PPO and
    OTC-GRPO tool rewards). Checked: the OTC-PPO cosine against a review of
    the paper; f(m, n), the three branches and r = alpha r_tool r_phi
    against a verl implementation in the code index (its repository not
    identified: `map_to_2n`, `oct_times_penalty`, `oct_budget_penalty`)
    and a third-party OTC-GRPO reward module. The paper's own text could
    not be read here (not verified beyond these); c's default 1.0 is the
    third-party module's.
  """
  checks.positive(c=c)
  m, n = stats.f32(calls), stats.f32(optimal)
  has_n = n > 0
  f = jnp.where(has_n, stats.safe_div(2.0 * n * m, m + n), m)
  cosine = jnp.cos(m * math.pi / (2.0 * m + c))
  sine = jnp.sin(stats.safe_div(f * math.pi, 2.0 * n))
  return jnp.where(has_n, sine, cosine)


def otc_rewards_of(
  rewards_PG: ArrayLike,
  calls_PG: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  variant: str = "grpo",
  c: float = 1.0,
  alpha: float = 1.0,
  among: str = "correct",
) -> jax.Array:
  """OTC's tool-integrated reward r = alpha r_tool(m, n) r_phi per group.

  r_phi is the correctness reward (r_phi > 0: correct). For OTC-GRPO
  (``variant="grpo"``) n is the fewest calls of a correct valid sample of
  the group (``among="all"``: of any valid sample, as the indexed verl
  code's `oct_times_penalty`); OTC-PPO (``"ppo"``) has no n
  (`otc_tool_reward` with n = 0). Samples with r_phi <= 0 keep r_phi
  unchanged (that code's factor 1 for wrong answers; for r_phi in {0, 1}
  this is the paper's product).

  Args:
    rewards_PG: [..., G] r_phi, the correctness reward.
    calls_PG: [..., G] tool calls of each sample (m).
    sample_mask_PG: [..., G] validity (default all); invalid samples give
      no n and keep their reward.
    variant: "grpo" (n from the group) or "ppo" (no n).
    c: `otc_tool_reward`'s smoothing constant.
    alpha: the scale of the tool-integrated reward (the paper's alpha).
    among: which samples estimate n: "correct" or "all".

  Returns:
    [..., G] float32 rewards.

  References:
    arXiv 2504.14870; see `otc_tool_reward` for what was checked.
  """
  checks.one_of("variant", variant, _OTC_VARIANTS)
  checks.one_of("among", among, _OTC_AMONG)
  checks.non_negative(alpha=alpha)
  checks.same_shape(["rewards_PG", "calls_PG"], rewards_PG, calls_PG)
  valid = _valid(rewards_PG, sample_mask_PG) > 0
  r, m = stats.f32(rewards_PG), stats.f32(calls_PG)
  correct = valid & (r > 0)
  if variant == "ppo":
    n = jnp.zeros_like(m)
  else:
    pool = correct if among == "correct" else valid
    fewest = jnp.min(jnp.where(pool, m, jnp.inf), axis=-1, keepdims=True)
    n = jnp.broadcast_to(jnp.where(jnp.isfinite(fewest), fewest, 0.0), m.shape)
  tool = otc_tool_reward(m, n, c=c)
  return jnp.where(correct, alpha * tool * r, r)


def otc_rewards(
  *,
  variant: str = "grpo",
  c: float = 1.0,
  alpha: float = 1.0,
  among: str = "correct",
  calls: str = "tool_calls_PG",
  column: Optional[int] = None,
) -> Transform:
  """OTC (arXiv 2504.14870): ``rewards_PG`` = `otc_rewards_of`.

  r_phi is ``rewards_PG`` (or ``rewards_PGK[..., column]``: the other
  reward columns are then dropped); m is ``Batch.extra[calls]`` summed over
  its turns. Put it before the advantage stage (OTC-GRPO:
  ``group_advantages(grpo)``; OTC-PPO: ``gae_advantages``). On the host,
  `rljax.rewards.otc` computes the same reward as a task reward function.
  """
  checks.one_of("variant", variant, _OTC_VARIANTS)
  checks.one_of("among", among, _OTC_AMONG)
  checks.non_negative(alpha=alpha)
  checks.positive(c=c)

  def fn(batch: Batch) -> Batch:
    m = jnp.sum(_turn_array(batch, calls, "otc_rewards"), axis=-1)
    if column is None:
      batch.require("rewards_PG", by="otc_rewards")
      r = batch.rewards_PG
    else:
      batch.require("rewards_PGK", by="otc_rewards(column=...)")
      k = batch.rewards_PGK.shape[-1]
      if not -k <= column < k:
        raise ValueError(
          f"otc_rewards: column {column} is out of range for rewards_PGK"
          f" with {k} columns."
        )
      r = batch.rewards_PGK[..., column]
    new = otc_rewards_of(
      r,
      m,
      batch.samples(),
      variant=variant,
      c=c,
      alpha=alpha,
      among=among,
    )
    return batch._replace(rewards_PG=new)

  return stateless_prepare(fn)


# ---------------------------------------------------------------------------
# Step groups: z-scores of turn values within comparison sets.
# ---------------------------------------------------------------------------


def _set_zscores(values_PGN, member_PGN, groups_PGN, eps: float):
  """(v - mean) / (std + eps) over the members sharing a group id within
  a prompt (every member of a prompt when `groups_PGN` is None); 0 for
  non-members and for sets of fewer than 2 members. Unbiased std."""
  v = stats.f32(values_PGN)
  member = stats.f32(member_PGN)
  p, g, n = v.shape
  if groups_PGN is None:
    same = jnp.ones((p, g * n, g * n), jnp.float32)
  else:
    ids = jnp.asarray(groups_PGN).reshape(p, g * n)
    same = stats.f32(ids[:, :, None] == ids[:, None, :])
  flat_v, flat_m = v.reshape(p, g * n), member.reshape(p, g * n)
  w = same * flat_m[:, None, :] * flat_m[:, :, None]  # [P, GN, GN]
  count = jnp.sum(w, -1)
  diff = flat_v[:, None, :] - flat_v[:, :, None]  # v_j - v_i
  shift = stats.safe_div(jnp.sum(w * diff, -1), count)  # mean - v_i
  sq = jnp.square(diff - shift[..., None])
  std = stats.safe_sqrt(stats.safe_div(jnp.sum(w * sq, -1), count - 1.0))
  z = jnp.where((count >= 2) & (flat_m > 0), -shift / (std + eps), 0.0)
  return z.reshape(p, g, n)


# ---------------------------------------------------------------------------
# THOR (arXiv 2509.13761): trajectory- and step-level credit for code calls.
# ---------------------------------------------------------------------------


def thor_step_rewards_of(
  tool_calls_PGN: ArrayLike, tool_errors_PGN: ArrayLike
) -> tuple[jax.Array, jax.Array]:
  """THOR's step reward: 1 for an action whose tool calls all executed,
  0 for one with a failed call.

  Returns:
    (r_step_PGN float32, steps_PGN bool): r_step = 1[calls > 0 and errors
    = 0]; steps marks the actions that called a tool (the only ones with a
    step reward).
  """
  checks.same_shape(
    ["tool_calls_PGN", "tool_errors_PGN"], tool_calls_PGN, tool_errors_PGN
  )
  calls, errors = jnp.asarray(tool_calls_PGN), jnp.asarray(tool_errors_PGN)
  steps = calls > 0
  return stats.f32(steps & (errors == 0)), steps


def thor_advantages_of(
  rewards_PG: ArrayLike,
  step_rewards_PGN: ArrayLike,
  steps_PGN: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  step_groups_PGN: Optional[ArrayLike] = None,
  eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array]:
  """THOR's hierarchical advantages: trajectory-level GRPO on the final
  answer and step-level GRPO on code-execution success.

      A_traj_i    = (R_i - mean_G R) / (std_G R + eps)
      A_step_{ik} = (r_ik - mean_S r) / (std_S r + eps)   for a tool step k

  S is the comparison set of step (i, k): every tool step of the prompt's
  G episodes (default), or the steps sharing its id in ``step_groups_PGN``
  (THOR's code compares the regenerations of one step from a shared
  prefix: give those forks one id). Sets of fewer than 2 steps give 0.
  `thor_advantages` puts A_traj + step_coef A_step on action k's tokens.

  What was checked: the official code (JingMog/THOR, verl `run_code_grpo.sh`,
  `vllm_rollout_spmd.py`, `reward_manager/naive.py`): trajectories get GRPO
  on answer correctness; for a failed code step the prefix before it is
  re-sampled `pass_rate_n` times, each regeneration scored by its own
  execution (pass 1 / fail 0) and normalised by GRPO within that group, its
  loss masked to the regenerated step. Here both terms act on the same
  episode (the sum of the two losses' advantages on a token, exact for the
  unclipped surrogate); pass the fork ids of re-sampled steps as
  ``step_groups_PGN`` for the code's comparison. Not built: the code's
  filter that drops episodes with a failed execution, its NLL term on
  positive-advantage tokens (``grpo_select_alpha``), TIRGen and the
  inference-time self-correction. The paper's equations could not be read
  here (abstract and reviews only).

  Args:
    rewards_PG: [P, G] trajectory rewards (answer correctness).
    step_rewards_PGN: [P, G, N] step rewards (`thor_step_rewards_of`).
    steps_PGN: [P, G, N] which actions are tool steps.
    sample_mask_PG: [P, G] validity (default all).
    step_groups_PGN: [P, G, N] int comparison-set ids within a prompt
      (default: one set per prompt).
    eps: added to both stds.

  Returns:
    (A_traj_PG, A_step_PGN), float32, 0 for invalid samples and non-steps.
  """
  checks.rank("rewards_PG", rewards_PG, 2, "[P, G]")
  _check_turns("step_rewards_PGN", step_rewards_PGN, rewards_PG)
  checks.same_shape(
    ["step_rewards_PGN", "steps_PGN"], step_rewards_PGN, steps_PGN
  )
  if step_groups_PGN is not None:
    checks.same_shape(
      ["step_rewards_PGN", "step_groups_PGN"], step_rewards_PGN, step_groups_PGN
    )
    _check_int("step_groups_PGN", step_groups_PGN)
  checks.non_negative(eps=eps)
  valid = _valid(rewards_PG, sample_mask_PG)
  a_traj = advantages.grpo(rewards_PG, valid, eps=eps)
  member = (jnp.asarray(steps_PGN) != 0) & (valid[..., None] > 0)
  a_step = _set_zscores(step_rewards_PGN, member, step_groups_PGN, eps)
  return a_traj, a_step


def thor_advantages(
  *,
  step_coef: float = 1.0,
  step_groups: Optional[str] = None,
  eps: float = 1e-6,
) -> Transform:
  """THOR (arXiv 2509.13761): `thor_advantages_of` on the batch.

  Step rewards come from ``Batch.extra["tool_calls_PG"]`` and
  ``["tool_errors_PG"]`` ([P, G, N]); ``step_groups`` names an optional
  [P, G, N] extra of comparison-set ids. Writes ``advantages_PGT``: A_traj
  on every action token plus ``step_coef`` A_step on the tokens of tool
  steps (through ``turn_ids_PGT``).
  """
  checks.non_negative(step_coef=step_coef, eps=eps)

  def fn(batch: Batch) -> Batch:
    _need_group(batch, "thor_advantages")
    by = "thor_advantages"
    r_step, steps = thor_step_rewards_of(
      _turn_array(batch, "tool_calls_PG", by),
      _turn_array(batch, "tool_errors_PG", by),
    )
    groups = (
      None if step_groups is None else _turn_array(batch, step_groups, by)
    )
    a_traj, a_step = thor_advantages_of(
      sequence_rewards(batch),
      r_step,
      steps,
      batch.samples(),
      step_groups_PGN=groups,
      eps=eps,
    )
    return _with_step_advantages(batch, a_traj, a_step, step_coef, by)

  return stateless_prepare(fn)


# ---------------------------------------------------------------------------
# ToolPO (DeepAgent, arXiv 2510.21618): tool-call advantage attribution.
# ---------------------------------------------------------------------------


def toolpo_action_rewards_of(
  tool_calls_PGN: ArrayLike, tool_errors_PGN: ArrayLike, *, weight: float = 1.0
) -> jax.Array:
  """ToolPO's action-level reward R_action = lambda_1 sum_t C(a_t): the
  number of tool calls that succeeded (calls - errors, summed over turns),
  times ``weight``. [P, G] float32."""
  checks.same_shape(
    ["tool_calls_PGN", "tool_errors_PGN"], tool_calls_PGN, tool_errors_PGN
  )
  checks.non_negative(weight=weight)
  ok = stats.f32(tool_calls_PGN) - stats.f32(tool_errors_PGN)
  return weight * jnp.sum(jnp.maximum(ok, 0.0), axis=-1)


def toolpo_advantages_of(
  success_PG: ArrayLike,
  action_PG: ArrayLike,
  mask_PGT: ArrayLike,
  call_mask_PGT: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  scale_by_std: bool = False,
  eps: float = 1e-6,
) -> jax.Array:
  """ToolPO's token advantage: the trajectory's success advantage on every
  token plus its tool-call advantage on the tool-call tokens.

      A_succ_i = R_succ_i - mean_G R_succ,  A_act_i = R_act_i - mean_G R_act
      A(y_t)   = A_succ_i + M(y_t) A_act_i

  M(y_t) = 1 on the tokens of tool calls (``call_mask_PGT``). With
  ``scale_by_std`` each term is also divided by its group's std + eps
  (GRPO's form).

  What was checked: the DeepAgent paper's ToolPO (Sec. "Tool Policy
  Optimization": R_succ, R_action = lambda_1 sum_t C(a_t) + lambda_2
  S_pref, group-relative advantages, token attribution by the mask M)
  through third-party summaries only: neither the paper's body nor training
  code (RUC-NLPIR/DeepAgent ships inference code) could be read, so the
  mean-only group baseline is our reading (not verified) and the std form
  is an option. Not built: the memory-folding term S_pref (pass it inside
  ``action_PG``) and the LLM-simulated APIs.

  Args:
    success_PG: [P, G] global success reward R_succ.
    action_PG: [P, G] action-level reward R_action
      (`toolpo_action_rewards_of`).
    mask_PGT: [P, G, T] the tokens in the loss.
    call_mask_PGT: [P, G, T] M, 1 on tool-call tokens.
    sample_mask_PG: [P, G] validity (default all).
    scale_by_std: divide each term by its group std + eps.
    eps: see ``scale_by_std``.

  Returns:
    [P, G, T] float32, 0 outside ``mask_PGT`` and for invalid samples.
  """
  checks.rank("success_PG", success_PG, 2, "[P, G]")
  checks.same_shape(["success_PG", "action_PG"], success_PG, action_PG)
  checks.rank("mask_PGT", mask_PGT, 3, "[P, G, T]")
  checks.leading_shape("mask_PGT", mask_PGT, np.shape(success_PG), "success_PG")
  checks.same_shape(["mask_PGT", "call_mask_PGT"], mask_PGT, call_mask_PGT)
  checks.non_negative(eps=eps)
  valid = _valid(success_PG, sample_mask_PG, "success_PG")
  relative = advantages.grpo if scale_by_std else advantages.dr_grpo
  kwargs = {"eps": eps} if scale_by_std else {}
  a_succ = relative(success_PG, valid, **kwargs)
  a_act = relative(action_PG, valid, **kwargs)
  mask = stats.f32(mask_PGT) * valid[..., None]
  calls = stats.f32(call_mask_PGT) * mask
  return a_succ[..., None] * mask + a_act[..., None] * calls


def toolpo_advantages(
  *,
  action_rewards: Optional[str] = None,
  call_mask: Optional[str] = None,
  weight: float = 1.0,
  scale_by_std: bool = False,
  eps: float = 1e-6,
) -> Transform:
  """ToolPO (DeepAgent, arXiv 2510.21618): add the tool-call advantage
  M(y_t) A_act to ``advantages_PGT``.

  Chain it after the outcome stage, whose advantage is A_succ (the paper's
  mean-centred form is ``group_advantages(dr_grpo)``; ``grpo`` for the std
  form). R_action is ``Batch.extra[action_rewards]`` ([P, G]) or, by
  default, ``weight`` times the successful tool calls of
  ``tool_calls_PG`` / ``tool_errors_PG``. M is ``Batch.extra[call_mask]``
  ([P, G, T], 1 on tool-call tokens) or, by default, every token of an
  action that called a tool (through ``turn_ids_PGT``). See
  `toolpo_advantages_of`.
  """
  checks.non_negative(weight=weight, eps=eps)
  by = "toolpo_advantages"

  def fn(batch: Batch) -> Batch:
    _need_group(batch, by)
    if batch.advantages_PGT is None:
      raise ValueError(
        "toolpo_advantages adds the tool-call term to Batch.advantages_PGT;"
        " chain an outcome advantage stage first, e.g."
        " chain(group_advantages(rljax.advantages.dr_grpo),"
        " toolpo_advantages())."
      )
    calls = _turn_array(batch, "tool_calls_PG", by)
    if action_rewards is None:
      errors = _turn_array(batch, "tool_errors_PG", by)
      r_act = toolpo_action_rewards_of(calls, errors, weight=weight)
    else:
      r_act = stats.f32(batch.get(action_rewards, by=by))
    mask = batch.loss_mask()
    if call_mask is None:
      turn_ids = batch.get("turn_ids_PGT", by=by)
      m = _on_actions(stats.f32(calls > 0), turn_ids, mask)
    else:
      m = stats.f32(batch.get(call_mask, by=by))
    zeros = jnp.zeros(batch.shape[:2], jnp.float32)
    extra = toolpo_advantages_of(
      zeros,
      r_act,
      mask,
      m,
      batch.samples(),
      scale_by_std=scale_by_std,
      eps=eps,
    )
    return batch._replace(
      advantages_PGT=stats.f32(batch.advantages_PGT) + extra
    )

  return stateless_prepare(fn)
