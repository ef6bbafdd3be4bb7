"""`Task`: a train/test split of example dicts, its rewards and its prompts."""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
from typing import Any

from rljax.rewards import RewardFn


@dataclasses.dataclass(frozen=True)
class Task:
  """A task with verifiable answers.

  Attributes:
    name: e.g. "arithmetic" or "reasoning_gym:countdown".
    train: a grain `MapDataset` (random access, `len`) of example dicts with
      at least "question" and "answer" (str) and any extra metadata.
    test: a held-out grain `MapDataset` of the same kind.
    rewards: the default reward spec for `rljax.rewards.score`,
      ((name, fn, weight), ...).
    format_prompt: example dict -> plain prompt text (completion style; chat
      templating is the training loop's job).
    alphabet: every character prompts and answers can contain, when the task
      knows it (a scratch model's character tokenizer is built from it);
      None otherwise.
    environment: for an interactive task, the factory of a fresh
      `rljax.envs.Environment` per episode (the trainer then samples
      multi-turn episodes, `rljax.envs.EpisodeRollouts`); None: each sample
      is one completion of ``format_prompt(example)``.
  """

  name: str
  train: Any
  test: Any
  rewards: Sequence[tuple[str, RewardFn, float]]
  format_prompt: Callable[[Mapping[str, Any]], str]
  alphabet: str | None = None
  environment: Callable[[], Any] | None = None
