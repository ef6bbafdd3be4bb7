"""Stage schedules: a run in stages, each with its own prompts, sampler and
generation budget (curricula, Cascade RL, CAMPO, Train-Long-Think-Short)."""

from collections.abc import Mapping, Sequence
import dataclasses
from typing import Any, Optional

import numpy as np

from rljax.selection._base import SAMPLERS
from rljax.selection._base import Feedback
from rljax.selection._base import PromptSampler
from rljax.selection._base import Selection
from rljax.selection._base import Shuffled
from rljax.selection._base import State
from rljax.selection._base import get


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stage of a `Stages` schedule.

  Attributes:
    steps: how many trainer steps the stage lasts; None for the last stage
      (the rest of the run).
    sampler: the stage's prompt sampler (its own state, over the stage's
      prompts); a `PromptSampler`, or a name for `rljax.selection.get`
      with `sampler_kwargs`. Default: `Shuffled` with 8 samples.
    where: example fields the stage's prompts must match, e.g.
      ``{"op": "+"}`` (a domain of a mixed training set); a list value
      matches any of its items (``{"a": [0, 1, 2]}``); None: every
      training prompt.
    max_new_tokens: the stage's generation budget (at most the config's
      ``sampler.max_new_tokens``, which stays the rollout's width, so the
      update compiles once); None: the config's.
    temperature: the stage's sampling temperature, which the update's
      log-probs also use (one compile per distinct value); None: the
      config's.
  """

  steps: Optional[int] = None
  sampler: Any = None
  sampler_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  where: Optional[Mapping[str, Any]] = None
  max_new_tokens: Optional[int] = None
  temperature: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Stages(PromptSampler):
  """A schedule of stages, run one after another.

  Stage k runs for its ``steps`` trainer steps, selecting with its own
  sampler among the training prompts that match its ``where``, sampling
  at its ``temperature`` and generating at most its ``max_new_tokens``; each stage's sampler keeps its
  own state (so a stage that comes back to a domain does not reset what
  was learnt in it). The schedule is by trainer step, so a resumed run is
  in the same stage with the same state.

  This is the shape of several seed papers' training recipes:

  * Cascade RL (catalog row 2.11; Nemotron-Cascade, arXiv 2512.13607):
    sequential domain-wise RL stages, one domain per stage
    (``where={"domain": ...}``).
  * CAMPO (row 2.108): generation-length stages, e.g. 16K then 24K then
    32K tokens (``max_new_tokens`` growing), with a repetition penalty in
    the reward (`rljax.rewards.repetition_penalty`).
  * Train-Long-Think-Short: a generation budget that shrinks stage by
    stage (``max_new_tokens`` falling).

  ``max_samples`` is the largest of the stages' samplers' (the rollout's G
  for the whole run).

  Args:
    stages: `Stage`s (or dicts of their fields); every stage but the last
      needs ``steps``.
    num_samples: the samples per prompt of stages whose sampler is given
      by name (or not at all) without its own ``num_samples``.
  """

  stages: Sequence[Any] = ()
  num_samples: int = 8
  ids: Optional[tuple[np.ndarray, ...]] = None  # set by `prepare`

  def __post_init__(self):
    stages = tuple(
      s if isinstance(s, Stage) else Stage(**dict(s)) for s in self.stages
    )
    if not stages:
      raise ValueError("Stages(stages=...) is empty; give at least one Stage.")
    for k, s in enumerate(stages):
      last = k == len(stages) - 1
      if s.steps is None and not last:
        raise ValueError(
          f"stage {k} has steps=None; only the last stage may run for the"
          " rest of the run."
        )
      if s.steps is not None and int(s.steps) < 1:
        raise ValueError(f"stage {k} has steps={s.steps}; it must be >= 1.")
      if s.max_new_tokens is not None and int(s.max_new_tokens) < 1:
        raise ValueError(
          f"stage {k} has max_new_tokens={s.max_new_tokens}; it must be >= 1."
        )
      if s.temperature is not None and not float(s.temperature) > 0:
        raise ValueError(
          f"stage {k} has temperature={s.temperature}; it must be > 0."
        )
      if s.where is not None and not isinstance(s.where, Mapping):
        raise ValueError(
          f"stage {k} has where={s.where!r}; give a dict of example fields,"
          " e.g. {'op': '+'}."
        )
    stages = tuple(
      dataclasses.replace(
        s,
        sampler=_sampler(
          s.sampler, {"num_samples": self.num_samples, **s.sampler_kwargs}
        ),
      )
      for s in stages
    )
    object.__setattr__(self, "stages", stages)

  @property
  def max_samples(self) -> int:
    return max(s.sampler.max_samples for s in self.stages)

  def prepare(self, examples) -> "Stages":
    ids = []
    for k, s in enumerate(self.stages):
      if s.where is None:
        ids.append(np.arange(len(examples), dtype=np.int64))
        continue
      match = [
        i
        for i in range(len(examples))
        if all(_matches(examples[i].get(f), v) for f, v in s.where.items())
      ]
      if not match:
        raise ValueError(
          f"stage {k}'s where={dict(s.where)} matches no training prompt;"
          " check the field names and values of the task's examples."
        )
      ids.append(np.asarray(match, np.int64))
    return dataclasses.replace(self, ids=tuple(ids))

  def stage(self, step: int) -> int:
    """The index of the stage that trainer step `step` (0-based) is in."""
    end = 0
    for k, s in enumerate(self.stages):
      if s.steps is None:
        return k
      end += int(s.steps)
      if step < end:
        return k
    return len(self.stages) - 1

  def init(self, num_prompts: int, seed: int) -> State:
    ids = self._ids(num_prompts)
    return {
      "num_prompts": int(num_prompts),
      "stages": [
        s.sampler.init(len(i), seed + k)
        for k, (s, i) in enumerate(zip(self.stages, ids))
      ],
    }

  def select(self, state: State, step: int, size: int):
    k = self.stage(step)
    stage, ids = self.stages[k], self._ids(state["num_prompts"])[k]
    chosen, inner = stage.sampler.select(state["stages"][k], step, size)
    settings = dict(chosen.settings or {})
    if stage.max_new_tokens is not None:
      settings["max_new_tokens"] = int(stage.max_new_tokens)
    if stage.temperature is not None:
      settings["temperature"] = float(stage.temperature)
    selection = Selection(
      prompt_ids=ids[np.asarray(chosen.prompt_ids)],
      num_samples=np.asarray(chosen.num_samples, np.int32),
      settings=settings or None,
    )
    return selection, _with(state, k, inner)

  def update(self, state: State, feedback: Feedback) -> State:
    k = self.stage(feedback.step)
    ids = self._ids(state["num_prompts"])[k]
    local = np.searchsorted(ids, feedback.prompt_ids)
    inner = self.stages[k].sampler.update(
      state["stages"][k], feedback._replace(prompt_ids=local)
    )
    return _with(state, k, inner)

  def _ids(self, num_prompts: int) -> tuple[np.ndarray, ...]:
    if self.ids is not None:
      return self.ids
    if any(s.where is not None for s in self.stages):
      raise ValueError(
        "Stages with `where` need the training examples: call"
        " stages.prepare(task.train) first (the Trainer does)."
      )
    return tuple(np.arange(num_prompts, dtype=np.int64) for _ in self.stages)


def _sampler(sampler: Any, kwargs: Mapping[str, Any]) -> PromptSampler:
  if sampler is None:
    return Shuffled(**kwargs)
  if isinstance(sampler, str):
    return get(sampler, **kwargs)
  if not isinstance(sampler, PromptSampler):
    raise ValueError(
      f"a stage's sampler must be a PromptSampler or a sampler name; got"
      f" {type(sampler).__name__}."
    )
  return sampler


def _matches(value: Any, wanted: Any) -> bool:
  if isinstance(wanted, (list, tuple)):
    return value in wanted
  return value == wanted


def _with(state: State, k: int, inner: State) -> State:
  stages = list(state["stages"])
  stages[k] = inner
  return {**state, "stages": stages}


SAMPLERS["stages"] = Stages
