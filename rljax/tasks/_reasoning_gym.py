"""Adapter over `reasoning-gym`'s procedural datasets (an optional extra)."""

from collections.abc import Mapping
import dataclasses
import functools
import importlib
from typing import Any

import numpy as np

from rljax import rewards
from rljax._src import checks
from rljax.tasks._base import Task

TESTED = ("countdown", "basic_arithmetic", "gsm_symbolic")
_INSTRUCTIONS = {
  "answer_tag": "Put only the final answer inside <answer> </answer> tags.",
  "hash": 'Write only the final answer after "####" at the end.',
}


def reasoning_gym(
  name: str,
  *,
  size: int = 10_000,
  test_size: int = 500,
  seed: int = 0,
  extract: str = "answer_tag",
  partial_credit: bool = False,
  **config: Any,
) -> Task:
  """A task from `reasoning_gym.create_dataset(name, **config)`.

  Each reasoning-gym example k is generated from `Random(base_seed + k)`.
  Train uses base seed `seed * (size + test_size)` and test the next
  `test_size` seeds after it, so no two examples (of either split, or of
  another `seed` with the same sizes) share a random stream; a tiny config
  can still produce the same problem twice by chance.

  The prompt is the dataset's question and an instruction for where to put
  the answer; the reward "correct" extracts it (`rewards.extract_answer`
  with mode `extract`) and judges it with the dataset's own `score_answer`.
  Tested on countdown, basic_arithmetic and gsm_symbolic (any registered
  name works).

  Args:
    name: a reasoning-gym dataset name, e.g. "countdown".
    size: length of the train dataset.
    test_size: length of the held-out test dataset.
    seed: selects both splits' examples.
    extract: "answer_tag" (<answer>...</answer>, reasoning-gym's own
      convention) or "hash" (the line after "####").
    partial_credit: False (default) gives 1.0 when `score_answer` is 1.0
      and 0.0 otherwise, as DeepSeek-R1 / DAPO binary rewards; True passes
      reasoning-gym's graded scores through (countdown gives 0.05 for a
      wrong expression on the right numbers, basic_arithmetic credits any
      answer that contains the gold, e.g. "-68" for "68", partly).
    **config: the dataset's config fields (e.g. min_numbers=3).

  Returns:
    A `Task` named "reasoning_gym:<name>"; examples are reasoning-gym's
    {"question", "answer", "metadata"} dicts.

  References:
    Stojanovski et al., "Reasoning Gym", arXiv 2505.24760.
  """
  checks.positive(size=size, test_size=test_size)
  checks.non_negative(seed=seed)
  checks.one_of("extract", extract, tuple(_INSTRUCTIONS))
  for reserved in ("size", "seed"):
    if reserved in config:
      raise ValueError(f"pass {reserved} as reasoning_gym's own argument.")
  train_seed = seed * (size + test_size)
  train = _create(name, train_seed, size, config)
  test = _create(name, train_seed + size, test_size, config)
  import grain

  correct = functools.partial(_correct, train, extract, partial_credit)
  return Task(
    name=f"reasoning_gym:{name}",
    train=grain.MapDataset.source(train),
    test=grain.MapDataset.source(test),
    rewards=(("correct", correct, 1.0),),
    format_prompt=_Prompt(_INSTRUCTIONS[extract]),
  )


def _create(name: str, seed: int, size: int, config: Mapping[str, Any]):
  """reasoning_gym.create_dataset with errors that say what to fix."""
  try:
    rg = importlib.import_module("reasoning_gym")
  except ImportError as e:
    raise ImportError(
      "rljax.tasks.reasoning_gym needs the optional package reasoning-gym:"
      " pip install 'rljax[tasks]'."
    ) from e
  if name not in rg.factory.DATASETS:
    raise ValueError(
      f"unknown reasoning-gym dataset {name!r}; tested: {list(TESTED)};"
      f" registered: {sorted(rg.factory.DATASETS)}."
    )
  try:
    return rg.create_dataset(name, seed=seed, size=size, **config)
  except (AssertionError, TypeError) as e:
    raise ValueError(f"bad config for reasoning-gym {name!r}: {e!r}") from e


@dataclasses.dataclass(frozen=True)
class _Prompt:
  """example -> its question and the answer-format instruction."""

  instruction: str

  def __call__(self, example: Mapping[str, Any]) -> str:
    return f"{example['question'].rstrip()}\n\n{self.instruction}"


def _correct(
  dataset: Any, extract: str, partial_credit: bool, samples: rewards.Samples
) -> rewards.RewardResult:
  """The reward: the dataset's `score_answer` on each extracted answer."""
  answers = [rewards.extract_answer(t, mode=extract) for t in samples.texts]
  values = [
    0.0 if a is None else _score(dataset, a, entry)
    for a, entry in zip(answers, samples.metadata)
  ]
  values = np.asarray(values, np.float32)
  if not partial_credit:
    values = (values >= 1.0).astype(np.float32)
  parsed = np.asarray([a is not None for a in answers])
  return rewards.RewardResult(values, parsed)


def _score(dataset: Any, answer: str, entry: Mapping[str, Any]) -> float:
  """dataset.score_answer, 0.0 where it raises on a malformed answer."""
  if "answer" not in entry or "metadata" not in entry:
    raise ValueError(
      "reasoning-gym rewards need each sample's metadata to be its example"
      f" dict with 'answer' and 'metadata'; got the keys {sorted(entry)}."
    )
  try:
    return float(dataset.score_answer(answer, entry))
  except Exception:
    return 0.0
