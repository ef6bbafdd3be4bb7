"""The native countdown scorer: parity with reasoning-gym, never sympy."""

import random
import re

import numpy as np
import pytest

from rljax import rewards
from rljax import tasks
from rljax.tasks._countdown import countdown_score

countdown = pytest.importorskip("reasoning_gym.games.countdown")

MALFORMED = [
  "",
  "   ",
  "abc",
  "25 + 4 =",
  "(25 + 4",
  "25 + 4)",
  "25 x 4",
  "25 × 4",
  "25 ÷ 5",
  "2 3",
  "(2)(3)",
  "2(3 + 4)",
  "1 + 2; 3",
  "1 = 1",
  "1 < 2",
  "007 + 1",
  "1 +* 2",
  "x + 1",
  "1j",
  "1 +",
  "[1, 2]",
  "1 + 2 # a comment 3",
  "(1\n+ 2)",
  "1\n+ 2",
]


def _examples(count):
  dataset = countdown.CountdownDataset(
    countdown.CountdownConfig(seed=11, size=count)
  )
  return dataset, [dataset[i] for i in range(count)]


def _perturbed(answer, numbers, target, rng):
  """Ordinary wrong, right and malformed variants of a solution."""
  ops = [m.start() for m in re.finditer(r"[-+*/]", answer)]
  ints = list(re.finditer(r"\d+", answer))
  out = [
    answer,
    answer.replace(" ", ""),
    f"({answer})",
    f" ( {answer} ) ",
    f"{answer} = {target}",
    f"{answer} + 0",
    f"{answer} * 1",
    f"{answer} - {numbers[0]}",
    f"({answer}) / 0",
    f"({numbers[0]} - {numbers[0]}) / ({numbers[0]} - {numbers[0]})",
    " + ".join(map(str, numbers)),
    " * ".join(map(str, numbers)),
    " - ".join(map(str, numbers)),
    " / ".join(map(str, numbers)),
    " + ".join(map(str, numbers[:-1])),
    " + ".join(map(str, numbers + [1])),
    " + ".join(f"{n}.0" for n in numbers),
    " + ".join(f"{n}.5" for n in numbers),
    str(target),
  ]
  for _ in range(4):
    chars = list(answer)
    if ops:
      chars[rng.choice(ops)] = rng.choice("+-*/")
    out.append("".join(chars))
  for _ in range(2):
    match = rng.choice(ints)
    bumped = str(int(match.group()) + rng.choice([-1, 1]))
    out.append(answer[: match.start()] + bumped + answer[match.end() :])
  return out


def test_parity_with_reasoning_gym_on_ordinary_answers():
  dataset, examples = _examples(60)
  rng = random.Random(0)
  seen = set()
  for example in examples:
    meta = example["metadata"]
    answers = _perturbed(
      example["answer"], meta["numbers"], meta["target"], rng
    )
    for answer in answers + MALFORMED:
      ours = countdown_score(answer, example)
      theirs = dataset.score_answer(answer, example)
      assert ours == theirs, (answer, example["answer"], ours, theirs)
      seen.add(ours)
  assert seen == {0.01, 0.05, 1.0}


def test_isclose_tolerance_is_reasoning_gyms():
  # np.isclose(atol=1e-6) also has rtol=1e-5: 99999/200 = 499.995 counts as
  # 500, 499.99 does not.
  example = {"answer": "", "metadata": {"numbers": [99999, 200], "target": 500}}
  dataset, _ = _examples(1)
  for answer in ("99999 / 200", "99999 / 200 - 0.005"):
    assert countdown_score(answer, example) == dataset.score_answer(
      answer, example
    )
  assert countdown_score("99999 / 200", example) == 1.0


@pytest.mark.parametrize(
  "answer",
  [
    "2 ** 10",
    "2 ^ 10",
    "5!",
    "pi * 2",
    "True + 1",
    "2**(5*2)",
    "1 // 2",
    "1 % 2",
    "'1' + '2'",
    "1e400 - 1e400",
  ],
)
def test_what_only_sympy_accepts_scores_malformed(answer):
  # Outside the safe grammar or its bounds: 0.01 where sympy may say 0.05.
  example = {"answer": "", "metadata": {"numbers": [2, 10, 5], "target": 1024}}
  assert countdown_score(answer, example) == 0.01


HOSTILE = [
  "__import__('os').system('touch pwned')",
  "exec('import os')",
  "open('pwned', 'w').write('x')",
  "(lambda: 1)()",
  "().__class__.__base__.__subclasses__()",
  "9**9**9**9",
  "1e999999999",
  "(" * 100_000 + "1" + ")" * 100_000,
  "-" * 100_000 + "1",
  "1+" * 10_000 + "1",
  "9" * 1_000_000,
  "1\x00+2",
  "\ud800",
  "６８",
]


def test_hostile_answers_never_reach_sympy(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  called = []
  monkeypatch.setattr(
    countdown, "parse_expr", lambda *a, **k: called.append(a) or 0
  )
  task = tasks.reasoning_gym("countdown", size=2, test_size=1)
  fn = task.rewards[0][1]
  assert fn.sandbox is None  # countdown never starts a subprocess
  example = task.train[0]
  texts = [f"<answer>{h}</answer>" for h in HOSTILE] + [
    f"<answer>{example['answer']}</answer>"
  ]
  n = len(texts)
  samples = rewards.Samples(texts, np.ones(n), np.zeros(n, bool), [example] * n)
  values = rewards.score(samples, task.rewards).values_NK[:, 0]
  assert values.tolist() == [0.0] * (n - 1) + [1.0]
  assert not called
  assert not (tmp_path / "pwned").exists()


def test_missing_metadata_names_the_keys():
  with pytest.raises(ValueError, match="'numbers' and 'target'"):
    countdown_score("1 + 2", {"answer": "3", "metadata": {"numbers": [1, 2]}})
