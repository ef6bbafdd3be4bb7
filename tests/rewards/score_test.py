"""score: weighted sums by hand, metrics, float32, errors; format and length."""

import faulthandler
import math
import random
import re

import numpy as np
import pytest

from rljax import rewards
from rljax import shaping
from rljax._src.errors import UserError


def _samples(texts, num_tokens=None, answers=None):
  n = len(texts)
  return rewards.Samples(
    texts=list(texts),
    num_tokens=np.asarray(num_tokens if num_tokens is not None else [1] * n),
    truncated=np.zeros((n,), bool),
    metadata=[{"answer": a} for a in (answers or ["0"] * n)],
  )


def _constant(values, parsed=None):
  return lambda samples: rewards.RewardResult(np.asarray(values), parsed)


def test_weighted_sum_by_hand_and_metrics():
  samples = _samples(["a", "b", "c", "d"])
  half = _constant([0.5, 0.5, 0.0, 1.0], np.array([1, 1, 0, 1], bool))
  ints = lambda s: np.array([1, 0, 1, 1], np.int32)  # a plain array
  scores = rewards.score(samples, [("acc", half, 2.0), ("fmt", ints, -0.5)])
  # total = 2 * acc - 0.5 * fmt:
  #   [2*0.5 - 0.5, 2*0.5 - 0, 2*0 - 0.5, 2*1 - 0.5] = [0.5, 1.0, -0.5, 1.5]
  np.testing.assert_array_equal(scores.total_N, [0.5, 1.0, -0.5, 1.5])
  np.testing.assert_array_equal(
    scores.values_NK, [[0.5, 1], [0.5, 0], [0, 1], [1, 1]]
  )
  np.testing.assert_array_equal(scores.weights_K, [2.0, -0.5])
  assert scores.names == ("acc", "fmt")
  for array in (scores.values_NK, scores.weights_K, scores.total_N):
    assert array.dtype == np.float32
  # reward/acc = (0.5 + 0.5 + 0 + 1) / 4 = 0.5; reward/fmt = 3 / 4;
  # unparseable/acc = 1 / 4; fmt reports no parsed flags, so no rate.
  assert scores.metrics == {
    "reward/acc": 0.5,
    "reward/fmt": 0.75,
    "unparseable/acc": 0.25,
  }


def test_mapping_spec_and_half_rewards_stay_half():
  samples = _samples(["a", "b"])
  spec = {"x": (_constant([0.5, 0.25]), 1.0), "y": (_constant([1, 0]), 0.5)}
  scores = rewards.score(samples, spec)
  # [0.5 + 0.5 * 1, 0.25 + 0.5 * 0] = [1.0, 0.25]
  np.testing.assert_array_equal(scores.total_N, [1.0, 0.25])
  assert scores.values_NK[0, 0] == 0.5


def test_nan_means_not_applicable_like_shaping_weighted_sum():
  samples = _samples(["a", "b", "c"])
  spec = [
    ("x", _constant([1.0, math.nan, 0.5]), 1.0),
    ("y", _constant([math.nan, math.nan, 1.0]), 3.0),
  ]
  scores = rewards.score(samples, spec)
  # [1 + 0, 0 + 0, 0.5 + 3] = [1, 0, 3.5]
  np.testing.assert_array_equal(scores.total_N, [1.0, 0.0, 3.5])
  reference = shaping.weighted_sum(scores.values_NK, scores.weights_K)
  np.testing.assert_allclose(scores.total_N, np.asarray(reference))
  assert scores.metrics["reward/x"] == 0.75  # mean of 1 and 0.5
  assert scores.metrics["reward/y"] == 1.0


def test_infinite_rewards_are_rejected_with_the_reward_and_indices():
  samples = _samples(["a", "b", "c", "d"])
  spec = [("ok", _constant([1.0, 0.0, math.nan, 1.0]), 1.0)]
  for name, values, shown in [
    ("inf", [1.0, math.inf, 0.0, -math.inf], "1, 3"),
    ("big", [0.0, 0.0, 1e39, 0.0], "2"),  # float32 overflows to inf
  ]:
    bad = spec + [(name, _constant(values), 0.0)]
    with pytest.raises(UserError, match=f"reward '{name}'.*indices {shown}"):
      rewards.score(samples, bad)
  many = _constant([math.inf] * 7)
  with pytest.raises(UserError, match="0, 1, 2, 3, 4 and 2 more.*NaN"):
    rewards.score(_samples(["x"] * 7), [("many", many, 1.0)])
  assert rewards.score(samples, spec).total_N.tolist() == [1.0, 0.0, 0.0, 1.0]


def test_wrong_length_names_the_reward():
  samples = _samples(["a", "b", "c"])
  with pytest.raises(ValueError, match="'short'.*shape \\(3,\\)"):
    rewards.score(samples, [("short", _constant([1.0, 0.0]), 1.0)])
  bad_parsed = _constant([1.0, 0.0, 1.0], np.array([True]))
  with pytest.raises(ValueError, match="'p' returned parsed"):
    rewards.score(samples, [("p", bad_parsed, 1.0)])


def test_bad_specs_and_samples():
  samples = _samples(["a"])
  ok = _constant([1.0])
  with pytest.raises(ValueError, match="empty"):
    rewards.score(samples, [])
  with pytest.raises(ValueError, match="unique"):
    rewards.score(samples, [("a", ok, 1.0), ("a", ok, 1.0)])
  with pytest.raises(ValueError, match="weight of reward 'a'"):
    rewards.score(samples, {"a": (ok, math.inf)})
  with pytest.raises(ValueError, match="callable"):
    rewards.score(samples, [("a", 1.0, ok)])
  uneven = samples._replace(metadata=[])
  with pytest.raises(ValueError, match="samples.metadata has 0"):
    rewards.score(uneven, [("a", ok, 1.0)])


# ----------------------------------------------------------------------------
# answer_format and length_penalty


def test_answer_format():
  texts = [
    "<think>2+2 is 4</think>\n<answer>4</answer>",
    "<think>multi\nline</think><answer>\n4\n</answer>",
    "<answer>4</answer>",
    "<think>x</think><answer>4</answer> trailing",
    "<think>x</think> <answer>4</answer>\n",  # "$" matches before a final \n
  ]
  out = rewards.answer_format()(_samples(texts))
  np.testing.assert_array_equal(out.values, [1, 1, 0, 0, 1])
  assert out.values.dtype == np.float32 and out.parsed is None
  boxed = rewards.answer_format(pattern=r"\\boxed\{")
  np.testing.assert_array_equal(
    boxed(_samples(["a \\boxed{1}", "1"])).values, [1, 0]
  )
  with pytest.raises(ValueError, match="pattern"):
    rewards.answer_format(pattern="(")


def test_answer_format_default_matches_its_regex():
  regex = re.compile(rewards.THINK_ANSWER, re.DOTALL)
  pieces = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "x"]
  rng = random.Random(0)
  texts = [
    "".join(rng.choice(pieces) for _ in range(rng.randint(0, 9)))
    for _ in range(3000)
  ]
  out = rewards.answer_format()(_samples(texts))
  expected = [regex.search(t) is not None for t in texts]
  np.testing.assert_array_equal(out.values, expected)
  assert 0 < sum(expected) < len(texts)


def test_answer_format_is_linear_on_a_backtracking_bomb():
  # As a regex, THINK_ANSWER takes quadratic time here (hours for this
  # text). Hang guard: the process dies with a traceback if this hangs.
  bomb = "<think>" + "</think><answer></answer>x" * 200_000
  faulthandler.dump_traceback_later(300, exit=True)
  try:
    out = rewards.answer_format()(_samples([bomb, bomb + "</answer>"]))
  finally:
    faulthandler.cancel_dump_traceback_later()
  np.testing.assert_array_equal(out.values, [0, 1])


def test_length_penalty_by_hand():
  fn = rewards.length_penalty(max_length=10, buffer=4, factor=0.5)
  # ramp starts at 10 - 4 = 6 tokens: -0.5 * clip(L - 6, 0, 4) / 4
  #   L = 3 -> 0, 6 -> 0, 7 -> -0.125, 8 -> -0.25, 10 -> -0.5, 12 -> -0.5
  out = fn(_samples(["x"] * 6, num_tokens=[3, 6, 7, 8, 10, 12]))
  np.testing.assert_array_equal(out.values, [0, 0, -0.125, -0.25, -0.5, -0.5])
  assert out.values.dtype == np.float32 and out.parsed is None


def test_length_penalty_checks_hyperparameters_up_front():
  with pytest.raises(ValueError, match="buffer"):
    rewards.length_penalty(max_length=10, buffer=11)
  with pytest.raises(ValueError, match="max_length"):
    rewards.length_penalty(max_length=0, buffer=1)
