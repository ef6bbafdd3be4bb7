"""TreePO's tree advantage (arXiv 2508.17445) against a numpy reference that
loops over leaves and subtrees, a hand-worked tree, and its reductions to
GRPO, Dr.GRPO and REINFORCE++-baseline when no subtree is shared."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import advantages
from rljax import algorithms
from rljax import transforms as T

# The hand-worked tree (P = 1, G = 4, D = 2): root -> A {g0, g1} and
# B {g2, g3}; g3 ends after its first segment (-1 at depth 2). The depth-2
# nodes are the leaves' own segments (singletons, compared with nothing).
HAND_TREE = np.array([[[0, 2], [0, 3], [1, 4], [1, -1]]], np.int32)
HAND_R = np.array([[1.0, 1.0, 0.0, 1.0]], np.float32)


def np_treepo(
  rewards,
  tree,
  valid=None,
  *,
  weighting="average",
  normalize="batch",
  skip_constant_subtrees=False,
  lengths=None,
  eps=None,
):
  """Loops: for each valid leaf, the root group and each deeper subtree."""
  r = np.asarray(rewards, np.float64)
  tree = np.asarray(tree)
  p_size, g_size, depth = tree.shape
  valid = np.ones_like(r, bool) if valid is None else np.asarray(valid) > 0
  eps = (1e-8 if normalize == "batch" else 1e-6) if eps is None else eps
  adv = np.zeros_like(r)
  scored = np.zeros_like(r, bool)
  for p in range(p_size):
    members = [j for j in range(g_size) if valid[p, j]]
    if len(members) < 2:
      continue
    for i in members:
      groups = [(members, True)]  # the root always counts
      for d in range(depth):
        if tree[p, i, d] < 0:
          continue
        groups.append(
          ([j for j in members if tree[p, j, d] == tree[p, i, d]], False)
        )
      num = den = 0.0
      for group, is_root in groups:
        vals = r[p, group]
        if len(group) < 2:
          continue
        std = vals.std(ddof=1)
        if skip_constant_subtrees and not is_root and std == 0:
          continue
        term = r[p, i] - vals.mean()
        if normalize == "subtree":
          term /= std + eps
        w = len(group) if weighting == "group_size" else 1.0
        num, den = num + w * term, den + w
      adv[p, i] = num / den
      scored[p, i] = True
  if normalize == "batch":
    w = scored * (1.0 if lengths is None else np.asarray(lengths, np.float64))
    mean = (w * adv).sum() / w.sum()
    var = (w * (adv - mean) ** 2).sum() / (w.sum() - 1)
    adv = np.where(scored, (adv - mean) / np.sqrt(var + eps), 0.0)
  return adv


def random_trees(rng, p_size, g_size, depth, branch=2):
  """Consistent trees: each leaf picks a child at each depth (ids unique per
  depth and prompt) and ends after a random number of segments."""
  tree = np.full((p_size, g_size, depth), -1, np.int32)
  for p, g in itertools.product(range(p_size), range(g_size)):
    node, end = 0, rng.integers(1, depth + 1)
    for d in range(end):
      node = node * branch + rng.integers(branch)
      tree[p, g, d] = node
  return tree


def test_hand_worked_tree():
  # R = [1, 1, 0, 1]. Root mean 0.75: terms [.25, .25, -.75, .25].
  # A = {g0, g1} mean 1: [0, 0]; B = {g2, g3} mean .5: g2 -.5, g3 +.5.
  # average: g0 = g1 = (.25 + 0)/2 = .125, g2 = (-.75 - .5)/2 = -.625,
  # g3 = (.25 + .5)/2 = .375.
  f = T.treepo_advantages_of
  none = f(HAND_R, HAND_TREE, normalize="none")
  np.testing.assert_allclose(none, [[0.125, 0.125, -0.625, 0.375]], rtol=1e-6)
  # group_size: root weight 4, subtrees 2: g0 = (4 * .25 + 0)/6 = 1/6,
  # g2 = (4 * -.75 + 2 * -.5)/6 = -2/3, g3 = (4 * .25 + 2 * .5)/6 = 1/3.
  sized = f(HAND_R, HAND_TREE, weighting="group_size", normalize="none")
  np.testing.assert_allclose(sized, [[1 / 6, 1 / 6, -2 / 3, 1 / 3]], rtol=1e-6)
  # skip_constant_subtrees drops A (all 1): g0 = g1 = .25 (root only).
  skip = f(HAND_R, HAND_TREE, normalize="none", skip_constant_subtrees=True)
  np.testing.assert_allclose(skip, [[0.25, 0.25, -0.625, 0.375]], rtol=1e-6)
  # batch: mean of [.125, .125, -.625, .375] is 0; unbiased var =
  # (2 * .015625 + .390625 + .140625)/3 = .1875, sqrt = .4330127.
  batch = f(HAND_R, HAND_TREE)
  np.testing.assert_allclose(
    batch, [[0.2886751, 0.2886751, -1.4433757, 0.8660254]], rtol=1e-5
  )
  # subtree: root std .5 -> [.5, .5, -1.5, .5]; A's std 0 -> 0; B's std
  # .7071068 -> g2 -.7071068, g3 +.7071068. g2 = (-1.5 - .7071068)/2.
  sub = f(HAND_R, HAND_TREE, normalize="subtree")
  np.testing.assert_allclose(
    sub, [[0.25, 0.25, -1.1035534, 0.6035534]], rtol=1e-5
  )


@pytest.mark.parametrize(
  "weighting,normalize,skip",
  list(
    itertools.product(
      ["average", "group_size"], ["batch", "subtree", "none"], [False, True]
    )
  ),
)
def test_matches_numpy_reference_jitted(weighting, normalize, skip):
  rng = np.random.default_rng(0)
  p_size, g_size, depth = 5, 8, 3
  tree = random_trees(rng, p_size, g_size, depth)
  rewards = rng.integers(0, 2, (p_size, g_size)).astype(np.float32)
  rewards[0] += rng.normal(size=g_size).astype(np.float32)  # not just 0/1
  valid = rng.random((p_size, g_size)) > 0.2
  valid[1, 1:] = False  # a prompt with one valid leaf: no baseline
  lengths = rng.integers(1, 9, (p_size, g_size)).astype(np.float32)
  kwargs = dict(
    weighting=weighting, normalize=normalize, skip_constant_subtrees=skip
  )
  got = jax.jit(
    lambda r, t, m, n: T.treepo_advantages_of(r, t, m, lengths_PG=n, **kwargs)
  )(rewards, tree, valid, lengths)
  assert got.dtype == jnp.float32 and got.shape == (p_size, g_size)
  want = np_treepo(rewards, tree, valid, lengths=lengths, **kwargs)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(got)[~valid] == 0) and np.all(got[1] == 0)


def test_gradients_match_finite_differences():
  rng = np.random.default_rng(1)
  tree = random_trees(rng, 3, 6, 3)
  rewards = rng.normal(size=(3, 6))
  c = rng.normal(size=(3, 6))
  for normalize in ["batch", "subtree", "none"]:

    def f(r, normalize=normalize):
      adv = T.treepo_advantages_of(r, tree, normalize=normalize)
      return jnp.sum(adv * c)

    grad = np.asarray(jax.grad(f)(jnp.asarray(rewards, jnp.float32)))
    want = np.zeros_like(rewards)
    for idx in np.ndindex(rewards.shape):
      step = np.zeros_like(rewards)
      step[idx] = 1e-5
      up = (np_treepo(rewards + step, tree, normalize=normalize) * c).sum()
      down = (np_treepo(rewards - step, tree, normalize=normalize) * c).sum()
      want[idx] = (up - down) / 2e-5
    np.testing.assert_allclose(grad, want, rtol=2e-3, atol=2e-4)


def test_invalid_samples_are_zero_and_count_nowhere():
  rng = np.random.default_rng(2)
  tree = random_trees(rng, 2, 6, 3)
  rewards = rng.normal(size=(2, 6)).astype(np.float32)
  valid = np.ones((2, 6), bool)
  valid[0, [1, 4]] = False
  got = T.treepo_advantages_of(rewards, tree, valid)
  # Garbage (NaN rewards, other ids) at the invalid leaves changes nothing.
  noisy_r, noisy_t = rewards.copy(), tree.copy()
  noisy_r[~valid] = np.nan
  noisy_t[~valid] = 0
  np.testing.assert_array_equal(
    got, T.treepo_advantages_of(noisy_r, noisy_t, valid)
  )
  assert np.all(np.asarray(got)[~valid] == 0)
  # Same as dropping them: prompt 0 alone with its 4 valid leaves.
  keep = [0, 2, 3, 5]
  alone = T.treepo_advantages_of(
    rewards[:1, keep], tree[:1, keep], normalize="subtree"
  )
  np.testing.assert_allclose(
    T.treepo_advantages_of(rewards, tree, valid, normalize="subtree")[0, keep],
    alone[0],
    rtol=1e-5,  # subtree statistics over a masked larger batch: reordered
    atol=1e-6,
  )


@pytest.mark.parametrize("depth", [0, 3])
def test_no_shared_subtree_reduces_to_grpo(depth):
  # The paper's average over {root} is the group-relative term alone: with
  # per-subtree std it is GRPO, without any std Dr.GRPO.
  rng = np.random.default_rng(3)
  rewards = rng.integers(0, 3, (4, 6)).astype(np.float32)
  valid = rng.random((4, 6)) > 0.2
  tree = np.full((4, 6, depth), -1, np.int32)
  f = T.treepo_advantages_of
  np.testing.assert_allclose(
    f(rewards, tree, valid, normalize="subtree"),
    advantages.grpo(rewards, valid),
    rtol=1e-6,
    atol=1e-7,
  )
  np.testing.assert_allclose(
    f(rewards, tree, valid, normalize="none", weighting="group_size"),
    advantages.dr_grpo(rewards, valid),
    rtol=1e-6,
    atol=1e-7,
  )
  # Singleton subtrees (each leaf its own id) compare nothing either.
  own = np.broadcast_to(np.arange(6)[None, :, None], (4, 6, depth))
  np.testing.assert_allclose(
    f(rewards, own, valid, normalize="subtree"),
    advantages.grpo(rewards, valid),
    rtol=1e-6,
    atol=1e-7,
  )


def _batch(rewards, tree, mask_PGT, sample_mask=None):
  return rljax.Batch(
    mask_PGT=jnp.asarray(mask_PGT),
    rewards_PG=jnp.asarray(rewards),
    sample_mask_PG=None if sample_mask is None else jnp.asarray(sample_mask),
  ).with_extra(tree_PG=jnp.asarray(tree))


def test_transform_whitens_over_tokens_like_verl():
  rng = np.random.default_rng(4)
  p_size, g_size, t_size = 3, 6, 5
  tree = random_trees(rng, p_size, g_size, 3)
  rewards = rng.integers(0, 2, (p_size, g_size)).astype(np.float32)
  lengths = rng.integers(1, t_size + 1, (p_size, g_size))
  mask = (np.arange(t_size) < lengths[..., None]).astype(np.float32)
  valid = np.ones((p_size, g_size), np.float32)
  valid[2, 0] = 0
  t = T.treepo_advantages()
  out, _ = jax.jit(t.prepare)(_batch(rewards, tree, mask, valid), t.init())
  want = np_treepo(rewards, tree, valid, lengths=lengths)
  np.testing.assert_allclose(
    out.advantages_PGT, want[..., None] * mask * valid[..., None], atol=1e-5
  )
  # No shared subtree: exactly REINFORCE++-baseline's token whitening.
  flat = np.full_like(tree, -1)
  base = T.reinforce_pp_baseline_advantages()
  got, _ = t.prepare(_batch(rewards, flat, mask, valid), t.init())
  ref, _ = base.prepare(_batch(rewards, flat, mask, valid), base.init())
  np.testing.assert_allclose(
    got.advantages_PGT, ref.advantages_PGT, rtol=1e-5, atol=1e-6
  )


def test_bad_input_raises():
  f = T.treepo_advantages_of
  with pytest.raises(ValueError, match="weighting"):
    f(HAND_R, HAND_TREE, weighting="depth")
  with pytest.raises(ValueError, match="normalize"):
    T.treepo_advantages(normalize="global")
  with pytest.raises(ValueError, match="integer node ids"):
    f(HAND_R, HAND_TREE.astype(np.float32))
  with pytest.raises(ValueError, match="tree_PGD"):
    f(HAND_R, HAND_TREE[0])
  with pytest.raises(ValueError, match="tree_PGD"):
    f(HAND_R, HAND_TREE[:, :3])
  t = T.treepo_advantages()
  batch = rljax.Batch(mask_PGT=jnp.ones((1, 4, 2)), rewards_PG=HAND_R)
  with pytest.raises(ValueError, match="tree_PG"):
    t.prepare(batch, t.init())


def test_treepo_preset_prepares_and_differentiates():
  rng = np.random.default_rng(5)
  mask = np.ones((2, 4, 3), np.float32)
  tree = np.concatenate([HAND_TREE, HAND_TREE])
  rewards = np.array([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
  logp = rng.uniform(-3, -0.1, mask.shape).astype(np.float32)
  batch = _batch(rewards, tree, mask)._replace(old_logp_PGT=jnp.asarray(logp))
  algo = algorithms.get("treepo")
  prepared, _ = algo.prepare(batch, algo.init())
  # Dynamic sampling drops prompt 1 (all rewards equal); prompt 0 alone is
  # the hand-worked tree whitened over its 4 x 3 tokens.
  want = np_treepo(rewards[:1], tree[:1], lengths=np.full((1, 4), 3.0))
  np.testing.assert_allclose(
    prepared.advantages_PGT[0, :, 0], want[0], rtol=1e-5
  )
  np.testing.assert_array_equal(prepared.advantages_PGT[1], 0)

  def loss(x):
    total = algo.loss(x, prepared, algo.init())[0]
    return total.num / total.den

  # At ratio 1 the clipped surrogate's gradient is -A / (number of tokens).
  grad = jax.grad(loss)(jnp.asarray(logp))
  n_tokens = float(np.asarray(prepared.loss_mask()).sum())
  np.testing.assert_allclose(
    grad,
    -prepared.advantages_PGT * prepared.loss_mask() / n_tokens,
    rtol=1e-5,
    atol=1e-7,
  )
