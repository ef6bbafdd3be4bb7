"""Tool-use credit on agent episodes: OTC, THOR, ToolPO, InfoPO and PORTool.

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

from collections.abc import Sequence
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from rljax import advantages
from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import _keep_terms
from rljax._src.base import stateless_prepare
from rljax.transforms._advantages import _need_group
from rljax.transforms._advantages import sequence_rewards
from rljax.transforms._variants import correctness

# ---------------------------------------------------------------------------
# Turns and tokens.
# ---------------------------------------------------------------------------


def _on_actions(values_PGN, turn_ids_PGT, mask_PGT) -> jax.Array:
  """[P, G, T] each token's turn value (`advantages.turns_to_tokens`) on
  the tokens of `mask`."""
  out = advantages.turns_to_tokens(values_PGN, turn_ids_PGT)
  return out * stats.f32(mask_PGT)


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
    mask = batch.loss_mask()
    turn_ids = batch.get("turn_ids_PGT", by=by)
    adv = a_traj[..., None] * mask + step_coef * _on_actions(
      a_step, turn_ids, mask
    )
    return batch._replace(advantages_PGT=adv)

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


# ---------------------------------------------------------------------------
# InfoPO: information gain of an observation for the next action.
# ---------------------------------------------------------------------------

INFOPO_PLACEHOLDER = "No information found."


def infopo_information_gain(
  logp_PGT: ArrayLike,
  cf_logp_PGT: ArrayLike,
  turn_ids_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  *,
  num_turns: int,
) -> tuple[jax.Array, jax.Array]:
  """InfoPO's information gain of each observation, credited to the action
  that produced it.

      IG_t = (1 / |a_{t+1}|) sum_{j in a_{t+1}} [log pi(a_{t+1,j} | h, o_t)
                                  - log pi(a_{t+1,j} | h, placeholder)]

  ``cf_logp_PGT`` holds, on action t+1's tokens, their log-probs with
  observation t replaced by the placeholder
  (`infopo_counterfactual_logprobs`). IG_t is defined where observation t
  and action t+1 both have tokens.

  Args:
    logp_PGT: [P, G, T] log-probs with the real observations.
    cf_logp_PGT: [P, G, T] counterfactual log-probs (see above).
    turn_ids_PGT: [P, G, T] int turn of each token, -1 on padding.
    mask_PGT: [P, G, T] 1 on action tokens.
    num_turns: N, the number of turns (max_turns).

  Returns:
    (ig_PGN float32, valid_PGN bool), IG_t = 0 where not defined.

  References:
    "InfoPO: Information-Driven Policy Optimization for User-Centric
    Agents" (no arXiv id found: the official README's is a placeholder).
    Checked against its official code, kfq20/InfoPO
    `verl/trainer/ppo/intrinsic_reward.py::compute_batched_kl_divergence`
    (the mean log-ratio at the sampled tokens, teacher forced) and
    `compute_intrinsic_rewards` (credited to the action that produced the
    observation).
  """
  checks.rank("logp_PGT", logp_PGT, 3, "[P, G, T]")
  for name, x in [
    ("cf_logp_PGT", cf_logp_PGT),
    ("turn_ids_PGT", turn_ids_PGT),
    ("mask_PGT", mask_PGT),
  ]:
    checks.same_shape(["logp_PGT", name], logp_PGT, x)
  _check_int("turn_ids_PGT", turn_ids_PGT)
  if not isinstance(num_turns, int) or num_turns < 1:
    raise ValueError(f"num_turns must be an int >= 1; got {num_turns!r}.")
  ids = jnp.asarray(turn_ids_PGT)
  action = stats.f32(mask_PGT) * stats.f32(ids >= 0)
  observation = stats.f32(ids >= 0) * (1.0 - stats.f32(mask_PGT > 0))
  gain = stats.f32(logp_PGT) - stats.f32(cf_logp_PGT)
  act_n = advantages.per_turn_sum(action, ids, action, num_turns)
  obs_n = advantages.per_turn_sum(observation, ids, observation, num_turns)
  sum_n = advantages.per_turn_sum(gain, ids, action, num_turns)
  # Action t+1's mean gain belongs to turn t.
  nxt_sum = jnp.pad(sum_n[..., 1:], ((0, 0), (0, 0), (0, 1)))
  nxt_n = jnp.pad(act_n[..., 1:], ((0, 0), (0, 0), (0, 1)))
  valid = (obs_n > 0) & (nxt_n > 0) & (act_n > 0)
  return jnp.where(valid, stats.safe_div(nxt_sum, nxt_n), 0.0), valid


def infopo_advantages_of(
  rewards_PG: ArrayLike,
  ig_PGN: ArrayLike,
  ig_valid_PGN: ArrayLike,
  turn_ids_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  sample_mask_PG: Optional[ArrayLike] = None,
  *,
  beta: float = 0.5,
  gate_temperature: float = 0.5,
  baseline_std: float = 1.0,
  eps: float = 1e-6,
) -> jax.Array:
  """InfoPO's fusion of the outcome advantage and the information gain.

  1. A_out_i = GRPO of the outcome R_i in its group, on every action token.
  2. Intrinsic token reward r_j = IG_t / |a_t| on action t's tokens (where
     IG_t is defined); A_int_j = (r_j - mean) / (std + eps), mean and
     unbiased std over those tokens of the group's G episodes.
  3. Magnitude cap: rho = min(1, max(s_out, baseline_std) / s_int), s the
     unbiased std (+ eps) over all action tokens of the batch.
  4. Variance gate per group: g = sigmoid(-std_G(R) / gate_temperature),
     near 0.5 when the group's outcomes agree, near 0 when they differ.
  5. A_j = A_out_i + beta g rho A_int_j.

  What was checked: the official code (kfq20/InfoPO,
  `core_algos.py::compute_info_grpo_advantage` with the default
  "Equalized" turn credits, which broadcast the GRPO advantage, and
  `intrinsic_reward.py` for IG / |a_t|); beta 0.5 and temperature 0.5 are
  the official run's (`examples/sglang_multiturn/config/grpo_multiturn.yaml`;
  the function's own defaults are 0.1 and 0.05), baseline std 1.0 and eps
  1e-6 the code's; its exponential decay of beta over epochs is
  `infopo_advantages`' ``decay``. Differences: a group of fewer than 2
  valid episodes gets A_out = 0 (the code: mean 0, std 1, so A_out = R)
  and gate std 1 as in the code; the intrinsic statistics count the tokens
  where IG is defined (the code: where the token reward is non-zero). With
  baseline_std >= 1 the cap never binds (A_int's spread is below 1 by
  construction); it acts for smaller floors. The paper was not read
  (no arXiv id in the catalog).

  Args:
    rewards_PG: [P, G] outcome rewards.
    ig_PGN: [P, G, N] information gain credited to action t
      (`infopo_information_gain`).
    ig_valid_PGN: [P, G, N] where IG_t is defined.
    turn_ids_PGT: [P, G, T] int turn ids.
    mask_PGT: [P, G, T] 1 on action tokens.
    sample_mask_PG: [P, G] validity (default all).
    beta: the intrinsic weight beta (>= 0).
    gate_temperature: the gate's temperature (> 0).
    baseline_std: the floor of the magnitude cap's target (> 0).
    eps: added to the stds.

  Returns:
    [P, G, T] float32 advantages, 0 off the action tokens.
  """
  checks.rank("rewards_PG", rewards_PG, 2, "[P, G]")
  _check_turns("ig_PGN", ig_PGN, rewards_PG)
  checks.same_shape(["ig_PGN", "ig_valid_PGN"], ig_PGN, ig_valid_PGN)
  checks.rank("turn_ids_PGT", turn_ids_PGT, 3, "[P, G, T]")
  checks.same_shape(["turn_ids_PGT", "mask_PGT"], turn_ids_PGT, mask_PGT)
  checks.leading_shape(
    "turn_ids_PGT", turn_ids_PGT, np.shape(rewards_PG), "rewards_PG"
  )
  checks.non_negative(beta=beta, eps=eps)
  checks.positive(gate_temperature=gate_temperature, baseline_std=baseline_std)
  return _infopo_fusion(
    rewards_PG,
    ig_PGN,
    ig_valid_PGN,
    turn_ids_PGT,
    mask_PGT,
    _valid(rewards_PG, sample_mask_PG),
    beta,
    gate_temperature,
    baseline_std,
    eps,
  )


def _infopo_fusion(
  rewards_PG,
  ig_PGN,
  ig_valid_PGN,
  turn_ids_PGT,
  mask_PGT,
  valid,
  beta,
  tau,
  floor,
  eps,
) -> jax.Array:
  """`infopo_advantages_of` after its checks (beta may be traced)."""
  mask = stats.f32(mask_PGT) * valid[..., None]
  r = jnp.where(valid > 0, stats.f32(rewards_PG), 0.0)
  a_out = advantages.grpo(r, valid, eps=eps)[..., None] * mask
  n = np.shape(ig_PGN)[-1]
  lengths = _turn_counts(turn_ids_PGT, mask, n)
  has = stats.f32(ig_valid_PGN) * stats.f32(lengths > 0)
  per_token = stats.safe_div(stats.f32(ig_PGN) * has, lengths)
  r_int = _on_actions(per_token, turn_ids_PGT, mask)
  in_int = _on_actions(has, turn_ids_PGT, mask)  # tokens with an IG
  mean = stats.masked_mean(r_int, in_int, axis=(1, 2), keepdims=True)
  std = stats.masked_std(r_int, in_int, axis=(1, 2), keepdims=True)
  a_int = in_int * (r_int - mean) / (std + eps)
  s_out = stats.masked_std(a_out, mask) + eps
  s_int = stats.masked_std(a_int, mask) + eps
  rho = jnp.minimum(1.0, jnp.maximum(s_out, floor) / s_int)
  group_std = stats.masked_std(r, valid, axis=-1)
  group_std = jnp.where(jnp.sum(valid, -1) >= 2, group_std, 1.0)
  gate = jax.nn.sigmoid(-group_std / tau)
  return a_out + beta * gate[:, None, None] * rho * a_int


class InfoPOState(NamedTuple):
  """The number of rollout batches seen (for beta's decay)."""

  step: jax.Array  # int32


def infopo_advantages(
  *,
  counterfactual: str = "infopo_cf_logp_PGT",
  logp: Optional[str] = None,
  num_turns: Optional[int] = None,
  beta: float = 0.5,
  decay: float = 0.0,
  gate_temperature: float = 0.5,
  baseline_std: float = 1.0,
  eps: float = 1e-6,
) -> Transform:
  """InfoPO: outcome GRPO plus the variance-gated information gain.

  Reads the counterfactual log-probs ``Batch.extra[counterfactual]``
  ([P, G, T], from `infopo_counterfactual_logprobs`: the Trainer runs it
  with the old-log-prob pass), the real-context log-probs
  ``Batch.old_logp_PGT`` (or ``Batch.extra[logp]``), ``turn_ids_PGT`` and
  the outcome reward; writes ``advantages_PGT`` (`infopo_advantages_of`).
  beta decays as beta exp(-decay k) after k rollout batches (the code's
  per-epoch decay, default off). N is ``num_turns`` or the last axis of
  ``Batch.extra["turn_rewards_PG"]``.
  """
  checks.non_negative(beta=beta, decay=decay, eps=eps)
  checks.positive(gate_temperature=gate_temperature, baseline_std=baseline_std)
  by = "infopo_advantages"

  def init():
    return InfoPOState(step=jnp.zeros((), jnp.int32))

  def prepare(batch: Batch, state: InfoPOState):
    _need_group(batch, by)
    if logp is None:
      batch.require("old_logp_PGT", by=by)
      real = batch.old_logp_PGT
    else:
      real = batch.get(logp, by=by)
    n = num_turns
    if n is None:
      n = _turn_array(batch, "turn_rewards_PG", by).shape[-1]
    turn_ids = batch.get("turn_ids_PGT", by=by)
    mask = batch.loss_mask()
    ig, ig_valid = infopo_information_gain(
      real, batch.get(counterfactual, by=by), turn_ids, mask, num_turns=n
    )
    weight = beta * jnp.exp(-decay * stats.f32(state.step))
    out = _infopo_fusion(
      sequence_rewards(batch),
      ig,
      ig_valid,
      turn_ids,
      mask,
      batch.samples(),
      weight,
      gate_temperature,
      baseline_std,
      eps,
    )
    return batch._replace(advantages_PGT=out), InfoPOState(state.step + 1)

  return Transform(init=init, prepare=prepare, apply=_keep_terms)


def infopo_counterfactual_logprobs(
  model,
  tokens_BL: ArrayLike,
  mask_BL: ArrayLike,
  turn_ids_BT: ArrayLike,
  action_mask_BT: ArrayLike,
  placeholder_ids: Sequence[int],
  *,
  num_turns: int,
  temperature: float = 1.0,
  schedule: str = "auto",
) -> tuple[jax.Array, jax.Array]:
  """InfoPO's counterfactual pass: each action's log-probs with the
  observation before it replaced by a placeholder.

  For each turn t < N - 1 the sequence is copied with observation t's
  tokens overwritten by ``placeholder_ids`` (cut to the observation's
  length, or extended by repeating its last token, so every later token
  keeps its position: the official code's `compute_batched_kl_divergence`),
  and the policy scores action t+1's tokens in that context. One forward
  pass per turn (a `jax.lax.scan`), plus one on the real sequences.

  Args:
    model: the policy (`rljax.models.Transformer`).
    tokens_BL: [B, L] prompt + completion tokens (the completion is the
      last T columns; prompts left-padded).
    mask_BL: [B, L] 1 on real tokens.
    turn_ids_BT: [B, T] int turn of each completion token, -1 on padding.
    action_mask_BT: [B, T] 1 on action tokens (0 on observations).
    placeholder_ids: the tokens of the placeholder text (the code's "No
      information found.", `INFOPO_PLACEHOLDER`), at least one.
    num_turns: N, the number of turns (max_turns).
    temperature: the sampling temperature (`rljax.models.token_logprobs`).
    schedule: the vocabulary projection (`rljax.models.token_logprobs`).

  Returns:
    (logp_BT, cf_logp_BT), float32: the completion's log-probs, and the
    same where, on the tokens of action k >= 1, the context has
    observation k - 1 replaced (equal to logp_BT on every other token).
    Reshape to [P, G, T] for `infopo_information_gain`.
  """
  # rljax.transforms imports without flax; the model code loads on use.
  from rljax.models import token_logprobs

  checks.rank("tokens_BL", tokens_BL, 2, "[B, L]")
  checks.same_shape(["tokens_BL", "mask_BL"], tokens_BL, mask_BL)
  checks.rank("turn_ids_BT", turn_ids_BT, 2, "[B, T]")
  checks.same_shape(
    ["turn_ids_BT", "action_mask_BT"], turn_ids_BT, action_mask_BT
  )
  _check_int("turn_ids_BT", turn_ids_BT)
  b, length = np.shape(tokens_BL)
  width = np.shape(turn_ids_BT)[-1]
  if np.shape(turn_ids_BT)[0] != b or width > length:
    raise ValueError(
      f"turn_ids_BT has shape {np.shape(turn_ids_BT)}; it must cover the"
      f" last T <= L columns of the {b} rows of tokens_BL"
      f" {np.shape(tokens_BL)}."
    )
  placeholder = np.asarray(placeholder_ids, np.int32).reshape(-1)
  if placeholder.size == 0:
    raise ValueError(
      "placeholder_ids is empty; pass the tokenized placeholder text, e.g."
      f" tokenizer.encode({INFOPO_PLACEHOLDER!r})."
    )
  if not isinstance(num_turns, int) or num_turns < 1:
    raise ValueError(f"num_turns must be an int >= 1; got {num_turns!r}.")
  tokens = jnp.asarray(tokens_BL, jnp.int32)
  mask = jnp.asarray(mask_BL)
  pad = ((0, 0), (length - width, 0))
  ids = jnp.pad(jnp.asarray(turn_ids_BT), pad, constant_values=-1)
  acts = jnp.pad(stats.f32(action_mask_BT), pad) > 0
  obs = (ids >= 0) & ~acts
  score = lambda x: token_logprobs(  # noqa: E731
    model, x, mask, temperature=temperature, schedule=schedule
  )[0]
  logp = score(tokens)
  fill = jnp.asarray(placeholder)

  def one_turn(cf, t):
    here = obs & (ids == t)
    rank = jnp.cumsum(here, axis=-1) - 1
    swapped = jnp.where(here, fill[jnp.clip(rank, 0, fill.size - 1)], tokens)
    nxt = acts & (ids == t + 1)
    return jnp.where(nxt, score(swapped), cf), None

  cf, _ = jax.lax.scan(one_turn, logp, jnp.arange(max(num_turns - 1, 0)))
  return logp[:, length - width :], cf[:, length - width :]


# ---------------------------------------------------------------------------
# PORTool: fork-relative advantages on tool-call trees.
# ---------------------------------------------------------------------------

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
    mask = batch.loss_mask()
    turn_ids = batch.get("turn_ids_PGT", by=by)
    adv = a_traj[..., None] * mask + coef * _on_actions(a_fork, turn_ids, mask)
    return batch._replace(advantages_PGT=adv)

  return stateless_prepare(fn)
