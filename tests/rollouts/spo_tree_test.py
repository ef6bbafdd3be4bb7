"""SPO-tree's sampler (arXiv 2505.23564): each token's tree level by hand,
the strategy's draw on a tiny random model (leaves share their ancestors'
segments, every segment trains once), and one trainer step with it."""

import pathlib

import jax
import numpy as np
import pytest

from rljax import rollouts
from rljax import sampling
from rljax import testing
from rljax import transforms as T
from rljax.training import Trainer

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs"
STOPS = (3, 4, 5)  # frequent stops: some branches end early


def test_segment_depths_by_hand():
  # Segments of 2 tokens, D = 3. Leaf 0 reaches level 3 with 6 tokens:
  # levels 1 1 2 2 3 3. Leaf 1 ended at level 2 after 3 tokens: 1 1 2.
  # Leaf 2 ended in its first segment after 1 token. Row 3 is unused.
  tree = np.array([[[0, 2, 4], [0, 3, -1], [1, -1, -1], [-1, -1, -1]]])
  lengths = np.array([[6, 3, 1, 0]])
  mask = np.arange(7) < lengths[..., None]
  depth = rollouts.segment_depths(mask, tree, segment=2)
  np.testing.assert_array_equal(
    depth[0],
    [
      [1, 1, 2, 2, 3, 3, 0],
      [1, 1, 2, 0, 0, 0, 0],
      [1, 0, 0, 0, 0, 0, 0],
      [0, 0, 0, 0, 0, 0, 0],
    ],
  )
  # An invalid sample gets no level.
  depth = rollouts.segment_depths(
    mask, tree, segment=2, sample_mask_PG=[[1, 0, 1, 1]]
  )
  np.testing.assert_array_equal(depth[0, 1], 0)
  with pytest.raises(ValueError, match="segment"):
    rollouts.segment_depths(mask, tree, segment=0)
  with pytest.raises(ValueError, match="tree_PGD"):
    rollouts.segment_depths(mask, tree[..., 0], segment=2)


def test_bad_settings_raise():
  with pytest.raises(ValueError, match="branching"):
    rollouts.SegmentTree(branching=(2, 0))
  with pytest.raises(ValueError, match="segment"):
    rollouts.SegmentTree(segment=0)
  with pytest.raises(ValueError, match="rho"):
    rollouts.SegmentTree(rho=1.5)
  assert rollouts.get("segment_tree", branching=[3, 2]).num_leaves == 6


@pytest.mark.slow  # engine compilation and a few rounds of forks on CPU
def test_draw_trains_every_segment_once(model):
  engine = sampling.Engine(
    model.config,
    slots=4,
    page_size=4,
    segment=4,
    max_length=24,
    stop_ids=STOPS,
  )
  prompts = [[7, 8, 9], [10, 11]]
  strategy = rollouts.SegmentTree(branching=(2, 2, 2), segment=2, rho=0.9)
  with pytest.raises(ValueError, match="makes 8 leaves"):
    strategy.draw(
      engine,
      model,
      prompts,
      np.array([8, 4]),
      key=jax.random.key(0),
      max_new_tokens=7,
      width=8,
      temperature=1.5,
    )
  drawn = strategy.draw(
    engine,
    model,
    prompts,
    np.array([8, 8]),
    key=jax.random.key(1),
    max_new_tokens=7,
    width=8,
    temperature=1.5,
  )
  rollout, extra = drawn.rollout, drawn.extra
  tree, depth = extra["tree_PG"], extra["spo_depth_PGT"]
  mask = np.asarray(rollout.mask_PGT) > 0
  assert tree.shape == (2, 8, 3) and depth.shape == mask.shape == (2, 8, 8)
  np.testing.assert_array_equal(
    extra["spo_low_prob_PGT"], (np.exp(rollout.full_logp_PGT) < 0.9) & mask
  )
  np.testing.assert_array_equal(depth > 0, mask)
  for p in range(2):
    for a in range(8):
      for b in range(8):
        # Where two leaves share their level-l node, the tokens of levels
        # up to l are the same tokens.
        shared = (tree[p, a] == tree[p, b]) & (tree[p, a] >= 0)
        upto = int(shared.sum())
        at = (depth[p, a] > 0) & (depth[p, a] <= upto)
        np.testing.assert_array_equal(depth[p, b, at], depth[p, a, at])
        np.testing.assert_array_equal(
          rollout.tokens_PGT[p, b, at], rollout.tokens_PGT[p, a, at]
        )
  # Each node's segment trains on one leaf (the first below it), on all
  # its tokens (no probability mask, zero advantages kept).
  rewards = np.random.default_rng(0).random((2, 8)).astype(np.float32)
  _, keep = T.spo_tree_advantages_of(
    rewards,
    tree,
    depth,
    rollout.mask_PGT,
    None,
    rollout.sample_mask_PG,
    drop_zero=False,
    normalize="none",
  )
  keep = np.asarray(keep) > 0
  for p in range(2):
    valid = [g for g in range(8) if rollout.sample_mask_PG[p, g]]
    for level in (1, 2, 3):
      for node in {int(tree[p, g, level - 1]) for g in valid} - {-1}:
        leaves = [g for g in valid if tree[p, g, level - 1] == node]
        owner = leaves[0]
        np.testing.assert_array_equal(
          keep[p, owner], keep[p, owner] | (depth[p, owner] == level)
        )
        for g in leaves[1:]:
          assert not keep[p, g][depth[p, g] == level].any()
  assert engine.pages_in_use() == 0


@pytest.mark.slow  # a trainer step
def test_trainer_step_with_segment_trees(tmp_path):
  config = testing.tiny_run_config(
    CONFIG / "spo_tree.py",
    tmp_path,
    "train.steps=1",
    "sampler.groups_kwargs={'branching': [2, 2], 'segment': 1}",
  )
  trainer = Trainer(config)
  metrics = trainer.step(0)
  assert all(np.isfinite(v) for v in metrics.values())
  extra = trainer._last.extra
  mask = trainer._last.rollout.mask_PGT
  assert extra["tree_PG"].shape == (8, 4, 2)
  assert extra["spo_depth_PGT"].shape == mask.shape == (8, 4, 4)
  np.testing.assert_array_equal(extra["spo_depth_PGT"] > 0, mask > 0)
