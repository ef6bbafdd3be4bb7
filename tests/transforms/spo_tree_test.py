"""SPO-tree's tree-based segment advantage (arXiv 2505.23564) against a
numpy reference that builds each tree's nodes explicitly and recurses over
them, two hand-worked trees (the official README's figure and one with an
early end), gradients with respect to the rewards by finite differences,
and the preset's policy gradient."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import algorithms
from rljax import transforms as T

SEGMENT = 2  # tokens per internal node in the random cases
OPTIONS = ("value", "sibling_std", "drop_zero", "normalize")
ADV = jax.jit(T.spo_tree_advantages_of, static_argnames=OPTIONS)
VALUES = jax.jit(T.spo_tree_values_of, static_argnames=("value",))


def _nodes(tree, valid, p):
  """The explicit tree of prompt p: each valid leaf's path of node keys
  (level, id) from the root (0, 0), each node's children in order of
  appearance and the leaves below it."""
  paths, children, below = {}, {}, {}
  for g in range(tree.shape[1]):
    if not valid[p, g] or tree[p, g, 0] < 0:
      continue
    path = [(0, 0)] + [
      (d + 1, int(tree[p, g, d]))
      for d in range(tree.shape[2])
      if tree[p, g, d] >= 0
    ]
    paths[g] = path
    for a, b in zip(path[:-1], path[1:]):
      children.setdefault(a, [])
      if b not in children[a]:
        children[a].append(b)
    for node in path:
      below.setdefault(node, []).append(g)
  return paths, children, below


def _np_value(node, r_p, children, below, value):
  """V(node): a leaf node's reward, else the mean of its children's values
  ("children") or of the rewards of the leaves below it ("leaves")."""
  if node not in children:  # a leaf node: one leaf below it
    return r_p[below[node][0]]
  if value == "children":
    return np.mean(
      [_np_value(c, r_p, children, below, value) for c in children[node]]
    )
  return np.mean([r_p[g] for g in below[node]])


def np_spo_tree(
  rewards,
  tree,
  depth,
  mask,
  low=None,
  valid=None,
  *,
  value="children",
  sibling_std=False,
  drop_zero=True,
  normalize="batch",
  eps=1e-8,
):
  """Recursion over explicit nodes, then each leaf's tokens; returns the
  advantages, the kept tokens and the node values [P, G, 1 + D]."""
  r = np.asarray(rewards, np.float64)
  tree, depth = np.asarray(tree), np.asarray(depth)
  mask = np.asarray(mask) > 0
  valid = np.ones(r.shape, bool) if valid is None else np.asarray(valid) > 0
  p_size, g_size, d_size = tree.shape
  adv = np.zeros(mask.shape)
  keep = np.zeros(mask.shape, bool)
  values = np.zeros((p_size, g_size, d_size + 1))
  for p in range(p_size):
    paths, children, below = _nodes(tree, valid, p)

    def v(node, r_p=r[p], children=children, below=below):
      return _np_value(node, r_p, children, below, value)

    for g, path in paths.items():
      for level, node in enumerate(path):
        values[p, g, level] = v(node)
      for t in range(mask.shape[-1]):
        d = depth[p, g, t]
        if not mask[p, g, t] or d < 1 or d >= len(path):
          continue
        node, parent = path[d], path[d - 1]
        a = v(node) - v(parent)
        if sibling_std:
          a /= np.std([v(c) for c in children[parent]]) + eps
        if below[node][0] != g or (drop_zero and a == 0):
          continue
        if low is not None and not low[p, g, t]:
          continue
        adv[p, g, t], keep[p, g, t] = a, True
  if normalize == "batch":
    mean = adv[keep].mean() if keep.any() else 0.0
    var = adv[keep].var(ddof=1) if keep.sum() > 1 else 0.0
    adv = np.where(keep, (adv - mean) / np.sqrt(var + eps), 0.0)
  return adv, keep, values


def _grow(rng, branching, path, counter, leaves):
  """The nodes below `path`, depth-first: `branching[level]` children,
  each a leaf at the last level or with probability 0.3."""
  for _ in range(branching[len(path)]):
    node = path + [next(counter)]
    if len(node) == len(branching) or rng.random() < 0.3:
      leaves.append(node)
    else:
      _grow(rng, branching, node, counter, leaves)


def _random_tree(rng, branching=(2, 3, 2), p_size=3, t_extra=2):
  """Trees of `branching` whose nodes above the last level end early with
  probability 0.3, leaves depth-first, ids in creation order; token levels
  as `SegmentTree` lays them out (SEGMENT tokens per internal node)."""
  d_size, g_size = len(branching), int(np.prod(branching))
  t_size = d_size * SEGMENT + t_extra
  tree = np.full((p_size, g_size, d_size), -1, np.int32)
  depth = np.zeros((p_size, g_size, t_size), np.int32)
  for p in range(p_size):
    leaves = []
    _grow(rng, branching, [], itertools.count(), leaves)
    for g, path in enumerate(sorted(leaves)):
      tree[p, g, : len(path)] = path
      last = (len(path) - 1) * SEGMENT
      length = last + rng.integers(1, SEGMENT + t_extra + 1)
      if len(path) < d_size:
        length = min(length, last + SEGMENT)
      t = np.arange(length)
      depth[p, g, :length] = np.minimum(t // SEGMENT, len(path) - 1) + 1
  mask = (depth > 0).astype(np.float32)
  low = (rng.random(mask.shape) < 0.7).astype(np.int32)
  return tree, depth, mask, low


# The README's tree (AIFrameResearch/SPO figures/advantage_estimation.png,
# panel (b)): root -> A {1, 0, 1}, B {1, 1, 1}, C {0, 0, 0}; one token
# per level (t = 0 is the level-1 node's, t = 1 the leaf's).
FIG_TREE = np.array(
  [[[0, 3], [0, 4], [0, 5], [1, 6], [1, 7], [1, 8], [2, 9], [2, 10], [2, 11]]],
  np.int32,
)
FIG_R = np.array([[1, 0, 1, 1, 1, 1, 0, 0, 0]], np.float32)
FIG_DEPTH = np.broadcast_to(np.array([1, 2], np.int32), (1, 9, 2))
FIG_MASK = np.ones((1, 9, 2), np.float32)


def test_readme_tree_by_hand():
  # V(A) = 2/3, V(B) = 1, V(C) = 0, V(root) = (2/3 + 1 + 0) / 3 = 5/9.
  v = np.asarray(VALUES(FIG_R, FIG_TREE))
  np.testing.assert_allclose(v[0, :, 0], 5 / 9, rtol=1e-6)
  np.testing.assert_allclose(v[0, :, 1], [2 / 3] * 3 + [1] * 3 + [0] * 3)
  np.testing.assert_allclose(v[0, :, 2], FIG_R[0])
  f = ADV
  adv, keep = f(FIG_R, FIG_TREE, FIG_DEPTH, FIG_MASK, normalize="none")
  # A(A) = 2/3 - 5/9 = 1/9, A(B) = 1 - 5/9 = 4/9 (the figure's), A(C) =
  # -5/9, each on the first leaf below it; A's leaves 1 - 2/3 = 1/3,
  # 0 - 2/3 = -2/3, 1/3. B's and C's leaves equal their parent: A = 0,
  # left out with the other copies of the level-1 segments.
  want = np.zeros((9, 2))
  want[0] = [1 / 9, 1 / 3]
  want[1, 1], want[2, 1] = -2 / 3, 1 / 3
  want[3, 0], want[6, 0] = 4 / 9, -5 / 9
  np.testing.assert_allclose(adv[0], want, atol=1e-6)
  np.testing.assert_array_equal(keep[0], want != 0)
  # Whitened: the six kept values (1, 3, -6, 3, 4, -5) / 9 have mean 0 and
  # unbiased variance (1 + 9 + 36 + 9 + 16 + 25) / 81 / 5 = 96 / 405, so
  # A(B) becomes (4/9) / sqrt(96/405) = 0.912871.
  adv, _ = f(FIG_R, FIG_TREE, FIG_DEPTH, FIG_MASK)
  np.testing.assert_allclose(adv[0, 3, 0], 0.912871, rtol=1e-5)
  np.testing.assert_allclose(jnp.sum(adv), 0.0, atol=1e-5)
  # Sibling std (the code's "grpo"): std(2/3, 1, 0) = sqrt(42/243) =
  # 0.415740, so A(B) = 0.444444 / 0.415740 = 1.069045; std(1, 0, 1) =
  # sqrt(2/9) = 0.471405 and A's first leaf 0.333333 / 0.471405 = 0.707107.
  adv, _ = f(
    FIG_R, FIG_TREE, FIG_DEPTH, FIG_MASK, sibling_std=True, normalize="none"
  )
  np.testing.assert_allclose(adv[0, 3, 0], 1.069045, rtol=1e-5)
  np.testing.assert_allclose(adv[0, 0, 1], 0.707107, rtol=1e-5)


def test_early_end_children_versus_leaves_by_hand():
  # root -> A {a1: 1, a2: 1}, B (ended after its first segment): 0; the
  # fourth sample is invalid. Children: V(A) = 1, V(B) = 0, V(root) = 1/2,
  # A(A) = 1/2, A(B) = -1/2. Leaves: V(root) = (1 + 1 + 0) / 3 = 2/3,
  # A(A) = 1/3, A(B) = -2/3. a1 and a2 equal A (0): left out.
  tree = np.array([[[0, 2], [0, 3], [1, -1], [-1, -1]]], np.int32)
  r = np.array([[1.0, 1.0, 0.0, 0.0]], np.float32)
  depth = np.array([[[1, 2], [1, 2], [1, 1], [0, 0]]], np.int32)
  mask = (depth > 0).astype(np.float32)
  v = VALUES(r, tree)
  np.testing.assert_allclose(v[0, :3, 0], 0.5)
  v = VALUES(r, tree, value="leaves")
  np.testing.assert_allclose(v[0, :3, 0], 2 / 3, rtol=1e-6)
  np.testing.assert_array_equal(v[0, 3], 0)  # no node above an invalid row
  for value, a, b in (("children", 0.5, -0.5), ("leaves", 1 / 3, -2 / 3)):
    adv, keep = ADV(r, tree, depth, mask, value=value, normalize="none")
    np.testing.assert_allclose(
      adv[0], [[a, 0], [0, 0], [b, b], [0, 0]], atol=1e-6
    )
    np.testing.assert_array_equal(keep[0], adv[0] != 0)
    # Without drop_zero the leaves' own segments train with A = 0.
    _, keep = ADV(
      r, tree, depth, mask, value=value, drop_zero=False, normalize="none"
    )
    np.testing.assert_array_equal(keep[0], [[1, 1], [0, 1], [1, 1], [0, 0]])


@pytest.mark.parametrize(
  "value,sibling_std,drop_zero,normalize,use_low",
  [
    ("children", False, True, "batch", True),
    ("children", True, True, "none", True),
    ("leaves", False, False, "batch", False),
    ("leaves", True, False, "none", True),
    ("children", False, False, "none", False),
  ],
)
def test_matches_the_numpy_reference(
  value, sibling_std, drop_zero, normalize, use_low
):
  rng = np.random.default_rng(0)
  tree, depth, mask, low = _random_tree(rng)
  rewards = rng.integers(0, 2, tree.shape[:2]).astype(np.float32)
  valid = (rng.random(rewards.shape) < 0.9).astype(np.float32)
  kwargs = dict(
    value=value,
    sibling_std=sibling_std,
    drop_zero=drop_zero,
    normalize=normalize,
  )
  f = ADV
  adv, keep = f(
    rewards, tree, depth, mask, low if use_low else None, valid, **kwargs
  )
  want, want_keep, values = np_spo_tree(
    rewards, tree, depth, mask, low if use_low else None, valid, **kwargs
  )
  assert want_keep.sum() > 10  # the case trains something
  np.testing.assert_array_equal(keep, want_keep)
  np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-5)
  got = VALUES(rewards, tree, valid, value=value)
  np.testing.assert_allclose(got, values, rtol=1e-6, atol=1e-6)


def test_gradient_wrt_rewards_matches_finite_differences():
  rng = np.random.default_rng(1)
  tree, depth, mask, low = _random_tree(rng, p_size=2)
  rewards = rng.random(tree.shape[:2])  # no ties: no segment crosses 0
  w = rng.normal(size=mask.shape)

  def f_jax(r):
    adv, _ = T.spo_tree_advantages_of(
      r, tree, depth, mask, low, sibling_std=True
    )
    return jnp.sum(adv * w)

  def f_np(r):
    adv, _, _ = np_spo_tree(r, tree, depth, mask, low, sibling_std=True)
    return np.sum(adv * w)

  grad = jax.jit(jax.grad(f_jax))(jnp.asarray(rewards, jnp.float32))
  want, h = np.zeros(rewards.shape), 1e-6
  for idx in np.ndindex(rewards.shape):
    up, down = rewards.copy(), rewards.copy()
    up[idx] += h
    down[idx] -= h
    want[idx] = (f_np(up) - f_np(down)) / (2 * h)
  assert np.abs(want).max() > 0.1
  np.testing.assert_allclose(grad, want, rtol=2e-3, atol=2e-3)


def _batch(rewards, tree, depth, mask, low, valid=None):
  return rljax.Batch(
    mask_PGT=jnp.asarray(mask),
    rewards_PG=jnp.asarray(rewards),
    sample_mask_PG=None if valid is None else jnp.asarray(valid),
  ).with_extra(
    tree_PG=jnp.asarray(tree),
    spo_depth_PGT=jnp.asarray(depth),
    spo_low_prob_PGT=jnp.asarray(low),
  )


def test_transform_and_preset_train_each_segment_once():
  rng = np.random.default_rng(2)
  tree, depth, mask, low = _random_tree(rng)
  rewards = rng.integers(0, 2, tree.shape[:2]).astype(np.float32)
  valid = np.ones(rewards.shape, np.float32)
  valid[0, 0] = 0  # a filtered sample
  batch = _batch(rewards, tree, depth, mask, low, valid)
  t = T.spo_tree_advantages()
  out, _ = jax.jit(t.prepare)(batch, ())
  want, keep, _ = np_spo_tree(rewards, tree, depth, mask, low, valid)
  np.testing.assert_allclose(out.advantages_PGT, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(out.mask_PGT, keep)
  t = T.spo_tree_advantages(probability_mask=False, normalize="none")
  out, _ = t.prepare(batch, t.init())
  want, keep, _ = np_spo_tree(
    rewards, tree, depth, mask, None, valid, normalize="none"
  )
  np.testing.assert_array_equal(out.mask_PGT, keep)
  np.testing.assert_allclose(out.advantages_PGT, want, atol=1e-6)
  # The preset: at ratio 1 the token-mean clipped surrogate's gradient is
  # -A / (number of kept tokens) on the kept tokens, 0 elsewhere.
  algo = algorithms.get("spo_tree", kl_coef=0.0)
  logp = rng.uniform(-3, -0.1, mask.shape).astype(np.float32)
  prepared, _ = algo.prepare(
    batch._replace(old_logp_PGT=jnp.asarray(logp)), algo.init()
  )

  def loss(x):
    total = algo.loss(x, prepared, algo.init())[0]
    return total.num / total.den

  grad = jax.grad(loss)(jnp.asarray(logp))
  want, keep, _ = np_spo_tree(rewards, tree, depth, mask, low, valid)
  np.testing.assert_allclose(
    grad, -want * keep / keep.sum(), rtol=1e-4, atol=1e-6
  )


def test_bad_input_raises():
  f = T.spo_tree_advantages_of
  with pytest.raises(ValueError, match="value"):
    f(FIG_R, FIG_TREE, FIG_DEPTH, FIG_MASK, value="mean")
  with pytest.raises(ValueError, match="normalize"):
    f(FIG_R, FIG_TREE, FIG_DEPTH, FIG_MASK, normalize="group")
  with pytest.raises(ValueError, match="integer node ids"):
    f(FIG_R, FIG_TREE.astype(np.float32), FIG_DEPTH, FIG_MASK)
  with pytest.raises(ValueError, match="depth_PGT must hold integer"):
    f(FIG_R, FIG_TREE, FIG_DEPTH.astype(np.float32), FIG_MASK)
  with pytest.raises(ValueError, match="shapes must match"):
    f(FIG_R, FIG_TREE, FIG_DEPTH[..., :1], FIG_MASK)
  with pytest.raises(ValueError, match="tree_PGD"):
    f(FIG_R, FIG_TREE[..., 0], FIG_DEPTH, FIG_MASK)
  t = T.spo_tree_advantages()
  batch = rljax.Batch(mask_PGT=jnp.asarray(FIG_MASK), rewards_PG=FIG_R)
  with pytest.raises(ValueError, match="tree_PG"):
    t.prepare(batch, t.init())
