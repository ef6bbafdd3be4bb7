"""The prompt-sampler interface and the default shuffled stream."""

import abc
import dataclasses
from typing import Any, NamedTuple, Optional

import grain
import numpy as np


class Selection(NamedTuple):
  """The next step's prompts and how many samples each gets."""

  prompt_ids: np.ndarray  # int64 [P] dataset indices
  num_samples: np.ndarray  # int32 [P] samples of each prompt (>= 1)
  # This step's sampling settings where they differ from the run's config
  # (stage schedules): "max_new_tokens" (<= sampler.max_new_tokens, the
  # rollout's width) and "temperature" (sampling, scoring and the update's
  # log-probs; one compile per value). None: the config's.
  settings: Optional[dict] = None


class Feedback(NamedTuple):
  """A scored rollout, as a sampler's `update` sees it: the whole global
  batch, the same on every process. Samples past a prompt's count are
  invalid (``valid`` 0) and hold zeros."""

  prompt_ids: np.ndarray  # int64 [P]
  rewards: np.ndarray  # float32 [P, G_max] total reward
  correct: np.ndarray  # bool [P, G_max] the task's first reward > 0
  lengths: np.ndarray  # int32 [P, G_max] completion tokens
  valid: np.ndarray  # bool [P, G_max]
  step: int  # the trainer step that sampled it (0-based)


State = dict[str, Any]  # numpy arrays and Python scalars (JSON-checkpointed)


class PromptSampler(abc.ABC):
  """Decides which prompts each step samples, and how many samples each.

  A sampler is a pure function of its state: `init` makes the state,
  `select` reads it (and may advance it) to choose a step's prompts, and
  `update` folds in the scored rollout of a selection. The trainer calls
  them with the same arguments on every process, checkpoints the state
  with the train state (as JSON: dicts of numpy arrays and scalars) and
  restores it on resume, so selections resume exactly and agree across
  hosts. Randomness comes from the state (a seed and a counter), never
  from global generators.

  Subclasses define `init`, `select` and, when they learn, `update`.
  ``max_samples`` bounds the samples a selection gives any prompt (the
  rollout's G axis: prompts with fewer samples leave the rest invalid,
  ``Batch.sample_mask_PG``). Dynamic-sampling refills call `select` again.
  """

  max_samples: int = 1

  def prepare(self, examples) -> "PromptSampler":
    """This sampler bound to the training set (random access to its
    example dicts), for samplers that select by example fields; the
    trainer calls it once before `init`. Default: itself."""
    del examples
    return self

  @abc.abstractmethod
  def init(self, num_prompts: int, seed: int) -> State:
    """The state before the first step, for a training set of
    `num_prompts` examples and the run's seed."""

  @abc.abstractmethod
  def select(self, state: State, step: int, size: int):
    """(Selection of `size` prompts, new state)."""

  def update(self, state: State, feedback: Feedback) -> State:
    """The state after seeing a scored rollout (default: unchanged)."""
    del feedback
    return state


@dataclasses.dataclass(frozen=True)
class Shuffled(PromptSampler):
  """Today's stream: the training set shuffled once by the seed and
  repeated, `num_samples` samples per prompt.

  Step batch k is items ``[k P, (k + 1) P)`` of grain's
  ``dataset.shuffle(seed).repeat()`` order, whatever the number of
  processes, so a run resumes on any number of hosts. The state is the
  position in the stream.
  """

  num_samples: int = 8

  @property
  def max_samples(self) -> int:
    return self.num_samples

  def init(self, num_prompts: int, seed: int) -> State:
    if num_prompts < 1:
      raise ValueError("the training set is empty.")
    return {"position": 0, "num_prompts": int(num_prompts), "seed": int(seed)}

  def select(self, state: State, step: int, size: int):
    del step
    order = _order(state["num_prompts"], state["seed"])
    start = int(state["position"])
    ids = np.asarray([order[i] for i in range(start, start + size)])
    selection = Selection(
      prompt_ids=ids.astype(np.int64),
      num_samples=np.full(size, self.num_samples, np.int32),
    )
    return selection, {**state, "position": start + size}


def _order(num_prompts: int, seed: int):
  """grain's shuffled, repeated order of dataset indices (lazy)."""
  return grain.MapDataset.range(num_prompts).shuffle(seed=seed).repeat()


_SETTINGS = ("max_new_tokens", "temperature")


def check_selection(
  selection: Selection,
  size: int,
  num_prompts: int,
  max_samples: int,
  name: str,
  max_new_tokens: Optional[int] = None,
) -> Selection:
  """A sampler's selection, checked (a clear error naming the sampler)."""
  ids = np.asarray(selection.prompt_ids)
  counts = np.asarray(selection.num_samples)
  settings = dict(selection.settings or {})
  budget = settings.get("max_new_tokens")
  temperature = settings.get("temperature", 1.0)
  problem: Optional[str] = None
  if ids.shape != (size,) or counts.shape != (size,):
    problem = (
      f"returned prompt_ids {ids.shape} and num_samples {counts.shape};"
      f" both must have shape ({size},)"
    )
  elif ids.size and (ids.min() < 0 or ids.max() >= num_prompts):
    problem = f"chose prompt ids outside [0, {num_prompts})"
  elif counts.size and (counts.min() < 1 or counts.max() > max_samples):
    problem = (
      f"gave {counts.min()}..{counts.max()} samples per prompt; each must be"
      f" in [1, max_samples={max_samples}]"
    )
  elif set(settings) - set(_SETTINGS):
    problem = (
      f"set settings {sorted(set(settings) - set(_SETTINGS))}; a selection"
      f" may set {list(_SETTINGS)}"
    )
  elif budget is not None and not (
    isinstance(budget, (int, np.integer))
    and 1 <= budget <= (max_new_tokens or budget)
  ):
    problem = (
      f"set max_new_tokens={budget!r}; it must be an int in [1,"
      f" sampler.max_new_tokens={max_new_tokens}] (raise"
      " sampler.max_new_tokens, the rollout's width, for longer stages)"
    )
  elif not (isinstance(temperature, (int, float)) and temperature > 0):
    problem = f"set temperature={temperature!r}; it must be a number > 0"
  if problem:
    raise ValueError(f"prompt sampler {name} {problem}.")
  return Selection(
    ids.astype(np.int64), counts.astype(np.int32), settings or None
  )


@dataclasses.dataclass(frozen=True)
class Uncertainty(PromptSampler):
  """More samples for the prompts whose outcome is least certain.

  Prompts come in `Shuffled` order. Each prompt keeps a Beta posterior of
  its success rate, alpha = prior + correct samples, beta = prior + wrong
  ones, both multiplied by `decay` at every update of that prompt (1: no
  forgetting). A step's budget of ``P * num_samples`` samples is split in
  proportion to sqrt(p(1 - p)), p = alpha / (alpha + beta), the standard
  deviation of one sample's reward: prompts the policy always or never
  solves (whose groups have no advantage signal) get `min_samples`, the
  uncertain ones up to ``max_samples_per_prompt`` (default twice
  ``num_samples``: at ``num_samples`` no prompt could get more than the
  uniform share, and the allocation would be uniform). Unseen prompts have
  p = 1/2, so the first pass is uniform. Counts are rounded by largest remainders within
  [min_samples, max_samples] and sum to at most the budget.

  This is rljax's own baseline allocator (no paper's exact rule); the
  literature's allocators (Knapsack-RL, GVM, VAS, ...) are samplers of the
  same interface.
  """

  num_samples: int = 8
  min_samples: int = 2
  max_samples_per_prompt: Optional[int] = None
  prior: float = 1.0
  decay: float = 1.0

  def __post_init__(self):
    if self.max_samples_per_prompt is None:
      object.__setattr__(self, "max_samples_per_prompt", 2 * self.num_samples)
    if not 1 <= self.min_samples <= self.num_samples:
      raise ValueError(
        f"min_samples={self.min_samples} must be in [1, num_samples="
        f"{self.num_samples}]."
      )
    if self.max_samples_per_prompt < self.num_samples:
      raise ValueError(
        f"max_samples_per_prompt={self.max_samples_per_prompt} must be >="
        f" num_samples={self.num_samples}."
      )
    if not self.prior > 0 or not 0 < self.decay <= 1:
      raise ValueError(
        f"prior must be > 0 and decay in (0, 1]; got {self.prior},"
        f" {self.decay}."
      )

  @property
  def max_samples(self) -> int:
    return self.max_samples_per_prompt

  def init(self, num_prompts: int, seed: int) -> State:
    state = Shuffled(self.num_samples).init(num_prompts, seed)
    ones = np.full(num_prompts, self.prior, np.float64)
    return {**state, "alpha": ones, "beta": ones.copy()}

  def select(self, state: State, step: int, size: int):
    chosen, state = Shuffled(self.num_samples).select(state, step, size)
    ids = chosen.prompt_ids
    p = state["alpha"][ids] / (state["alpha"][ids] + state["beta"][ids])
    counts = allocate(
      np.sqrt(p * (1 - p)),
      size * self.num_samples,
      self.min_samples,
      self.max_samples_per_prompt,
    )
    return Selection(ids, counts), state

  def update(self, state: State, feedback: Feedback) -> State:
    alpha = np.array(state["alpha"], np.float64)
    beta = np.array(state["beta"], np.float64)
    ids = np.asarray(feedback.prompt_ids)
    right = (feedback.correct & feedback.valid).sum(-1)
    wrong = (~feedback.correct & feedback.valid).sum(-1)
    for i, r, w in zip(ids, right, wrong):  # a prompt may repeat
      alpha[i] = self.decay * alpha[i] + r
      beta[i] = self.decay * beta[i] + w
    return {**state, "alpha": alpha, "beta": beta}


def allocate(weights, budget: int, low: int, high: int) -> np.ndarray:
  """Integer counts in [low, high], about proportional to `weights`, with
  sum <= `budget` (largest remainders; equal weights give equal counts)."""
  w = np.asarray(weights, np.float64)
  n = w.size
  if n * low > budget:
    raise ValueError(
      f"a budget of {budget} samples cannot give {n} prompts {low} each."
    )
  share = np.full(n, budget / n) if w.sum() <= 0 else budget * w / w.sum()
  counts = np.clip(np.floor(share), low, high).astype(np.int64)
  # Hand out what is left by largest remainder, never above `high`.
  order = np.argsort(-(share - np.floor(share)), kind="stable")
  left = budget - counts.sum()
  while left > 0:
    open_ = [i for i in order if counts[i] < high]
    if not open_:
      break
    for i in open_[:left]:
      counts[i] += 1
    left = budget - counts.sum()
  while left < 0:  # clipping up to `low` overspent: take from the largest
    i = int(np.argmax(np.where(counts > low, counts, -1)))
    counts[i] -= 1
    left += 1
  return counts.astype(np.int32)


SAMPLERS = {"shuffled": Shuffled, "uncertainty": Uncertainty}


def get(name: str, **kwargs) -> PromptSampler:
  """A prompt sampler by name (``sampler.prompts`` in a config)."""
  if name not in SAMPLERS:
    raise ValueError(
      f"unknown prompt sampler {name!r}; known: {sorted(SAMPLERS)}."
    )
  return SAMPLERS[name](**kwargs)
