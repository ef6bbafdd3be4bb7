"""Single-stream SPO's prioritized prompt sampler (arXiv 2509.13232).

Each prompt keeps a discounted Beta(alpha, beta) tracker of its success
rate, p_hat = alpha / (alpha + beta); a step's prompts are drawn with
probability proportional to the priority w = sqrt(p_hat (1 - p_hat)) +
epsilon, which favours the prompts whose outcome is least certain (those
whose advantage carries the most signal) and, through epsilon, keeps every
prompt in play. The advantage side of SPO is
`rljax.transforms.single_stream_advantages`, which keeps the same tracker on
the device.
"""

from collections.abc import Sequence
import dataclasses
from typing import Optional

import numpy as np

from rljax.selection._base import SAMPLERS
from rljax.selection._base import Feedback
from rljax.selection._base import PromptSampler
from rljax.selection._base import Selection
from rljax.selection._base import Shuffled
from rljax.selection._base import State


def single_stream_prior(
  num_prompts: int,
  successes: Optional[Sequence[float]] = None,
  trials: Optional[Sequence[float]] = None,
  *,
  weight: float = 8.0,
  prior: float = 0.5,
) -> np.ndarray:
  """SPO's initial tracker, [num_prompts, 2] float64 (alpha_0, beta_0).

  Without offline estimates every prompt starts at alpha = beta = `prior`
  (0.5, the official code's ``offline_N = 0``: p_hat = 1/2). With them,
  prompt x of s successes in n offline samples starts at

      p_0 = (s + 1/2) / (n + 1),  alpha_0 = N_0 p_0,  beta_0 = N_0 (1 - p_0)

  (the Jeffreys-smoothed success rate with the weight N_0 = `weight` of
  N_0 observations; the official code uses N_0 = 1 / (1 - rho_min) = 8 for
  rho_min = 0.875, the tracker's longest memory). Prompts with n = 0 start
  at `prior`.

  Args:
    num_prompts: the training set's size.
    successes: [num_prompts] successful offline samples of each prompt.
    trials: [num_prompts] offline samples of each prompt (with
      `successes`).
    weight: N_0, the offline estimate's worth in observations.
    prior: alpha = beta of a prompt without offline samples.

  References:
    Xu and Ding, "Single-stream Policy Optimization", arXiv 2509.13232; the
    formula is the official code's (verl-project/verl-recipe
    `spo/spo_ray_trainer.py`, ``fit``), which uses the configured
    ``offline_N`` as n even where a prompt has fewer scores; we use each
    prompt's own count.
  """
  if int(num_prompts) < 1:
    raise ValueError(f"num_prompts={num_prompts}; the training set is empty.")
  if not weight > 0 or not prior > 0:
    raise ValueError(f"weight and prior must be > 0; got {weight}, {prior}.")
  out = np.full((int(num_prompts), 2), float(prior), np.float64)
  if successes is None and trials is None:
    return out
  if successes is None or trials is None:
    raise ValueError(
      "single_stream_prior needs both successes and trials (offline"
      " successes and samples per prompt), or neither."
    )
  s = np.asarray(successes, np.float64)
  n = np.asarray(trials, np.float64)
  if s.shape != (num_prompts,) or n.shape != (num_prompts,):
    raise ValueError(
      f"successes {s.shape} and trials {n.shape} must both have shape"
      f" ({num_prompts},): one count per training prompt."
    )
  if np.any(s < 0) or np.any(s > n):
    raise ValueError("successes must be in [0, trials] for every prompt.")
  p0 = (s + 0.5) / (n + 1.0)
  seen = n > 0
  out[seen, 0] = weight * p0[seen]
  out[seen, 1] = weight * (1.0 - p0[seen])
  return out


@dataclasses.dataclass(frozen=True)
class SingleStream(PromptSampler):
  """SPO's prioritized sampling: prompts drawn by tracker uncertainty.

  Each step draws `size` distinct prompts (with replacement only when the
  candidates are fewer) with probability proportional to

      w(x) = sqrt(p_hat(x) (1 - p_hat(x))) + epsilon,
      p_hat = alpha / (alpha + beta),

  and gives each `num_samples` samples (1: the single stream). `update`
  moves the tracker of every prompt of the scored rollout,

      alpha <- rho alpha + sum_g r_g,   beta <- rho beta + sum_g (1 - r_g),

  over its valid samples, with r the total reward clipped to [0, 1]
  (the paper's binary reward) and one discount per prompt and step (a
  prompt chosen twice adds both rows). That is the update of
  `rljax.transforms.single_stream_advantages` with a constant rho, so with
  equal settings both trackers agree; under the transform's KL-adaptive
  rho, which the host cannot see, this tracker only sets priorities.

  Candidates: the whole training set (`pool_size` None), or the official
  code's variant: the next `pool_size` prompts of the `Shuffled` stream
  (its data loader's ``gen_batch_size`` batch) each step. Draws use
  numpy's generator seeded by (seed, counter), the counter kept in the
  state, so every host draws the same prompts and a resumed run continues
  exactly.

  Args:
    num_samples: samples per prompt (1 in the paper).
    epsilon: the exploration floor of the priority (paper and code: 0.05).
    rho: the tracker's discount per visit (the code's constant 0.875).
    pool_size: candidates per step (None: every prompt).
    prior_weight, initial_successes, initial_trials: the offline
      initialisation, `single_stream_prior` (None: p_hat = 1/2).

  References:
    Xu and Ding, "Single-stream Policy Optimization", arXiv 2509.13232
    (prioritized sampling). Checked: the priority, epsilon = 0.05 and the
    draw without replacement from the candidate pool against the official
    code (verl-project/verl-recipe `spo/spo_ray_trainer.py`, ``fit``); the
    paper's text beyond its abstract could not be read here.
  """

  num_samples: int = 1
  epsilon: float = 0.05
  rho: float = 0.875
  pool_size: Optional[int] = None
  prior_weight: float = 8.0
  initial_successes: Optional[Sequence[float]] = None
  initial_trials: Optional[Sequence[float]] = None

  def __post_init__(self):
    if self.num_samples < 1:
      raise ValueError(f"num_samples={self.num_samples} must be >= 1.")
    if not self.epsilon >= 0 or not 0 < self.rho <= 1:
      raise ValueError(
        f"epsilon must be >= 0 and rho in (0, 1]; got {self.epsilon},"
        f" {self.rho}."
      )
    if self.pool_size is not None and self.pool_size < 1:
      raise ValueError(
        f"pool_size={self.pool_size} must be >= 1, or None (every prompt)."
      )

  @property
  def max_samples(self) -> int:
    return self.num_samples

  def init(self, num_prompts: int, seed: int) -> State:
    tracker = single_stream_prior(
      num_prompts,
      self.initial_successes,
      self.initial_trials,
      weight=self.prior_weight,
    )
    return {
      **Shuffled(self.num_samples).init(num_prompts, seed),
      "counter": 0,
      "alpha": tracker[:, 0].copy(),
      "beta": tracker[:, 1].copy(),
    }

  def weights(self, state: State) -> np.ndarray:
    """w = sqrt(p_hat (1 - p_hat)) + epsilon of every prompt."""
    alpha = np.asarray(state["alpha"], np.float64)
    p = alpha / (alpha + np.asarray(state["beta"], np.float64))
    return np.sqrt(p * (1.0 - p)) + self.epsilon

  def select(self, state: State, step: int, size: int):
    if self.pool_size is None:
      candidates = np.arange(int(state["num_prompts"]))
    else:
      pool, state = Shuffled(self.num_samples).select(
        state, step, self.pool_size
      )
      candidates = pool.prompt_ids
    w = self.weights(state)[candidates]
    rng = np.random.default_rng([int(state["seed"]), int(state["counter"])])
    pick = rng.choice(
      candidates.size, size, replace=size > candidates.size, p=w / w.sum()
    )
    chosen = Selection(
      prompt_ids=candidates[pick].astype(np.int64),
      num_samples=np.full(size, self.num_samples, np.int32),
    )
    return chosen, {**state, "counter": int(state["counter"]) + 1}

  def update(self, state: State, feedback: Feedback) -> State:
    ids = np.asarray(feedback.prompt_ids, np.int64)
    valid = np.asarray(feedback.valid, bool)
    r = np.clip(np.asarray(feedback.rewards, np.float64), 0.0, 1.0)
    wins = np.where(valid, r, 0.0).sum(-1)
    unique, rows = np.unique(ids, return_inverse=True)
    total_wins = np.zeros(unique.size)
    total = np.zeros(unique.size)
    np.add.at(total_wins, rows, wins)
    np.add.at(total, rows, valid.sum(-1))
    seen = total > 0
    unique, total_wins, total = unique[seen], total_wins[seen], total[seen]
    alpha = np.array(state["alpha"], np.float64)
    beta = np.array(state["beta"], np.float64)
    alpha[unique] = self.rho * alpha[unique] + total_wins
    beta[unique] = self.rho * beta[unique] + total - total_wins
    return {**state, "alpha": alpha, "beta": beta}


SAMPLERS["single_stream"] = SingleStream
