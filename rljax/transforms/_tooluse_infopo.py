"""InfoPO: the information gain of an observation for the next action.

Conventions (turn ids, action mask, [P, G, N] turn arrays) as in
`rljax.transforms._tooluse`, whose helpers this module shares.
"""

from collections.abc import Sequence
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
from rljax.transforms._advantages import _need_group
from rljax.transforms._advantages import sequence_rewards
from rljax.transforms._tooluse import _check_int
from rljax.transforms._tooluse import _check_turns
from rljax.transforms._tooluse import _on_actions
from rljax.transforms._tooluse import _turn_array
from rljax.transforms._tooluse import _turn_counts
from rljax.transforms._tooluse import _valid

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
    Read against its official code (not run), kfq20/InfoPO
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

  What was read (not run): the official code (kfq20/InfoPO,
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
