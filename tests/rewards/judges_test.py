"""Judges as callables: FAPO, P-GRPO, CGPO, TP-GRPO rewards; EMPO and SPO
annotators."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from rljax import rewards
from rljax import transforms


def _samples(texts, metas):
  n = len(texts)
  return rewards.Samples(
    texts=texts,
    num_tokens=np.full(n, 3),
    truncated=np.zeros(n, bool),
    metadata=metas,
  )


def _outcome(samples):
  return rewards.RewardResult(
    np.array([1.0 if "ok" in t else 0.0 for t in samples.texts], np.float32),
    np.ones(len(samples.texts), bool),
  )


def test_judge_reward_and_errors():
  s = _samples(["a", "bb"], [{}, {}])
  np.testing.assert_allclose(
    rewards.judge_reward(lambda t, m: len(t))(s), [1, 2]
  )
  with pytest.raises(ValueError, match="must return a number"):
    rewards.judge_reward(lambda t, m: "x")(s)
  with pytest.raises(ValueError, match="finite"):
    rewards.judge_reward(lambda t, m: math.inf)(s)
  with pytest.raises(ValueError, match="must be callable"):
    rewards.judge_reward(3)


def test_fapo_by_hand():
  # Deterministic GenRM: the first error is the index after "err@", -1 if
  # none. Correct & flawed -> 1 - 1 = 0; correct & clean -> 1; wrong -> -1;
  # an unreadable GenRM answer counts as clean.
  calls = []

  def genrm(text, meta):
    calls.append(text)
    if "garbled" in text:
      return "??"
    return text.split("err@")[1] if "err@" in text else -1

  texts = ["ok err@2", "ok", "wrong err@0", "ok garbled"]
  fn = rewards.flawed_positive_reward(_outcome, genrm)
  out = fn(_samples(texts, [{}] * 4))
  np.testing.assert_allclose(out.values, [0.0, 1.0, -1.0, 1.0])
  assert "wrong err@0" not in calls  # GenRM runs on correct answers only
  # lambda = 0.5 puts flawed positives at 0.5; incorrect=None keeps 0.
  out = rewards.flawed_positive_reward(
    _outcome, genrm, penalty=0.5, incorrect=None
  )(_samples(texts, [{}] * 4))
  np.testing.assert_allclose(out.values, [0.5, 1.0, 0.0, 1.0])


def test_fapo_scores_through_score():
  fn = rewards.flawed_positive_reward(_outcome, lambda t, m: -1)
  scores = rewards.score(_samples(["ok", "no"], [{}, {}]), [("fapo", fn, 1.0)])
  np.testing.assert_allclose(scores.total_N, [1.0, -1.0])


def test_success_gated_reward_matches_transform_function():
  texts = ["ok long", "no long", "ok"]
  prm = rewards.judge_reward(lambda t, m: 0.1 * len(t))
  out = rewards.success_gated_reward(_outcome, prm)(_samples(texts, [{}] * 3))
  r_out = _outcome(_samples(texts, [{}] * 3)).values
  want = transforms.success_gated_rewards(r_out, 0.1 * np.array([7, 7, 2]))
  np.testing.assert_allclose(out.values, want, rtol=1e-6)
  np.testing.assert_allclose(out.values, [1.7, 0.0, 1.2], rtol=1e-6)


def test_calibrated_reward_by_hand_and_caches_reference():
  calls = []

  def rm(text, meta):
    calls.append(text)
    return float(len(text))

  meta = {"reference": "abc"}
  s = _samples(["abc", "abcd", "a"], [meta, meta, meta])
  out = rewards.calibrated_reward(rm)(s)
  # sigmoid(3 - 3) = .5; sigmoid(1); sigmoid(-2).
  s1, s2 = 1 / (1 + math.exp(-1)), 1 / (1 + math.exp(2))
  np.testing.assert_allclose(out, [0.5, s1, s2], rtol=1e-6)
  assert calls.count("abc") == 2  # the reference once, the sample once
  with pytest.raises(ValueError, match="needs metadata\\['reference'\\]"):
    rewards.calibrated_reward(rm)(_samples(["x"], [{}]))


def test_thought_rewards_by_hand():
  # [T, T, F, F, T] -> thoughts +, -, + -> 1; [] -> 0; [F] -> -2 at unit 2.
  assert rewards.thought_rewards([1, 1, 0, 0, 1]) == 1.0
  assert rewards.thought_rewards([]) == 0.0
  assert rewards.thought_rewards([False], unit=2.0) == -2.0
  fn = rewards.thought_reward(lambda t, m: [c == "y" for c in t])
  np.testing.assert_allclose(fn(_samples(["yyn", "nny"], [{}, {}])), [0, 0])


def test_cluster_answers_by_hand_and_empo():
  texts = ["x 4", "y 4", "z 5", "none", "1", "2", "3", "4"]
  ids = rewards.cluster_answers(texts, 4)
  np.testing.assert_array_equal(ids, [[0, 0, 1, -1], [0, 1, 2, 3]])
  r = transforms.cluster_frequency_rewards(ids)
  np.testing.assert_allclose(r, [[0.5, 0.5, 0.25, 0], [0, 0, 0, 0]])
  # A custom equivalence merges "4" and "4.0".
  ids = rewards.cluster_answers(
    ["4", "4.0", "5"],
    3,
    extract=lambda t: t,
    equivalent=lambda a, b: float(a) == float(b),
  )
  np.testing.assert_array_equal(ids, [[0, 0, 1]])
  with pytest.raises(ValueError, match="group_size=4"):
    rewards.cluster_answers(["a"] * 6, 4)


def test_preference_matrix_antisymmetric_and_both_orders():
  texts = ["aaa", "a", "aa"]
  prefer = lambda a, b, m: float(len(a) > len(b))  # noqa: E731
  pref = rewards.preference_matrix(texts, [{}] * 3, 3, prefer)
  want = [[0.5, 1, 1], [0, 0.5, 0], [0, 1, 0.5]]
  np.testing.assert_allclose(pref[0], want)
  biased = lambda a, b, m: 0.7  # noqa: E731  (always prefers the first)
  pref = rewards.preference_matrix(
    texts, [{}] * 3, 3, biased, antisymmetric=False
  )
  np.testing.assert_allclose(pref[0, 0, 1], 0.7)
  np.testing.assert_allclose(pref[0, 1, 0], 0.7)
  np.testing.assert_allclose(
    transforms.win_rate_rewards(
      rewards.preference_matrix(texts, [{}] * 3, 3, prefer)
    ),
    [[1.0, 0.0, 0.5]],
  )


def test_annotators_produce_extra_arrays():
  scored = SimpleNamespace(
    rollout=SimpleNamespace(tokens_PGT=np.zeros((2, 2, 3), np.int32)),
    completions=["1", "1", "2", "3"],
    examples=[{"q": 0}, {"q": 1}],
  )
  out = rewards.cluster_annotate()(scored)
  np.testing.assert_array_equal(out["answer_ids_PG"], [[0, 0], [0, 1]])
  out = rewards.preference_annotate(lambda a, b, m: 0.25)(scored)
  assert out["preferences_PG"].shape == (2, 2, 2)
  flags = rewards.flag_annotate([lambda t, m: t == "2", lambda t, m: False])
  np.testing.assert_array_equal(flags(scored)["flagged_PG"], [[0, 0], [1, 0]])
  np.testing.assert_array_equal(
    rewards.judge_flags(["a", "b"], [{}, {}], [lambda t, m: t == "b"]),
    [False, True],
  )
