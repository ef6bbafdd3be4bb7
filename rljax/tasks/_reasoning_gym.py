"""Adapter over `reasoning-gym`'s procedural datasets (an optional extra)."""

from collections.abc import Mapping
import dataclasses
import importlib
import logging
from typing import Any

import numpy as np

from rljax import rewards
from rljax import sandbox
from rljax._src import checks
from rljax.tasks._base import Task
from rljax.tasks._countdown import countdown_score

TESTED = ("countdown", "basic_arithmetic", "gsm_symbolic")
SCORE_TIMEOUT = 10.0  # seconds to score one answer in the sandbox
_logger = logging.getLogger(__name__)
_FLOAT32_MAX = 3.4e38
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
  Model text is never evaluated in this process: many of those scorers
  call `sympy.parse_expr` (Python eval), so they run in a
  `rljax.sandbox.Sandbox` worker, started at the first reward call, with
  `SCORE_TIMEOUT` seconds per answer (a time-out or crash scores 0 and
  counts as unparsed). Countdown is scored natively with the same rule and
  no subprocess (`rewards.evaluate_arithmetic`; answers outside + - * /
  and parentheses, e.g. with "**", score 0.01). Tested on countdown,
  basic_arithmetic and gsm_symbolic (any registered name works).

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

  correct = _Correct(name, train_seed, size, config, extract, partial_credit)
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


class _Correct:
  """The reward "correct": the dataset's own rule on each extracted answer.

  Countdown is scored natively (`countdown_score`, no eval); every other
  dataset's `score_answer` runs in a `rljax.sandbox.Sandbox` (one fresh
  fork per answer, `SCORE_TIMEOUT` seconds each), started at the first
  call. An answer whose scoring times out, crashes or fails scores 0 and
  counts as unparsed. Pickles cheaply (the sandbox as its settings).
  """

  def __init__(
    self,
    name: str,
    seed: int,
    size: int,
    config: Mapping[str, Any],
    extract: str,
    partial_credit: bool,
  ):
    self.extract = extract
    self.partial_credit = partial_credit
    self.dataset = (name, seed, size, dict(config))
    self.sandbox = None
    if name != "countdown":
      self.sandbox = sandbox.Sandbox(
        timeout=SCORE_TIMEOUT,
        preload=(__name__,),
        initializer=_dataset,
        initargs=self.dataset,
      )

  def __call__(self, samples: rewards.Samples) -> rewards.RewardResult:
    answers = [
      rewards.extract_answer(t, mode=self.extract) for t in samples.texts
    ]
    todo = [i for i, a in enumerate(answers) if a is not None]
    for i in todo:
      _check_entry(samples.metadata[i])
    values = np.zeros((len(answers),), np.float32)
    parsed = np.asarray([a is not None for a in answers], bool)
    if self.sandbox is None:
      for i in todo:
        values[i] = countdown_score(answers[i], samples.metadata[i])
    else:
      calls = [(*self.dataset, answers[i], samples.metadata[i]) for i in todo]
      outcomes = self.sandbox.map(_score_in_worker, calls)
      failed = []
      for i, outcome in zip(todo, outcomes):
        value = _finite_score(outcome.value) if outcome.ok else None
        if value is None:
          parsed[i] = False
          failed.append(outcome)
        else:
          values[i] = value
      if failed:
        _logger.warning(
          "reasoning-gym %r: %d of %d answers could not be scored in the"
          " sandbox and score 0 (unparsed); the first: %s %r.",
          self.dataset[0],
          len(failed),
          len(todo),
          failed[0].status,
          failed[0].error[:200] or repr(failed[0].value)[:200],
        )
    if not self.partial_credit:
      values = (values >= 1.0).astype(np.float32)
    return rewards.RewardResult(values, parsed)


def _finite_score(value: Any) -> float | None:
  """A real, finite score from the worker, else None (never trust it)."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return None
  if not abs(value) <= _FLOAT32_MAX:  # also NaN
    return None
  return float(value)


def _check_entry(entry: Mapping[str, Any]) -> None:
  """ValueError unless the metadata is a reasoning-gym example dict."""
  if "answer" not in entry or "metadata" not in entry:
    raise ValueError(
      "reasoning-gym rewards need each sample's metadata to be its example"
      f" dict with 'answer' and 'metadata'; got the keys {sorted(entry)}."
    )


_DATASETS: dict[str, Any] = {}


def _dataset(name: str, seed: int, size: int, config: Mapping[str, Any]):
  """The dataset, built once per process (the sandbox worker's cache)."""
  key = repr((name, seed, size, sorted(config.items())))
  if key not in _DATASETS:
    _DATASETS[key] = _create(name, seed, size, config)
  return _DATASETS[key]


def _score_in_worker(
  name: str,
  seed: int,
  size: int,
  config: Mapping[str, Any],
  answer: str,
  entry: Mapping[str, Any],
) -> float:
  """dataset.score_answer as a float, 0.0 where it raises (in the sandbox)."""
  try:
    return float(_dataset(name, seed, size, config).score_answer(answer, entry))
  except Exception:
    return 0.0
