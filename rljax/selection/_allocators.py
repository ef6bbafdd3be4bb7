"""The literature's rollout allocators: how many samples each prompt of a
step gets, from what its earlier visits showed.

`Knapsack` (Knapsack RL), `GVM` (GVM-RAFT) and `XRPO` keep the prompts of
the `Shuffled` stream and split the step's budget of ``P * num_samples``
samples among them. Each keeps, per prompt, the outcome of its last visit
(the papers estimate a prompt's success rate from its previous epoch's or
pre-sampling stage's rollouts); a prompt not yet seen gets ``num_samples``,
the papers' uniform first pass. The pure allocation rules
(`knapsack_allocate`, `gvm_weights`, `xrpo_allocate`) are public so that a
reader can check them against the papers without a trainer.
"""

import abc
import dataclasses
import heapq
from typing import Optional

import numpy as np

from rljax.selection._base import SAMPLERS
from rljax.selection._base import Feedback
from rljax.selection._base import PromptSampler
from rljax.selection._base import Selection
from rljax.selection._base import Shuffled
from rljax.selection._base import State
from rljax.selection._base import allocate

# --- per-prompt outcome history, shared by the samplers ---------------------


def history_init(num_prompts: int) -> State:
  """Per-prompt outcome arrays of the last visit (all zero: unseen)."""
  zeros = np.zeros(num_prompts, np.float64)
  return {
    "visits": np.zeros(num_prompts, np.int64),
    "right": zeros,  # correct valid samples at the last visit
    "total": zeros.copy(),  # valid samples at the last visit
    "reward_std": zeros.copy(),  # their rewards' sample std (ddof 1)
    "right_length": zeros.copy(),  # mean length of the correct ones
  }


def history_update(state: State, feedback: Feedback) -> State:
  """`state` with the last-visit arrays of the prompts in `feedback`
  replaced (rows of one prompt within the batch are pooled)."""
  ids = np.asarray(feedback.prompt_ids, np.int64)
  valid = np.asarray(feedback.valid, bool)
  right = np.asarray(feedback.correct, bool) & valid
  rewards = np.where(valid, np.asarray(feedback.rewards, np.float64), 0.0)
  lengths = np.where(right, np.asarray(feedback.lengths, np.float64), 0.0)
  out = {k: np.array(state[k]) for k in history_init(0)}
  for i in np.unique(ids):
    rows = ids == i
    r_i = rewards[rows][valid[rows]]
    n_right = right[rows].sum()
    out["visits"][i] += 1
    out["right"][i] = n_right
    out["total"][i] = r_i.size
    out["reward_std"][i] = r_i.std(ddof=1) if r_i.size > 1 else 0.0
    out["right_length"][i] = lengths[rows].sum() / max(n_right, 1)
  return {**state, **out}


def last_success_rate(state: State, ids) -> np.ndarray:
  """Each prompt's success rate at its last visit; NaN if never seen."""
  right = np.asarray(state["right"], np.float64)[ids]
  total = np.asarray(state["total"], np.float64)[ids]
  return np.where(total > 0, right / np.maximum(total, 1), np.nan)


def _check_counts(num_samples: int, low: int, high: int) -> None:
  if not 1 <= low <= num_samples <= high:
    raise ValueError(
      f"need 1 <= min_samples <= num_samples <= max_samples_per_prompt; got"
      f" {low}, {num_samples}, {high}. Raise max_samples_per_prompt or lower"
      " min_samples."
    )


def _split_seen(p, budget: int, num_samples: int, high: int):
  """Unseen prompts (NaN) get `num_samples`; the rest of the budget is for
  the seen ones. Returns (counts with unseen filled, seen mask, budget)."""
  seen = ~np.isnan(p)
  counts = np.where(seen, 0, min(num_samples, high)).astype(np.int64)
  return counts, seen, budget - int(counts.sum())


def _spread(counts, order, left: int, high: int) -> int:
  """Hand `left` samples one at a time round-robin over `order` (index
  array), never above `high`; returns what could not be placed."""
  while left > 0:
    open_ = [i for i in order if counts[i] < high]
    if not open_:
      break
    for i in open_[:left]:
      counts[i] += 1
    left -= min(left, len(open_))
  return left


@dataclasses.dataclass(frozen=True)
class _Allocator(PromptSampler):
  """The `Shuffled` stream's prompts with each step's budget of
  ``P * num_samples`` samples split by `counts` from the per-prompt
  history (`history_update`); subclasses define `counts`."""

  num_samples: int = 8
  min_samples: int = 2
  max_samples_per_prompt: int = 32

  def __post_init__(self):
    _check_counts(
      self.num_samples, self.min_samples, self.max_samples_per_prompt
    )

  @property
  def max_samples(self) -> int:
    return self.max_samples_per_prompt

  def init(self, num_prompts: int, seed: int) -> State:
    state = Shuffled(self.num_samples).init(num_prompts, seed)
    return {**state, **history_init(num_prompts)}

  def select(self, state: State, step: int, size: int):
    chosen, state = Shuffled(self.num_samples).select(state, step, size)
    ids = chosen.prompt_ids
    counts = self.counts(
      state, ids, last_success_rate(state, ids), size * self.num_samples, step
    )
    return Selection(ids, np.asarray(counts, np.int32)), state

  @abc.abstractmethod
  def counts(
    self, state: State, ids, p: np.ndarray, budget: int, step: int
  ) -> np.ndarray:
    """[P] samples of prompts `ids` (success rates `p`, NaN unseen)."""

  def update(self, state: State, feedback: Feedback) -> State:
    return history_update(state, feedback)

  def _split(self, p, budget: int):
    """Unseen prompts get `num_samples`; (counts, seen mask, budget left)."""
    return _split_seen(p, budget, self.num_samples, self.max_samples)


# --- Knapsack RL ------------------------------------------------------------


def knapsack_value(num_samples, success_rate) -> np.ndarray:
  """Knapsack RL's value of giving a prompt N samples (arXiv 2509.25849):

    Value(N, p) = [1 - p^N - (1 - p)^N] * p (1 - p)^2,

  P(the group has both outcomes, so GRPO's gradient is non-zero) times
  InfoGain(p) ~ p (1 - p)^2. Broadcasts."""
  n = np.asarray(num_samples, np.float64)
  p = np.asarray(success_rate, np.float64)
  return (1 - p**n - (1 - p) ** n) * p * (1 - p) ** 2


def knapsack_allocate(
  success_rates,
  budget: int,
  *,
  low: int,
  high: int,
  unseen: Optional[int] = None,
  fallback_confidence: Optional[float] = 0.9,
) -> np.ndarray:
  """Knapsack RL's rollout counts (arXiv 2509.25849): N_i in [low, high]
  maximising sum_i Value(N_i, p_i) (`knapsack_value`) s.t. sum_i N_i <= B.

  Solved exactly by greedy marginal gains: Value(N + 1, p) - Value(N, p) =
  p (1 - p)^2 [p^N (1 - p) + (1 - p)^N p] is positive and decreasing in N
  for 0 < p < 1, so the objective is separable and concave and handing out
  samples one at a time to the largest marginal gain is optimal (the
  classical result for separable concave resource allocation; the paper
  solves the same problem by dynamic programming, which the tests use as
  the reference). Prompts with p in {0, 1} have zero value and get `low`;
  NaN rates (unseen prompts) get `unseen` and take no part.

  ``fallback_confidence`` c is the fallback of a public implementation
  (see `Knapsack`): informative prompts need about
  ceil(log(1 - c) / log(max(p, 1 - p))) samples to see both outcomes with
  probability c; when those needs (capped at `high`) leave budget over,
  the excess goes first to the never-solved (p = 0) prompts, the paper's
  "fallback" that lets hard prompts get large budgets. None turns it off. Any budget the knapsack cannot place (every
  informative prompt at `high`) is spread over the other prompts, p = 0
  first, so the sum is B whenever the caps allow.

  Args:
    success_rates: [P] estimated success rate of each prompt (NaN: unseen).
    budget: B, the total number of samples.
    low, high: the bounds on each N_i.
    unseen: the count of a NaN prompt (default `low`).
    fallback_confidence: c in (0, 1), or None.

  Returns:
    int32 [P] counts with sum <= B.
  """
  p = np.asarray(success_rates, np.float64)
  if not 1 <= low <= high:
    raise ValueError(f"need 1 <= low <= high; got low={low}, high={high}.")
  if fallback_confidence is not None and not 0 < fallback_confidence < 1:
    raise ValueError(
      f"fallback_confidence must be in (0, 1) or None; got"
      f" {fallback_confidence}."
    )
  known = ~np.isnan(p)
  if np.any((p[known] < 0) | (p[known] > 1)):
    raise ValueError("success_rates must lie in [0, 1] (NaN for unseen).")
  counts = np.where(known, low, np.clip(unseen or low, low, high))
  counts = counts.astype(np.int64)
  left = budget - int(counts.sum())
  if left < 0:
    raise ValueError(
      f"a budget of {budget} samples cannot give {p.size} prompts their"
      f" minimum ({low}, or unseen={unseen}); raise the budget."
    )
  useful = np.flatnonzero(known & (p > 0) & (p < 1))
  never = np.flatnonzero(known & (p == 0))
  if fallback_confidence is not None and left > 0 and never.size:
    q = np.maximum(p[useful], 1 - p[useful])
    need = np.ceil(np.log(1 - fallback_confidence) / np.log(q))
    need = int(np.clip(np.minimum(need, high) - low, 0, None).sum())
    if need < left:
      left = need + _spread(counts, never, left - need, high)
  heap = [(-_gain(counts[i], p[i]), int(i)) for i in useful if counts[i] < high]
  heapq.heapify(heap)
  while left > 0 and heap:
    _, i = heapq.heappop(heap)
    counts[i] += 1
    left -= 1
    if counts[i] < high:
      heapq.heappush(heap, (-_gain(counts[i], p[i]), i))
  rest = np.concatenate(
    [never, np.flatnonzero(~np.isin(np.arange(p.size), never))]
  )
  _spread(counts, rest, left, high)
  return counts.astype(np.int32)


def _gain(n: int, p: float) -> float:
  return float(knapsack_value(n + 1, p) - knapsack_value(n, p))


@dataclasses.dataclass(frozen=True)
class Knapsack(_Allocator):
  """Knapsack RL (arXiv 2509.25849): each step's budget of
  ``P * num_samples`` samples split by `knapsack_allocate`.

  Prompts come in `Shuffled` order; p_i is the prompt's success rate at
  its last visit (the paper uses the previous epoch's rollouts). Unseen
  prompts get ``num_samples``. Checked: the paper's abstract and its
  value function as summarised from the paper (InfoGain(p) ~ p (1 - p)^2)
  and as written in a public implementation of it
  (`sampling_budget_by_knapsack`, the ByteDance-style module found in the
  code corpus; its repository could not be identified, so "the code"
  below means that module), including its fallback. That code's dynamic
  programme counts a prompt's value only for samples above `low` (value
  0 at exactly `low`), which we do not copy: we maximise
  sum_i Value(N_i, p_i) as the paper writes it. The paper's bounds on N
  (it reports up to 93 samples) were not read; ours are arguments.
  """

  fallback_confidence: Optional[float] = 0.9

  def counts(self, state, ids, p, budget, step):
    del state, ids, step
    return knapsack_allocate(
      p,
      budget,
      low=self.min_samples,
      high=self.max_samples_per_prompt,
      unseen=self.num_samples,
      fallback_confidence=self.fallback_confidence,
    )


# --- GVM-RAFT ---------------------------------------------------------------


def gvm_weights(
  accept_rates, grad_norms, *, alpha: float = 1e-3, beta: float = 2.0
) -> np.ndarray:
  """GVM-RAFT's sample shares (arXiv 2505.02391), up to normalisation:

    n_i ∝ G_i / sqrt(p_i + alpha / p_i^(beta - 1)),

  with p_i the prompt's acceptance rate and G_i the norm of its accepted
  samples' log-likelihood gradient; 0 where p_i = 0 or G_i = 0. alpha = 0
  is the unregularised optimum n_i ∝ G_i / sqrt(p_i) of minimising the
  gradient variance sum_i G_i^2 / (n_i p_i) under sum_i n_i = N; the
  alpha / p^(beta - 1) term (official code, alpha 1e-3, beta 2) keeps
  rarely-accepted prompts from taking the whole budget."""
  p = np.asarray(accept_rates, np.float64)
  g = np.asarray(grad_norms, np.float64)
  if alpha < 0:
    raise ValueError(f"alpha must be >= 0; got {alpha}.")
  safe = np.where(p > 0, p, 1.0)
  w = g / np.sqrt(safe + alpha / safe ** (beta - 1))
  return np.where((p > 0) & (g > 0), w, 0.0)


@dataclasses.dataclass(frozen=True)
class GVM(_Allocator):
  """GVM-RAFT's dynamic sample allocation (arXiv 2505.02391), Algorithm 2
  run on the training stream: ``P * num_samples`` samples split in
  proportion to `gvm_weights` (largest remainders in [min_samples,
  max_samples_per_prompt]).

  The paper estimates p_i and G_i in a pre-sampling stage. Here p_i is
  the acceptance (correct) rate at the prompt's last visit, and an unseen
  prompt gets ``num_samples`` (a uniform first pass plays the
  pre-sampling stage). `Feedback` carries no gradient norms:
  ``gradient="constant"`` sets G_i = 1 (the allocation by acceptance rate
  alone); ``gradient="sqrt_length"`` uses G_i = sqrt(mean length of the
  accepted samples), a proxy for the official code's G_i (the norm of the
  gradient of the summed token log-probs, which grows like the square
  root of the length for weakly correlated token scores). Checked against
  the official code (RLHFlow/GVM, em/stage_2_calc_sample_size.py); the
  paper's Eq. 7 itself was not readable here.
  """

  min_samples: int = 1
  alpha: float = 1e-3
  beta: float = 2.0
  gradient: str = "constant"

  def __post_init__(self):
    super().__post_init__()
    if self.gradient not in ("constant", "sqrt_length"):
      raise ValueError(
        f"gradient must be 'constant' or 'sqrt_length'; got {self.gradient!r}."
      )

  def counts(self, state, ids, p, budget, step):
    del step
    counts, seen, budget = self._split(p, budget)
    if seen.any():
      g = np.ones(ids.size)
      if self.gradient == "sqrt_length":
        g = np.sqrt(np.asarray(state["right_length"], np.float64)[ids])
      w = gvm_weights(p[seen], g[seen], alpha=self.alpha, beta=self.beta)
      counts[seen] = allocate(w, budget, self.min_samples, self.max_samples)
    return counts


# --- XRPO -------------------------------------------------------------------


def xrpo_priority(
  reward_std,
  num_samples,
  step: int,
  *,
  confidence: float = 0.95,
  exploration: float = 0.1,
) -> np.ndarray:
  """XRPO's rollout priority (arXiv 2510.06672):

    h(n) = t_{1-a/2, n-1} s / sqrt(n)    (the t interval's half-width)
    Pi(n) = h(n) - h(n + 1) + lambda sqrt(log(1 + T) / n),

  the expected shrinkage of the confidence interval of the prompt's mean
  reward from one more rollout, plus an exploration bonus that grows with
  the training step T. ``confidence`` is 1 - a; ``exploration`` is
  lambda. Needs n >= 2."""
  s = np.asarray(reward_std, np.float64)
  n = np.asarray(num_samples, np.float64)
  if np.any(n < 2):
    raise ValueError("xrpo_priority needs num_samples >= 2 (a t interval).")
  # Imported here: scipy.stats takes about a second to import.
  from scipy import stats as scipy_stats  # pylint: disable=g-import-not-at-top

  q = 0.5 + confidence / 2
  h_n = scipy_stats.t.ppf(q, n - 1) * s / np.sqrt(n)
  h_next = scipy_stats.t.ppf(q, n) * s / np.sqrt(n + 1)
  return h_n - h_next + exploration * np.sqrt(np.log1p(step) / n)


def xrpo_allocate(
  reward_std,
  budget: int,
  step: int,
  *,
  low: int,
  high: int,
  confidence: float = 0.95,
  exploration: float = 0.1,
) -> np.ndarray:
  """XRPO's allocation: every prompt gets `low` (the base phase), then the
  rest of `budget` one rollout at a time to the prompt of largest
  `xrpo_priority` at its current count (ties: fewest samples, then lowest
  index), never above `high`. Returns int32 [P], sum <= budget."""
  s = np.asarray(reward_std, np.float64)
  if not 2 <= low <= high:
    raise ValueError(f"need 2 <= low <= high; got low={low}, high={high}.")
  if s.size * low > budget:
    raise ValueError(
      f"a budget of {budget} samples cannot give {s.size} prompts {low} each."
    )
  counts = np.full(s.size, low, np.int64)

  def key(i):
    pi = xrpo_priority(
      s[i], counts[i], step, confidence=confidence, exploration=exploration
    )
    return (-float(pi), int(counts[i]), int(i))

  heap = [key(i) for i in range(s.size) if low < high]
  heapq.heapify(heap)
  left = budget - int(counts.sum())
  while left > 0 and heap:
    _, _, i = heapq.heappop(heap)
    counts[i] += 1
    left -= 1
    if counts[i] < high:
      heapq.heappush(heap, key(i))
  return counts.astype(np.int32)


@dataclasses.dataclass(frozen=True)
class XRPO(_Allocator):
  """XRPO's adaptive rollout allocator (arXiv 2510.06672): the
  ``P * num_samples`` budget split by `xrpo_allocate`.

  The paper samples a base phase of rollouts per prompt, then hands out
  the rest in rounds by priority, re-estimating s from the samples so
  far. A sampler decides before sampling, so s is the sample std of the
  prompt's rewards at its last visit; unseen prompts get
  ``num_samples``. The t-interval half-width is the paper's as quoted by
  a review of it (the paper's own text beyond the abstract and the
  official code, UIUC-MLSys/XRPO, were not available here). The one-step
  reduction h(n) - h(n + 1) and the bonus lambda sqrt(log(1 + T) / n) are
  read from the catalog and a secondary description of the paper and are
  not verified, nor is the paper's default lambda.
  XRPO's in-context seeding is not part of this sampler; its advantage
  sharpening is `rljax.transforms.xrpo_novelty_advantages`.
  """

  confidence: float = 0.95
  exploration: float = 0.1

  def __post_init__(self):
    super().__post_init__()
    if self.min_samples < 2:
      raise ValueError(
        f"XRPO needs min_samples >= 2 (a t interval); got {self.min_samples}."
      )
    if not 0 < self.confidence < 1 or self.exploration < 0:
      raise ValueError(
        f"confidence must be in (0, 1) and exploration >= 0; got"
        f" {self.confidence}, {self.exploration}."
      )

  def counts(self, state, ids, p, budget, step):
    counts, seen, budget = self._split(p, budget)
    if seen.any():
      counts[seen] = xrpo_allocate(
        np.asarray(state["reward_std"], np.float64)[ids][seen],
        budget,
        step,
        low=self.min_samples,
        high=self.max_samples,
        confidence=self.confidence,
        exploration=self.exploration,
      )
    return counts


SAMPLERS["knapsack"] = Knapsack
SAMPLERS["gvm"] = GVM
SAMPLERS["xrpo"] = XRPO
