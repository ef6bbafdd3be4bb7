"""TreePO's adaptive branching and fallback (`rollouts.divergence_forks`,
`sample_trees(divergence=..., fallback=...)`): the fork rule by hand and
against a numpy reference, trees grown by a tiny model that follow it
exactly, groups a fallback fills, and a trainer step."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax import rollouts
from rljax import sampling
from rljax import testing
from rljax.rollouts import _trees
from rljax.training import Trainer

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "grpo.py"
STOPS = (3, 4, 5, 6)  # frequent stop ids: branches end early
MANY_STOPS = tuple(range(3, 12))  # whole trees end in their first round


def _reference_forks(scores, k, ended_now, done, leaves, policy, temp=1.0):
  """The official sampler's rule, written out: budget transfer, then an
  even split (remainder to the last path) or a largest-remainder split of
  softmax weights after one fork each."""
  n = len(scores)
  budget = max(min(leaves - done, k * ended_now + k * n), n)
  if policy == "even":
    out = [budget // n] * n
    out[-1] += budget % n
    return out
  s = np.asarray(scores, float)
  shifted = (s - s.min()) * (1.0 if policy.startswith("inverse") else -1.0)
  w = np.exp(shifted / temp) / np.exp(shifted / temp).sum()
  rest = budget - n
  raw = w * rest
  base = [int(np.floor(x)) for x in raw]
  left = rest - sum(base)
  frac = sorted(range(n), key=lambda a: (-(raw[a] - base[a]), a))
  for a in frac[:left]:
    base[a] += 1
  return [1 + b for b in base]


def test_divergence_forks_by_hand():
  kw = dict(forks_N=[2, 2, 2], freed=2, leaves=16)
  # 3 live paths, 1 ended this round, 3 leaves done, 16 leaves, k = 2:
  # B = max(min(16 - 3, 2*3 + 2), 3) = 8 -> 2, 2 and the last 2 + 2.
  got = rollouts.divergence_forks([0.0] * 3, done=3, **kw)
  np.testing.assert_array_equal(got, [2, 2, 4])
  # 12 leaves done: the budget left caps it, B = min(4, 8) = 4 -> 1, 1, 2.
  got = rollouts.divergence_forks([0.0] * 3, done=12, **kw)
  np.testing.assert_array_equal(got, [1, 1, 2])
  # Path log-probs -1, -3, -2, B = 8: weights softmax(-(2, 0, 1)) =
  # (0.0900, 0.6652, 0.2447); the rest 5 -> 0.450, 3.326, 1.224, floors
  # 0, 3, 1 and the one left to the largest fraction (path 0): 1, 3, 1;
  # plus one each: 2, 4, 2 (the least likely path branches most).
  got = rollouts.divergence_forks(
    [-1.0, -3.0, -2.0], done=3, policy="logprob", **kw
  )
  np.testing.assert_array_equal(got, [2, 4, 2])
  # Inverse: softmax(2, 0, 1) = (0.6652, 0.0900, 0.2447) -> 3.326, 0.450,
  # 1.224 -> 3, 0, 1 + 1 to path 1 -> 4, 2, 2.
  got = rollouts.divergence_forks(
    [-1.0, -3.0, -2.0], done=3, policy="inverse_logprob", **kw
  )
  np.testing.assert_array_equal(got, [4, 2, 2])


@pytest.mark.parametrize(
  "policy", ["even", "logprob", "inverse_logprob", "mean_logprob"]
)
def test_divergence_forks_match_reference(policy):
  rng = np.random.default_rng(0)
  for _ in range(200):
    n = int(rng.integers(1, 7))
    leaves = int(rng.integers(n, 33))
    done = int(rng.integers(0, leaves - n + 1))
    ended = int(rng.integers(0, 4))
    scores = rng.normal(size=n) * rng.choice([0.1, 3.0])
    temp = float(rng.choice([0.5, 1.0, 2.0]))
    got = rollouts.divergence_forks(
      scores,
      forks_N=[2] * n,
      freed=2 * ended,
      done=done,
      leaves=leaves,
      policy=policy,
      temperature=temp,
    )
    want = _reference_forks(scores, 2, ended, done, leaves, policy, temp)
    np.testing.assert_array_equal(got, want)
    assert got.min() >= 1 and got.sum() <= max(leaves - done, n)


def test_bad_options_name_the_argument():
  with pytest.raises(ValueError, match="divergence='bogus'"):
    rollouts.TreeRollouts(divergence="bogus", leaves=8)
  with pytest.raises(ValueError, match="leaves=None"):
    rollouts.TreeRollouts(divergence="even")
  with pytest.raises(ValueError, match="leaves=1"):
    rollouts.TreeRollouts(branching=(2, 2), divergence="even", leaves=1)
  with pytest.raises(ValueError, match="fallback='random' with fixed"):
    rollouts.TreeRollouts(fallback="random")
  with pytest.raises(ValueError, match="fallback='back'"):
    rollouts.TreeRollouts(divergence="even", leaves=8, fallback="back")
  with pytest.raises(ValueError, match="fallback_leaves='all'"):
    rollouts.TreeRollouts(divergence="even", leaves=8, fallback_leaves="all")
  with pytest.raises(ValueError, match="temperature=0"):
    rollouts.divergence_forks(
      [0.0], forks_N=[2], freed=0, done=0, leaves=4, temperature=0
    )
  paper = rollouts.TreeRollouts.treepo()
  assert paper.num_leaves == 16 and paper.branching == (2,) * 14
  assert (paper.segment, paper.divergence, paper.fallback) == (
    512,
    "even",
    "random",
  )


def _grow(
  model, fallback, key=3, stops=STOPS, prompts=((7, 8, 9), (10, 11), (12, 13))
):
  engine = sampling.Engine(
    model.config,
    slots=4,
    page_size=4,
    segment=4,
    max_length=24,
    stop_ids=stops,
  )
  out, tree = rollouts.sample_trees(
    engine,
    model,
    [list(x) for x in prompts],
    key=jax.random.key(key),
    branching=(2, 2, 2),
    segment=2,
    max_new_tokens=8,
    width=9,
    temperature=1.5,
    leaves=6,
    divergence="even",
    fallback=fallback,
  )
  assert engine.pages_in_use() == 0  # every node released
  return out, tree


def _check_shared_prefixes(out, tree, p):
  n = int(out.sample_mask_PG[p].sum())
  for a in range(n):
    for b in range(a + 1, n):
      shared = int(np.sum((tree[p, a] == tree[p, b]) & (tree[p, a] >= 0)))
      # d common ancestors: 2 * d common tokens (2-token segments).
      k = 2 * shared
      np.testing.assert_array_equal(
        out.tokens_PGT[p, a, :k], out.tokens_PGT[p, b, :k]
      )


@pytest.mark.slow  # a minute of CPU: engine rounds at three depths
def test_adaptive_trees_follow_the_rule(model):
  out, tree = _grow(model, fallback=None)
  assert tree.shape == (3, 6, 3)
  forks_seen = []
  for p in range(3):
    valid = out.sample_mask_PG[p] > 0
    n = int(valid.sum())
    assert np.all(valid[:n]) and np.all(tree[p, n:] == -1)
    paths = [tuple(int(x) for x in row if x >= 0) for row in tree[p, :n]]
    # Rebuild each round d: its live nodes (ancestors of a deeper leaf),
    # in creation order (ids), the nodes that ended, the leaves done.
    for d in range(1, 3):
      live = sorted({q[d - 1] for q in paths if len(q) > d})
      ended = sum(len(q) == d for q in paths)
      done = sum(len(q) <= d for q in paths)
      if not live:
        continue
      want = _reference_forks([0.0] * len(live), 2, ended, done, 6, "even")
      got = [
        len({q[d] for q in paths if len(q) > d and q[d - 1] == a}) for a in live
      ]
      assert got == want, (p, d, paths)
      forks_seen += got
    # A leaf above the last depth ended with a stop id in its segment.
    for a, q in enumerate(paths):
      length = int(out.mask_PGT[p, a].sum())
      if len(q) < 3:
        assert out.tokens_PGT[p, a, length - 1] in STOPS
    _check_shared_prefixes(out, tree, p)
  # The budget moved: some node forked other than 2 ways (this seed).
  assert any(f != 2 for f in forks_seen)


@pytest.mark.slow  # a minute of CPU: engine rounds and fallback restarts
def test_fallback_fills_groups(model):
  bare, _ = _grow(model, fallback=None, key=5, stops=MANY_STOPS)
  out, tree = _grow(model, fallback="random", key=5, stops=MANY_STOPS)
  # Without fallback a tree whose branches all stopped early stays short;
  # the fallback regrows every group to its 6 leaves.
  assert bare.sample_mask_PG.sum(1).min() < 6
  np.testing.assert_array_equal(out.sample_mask_PG, np.ones((3, 6)))
  prompts = ((7, 8, 9), (10, 11), (12, 13))
  for p in range(3):
    assert len({tuple(row) for row in tree[p]}) == 6  # distinct leaves
    _check_shared_prefixes(out, tree, p)
    # Each leaf's log-probs are the model's, the re-prefilled prefix of a
    # fallback branch included (kept from the leaf it restarted from).
    for a in range(6):
      length = int(out.mask_PGT[p, a].sum())
      seq = jnp.asarray(
        list(prompts[p]) + out.tokens_PGT[p, a, :length].tolist()
      )
      logp, _ = models.token_logprobs(
        model, seq[None], jnp.ones((1, len(seq))), temperature=1.5
      )
      np.testing.assert_allclose(
        out.full_logp_PGT[p, a, :length],
        np.asarray(logp[0, len(prompts[p]) :]),
        atol=1e-4,
      )


def test_fallback_starts_cut_at_segment_bounds():
  # A leaf at depth 3 (ancestors ending at 2 and 4 tokens) cut to depth j
  # keeps tokens[:bounds[j-1]] and ancestors path[:j]; the prompt when no
  # leaf stopped.
  class _Seq:
    completion = [1, 2, 3, 4, 5]
    logp = [-0.1, -0.2, -0.3, -0.4, -0.5]
    full_logp = [-1.0, -2.0, -3.0, -4.0, -5.0]

  leaf = _trees._Node(0, [0, 2, 5], _Seq(), bounds=(2, 4))
  rng = np.random.default_rng(0)
  cuts = set()
  for _ in range(50):
    [(j, n, head, path, bounds)] = _trees._fallback_starts(
      [leaf], 2, (2, 2, 2), "random", rng
    )
    cuts.add(j)
    b = (0, 2, 4)[j]
    assert n == 2 and list(head[0]) == [1, 2, 3, 4, 5][:b]
    assert list(head[2]) == [-1.0, -2.0, -3.0, -4.0, -5.0][:b]
    assert path == [0, 2, 5][:j] and bounds == (2, 4)[:j]
  assert cuts == {0, 1, 2}
  # Budget 5, k = 2: three restarts of 2, 2, 1 branches.
  starts = _trees._fallback_starts([leaf] * 4, 5, (2, 2, 2), "random", rng)
  assert [s[1] for s in starts] == [2, 2, 1]
  [start] = _trees._fallback_starts([], 5, (3, 2, 2), "random", rng)
  assert start[:2] == (0, 3) and start[3] == []


@pytest.mark.slow  # a trainer step
def test_trainer_samples_adaptive_trees(tmp_path):
  config = testing.tiny_run_config(CONFIG, tmp_path, "train.steps=1")
  groups = rollouts.TreeRollouts(
    branching=(2, 2),
    segment=2,
    leaves=config.sampler.num_samples,
    divergence="even",
    fallback="random",
  )
  trainer = Trainer(config, groups=groups)
  trainer.step(0)
  tree = trainer._last.extra["tree_PG"]
  assert tree.shape[1:] == (config.sampler.num_samples, 2)
  assert np.all(trainer._last.rollout.sample_mask_PG == 1)
