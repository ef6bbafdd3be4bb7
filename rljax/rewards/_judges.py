"""Judges as user callables: per-sample reward functions and group annotators.

A judge is any Python callable (a rule, a PRM, a GenRM behind an API): the
library only fixes how its answers become rewards.

* Per-sample judges give a `RewardFn` for `rljax.rewards.score`:
  `judge_reward` (any ``fn(text, metadata) -> float``), `flawed_positive_reward`
  (FAPO), `calibrated_reward` (CGPO), `thought_reward` (TP-GRPO's PRM).
* Group judges need the G answers of a prompt together (EMPO's clusters,
  SPO's pairwise preferences). A `RewardFn` sees all N samples but not the
  group size, so these run as annotators, ``Trainer(annotate=...)``: the
  host writes ``Batch.extra`` arrays (``answer_ids_PG``, ``preferences_PG``,
  ``flagged_PG``) and a batch stage of `rljax.transforms` turns them into
  rewards (`empo_rewards`, `spo_win_rates`, `cgpo_constraint_mask`). The
  plain functions (`cluster_answers`, `preference_matrix`, `judge_flags`)
  work on lists of texts for use outside the Trainer.
"""

from collections.abc import Callable, Mapping, Sequence
import math
from typing import Any, Optional

import numpy as np

from rljax.rewards._answers import extract_answer
from rljax.rewards._base import RewardFn
from rljax.rewards._base import RewardResult
from rljax.rewards._base import Samples

Judge = Callable[[str, Mapping[str, Any]], Any]


def _check_callable(name: str, fn: Any) -> None:
  if not callable(fn):
    raise ValueError(f"{name} must be callable; got {type(fn).__name__}.")


def _finite(name: str, value: Any, index: int) -> float:
  try:
    out = float(value)
  except (TypeError, ValueError):
    raise ValueError(
      f"{name} returned {value!r} for sample {index}; it must return a"
      " number (NaN where it does not apply)."
    ) from None
  if math.isinf(out):
    raise ValueError(
      f"{name} returned {out} for sample {index}; return finite values."
    )
  return out


def judge_reward(fn: Judge, *, name: str = "judge") -> RewardFn:
  """A `RewardFn` from a per-sample judge ``fn(text, metadata) -> float``.

  Use it for a PRM score (P-GRPO's r_proc), a reward model, a rule. NaN
  means "does not apply" (counted as 0 by `score`).
  """
  _check_callable(name, fn)

  def reward(samples: Samples) -> np.ndarray:
    return np.asarray(
      [
        _finite(name, fn(text, meta), i)
        for i, (text, meta) in enumerate(zip(samples.texts, samples.metadata))
      ],
      np.float32,
    )

  return reward


def _values(out) -> tuple[np.ndarray, Optional[np.ndarray]]:
  if isinstance(out, RewardResult):
    return np.asarray(out.values, np.float32), out.parsed
  return np.asarray(out, np.float32), None


# ---------------------------------------------------------------------------
# FAPO (arXiv 2510.22543)
# ---------------------------------------------------------------------------


def _error_index(value: Any) -> Optional[int]:
  """The GenRM's first-error index as an int, None if unreadable."""
  if value is None:
    return None
  try:
    return int(str(value).strip())
  except ValueError:
    return None


def flawed_positive_reward(
  outcome: RewardFn,
  genrm: Judge,
  *,
  penalty: float = 1.0,
  correct: float = 1.0,
  incorrect: Optional[float] = -1.0,
) -> RewardFn:
  """FAPO: a correct answer whose reasoning a GenRM finds flawed loses
  `penalty`.

  ``R = correct - penalty`` if `outcome` says correct and
  ``genrm(text, metadata)``, the index of the first erroneous step, is not
  -1; ``R = correct`` for other correct answers; ``R = incorrect`` for
  wrong ones (None keeps the outcome's own value). The GenRM is called on
  correct samples only (as in the official recipe); an answer it returns
  that is not an integer counts as "no flaw found".

  Args:
    outcome: the verifier; a sample is correct where its value >= 1.
    genrm: ``fn(text, metadata) -> int | str | None``, e.g. a
      FAPO-GenRM call parsed from its ``\\boxed{}`` index.
    penalty: lambda (paper: 1, so flawed positives get 0, midway between
      correct and incorrect: the "parameter-free" choice).
    correct, incorrect: the rewards of correct and incorrect answers (the
      recipe's +1 and -1).

  References:
    "FAPO: Flawed-Aware Policy Optimization for Efficient and Reliable
    Reasoning", arXiv 2510.22543 (R_FAPO = R_RLVR - lambda for flawed
    positives).
    Checked: against verl-recipe `fapo/reward_fn_reasoning.py::
    compute_score_fapo` (+1 / -1, FLAWED_REWARD_PENALTY = 1.0, flawed iff
    the boxed index != -1, unparsable = not flawed).
  """
  _check_callable("outcome", outcome)
  _check_callable("genrm", genrm)

  def reward(samples: Samples) -> RewardResult:
    values, parsed = _values(outcome(samples))
    is_correct = values >= 1.0
    out = np.where(
      is_correct, correct, values if incorrect is None else incorrect
    ).astype(np.float32)
    for i in np.flatnonzero(is_correct):
      index = _error_index(genrm(samples.texts[i], samples.metadata[i]))
      if index is not None and index != -1:
        out[i] = correct - penalty
    return RewardResult(out, parsed)

  return reward


# ---------------------------------------------------------------------------
# P-GRPO (arXiv 2508.05170), host-side form
# ---------------------------------------------------------------------------


def success_gated_reward(
  outcome: RewardFn, process: RewardFn, *, success: float = 1.0
) -> RewardFn:
  """P-GRPO in one `RewardFn`: ``r_out + 1[r_out >= success] * r_proc``.

  `process` (e.g. ``judge_reward(prm)``) is evaluated on every sample; use
  `rljax.transforms.p_grpo_rewards` to do the gating from two reward
  columns instead. See `rljax.transforms.success_gated_rewards`.
  """
  _check_callable("outcome", outcome)
  _check_callable("process", process)

  def reward(samples: Samples) -> RewardResult:
    r_out, parsed = _values(outcome(samples))
    r_proc, _ = _values(process(samples))
    gated = np.where(r_out >= success, np.nan_to_num(r_proc), 0.0)
    return RewardResult((r_out + gated).astype(np.float32), parsed)

  return reward


# ---------------------------------------------------------------------------
# CGPO (arXiv 2409.20370)
# ---------------------------------------------------------------------------


def calibrated_reward(
  reward_model: Judge, *, reference_key: str = "reference"
) -> RewardFn:
  """CGPO's calibrated reward ``sigmoid(R(q, o) - R(q, o_bar))``.

  ``reward_model(text, metadata)`` scores a completion; the reference o_bar
  is ``metadata[reference_key]`` (scored once per prompt). See
  `rljax.transforms.calibrated_rewards`.
  """
  _check_callable("reward_model", reward_model)

  def reward(samples: Samples) -> np.ndarray:
    cache: dict[int, float] = {}
    out = np.empty(len(samples.texts), np.float32)
    for i, (text, meta) in enumerate(zip(samples.texts, samples.metadata)):
      if reference_key not in meta:
        raise ValueError(
          f"calibrated_reward needs metadata[{reference_key!r}], the"
          f" reference answer; sample {i} has keys {sorted(meta)}."
        )
      if id(meta) not in cache:
        ref = reward_model(meta[reference_key], meta)
        cache[id(meta)] = _finite("reward_model", ref, i)
      r = _finite("reward_model", reward_model(text, meta), i)
      out[i] = 1.0 / (1.0 + math.exp(-(r - cache[id(meta)])))
    return out

  return reward


def judge_flags(
  texts: Sequence[str],
  metadata: Sequence[Mapping[str, Any]],
  judges: Sequence[Judge],
) -> np.ndarray:
  """CGPO's mixture of judges: bool [N], True where any judge flags the
  sample (``judge(text, metadata)`` truthy = constraint violated)."""
  for i, judge in enumerate(judges):
    _check_callable(f"judges[{i}]", judge)
  return np.asarray(
    [any(bool(j(t, m)) for j in judges) for t, m in zip(texts, metadata)],
    bool,
  )


# ---------------------------------------------------------------------------
# TP-GRPO (arXiv 2507.23317): thought-level rewards from step verdicts.
# ---------------------------------------------------------------------------


def thought_rewards(verdicts: Sequence[bool], *, unit: float = 1.0) -> float:
  """Sum of thought-level rewards: contiguous steps with the same verdict
  merge into one thought, worth ``+unit`` (correct) or ``-unit``.

  E.g. verdicts [T, T, F, F, T] are three thoughts: +1 - 1 + 1 = 1.
  """
  total, previous = 0.0, None
  for v in verdicts:
    v = bool(v)
    if v != previous:
      total += unit if v else -unit
    previous = v
  return total


def thought_reward(prm: Judge, *, unit: float = 1.0) -> RewardFn:
  """TP-GRPO's process column: ``prm(text, metadata)`` returns the step
  verdicts (a list of bools) of a generative PRM; the reward is their
  `thought_rewards`. Combine with the outcome in
  `rljax.transforms.tp_grpo_rewards`."""
  _check_callable("prm", prm)

  def reward(samples: Samples) -> np.ndarray:
    return np.asarray(
      [
        thought_rewards(prm(t, m), unit=unit)
        for t, m in zip(samples.texts, samples.metadata)
      ],
      np.float32,
    )

  return reward


# ---------------------------------------------------------------------------
# Group judges: EMPO clusters and SPO preferences.
# ---------------------------------------------------------------------------


def _groups(n: int, group_size: int) -> int:
  if group_size < 1 or n % group_size:
    raise ValueError(
      f"{n} texts do not split into groups of group_size={group_size}; pass"
      " the P*G completions in prompt-major order and G as group_size."
    )
  return n // group_size


def _default_extract(text: str) -> Optional[str]:
  return extract_answer(text, mode="last_number")


def cluster_answers(
  texts: Sequence[str],
  group_size: int,
  *,
  extract: Callable[[str], Optional[str]] = _default_extract,
  equivalent: Optional[Callable[[str, str], bool]] = None,
) -> np.ndarray:
  """EMPO's semantic clusters: int32 [P, G] cluster ids per group.

  Each text's answer is ``extract(text)``; None or "" means no answer
  (id -1). Within a group, answers join the cluster of the first earlier
  answer they are equivalent to (greedy first match, as the official
  code), by ``equivalent(a, b)`` or string equality. Ids are 0, 1, ... in
  order of first appearance.
  """
  num = _groups(len(texts), group_size)
  same = equivalent or (lambda a, b: a == b)
  ids = np.full((num, group_size), -1, np.int32)
  for p in range(num):
    heads: list[str] = []
    for i in range(group_size):
      answer = extract(texts[p * group_size + i])
      if answer is None or answer == "":
        continue
      for c, head in enumerate(heads):
        if same(head, answer):
          ids[p, i] = c
          break
      else:
        ids[p, i] = len(heads)
        heads.append(answer)
  return ids


def preference_matrix(
  texts: Sequence[str],
  metadata: Sequence[Mapping[str, Any]],
  group_size: int,
  prefer: Callable[[str, str, Mapping[str, Any]], float],
  *,
  antisymmetric: bool = True,
) -> np.ndarray:
  """SPO's pairwise preferences: float32 [P, G, G] with [p, i, j] =
  ``prefer(text_i, text_j, metadata)``, the probability that i beats j.

  With `antisymmetric` (default) the judge is asked once per pair and
  ``P(j > i) = 1 - P(i > j)``; otherwise both orders are asked (for judges
  with a position bias). The diagonal is 0.5.
  """
  _check_callable("prefer", prefer)
  num = _groups(len(texts), group_size)
  out = np.full((num, group_size, group_size), 0.5, np.float32)
  for p in range(num):
    base = p * group_size
    meta = metadata[base]
    for i in range(group_size):
      for j in range(i + 1, group_size):
        a, b = texts[base + i], texts[base + j]
        pij = _finite("prefer", prefer(a, b, meta), base + i)
        pji = 1.0 - pij if antisymmetric else prefer(b, a, meta)
        out[p, i, j], out[p, j, i] = pij, _finite("prefer", pji, base + j)
  return out


def _shape(scored) -> tuple[int, int]:
  p, g = np.shape(scored.rollout.tokens_PGT)[:2]
  return p, g


def _metadata(scored, g: int) -> list:
  return [e for e in scored.examples for _ in range(g)]


def cluster_annotate(
  extract: Callable[[str], Optional[str]] = _default_extract,
  equivalent: Optional[Callable[[str, str], bool]] = None,
  *,
  name: str = "answer_ids_PG",
) -> Callable[[Any], dict]:
  """``Trainer(annotate=...)`` for EMPO: writes `cluster_answers` of the
  scored completions to ``Batch.extra[name]``."""

  def annotate(scored) -> dict:
    _, g = _shape(scored)
    ids = cluster_answers(
      scored.completions, g, extract=extract, equivalent=equivalent
    )
    return {name: ids}

  return annotate


def preference_annotate(
  prefer: Callable[[str, str, Mapping[str, Any]], float],
  *,
  antisymmetric: bool = True,
  name: str = "preferences_PG",
) -> Callable[[Any], dict]:
  """``Trainer(annotate=...)`` for SPO: writes `preference_matrix` of the
  scored completions ([P, G, G]) to ``Batch.extra[name]``."""

  def annotate(scored) -> dict:
    _, g = _shape(scored)
    pref = preference_matrix(
      scored.completions,
      _metadata(scored, g),
      g,
      prefer,
      antisymmetric=antisymmetric,
    )
    return {name: pref}

  return annotate


def flag_annotate(
  judges: Sequence[Judge], *, name: str = "flagged_PG"
) -> Callable[[Any], dict]:
  """``Trainer(annotate=...)`` for CGPO: writes `judge_flags` ([P, G],
  float32 0/1) to ``Batch.extra[name]``."""

  def annotate(scored) -> dict:
    p, g = _shape(scored)
    flags = judge_flags(scored.completions, _metadata(scored, g), judges)
    return {name: flags.reshape(p, g).astype(np.float32)}

  return annotate
