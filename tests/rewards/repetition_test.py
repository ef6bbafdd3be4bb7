"""CAMPO's repetition penalty: the trailing-loop fraction against a
brute-force numpy reference, by hand, as a reward, and in a run."""

import pathlib

import numpy as np
import pytest

from rljax import rewards
from rljax import testing
from rljax.training import Trainer

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def np_loop_fraction(seq, min_repeats=2):
  """Brute force: the smallest start s such that seq[s:] is k >= min_repeats
  copies of its last block of some length L (k L = n - s)."""
  a = np.asarray([ord(c) for c in seq] if isinstance(seq, str) else seq)
  n = a.size
  for s in range(n):
    span = n - s
    for k in range(span, min_repeats - 1, -1):
      if span % k:
        continue
      blocks = a[s:].reshape(k, span // k)
      if (blocks == blocks[-1]).all():
        return span / n
  return 0.0


def test_by_hand():
  # "xyzabab": "ab" twice at the end: 4 of 7 items. "baaaaa": "a" five
  # times: 5/6 (a period-2 reading covers only 4). "abcabcab": "cab"
  # twice from index 2: 6/8. "abcab": no block at the end repeats
  # back-to-back ("b" vs "a", "ab" vs "bc"): 0. All one token: 1.
  f = rewards.loop_fraction
  assert f("xyzabab") == pytest.approx(4 / 7)
  assert f("baaaaa") == pytest.approx(5 / 6)
  assert f("abcabcab") == pytest.approx(6 / 8)
  assert f("abcab") == 0.0
  assert f([7, 7, 7, 7]) == 1.0
  assert f("") == 0.0
  # min_repeats=3: "xyzabab" has only 2 copies of "ab", the final "b"
  # is alone; "xababab" has 3: 6/7.
  assert f("xyzabab", min_repeats=3) == 0.0
  assert f("xababab", min_repeats=3) == pytest.approx(6 / 7)


@pytest.mark.parametrize("min_repeats", [2, 3])
def test_matches_a_brute_force_reference(min_repeats):
  rng = np.random.default_rng(min_repeats)
  for _ in range(300):
    head = rng.integers(0, 3, rng.integers(0, 8)).tolist()
    block = rng.integers(0, 3, rng.integers(1, 4)).tolist()
    seq = head + block * int(rng.integers(0, 5))
    assert rewards.loop_fraction(seq, min_repeats=min_repeats) == (
      pytest.approx(np_loop_fraction(seq, min_repeats))
    ), seq


def _samples(texts, truncated):
  return rewards.Samples(
    texts=texts,
    num_tokens=np.asarray([len(t) for t in texts]),
    truncated=np.asarray(truncated),
    metadata=[{"answer": "3"}] * len(texts),
  )


def test_reward_paper_and_code_variants():
  samples = _samples(["12", "1212", "3", "x1212"], [False, True, False, True])
  paper = rewards.repetition_penalty()(samples)
  np.testing.assert_allclose(paper.values, [0, -1, 0, -0.8])
  assert paper.parsed is None
  code = rewards.repetition_penalty(variant="code")(samples)
  np.testing.assert_allclose(code.values, [0, -1, 0, -1])
  # r = r_acc - gamma f(o) through rewards.score, gamma = 0.5: "3" is the
  # only correct one (exact answer 3); "x1212" gets -0.5 * 0.8.
  scores = rewards.score(
    samples,
    [
      ("correct", rewards.exact_answer(), 1.0),
      ("repetition", rewards.repetition_penalty(), 0.5),
    ],
  )
  np.testing.assert_allclose(scores.total_N, [0, -0.5, 1, -0.4], atol=1e-6)
  # Token ids instead of characters: "1212" as one id per pair -> 1.
  by_pairs = rewards.repetition_penalty(
    tokenize=lambda t: [t[i : i + 2] for i in range(0, len(t), 2)]
  )(_samples(["1212"], [False]))
  np.testing.assert_allclose(by_pairs.values, [-1.0])


def test_bad_input_is_named():
  with pytest.raises(ValueError, match="variant"):
    rewards.repetition_penalty(variant="dynamic")
  with pytest.raises(ValueError, match="min_repeats"):
    rewards.repetition_penalty(min_repeats=1)
  with pytest.raises(ValueError, match="min_repeats"):
    rewards.loop_fraction("aa", min_repeats=2.0)
  with pytest.raises(ValueError, match="tokenize"):
    rewards.repetition_penalty(tokenize="chars")


def test_extra_rewards_by_name():
  from rljax.training import _build

  (spec,) = _build.extra_rewards(
    [{"name": "rep", "reward": "repetition_penalty", "weight": 0.5}]
  )
  assert spec[0] == "rep" and spec[2] == 0.5
  with pytest.raises(ValueError, match="unknown reward"):
    _build.extra_rewards([{"reward": "nope"}])
  with pytest.raises(ValueError, match="names no 'reward'"):
    _build.extra_rewards([{"weight": 1.0}])
  with pytest.raises(ValueError, match="must be a dict"):
    _build.extra_rewards([{"reward": "repetition_penalty", "w": 1}])


@pytest.mark.slow
def test_campo_config_runs_with_the_penalty(tmp_path):
  config = testing.tiny_run_config(
    CONFIGS / "campo.py", tmp_path, "train.steps=2"
  )
  out = Trainer(config).run()
  assert len(out["history"]) == 2
  assert all(np.isfinite(h["loss"]) for h in out["history"])
  assert "reward/repetition" in out["history"][-1]
