"""Batch stages whose state learns across rollout batches: RiskPO's tracked
quantiles, HAPO's per-prompt history and a length-budget curriculum.

The state is an ordinary pytree (jitted, replicated, checkpointed with the
algorithm state). `prepare` runs once per rollout batch on the whole batch,
so micro-batching does not change these stages.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats
from rljax._src.base import Batch
from rljax._src.base import Transform
from rljax._src.base import _keep_terms
from rljax._src.tables import PromptTable

# ---------------------------------------------------------------------------
# RiskPO (arXiv 2510.00911): bundles, Mixed Value-at-Risk, quantile tracking.
# ---------------------------------------------------------------------------


def bundle_scores(
  rewards_PG: ArrayLike, perm_PG: ArrayLike, bundle_size: int
) -> jax.Array:
  """RiskPO bundle scores [ceil(P/B), G].

  Prompts ``b*B .. b*B+B-1`` form bundle b (the last one may be smaller);
  bundle b's j-th score is ``R_{b,j} = sum_{p in b} r[p, perm[p, j]]``, one
  response per question, each response used once.
  """
  r = stats.f32(rewards_PG)
  p, g = r.shape
  permuted = jnp.take_along_axis(r, jnp.asarray(perm_PG), axis=-1)
  num = -(-p // bundle_size)
  # Bundle membership as a [P, bundles] matrix: no padding or scatter, so
  # the sum works on prompts sharded over a mesh.
  member = jnp.arange(p)[:, None] // bundle_size == jnp.arange(num)[None]
  return jnp.einsum("pn,pg->ng", member.astype(jnp.float32), permuted)


def mvar_advantages(
  scores: ArrayLike,
  q_low: ArrayLike,
  q_high: ArrayLike,
  *,
  alpha: float = 0.2,
  beta: float = 0.8,
  omega: float = 0.5,
) -> jax.Array:
  """RiskPO's Mixed Value-at-Risk advantage of bundle scores R.

      A_rvar = [(R - q_a)+ - (R - q_b)+ + q_a - q_b] / (b - a)
      A_cvar = -(q_a - R)+ / a
      A      = (omega * A_cvar + A_rvar) / (omega + 1)

  with q_a, q_b the alpha- and beta-quantiles of the bundle scores
  (broadcast against `scores`). ``omega = 0`` is the pure range-VaR
  advantage. A never rewards R above q_b: solved bundles get A = 0, the
  lower tail gets the steepest slope.

  References:
    Ren et al., "RiskPO: Risk-based Policy Optimization via Verifiable
    Reward for LLM Post-Training", arXiv 2510.00911 (the MVaR objective and
    its bundle advantage).
    Checked: against RTkenny/RiskPO `verl/trainer/ppo/core_algos.py::
    compute_grpo_bundle_rvar_outcome_advantage_quantile_tracking`
    (natural_baseline_adv, use_mixing_risk_measure with w_mix = omega);
    the code adds eps = 1e-6 to both denominators, we do not. The paper's
    equation numbers were not read.
  """
  r = stats.f32(scores)
  qa, qb = stats.f32(q_low), stats.f32(q_high)
  rvar = (jax.nn.relu(r - qa) - jax.nn.relu(r - qb) + qa - qb) / (beta - alpha)
  cvar = -jax.nn.relu(qa - r) / alpha
  return (omega * cvar + rvar) / (omega + 1.0)


def track_quantiles(
  q: ArrayLike, levels: ArrayLike, scores: ArrayLike, *, lr: float
) -> jax.Array:
  """One SGD step of the pinball loss: ``q <- q - lr (F_n(q) - level)``,
  ``F_n(q)`` the fraction of `scores` strictly below q (RiskPO's online
  quantile tracking; the official code uses SGD with lr_q = 0.1)."""
  x = stats.f32(scores).reshape(-1)
  below = jnp.mean(x[None, :] < stats.f32(q)[:, None], axis=-1)
  return stats.f32(q) - lr * (below - stats.f32(levels))


class RiskPOState(NamedTuple):
  """Tracked quantiles [q_alpha, q_beta] of the bundle scores."""

  quantiles: jax.Array  # float32 [2]
  initialized: jax.Array  # int32 scalar: 0 before the first batch


_RISKPO_MODES = ("tracked", "batch", "mix")


def riskpo_advantages(
  *,
  bundle_size: int = 5,
  alpha: float = 0.2,
  beta: float = 0.8,
  omega: float = 0.5,
  lr: float = 0.1,
  quantiles: str = "tracked",
  scale_by_std: bool = False,
) -> Transform:
  """RiskPO advantages over random bundles, with tracked quantiles.

  Per batch: shuffle each prompt's G samples with the stage's PRNG key,
  form B-prompt bundles (`bundle_scores`), give every response of bundle
  score R_{b,j} the advantage `mvar_advantages`(R_{b,j}), then move the
  tracked quantiles one `track_quantiles` step on the batch's scores. The
  first batch initialises them to its empirical quantiles (as the official
  code's warm-up).

  Args:
    bundle_size: B questions per bundle (paper: 5).
    alpha, beta: the quantile levels (paper: 0.2 and 0.8; the official run
      script uses 0.2 and 0.9).
    omega: the CVaR weight (paper: 0.5; the script's w_mix is 1.5).
    lr: quantile-tracking step (official code: 0.1).
    quantiles: "tracked" (the paper: the tracked quantiles, before this
      batch's update), "batch" (each bundle's empirical quantiles over its G
      scores: what the official code computes in effect, since its tracked
      values never reach the advantage), or "mix" (their mean, the code's
      default mode).
    scale_by_std: divide by each bundle's score std (ddof 1, +1e-6), the
      code's ``norm_adv_by_std_in_grpo``; off by default (not in the
      paper's formula).

  Invalid samples (``sample_mask_PG``) count reward 0 in their bundle and
  get advantage 0. Needs ``Algorithm.prepare(..., key=...)``.
  """
  checks.positive(bundle_size=bundle_size, lr=lr)
  checks.non_negative(omega=omega)
  if not 0 < alpha < beta < 1:
    raise ValueError(
      f"riskpo_advantages needs 0 < alpha < beta < 1; got alpha={alpha},"
      f" beta={beta}."
    )
  checks.one_of("quantiles", quantiles, _RISKPO_MODES)
  levels = jnp.asarray([alpha, beta], jnp.float32)

  def init():
    return RiskPOState(jnp.zeros((2,), jnp.float32), jnp.zeros((), jnp.int32))

  def prepare(batch: Batch, state: RiskPOState):
    batch.require("rewards_PG", by="riskpo_advantages")
    key = batch.require_key(by="riskpo_advantages")
    p, g = batch.shape[:2]
    valid = batch.samples()
    rewards = jnp.where(valid > 0, stats.f32(batch.rewards_PG), 0.0)
    perm = jnp.argsort(jax.random.uniform(key, (p, g)), axis=-1)
    scores = bundle_scores(rewards, perm, bundle_size)  # [nb, G]
    first = jnp.quantile(scores.reshape(-1), levels)
    tracked = jnp.where(state.initialized > 0, state.quantiles, first)
    per_bundle = jnp.quantile(scores, levels, axis=-1).T  # [nb, 2]
    q = {
      "tracked": tracked[None, :],
      "batch": per_bundle,
      "mix": (tracked[None, :] + per_bundle) / 2,
    }[quantiles]
    adv = mvar_advantages(
      scores, q[:, :1], q[:, 1:], alpha=alpha, beta=beta, omega=omega
    )
    if scale_by_std:
      adv = adv / (jnp.std(scores, axis=-1, ddof=1, keepdims=True) + 1e-6)
    adv_P = jnp.repeat(adv, bundle_size, axis=0)[:p]  # paper j of prompt p
    inverse = jnp.argsort(perm, axis=-1)
    adv_PG = jnp.take_along_axis(adv_P, inverse, axis=-1) * valid
    stepped = track_quantiles(tracked, levels, scores, lr=lr)
    state = RiskPOState(stepped, jnp.ones((), jnp.int32))
    batch = batch._replace(advantages_PGT=adv_PG[..., None] * batch.loss_mask())
    return batch, state

  return Transform(init, prepare, _keep_terms)


# ---------------------------------------------------------------------------
# HAPO, history-aware length reward (arXiv 2505.11225).
# ---------------------------------------------------------------------------


def history_length_reward(
  lengths: ArrayLike,
  history: ArrayLike,
  correct: ArrayLike,
  has_history: ArrayLike,
  *,
  correct_floor: float = -0.7,
) -> jax.Array:
  """HAPO's length reward against the shortest correct length so far.

      f(l, h)  = cos(min(l / h, 2) * pi / 2)      (1 at l = 0, 0 at l = h,
                                                   -1 from l = 2h on)
      r_len    = max(correct_floor, f)  for correct responses,
               = min(0, f)              for incorrect ones,
               = 0                      where the prompt has no history.

  Correct answers shorter than the record are rewarded, longer ones are
  penalised down to `correct_floor` (so a correct answer, 1 - 0.7, still
  beats any incorrect one, <= 0); short incorrect answers are not
  rewarded but also not penalised, which keeps exploration open.

  References:
    Huang, Zhang and Cardie, "HAPO: Training Language Models to Reason
    Concisely via History-Aware Policy Optimization", arXiv 2505.11225
    (the cosine length reward).
    Checked: against HCY123902/HAPO `utils.py::compute_len_reward` (type
    "cosine", the default; -0.7 floor for correct answers) and
    `grpo_trainer.py::combined_reward_func` (R = r_corr + w r_len, w_lr =
    1; h <- min(h, correct lengths of the batch) after scoring the batch).
    The paper's equation numbering was not read.
  """
  checks.same_shape(["lengths", "correct"], lengths, correct)
  h = stats.f32(history)
  ratio = stats.safe_div(stats.f32(lengths), h)
  f = jnp.cos(jnp.minimum(ratio, 2.0) * (math.pi / 2))
  r = jnp.where(
    jnp.asarray(correct) != 0,
    jnp.maximum(correct_floor, f),
    jnp.minimum(0.0, f),
  )
  return jnp.where((jnp.asarray(has_history) != 0) & (h > 0), r, 0.0)


def hapo_history_rewards(
  num_prompts: int,
  *,
  weight: float = 1.0,
  correct_threshold: float = 1.0,
  correct_floor: float = -0.7,
) -> Transform:
  """HAPO: ``rewards_PG += weight * r_len`` with a per-prompt history.

  The state is a `PromptTable` of the shortest correct length seen for each
  prompt (``Batch.prompt_ids_P``). Each batch is rewarded against the
  history before it, then the history takes the minimum of the batch's
  correct lengths (in completion tokens). A sample is correct where
  ``rewards_PG >= correct_threshold`` (put this stage right after the
  verifier's reward, before other shaping).

  Args:
    num_prompts: the size of the table (``len(task.train)``).
    weight: w of R = r_correct + w r_len (official code: 1.0).
    correct_threshold: what counts as correct.
    correct_floor: the lowest length reward of a correct answer (-0.7).
  """
  checks.positive(num_prompts=num_prompts)

  def init():
    return PromptTable.create(num_prompts, fill=0.0)

  def prepare(batch: Batch, table: PromptTable):
    batch.require("rewards_PG", "prompt_ids_P", by="hapo_history_rewards")
    valid = batch.samples() > 0
    lengths = stats.sequence_lengths(batch.mask_PGT)
    correct = (stats.f32(batch.rewards_PG) >= correct_threshold) & valid
    history, seen = table.lookup(batch.prompt_ids_P)
    r_len = history_length_reward(
      lengths,
      history[:, None],
      correct,
      seen[:, None],
      correct_floor=correct_floor,
    )
    rewards = stats.f32(batch.rewards_PG) + weight * r_len * valid
    # The new record: min over this batch's correct lengths of every row
    # with the same prompt id (so duplicate ids store the same value).
    best = jnp.min(jnp.where(correct, lengths, jnp.inf), axis=-1)
    ids = jnp.asarray(batch.prompt_ids_P)
    same = ids[:, None] == ids[None, :]
    best = jnp.min(jnp.where(same, best[None, :], jnp.inf), axis=-1)
    old = jnp.where(seen > 0, history, jnp.inf)
    new = jnp.minimum(old, best)
    table = table.store(
      ids, jnp.where(jnp.isfinite(new), new, 0.0), best < jnp.inf
    )
    return batch._replace(rewards_PG=rewards), table

  return Transform(init, prepare, _keep_terms)


# ---------------------------------------------------------------------------
# Train Long, Think Short (arXiv 2508.08940): a decaying token budget.
# ---------------------------------------------------------------------------

_SCHEDULES = ("exponential", "linear")
_LENGTH_SHAPES = ("within", "triangular")


def budget_schedule(
  step: ArrayLike,
  *,
  initial: float,
  final: float,
  decay: float = 0.5,
  interval: int = 1,
  schedule: str = "exponential",
  steps: int = 100,
) -> jax.Array:
  """The token budget B_t after `step` rollout batches.

  exponential: ``B_t = max(final, initial * decay ** floor(t / interval))``
  (the paper's ``B(t) = max(1, B_0 gamma^floor(t/T))``, floored at `final`);
  linear: ``B_t = max(final, initial - (initial - final) * floor(t /
  interval) * interval / steps)``, reaching `final` after `steps` batches.
  """
  checks.one_of("schedule", schedule, _SCHEDULES)
  k = jnp.floor(stats.f32(step) / interval)
  if schedule == "exponential":
    budget = initial * jnp.power(jnp.float32(decay), k)
  else:
    budget = initial - (initial - final) * k * interval / steps
  return jnp.maximum(jnp.float32(final), budget)


def budget_length_reward(
  lengths: ArrayLike, budget: ArrayLike, *, shape: str = "within"
) -> jax.Array:
  """g(L, B), the length-efficiency term, in [0, 1].

  within (default): ``1`` for L <= B, then ``max(0, 1 - (L - B) / B)``
  (full credit inside the budget, none from 2B on).
  triangular: ``max(0, 1 - |L - B| / B)`` (peaks at the budget).

  Not verified: the paper's exact g was not found (only that the reward
  balances correctness, length efficiency against the current budget and
  format); both shapes are our choice.
  """
  checks.one_of("shape", shape, _LENGTH_SHAPES)
  length, b = stats.f32(lengths), stats.f32(budget)
  over = stats.safe_div(length - b, b)
  if shape == "within":
    return jnp.clip(1.0 - jnp.maximum(over, 0.0), 0.0, 1.0)
  return jnp.clip(1.0 - jnp.abs(over), 0.0, 1.0)


class BudgetState(NamedTuple):
  """The number of rollout batches seen (the curriculum step)."""

  step: jax.Array  # int32: rollout batches seen


def length_budget_curriculum(
  *,
  initial: float = 256.0,
  final: float = 87.0,
  decay: float = 0.5,
  interval: int = 1,
  schedule: str = "exponential",
  steps: int = 100,
  weight: float = 1.0,
  shape: str = "within",
) -> Transform:
  """Train Long, Think Short: ``rewards_PG += weight * g(L, B_t)``.

  The state counts `prepare` calls (rollout batches); B_t follows
  `budget_schedule`, g is `budget_length_reward` of the completion length in
  tokens. The paper's r = w_c correct + w_l g(L, B_t) + w_f format: give
  the task's correctness and format rewards their weights w_c, w_f in the
  reward spec and w_l here.

  Defaults: B_0 = 256 (the paper's starting budget); the final budget,
  decay and interval are placeholders to set for a run (the paper's decay
  ablation was not read; "not verified"). The sampler's generation budget
  follows the same schedule with a `rljax.selection.Stages` prompt sampler
  (configs/train_long_think_short.py, preset ``tlts``).

  References:
    Hammoud et al., "Train Long, Think Short: Curriculum Learning for
    Efficient Reasoning", arXiv 2508.08940 (the budget schedule
    B(t) = max(1, B_0 gamma^floor(t/T)) and the three-term reward).
  """
  checks.positive(initial=initial, final=final, interval=interval, steps=steps)
  checks.positive(decay=decay)
  checks.one_of("schedule", schedule, _SCHEDULES)
  checks.one_of("shape", shape, _LENGTH_SHAPES)

  def prepare(batch: Batch, state: BudgetState):
    batch.require("rewards_PG", by="length_budget_curriculum")
    budget = budget_schedule(
      state.step,
      initial=initial,
      final=final,
      decay=decay,
      interval=interval,
      schedule=schedule,
      steps=steps,
    )
    lengths = stats.sequence_lengths(batch.mask_PGT)
    g = budget_length_reward(lengths, budget, shape=shape)
    rewards = stats.f32(batch.rewards_PG) + weight * g * batch.samples()
    return batch._replace(rewards_PG=rewards), BudgetState(state.step + 1)

  return Transform(
    lambda: BudgetState(jnp.zeros((), jnp.int32)), prepare, _keep_terms
  )
