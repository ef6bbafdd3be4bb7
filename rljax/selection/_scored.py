"""Prompt samplers that choose *which* prompts a step samples from a score
of each prompt: MMR1's variance-aware sampling (`VAS`), V0's
predicted-success scheduling (`V0`) and VSPO's value-based swapping
(`VSPO`).

Both keep the `Shuffled` stream as their source of fresh prompts and a
per-prompt score learnt from the rollouts; randomness comes from
``np.random.default_rng([seed, draws])`` with a counter in the state, so a
selection is a pure function of the state.
"""

from collections.abc import Callable
import dataclasses
from typing import Optional

import numpy as np

from rljax.selection._base import SAMPLERS
from rljax.selection._base import Feedback
from rljax.selection._base import PromptSampler
from rljax.selection._base import Selection
from rljax.selection._base import Shuffled
from rljax.selection._base import State
from rljax.selection._base import allocate

# --- MMR1 variance-aware sampling -------------------------------------------


def vas_scores(
  success_rates, diversity=None, *, alpha: float = 1.0, beta: float = 0.0
) -> np.ndarray:
  """MMR1's Variance Promotion Score (arXiv 2509.21268):

    VPS(x) = alpha * OVS(x) + beta * TDS(x),   OVS = p (1 - p),

  the Bernoulli variance of the prompt's correctness (the official code's
  "learnability") plus a trajectory-diversity score TDS in [0, 1] (the
  code offers distinct-n, self-BLEU and edit distance of the completions).
  `diversity` None counts as TDS = 0."""
  p = np.asarray(success_rates, np.float64)
  tds = np.zeros_like(p) if diversity is None else np.asarray(diversity)
  return alpha * p * (1 - p) + beta * tds


def length_diversity(feedback: Feedback) -> np.ndarray:
  """[P] the fraction of distinct completion lengths among each prompt's
  valid samples: a trajectory-diversity score from what `Feedback`
  carries (completions of different lengths are different; the paper's
  token-level scores need the completions themselves)."""
  out = np.zeros(len(feedback.prompt_ids))
  for row, (lengths, valid) in enumerate(zip(feedback.lengths, feedback.valid)):
    kept = np.asarray(lengths)[np.asarray(valid, bool)]
    out[row] = np.unique(kept).size / max(kept.size, 1)
  return out


Diversity = None | str | Callable[[Feedback], np.ndarray]


@dataclasses.dataclass(frozen=True)
class VAS(PromptSampler):
  """MMR1's Variance-Aware Sampling (arXiv 2509.21268).

  Each step takes ``round(mixture * P)`` prompts drawn with replacement in
  proportion to their VPS (`vas_scores`) and the rest from the `Shuffled`
  stream, interleaved; every prompt gets ``num_samples``. VPS is learnt
  from the training rollouts: at each update a prompt's score becomes
  momentum * old + (1 - momentum) * VPS of its new group, and the drawing
  weights are a snapshot of the scores refreshed every ``update_every``
  steps. Unseen prompts score as p = 1/2 and TDS = 1.

  Checked against the official code (LengSicong/MMR1,
  verl/curriculum/samplers.py and the trainer's weight update): the
  mixture of weighted and shuffled draws (``mixture`` 0.5), the momentum
  (0.0) and the refresh period (4 steps) are its defaults, and its
  released config uses OVS alone (``alpha`` 1, ``beta`` 0). The code
  re-scores the whole training set with separate rollouts at each
  refresh; here a score changes only when its prompt is trained on.
  ``diversity``: None (TDS = 0), "lengths" (`length_diversity`) or a
  callable ``Feedback -> [P]`` in [0, 1] (the paper's token-level scores
  need the completions, which `Feedback` does not carry).
  """

  num_samples: int = 8
  mixture: float = 0.5
  alpha: float = 1.0
  beta: float = 0.0
  momentum: float = 0.0
  update_every: int = 4
  diversity: Diversity = None

  def __post_init__(self):
    if not 0 <= self.mixture <= 1 or not 0 <= self.momentum < 1:
      raise ValueError(
        f"mixture must be in [0, 1] and momentum in [0, 1); got"
        f" {self.mixture}, {self.momentum}."
      )
    if self.alpha < 0 or self.beta < 0 or self.alpha + self.beta == 0:
      raise ValueError(
        f"alpha and beta must be >= 0, not both 0; got {self.alpha},"
        f" {self.beta}."
      )
    if self.update_every < 1:
      raise ValueError(f"update_every must be >= 1; got {self.update_every}.")
    if not (self.diversity in (None, "lengths") or callable(self.diversity)):
      raise ValueError(
        "diversity must be None, 'lengths' or a callable Feedback -> [P];"
        f" got {self.diversity!r}."
      )

  @property
  def max_samples(self) -> int:
    return self.num_samples

  def init(self, num_prompts: int, seed: int) -> State:
    state = Shuffled(self.num_samples).init(num_prompts, seed)
    tds = 0.0 if self.diversity is None else 1.0
    first = float(vas_scores(0.5, tds, alpha=self.alpha, beta=self.beta))
    scores = np.full(num_prompts, first, np.float64)
    return {**state, "scores": scores, "weights": scores.copy(), "draws": 0}

  def select(self, state: State, step: int, size: int):
    weights = np.asarray(state["weights"], np.float64)
    if step % self.update_every == 0:
      weights = np.array(state["scores"], np.float64)
    k = int(round(self.mixture * size))
    rng = np.random.default_rng([int(state["seed"]), int(state["draws"])])
    total = weights.sum()
    probs = weights / total if total > 0 else None
    drawn = rng.choice(weights.size, size=k, replace=True, p=probs)
    stream, state = Shuffled(self.num_samples).select(state, step, size - k)
    ids = _interleave(drawn, stream.prompt_ids)
    counts = np.full(size, self.num_samples, np.int32)
    state = {**state, "weights": weights, "draws": int(state["draws"]) + 1}
    return Selection(ids, counts), state

  def update(self, state: State, feedback: Feedback) -> State:
    ids = np.asarray(feedback.prompt_ids, np.int64)
    valid = np.asarray(feedback.valid, bool)
    right = (np.asarray(feedback.correct, bool) & valid).sum(-1)
    p = right / np.maximum(valid.sum(-1), 1)
    tds = None
    if self.diversity == "lengths":
      tds = length_diversity(feedback)
    elif callable(self.diversity):
      tds = np.asarray(self.diversity(feedback), np.float64)
    new = vas_scores(p, tds, alpha=self.alpha, beta=self.beta)
    scores = np.array(state["scores"], np.float64)
    for i, v in zip(ids, new):  # a prompt drawn twice: the later row wins
      scores[i] = self.momentum * scores[i] + (1 - self.momentum) * v
    return {**state, "scores": scores}


def _interleave(a, b) -> np.ndarray:
  """a0, b0, a1, b1, ... then the longer one's tail (the code's order)."""
  out = []
  for i in range(max(len(a), len(b))):
    out += [a[i]] if i < len(a) else []
    out += [b[i]] if i < len(b) else []
  return np.asarray(out, np.int64)


# --- V0 ---------------------------------------------------------------------


def beta_mean(prompt_id: int, history: State, prior: float = 1.0) -> float:
  """The default V0 predictor: the Beta(prior + right, prior + wrong)
  posterior mean of the prompt's success rate over all its visits."""
  right = float(history["right_total"][prompt_id])
  wrong = float(history["wrong_total"][prompt_id])
  return (prior + right) / (2 * prior + right + wrong)


def v0_keep(p_hat, num_samples: int, skip_above: float) -> np.ndarray:
  """Whether a prompt is worth sampling: the predicted probability that
  all `num_samples` outcomes agree, p^G + (1 - p)^G, is at most
  `skip_above` (V0 skips predicted all-pass and all-fail prompts)."""
  p = np.asarray(p_hat, np.float64)
  return p**num_samples + (1 - p) ** num_samples <= skip_above


@dataclasses.dataclass(frozen=True)
class V0(PromptSampler):
  """V0's budget scheduling (arXiv 2602.03584): predict each candidate
  prompt's success rate before rollout, skip the predicted all-pass and
  all-fail ones, and split the budget toward high p^(1 - p^).

  Each step reads ``pool * P`` candidates from the `Shuffled` stream (the
  skipped ones are consumed), keeps the first P that `v0_keep` accepts
  (too few: the rest by largest p^(1 - p^)), and splits ``P *
  num_samples`` samples in proportion to p^(1 - p^) (`allocate`, within
  [min_samples, max_samples_per_prompt]).

  ``predictor(prompt_id, history) -> p^`` is the value model; V0 itself
  is a trained generalist model conditioned on the policy's
  (instruction, performance) history, which rljax does not ship. The
  default, `beta_mean`, is the Beta posterior mean of the prompt's own
  history. ``history`` is the sampler state: per-prompt arrays
  ``right_total`` and ``wrong_total`` (all visits) and the prompt's
  ``visits``. The abstract's mechanism (predict before rollout, allocate
  the budget) is verified; the skip rule and the p^(1 - p^) shares are
  the catalog's reading and are not verified against the paper.
  """

  num_samples: int = 8
  min_samples: int = 2
  max_samples_per_prompt: int = 16
  pool: int = 2
  skip_above: float = 0.9
  predictor: Optional[Callable[[int, State], float]] = None

  def __post_init__(self):
    if (
      not 1
      <= self.min_samples
      <= self.num_samples
      <= (self.max_samples_per_prompt)
    ):
      raise ValueError(
        "need 1 <= min_samples <= num_samples <= max_samples_per_prompt;"
        f" got {self.min_samples}, {self.num_samples},"
        f" {self.max_samples_per_prompt}."
      )
    if self.pool < 1 or not 0 < self.skip_above <= 1:
      raise ValueError(
        f"pool must be >= 1 and skip_above in (0, 1]; got {self.pool},"
        f" {self.skip_above}."
      )

  @property
  def max_samples(self) -> int:
    return self.max_samples_per_prompt

  def init(self, num_prompts: int, seed: int) -> State:
    state = Shuffled(self.num_samples).init(num_prompts, seed)
    zeros = np.zeros(num_prompts, np.float64)
    return {
      **state,
      "right_total": zeros,
      "wrong_total": zeros.copy(),
      "visits": np.zeros(num_prompts, np.int64),
    }

  def predict(self, state: State, ids) -> np.ndarray:
    """p^ of each prompt in `ids` (the predictor, checked to be in [0, 1])."""
    fn = self.predictor or beta_mean
    p = np.asarray([fn(int(i), state) for i in ids], np.float64)
    if np.any(~np.isfinite(p) | (p < 0) | (p > 1)):
      raise ValueError(
        "V0's predictor returned values outside [0, 1]; it must return the"
        " predicted success rate of the prompt."
      )
    return p

  def select(self, state: State, step: int, size: int):
    pool, state = Shuffled(self.num_samples).select(
      state, step, self.pool * size
    )
    p = self.predict(state, pool.prompt_ids)
    keep = v0_keep(p, self.num_samples, self.skip_above)
    spare = np.flatnonzero(~keep)
    spare = spare[np.argsort(-(p[spare] * (1 - p[spare])), kind="stable")]
    rows = np.concatenate([np.flatnonzero(keep), spare])[:size]
    rows = np.sort(rows)  # stream order
    counts = allocate(
      p[rows] * (1 - p[rows]),
      size * self.num_samples,
      self.min_samples,
      self.max_samples_per_prompt,
    )
    return Selection(pool.prompt_ids[rows], counts), state

  def update(self, state: State, feedback: Feedback) -> State:
    right_total = np.array(state["right_total"], np.float64)
    wrong_total = np.array(state["wrong_total"], np.float64)
    visits = np.array(state["visits"], np.int64)
    valid = np.asarray(feedback.valid, bool)
    right = (np.asarray(feedback.correct, bool) & valid).sum(-1)
    ids = np.asarray(feedback.prompt_ids, np.int64)
    np.add.at(right_total, ids, right)
    np.add.at(wrong_total, ids, valid.sum(-1) - right)
    np.add.at(visits, ids, 1)
    return {
      **state,
      "right_total": right_total,
      "wrong_total": wrong_total,
      "visits": visits,
    }


# --- VSPO -------------------------------------------------------------------


def vspo_value(success_rates, *, difficulty: float = 1.0) -> np.ndarray:
  """VSPO's task value (arXiv 2512.07478), as we read it:

    v(q) = p (1 - p) * (1 - p)^difficulty,

  the outcome variance (uncertainty) weighted toward hard prompts; 0 at
  p in {0, 1}. The paper's exact metric was not available: this is the
  catalog's reading ("p(1 - p) combined with difficulty"). An AI-written
  summary of the paper (a secondary source, not checked against it) gives
  another form, V = (R_max - mean) * std of the prompt's rollout rewards;
  not adopted here."""
  p = np.asarray(success_rates, np.float64)
  return p * (1 - p) * (1 - p) ** difficulty


@dataclasses.dataclass(frozen=True)
class VSPO(PromptSampler):
  """VSPO's value-based prompt swapping (arXiv 2512.07478).

  Prompts come in `Shuffled` order. A prompt whose last group had one
  outcome only (all right or all wrong: zero GRPO advantage, the
  "low-value samples" VSPO replaces) is swapped for the prompt of highest
  `vspo_value` among those seen so far whose last group was informative
  and that are not already in the batch (ties: lowest id); when there are
  none left, the prompt stays. p is the prompt's success rate at its last
  visit. Every prompt gets ``num_samples``.

  Checked: the abstract's mechanism (replace zero-advantage samples by
  prompts chosen by a task value balancing difficulty and uncertainty).
  Not verified: the value metric (`vspo_value` is the catalog's reading)
  and when the swap happens (the paper may resample after the rollout;
  a sampler must decide before it, so it uses the last visit). VSPO's
  value-smoothing clipping is not implemented: its form was not
  available (the arXiv HTML pages of v1 and v2 in the stored pages gave
  only the abstract; no official code was found; one secondary summary
  describes it only in words, as damping the advantages of high-value
  prompts sampled again and again).
  """

  num_samples: int = 8
  difficulty: float = 1.0

  def __post_init__(self):
    if self.difficulty < 0:
      raise ValueError(f"difficulty must be >= 0; got {self.difficulty}.")

  @property
  def max_samples(self) -> int:
    return self.num_samples

  def init(self, num_prompts: int, seed: int) -> State:
    state = Shuffled(self.num_samples).init(num_prompts, seed)
    zeros = np.zeros(num_prompts, np.float64)
    return {**state, "right": zeros, "total": zeros.copy()}

  def select(self, state: State, step: int, size: int):
    chosen, state = Shuffled(self.num_samples).select(state, step, size)
    ids = np.array(chosen.prompt_ids)
    right = np.asarray(state["right"], np.float64)
    total = np.asarray(state["total"], np.float64)
    p = right / np.maximum(total, 1)
    informative = (total > 0) & (right > 0) & (right < total)
    constant = (total[ids] > 0) & ~informative[ids]
    value = np.where(informative, vspo_value(p, difficulty=self.difficulty), -1)
    value[ids] = -1  # never swap in a prompt already in the batch
    order = np.lexsort((np.arange(value.size), -value))
    order = order[value[order] > 0][: int(constant.sum())]
    ids[np.flatnonzero(constant)[: order.size]] = order
    counts = np.full(size, self.num_samples, np.int32)
    return Selection(ids.astype(np.int64), counts), state

  def update(self, state: State, feedback: Feedback) -> State:
    right = np.array(state["right"], np.float64)
    total = np.array(state["total"], np.float64)
    valid = np.asarray(feedback.valid, bool)
    hits = (np.asarray(feedback.correct, bool) & valid).sum(-1)
    for i, r, n in zip(feedback.prompt_ids, hits, valid.sum(-1)):
      right[i], total[i] = r, n  # the last visit
    return {**state, "right": right, "total": total}


SAMPLERS["vas"] = VAS
SAMPLERS["v0"] = V0
SAMPLERS["vspo"] = VSPO
