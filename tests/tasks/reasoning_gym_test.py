"""reasoning-gym adapters and the task registry."""

import faulthandler
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from rljax import rewards
from rljax import tasks
from rljax.tasks import _reasoning_gym

NAMES = ("countdown", "basic_arithmetic", "gsm_symbolic")


def _score(task, texts, example, name="correct"):
  n = len(texts)
  samples = rewards.Samples(texts, np.ones(n), np.zeros(n, bool), [example] * n)
  scores = rewards.score(samples, task.rewards)
  return scores.values_NK[:, 0].tolist(), scores.metrics


def _wrong(name, example):
  if name != "countdown":
    return str(int(example["answer"]) + 1)
  numbers = example["metadata"]["numbers"]
  wrong = " + ".join(map(str, numbers))
  if eval(wrong) == example["metadata"]["target"]:
    wrong = " * ".join(map(str, numbers))
  return wrong  # the right numbers, the wrong value


@pytest.mark.parametrize("name", NAMES)
def test_gold_scores_one_wrong_zero(name):
  task = tasks.reasoning_gym(name, size=4, test_size=2)
  assert task.name == f"reasoning_gym:{name}"
  assert (len(task.train), len(task.test)) == (4, 2)
  for example in (task.train[0], task.test[1]):
    assert isinstance(example["question"], str)
    assert isinstance(example["answer"], str)
    prompt = task.format_prompt(example)
    assert prompt.startswith(example["question"].rstrip())
    assert prompt.endswith("inside <answer> </answer> tags.")
    texts = [
      f"<think>easy</think><answer>{example['answer']}</answer>",
      f"<answer>{_wrong(name, example)}</answer>",
      example["answer"],  # no tags: not parsed
    ]
    values, metrics = _score(task, texts, example)
    assert values == [1.0, 0.0, 0.0]
    assert metrics["unparseable/correct"] == pytest.approx(1 / 3)


def test_hash_extraction_and_partial_credit():
  task = tasks.reasoning_gym(
    "countdown", size=2, test_size=1, extract="hash", partial_credit=True
  )
  example = task.train[1]
  assert task.format_prompt(example).endswith('after "####" at the end.')
  texts = [
    f"work...\n#### {example['answer']}",
    f"#### {_wrong('countdown', example)}",
    "no marker",
  ]
  values, _ = _score(task, texts, example)
  # countdown's own score_answer: 1.0 solved, 0.05 right numbers but wrong
  # value; unparsed answers never reach it (0.0, not its 0.01 for None).
  assert values == [1.0, np.float32(0.05), 0.0]


@pytest.mark.parametrize("name", NAMES)
def test_generation_is_deterministic_and_splits_differ(name):
  a = tasks.reasoning_gym(name, size=3, test_size=3, seed=1)
  b = tasks.reasoning_gym(name, size=3, test_size=3, seed=1)
  c = tasks.reasoning_gym(name, size=3, test_size=3, seed=2)
  train = [a.train[i] for i in range(3)]
  test = [a.test[i] for i in range(3)]
  assert train == [b.train[i] for i in range(3)]
  assert test == [b.test[i] for i in range(3)]
  questions = {x["question"] for x in train}
  assert questions.isdisjoint(x["question"] for x in test)
  assert questions.isdisjoint(c.train[i]["question"] for i in range(3))


def test_config_passes_through_and_errors():
  task = tasks.reasoning_gym(
    "basic_arithmetic", size=3, test_size=1, min_terms=2, max_terms=2
  )
  assert task.train[0]["metadata"]["num_terms"] == 2
  with pytest.raises(ValueError, match="unknown reasoning-gym dataset"):
    tasks.reasoning_gym("no_such_dataset")
  with pytest.raises(ValueError, match="bad config"):
    tasks.reasoning_gym("countdown", min_numbers=1)
  with pytest.raises(ValueError, match="bad config"):
    tasks.reasoning_gym("countdown", not_a_field=1)
  with pytest.raises(ValueError, match="extract"):
    tasks.reasoning_gym("countdown", extract="boxed")
  with pytest.raises(ValueError, match="seed"):
    tasks.reasoning_gym("countdown", seed=-1)


def test_missing_package_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "reasoning_gym", None)
  with pytest.raises(ImportError, match=r"rljax\[tasks\]"):
    tasks.reasoning_gym("countdown")


def test_reward_needs_the_example_dict_as_metadata():
  task = tasks.reasoning_gym("gsm_symbolic", size=1, test_size=1)
  with pytest.raises(ValueError, match="'metadata'"):
    _score(task, ["<answer>1</answer>"], {"answer": "1"})


def test_registry():
  assert tasks.get("arithmetic", digits=1).train[0]["a"] < 10
  task = tasks.get("reasoning_gym:gsm_symbolic", size=2, test_size=1)
  assert task.name == "reasoning_gym:gsm_symbolic"
  for bad in ("arith", "reasoning_gym:", "reasoning_gym"):
    with pytest.raises(ValueError, match="choices: 'arithmetic'"):
      tasks.get(bad)


_IN_A_NEW_PROCESS = """
import json
from rljax import tasks
task = tasks.reasoning_gym("countdown", size=2, test_size=1, seed=5)
arith = tasks.arithmetic(seed=5)
print(json.dumps([task.train[1], task.test[0], arith.train[9]]))
"""


def test_examples_are_the_same_in_a_new_process():
  # A resumed run rebuilds the datasets in a fresh interpreter, with another
  # string-hash seed; the examples behind a saved grain index must not move.
  env = dict(os.environ, PYTHONHASHSEED="123")
  out = subprocess.run(
    [sys.executable, "-c", _IN_A_NEW_PROCESS],
    env=env,
    capture_output=True,
    text=True,
    check=True,
    timeout=120,
  ).stdout
  task = tasks.reasoning_gym("countdown", size=2, test_size=1, seed=5)
  arith = tasks.arithmetic(seed=5)
  here = [task.train[1], task.test[0], arith.train[9]]
  assert json.loads(out.strip().splitlines()[-1]) == json.loads(
    json.dumps(here)
  )


# ----------------------------------------------------------------------------
# Model text is never evaluated in the trainer

SANDBOXED = ("basic_arithmetic", "gsm_symbolic", "puzzle24")


@pytest.fixture(scope="module")
def sandboxed():
  """name -> a task whose scorer runs in the sandbox (1.5 s per answer)."""
  built = {}
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(_reasoning_gym, "SCORE_TIMEOUT", 1.5)
    for name in SANDBOXED:
      built[name] = tasks.reasoning_gym(name, size=8, test_size=1)
  yield built
  for task in built.values():
    task.rewards[0][1].sandbox.close()


def _injection(canary):
  return f"<answer>__import__('os').system('touch {canary}')</answer>"


@pytest.mark.parametrize("name", ("countdown",) + SANDBOXED)
def test_model_text_is_never_executed(name, sandboxed, tmp_path, monkeypatch):
  # Before the fix reasoning-gym's sympy.parse_expr ran this in the trainer
  # (countdown, puzzle24, ...) and created both files.
  monkeypatch.chdir(tmp_path)
  task = sandboxed.get(name) or tasks.reasoning_gym(name, size=2, test_size=1)
  example = task.train[0]
  texts = [_injection("pwned"), _injection(tmp_path / "canary")]
  values, _ = _score(task, texts, example)
  assert values == [0.0, 0.0]
  assert not (tmp_path / "pwned").exists()
  assert not (tmp_path / "canary").exists()


def _ordinary(name, example):
  gold = example["answer"]
  answers = [gold, f" {gold} ", f"{gold}.0", f"-{gold}", f"{gold} apples"]
  answers += [f"it is {gold}", gold[:-1] or "0", "", "x", "1 +", "(3"]
  if name == "puzzle24":
    answers += ["1 + 2 + 3 + 4", gold.replace("+", "-", 1), "24"]
  return answers


@pytest.mark.parametrize("name", SANDBOXED)
def test_sandboxed_scores_match_score_answer(name, sandboxed):
  task = sandboxed[name]
  fn = task.rewards[0][1]
  dataset = _reasoning_gym._create(*fn.dataset)
  graded = _reasoning_gym._Correct(*fn.dataset, "answer_tag", True)
  graded.sandbox = fn.sandbox  # the same worker, partial credit on
  for example in (task.train[i] for i in range(4)):
    answers = [a for a in _ordinary(name, example) if a.strip()]
    texts = [f"<answer>{a}</answer>" for a in answers]
    n = len(texts)
    samples = rewards.Samples(
      texts, np.ones(n), np.zeros(n, bool), [example] * n
    )
    expected = np.asarray(
      [dataset.score_answer(a.strip(), example) for a in answers], np.float32
    )
    out = graded(samples)
    np.testing.assert_array_equal(out.values, expected)
    assert out.parsed.all()
    binary = fn(samples)
    np.testing.assert_array_equal(binary.values, expected >= 1.0)


def test_a_hanging_answer_scores_zero_and_the_batch_goes_on(sandboxed):
  # puzzle24's scorer computes 9**9**9**9 with sympy (uninterruptible).
  task = sandboxed["puzzle24"]
  example = task.train[0]
  gold = f"<answer>{example['answer']}</answer>"
  n = 3
  texts = [gold, "<answer>9**9**9**9</answer>", gold]
  samples = rewards.Samples(texts, np.ones(n), np.zeros(n, bool), [example] * n)
  faulthandler.dump_traceback_later(300, exit=True)  # a hang guard
  try:
    out = task.rewards[0][1](samples)
  finally:
    faulthandler.cancel_dump_traceback_later()
  np.testing.assert_array_equal(out.values, [1, 0, 1])
  np.testing.assert_array_equal(out.parsed, [1, 0, 1])


def test_tasks_build_and_pickle_without_starting_a_process():
  task = tasks.reasoning_gym("basic_arithmetic", size=4, test_size=1)
  fn = task.rewards[0][1]
  assert repr(fn.sandbox).startswith("Sandbox(idle")
  copy = pickle.loads(pickle.dumps(task.rewards))[0][1]
  assert repr(copy.sandbox).startswith("Sandbox(idle")
  assert len(pickle.dumps(task.rewards)) < 4096
  countdown = tasks.reasoning_gym("countdown", size=2, test_size=1)
  assert countdown.rewards[0][1].sandbox is None  # scored natively


class _ForgedSandbox:
  """What a worker taken over by an answer could send back."""

  def map(self, fn, calls):
    from rljax.sandbox import Outcome

    forged = [
      Outcome("ok", "1.0"),
      Outcome("ok", float("inf")),
      Outcome("ok", 10**400),
      Outcome("ok", [1.0]),
      Outcome("ok", 1.0),
      Outcome("timeout", error="timed out after 10 s"),
      Outcome("crashed", error="signal SIGSEGV"),
    ]
    return forged[: len(calls)]


def test_what_the_worker_sends_back_is_never_trusted(caplog):
  task = tasks.reasoning_gym("gsm_symbolic", size=2, test_size=1)
  fn = task.rewards[0][1]
  fn.sandbox = _ForgedSandbox()
  example = task.train[0]
  texts = [f"<answer>{i}</answer>" for i in range(7)]
  values, metrics = _score(task, texts, example)
  assert values == [0, 0, 0, 0, 1, 0, 0]
  assert metrics["unparseable/correct"] == pytest.approx(6 / 7)
  assert "6 of 7 answers could not be scored" in caplog.text
