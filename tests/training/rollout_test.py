"""take_groups: assembling a batch from the kept groups of several rollouts."""

import numpy as np

from rljax.rewards import Scores
from rljax.sampling import Rollout
from rljax.training._rollout import Scored
from rljax.training._rollout import take_groups


def _scored(reward_mean, offset, p=2, g=2, t=3):
  fields = [np.full((p, g, t), offset)] * 6 + [np.full((p, g), offset)]
  totals = np.arange(p * g, dtype=np.float32) + offset
  scores = Scores(
    values_NK=totals[:, None],
    weights_K=np.ones(1, np.float32),
    names=("correct",),
    total_N=totals,
    metrics={"reward/correct": reward_mean},
  )
  return Scored(
    Rollout(
      *fields,
      full_logp_PGT=np.full((p, g, t), offset),
      sample_mask_PG=np.ones((p, g), np.int32),
    ),
    [{"i": offset + i} for i in range(p)],
    [f"p{offset + i}" for i in range(p)],
    [f"c{offset + n}" for n in range(p * g)],
    scores,
    totals.reshape(p, g),
  )


def test_groups_are_picked_across_rollouts_with_their_samples():
  # Group 3 = the second rollout's prompt 1 (samples 12, 13); group 0 = the
  # first rollout's prompt 0 (samples 0, 1).
  out = take_groups([_scored(0.2, 0), _scored(0.6, 10)], np.array([3, 0]))
  assert out.prompts == ["p11", "p0"]
  assert out.examples == [{"i": 11}, {"i": 0}]
  assert out.completions == ["c12", "c13", "c0", "c1"]
  np.testing.assert_array_equal(out.scores.total_N, [12, 13, 0, 1])
  np.testing.assert_array_equal(out.rewards_PG, [[12, 13], [0, 1]])
  np.testing.assert_array_equal(out.rollout.tokens_PGT[:, 0, 0], [10, 0])
  # Metrics cover everything sampled: (0.2 + 0.6) / 2.
  assert out.scores.metrics == {"reward/correct": 0.4}
