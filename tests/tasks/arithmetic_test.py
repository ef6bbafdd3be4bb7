"""The built-in arithmetic task: determinism, disjoint splits, answers."""

import pickle

import numpy as np
import pytest

from rljax import rewards
from rljax import tasks
from rljax.tasks import _arithmetic


def _problem(example):
  return (example["a"], example["op"], example["b"])


def _all(dataset):
  return [dataset[i] for i in range(len(dataset))]


def test_permute_is_a_bijection():
  for n in (1, 2, 3, 7, 64, 100, 1000):
    for key in (0, 12345):
      image = [_arithmetic._permute(x, n, key) for x in range(n)]
      assert sorted(image) == list(range(n)), (n, key)
  # the order is scrambled, not the identity
  assert [_arithmetic._permute(x, 1000, 1) for x in range(10)] != list(
    range(10)
  )


def test_same_seed_same_examples_other_seed_different():
  a = tasks.arithmetic(seed=3, train_size=200)
  b = tasks.arithmetic(seed=3, train_size=200)
  c = tasks.arithmetic(seed=4, train_size=200)
  assert _all(a.train) == _all(b.train) and _all(a.test) == _all(b.test)
  assert [_problem(x) for x in _all(a.train)] != [
    _problem(x) for x in _all(c.train)
  ]
  assert {_problem(x) for x in _all(a.test)} != {
    _problem(x) for x in _all(c.test)
  }
  # random access needs no earlier element
  assert a.train[150] == b.train[150] and a.train[150]["index"] == 150


def test_train_and_test_never_share_a_problem():
  # 3 operations x 10 x 10 = 300 problems; test = min(500, 300 // 5) = 60.
  task = tasks.arithmetic(digits=1, operations="+-*", train_size=480)
  test = [_problem(x) for x in _all(task.test)]
  train = [_problem(x) for x in _all(task.train)]
  assert len(test) == 60 and len(set(test)) == 60
  assert not set(test) & set(train)
  # each pass over the 240 train problems covers all of them once, and the
  # second pass is reshuffled
  first, second = train[:240], train[240:]
  assert len(set(first)) == 240 and set(first) == set(second)
  assert first != second
  everything = {
    (a, op, b) for op in "+-*" for a in range(10) for b in range(10)
  }
  assert set(first) | set(test) == everything
  big = tasks.arithmetic(digits=2, operations="+-", train_size=5000)
  big_test = {_problem(x) for x in _all(big.test)}
  assert len(big_test) == 500
  assert not big_test & {_problem(x) for x in _all(big.train)}


def test_answers_and_prompts():
  bare = tasks.arithmetic(operations="+-*", train_size=300)
  for example in _all(bare.train) + _all(bare.test):
    a, op, b = _problem(example)
    assert 0 <= a < 100 and 0 <= b < 100
    assert int(example["answer"]) == eval(f"{a}{op}{b}")
    assert example["question"] == f"{a}{op}{b}"
    assert bare.format_prompt(example) == f"{a}{op}{b}="
    text = bare.format_prompt(example) + example["answer"]
    assert set(text) <= set(tasks.ARITHMETIC_ALPHABET), text
  assert any(x["answer"].startswith("-") for x in _all(bare.train))
  question = tasks.arithmetic(prompt_style="question", digits=3)
  example = question.train[0]
  a, op, b = _problem(example)
  assert int(example["answer"]) == a + b and a < 1000 and b < 1000
  assert question.format_prompt(example) == (
    f"What is {a} + {b}? Put the final answer after ####."
  )


def test_default_rewards_fit_the_prompt_style():
  example = {"question": "23+45", "answer": "68"}

  def total(task, texts):
    samples = rewards.Samples(
      texts, np.ones(len(texts)), np.zeros(len(texts), bool), [example] * 3
    )
    return rewards.score(samples, task.rewards).total_N.tolist()

  bare = tasks.arithmetic()
  assert [name for name, _, _ in bare.rewards] == ["correct"]
  assert total(bare, ["68", "6", "68 "]) == [1.0, 0.0, 1.0]
  question = tasks.arithmetic(prompt_style="question")
  texts = ["23 + 45 = 68.\n#### 68", "#### 67", "the answer is 68"]
  assert total(question, texts) == [1.0, 0.0, 0.0]


def test_grain_datasets_resume_and_pickle():
  task = tasks.arithmetic()
  iterator = iter(task.train.to_iter_dataset())
  for _ in range(3):
    next(iterator)
  state = iterator.get_state()
  expected = [next(iterator) for _ in range(2)]
  resumed = iter(task.train.to_iter_dataset())
  resumed.set_state(state)
  assert [next(resumed) for _ in range(2)] == expected
  assert expected == [task.train[3], task.train[4]]
  assert pickle.loads(pickle.dumps(task.train))[7] == task.train[7]


def test_errors():
  with pytest.raises(ValueError, match="operations"):
    tasks.arithmetic(operations=("/",))
  with pytest.raises(ValueError, match="operations"):
    tasks.arithmetic(operations="++")
  with pytest.raises(ValueError, match="test_size.*100 problems"):
    tasks.arithmetic(digits=1, test_size=100)
  with pytest.raises(ValueError, match="digits"):
    tasks.arithmetic(digits=0)
  with pytest.raises(ValueError, match="train_size"):
    tasks.arithmetic(train_size=2.5)
  with pytest.raises(ValueError, match="prompt_style"):
    tasks.arithmetic(prompt_style="chat")
