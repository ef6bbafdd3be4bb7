"""Token-id stages: GTPO conflict tokens, HICRA planning tokens and AdaCoT's
decision-token mask, against numpy loops and hand-worked cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax.advantages import _tokens as K
from rljax.testing import random_batch
from rljax.transforms import _tokens as T


def _batch(seed=0, dtype=np.float32, vocab=3, prompts=4, samples=4, tokens=6):
  """A random batch with GRPO-like token advantages and a small vocabulary
  (so that conflicts and gram matches are frequent)."""
  b = random_batch(
    seed, prompts=prompts, samples=samples, tokens=tokens, dtype=dtype
  )
  rng = np.random.default_rng(seed + 100)
  shape = b.shape
  adv_pg = rng.choice([-1.5, -0.5, 0.0, 0.5, 1.0], size=shape[:2])
  tokens_pgt = rng.integers(0, vocab, size=shape).astype(np.int32)
  sample_mask = np.ones(shape[:2], np.float32)
  sample_mask[0, 1] = 0.0
  entropy = rng.uniform(0.0, 1.2, size=shape[:2])[..., None]
  entropy = entropy + rng.uniform(-0.1, 0.1, size=shape)
  return b._replace(
    tokens_PGT=tokens_pgt,
    advantages_PGT=(adv_pg[..., None] * np.asarray(b.mask_PGT)).astype(dtype),
    sample_mask_PG=sample_mask,
    old_entropy_PGT=entropy.astype(dtype),
  )


def _prepare(stage, batch):
  algo = rljax.Algorithm(stage, aggregate.token_mean)
  out, _ = jax.jit(lambda b: algo.prepare(b, algo.init()))(batch)
  return out


def _half(batch, part):
  sl = slice(0, 2) if part == 0 else slice(2, 4)
  return jax.tree.map(lambda x: x[sl], batch)


def _np(x):
  return np.asarray(x, np.float64)


def _loss_mask(batch):
  return _np(batch.mask_PGT) * _np(batch.sample_mask_PG)[..., None]


# ---------------------------------------------------------------------------
# GTPO: numpy reference with explicit loops.
# ---------------------------------------------------------------------------


def _np_conflict(tokens, valid, pos, neg, i, t, key):
  """Whether (i, t) conflicts, matching sample j at position key(j)."""
  G, TT = tokens.shape
  if not valid[i, t] or not (pos[i] or neg[i]):
    return False
  hit_pos = hit_neg = False
  for j in range(G):
    tj = key(j)
    if not 0 <= tj < TT or not valid[j, tj]:
      continue
    if tokens[j, tj] == tokens[i, t]:
      hit_pos |= bool(pos[j])
      hit_neg |= bool(neg[j])
  return hit_pos and hit_neg


def np_gtpo_group(tokens, valid, pos, neg, positions, w):
  """(delta, conflict) [G, T] of one group, by explicit loops."""
  G, TT = tokens.shape
  ends = [
    max(t for t in range(TT) if valid[i, t]) + 1 if valid[i].any() else 0
    for i in range(G)
  ]
  delta, conflict = np.zeros((G, TT)), np.zeros((G, TT))
  for i in range(G):

    def d(is_conflict, i=i):
      return (w if pos[i] else 0.0) if is_conflict else 1.0

    fwd_raw = [
      _np_conflict(tokens, valid, pos, neg, i, t, lambda j, t=t: t)
      for t in range(TT)
    ]
    if positions == "all":
      conf, dl = fwd_raw, [d(x) for x in fwd_raw]
    else:
      fwd = [all(fwd_raw[: t + 1]) for t in range(TT)]
      from_end = [ends[i] - 1 - t for t in range(TT)]
      bwd_raw = [
        _np_conflict(
          tokens, valid, pos, neg, i, t, lambda j, s=s: ends[j] - 1 - s
        )
        for t, s in enumerate(from_end)
      ]
      bwd = [t < ends[i] and all(bwd_raw[t : ends[i]]) for t in range(TT)]
      conf = [a or b for a, b in zip(fwd, bwd)]
      dl = [d(a) * d(b) for a, b in zip(fwd, bwd)]
    for t in range(TT):
      conflict[i, t] = float(conf[t] and valid[i, t])
      delta[i, t] = dl[t] if valid[i, t] else 0.0
  return delta, conflict


def np_gtpo(tokens, mask, adv, ent, *, positions, w=2.0, thr=0.7, c=0.1):
  P, G, _ = tokens.shape
  valid = mask > 0
  n = mask.sum(-1)
  a_seq = np.where(n > 0, (adv * mask).sum(-1) / np.maximum(n, 1), 0.0)
  h = np.where(n > 0, (ent * mask).sum(-1) / np.maximum(n, 1), 0.0)
  out = np.zeros(tokens.shape)
  conflict = np.zeros(tokens.shape)
  for p in range(P):
    delta, conflict[p] = np_gtpo_group(
      tokens[p], valid[p], a_seq[p] > 0, a_seq[p] < 0, positions, w
    )
    for i in range(G):
      if thr is None or h[p, i] <= thr:
        out[p, i] = (adv[p, i] - c * h[p, i]) * delta[i] * valid[p, i]
  return out, conflict


@pytest.mark.parametrize("positions", ["all", "runs"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gtpo_matches_numpy_loops(positions, seed):
  b = _batch(seed, vocab=2)
  out = _prepare(T.gtpo_advantages(positions=positions), b)
  mask = _loss_mask(b)
  adv, conflict = np_gtpo(
    np.asarray(b.tokens_PGT),
    mask,
    _np(b.advantages_PGT),
    _np(b.old_entropy_PGT),
    positions=positions,
  )
  assert out.advantages_PGT.dtype == jnp.float32
  np.testing.assert_allclose(out.advantages_PGT, adv, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(out.extra["gtpo_conflict_PGT"], conflict)
  np.testing.assert_array_equal(
    out.extra["gtpo_conflict_count_PG"], conflict.sum(-1)
  )
  assert conflict.sum() > 0  # the test exercises conflicts


# One group, G = 3, T = 4. Sample 2 has length 3; its padding holds id 8,
# which is sample 0's id at t = 3 and must not create a conflict.
HAND_TOKENS = np.array([[[5, 6, 7, 8], [5, 9, 7, 3], [4, 6, 8, 8]]], np.int32)
HAND_MASK = np.array([[[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]]], np.float32)
HAND_ADV_PG = np.array([[1.0, -0.5, -0.5]], np.float32)


def test_gtpo_token_weights_by_hand():
  # positions="all": t0 id 5 (samples 0+, 1-), t1 id 6 (0+, 2-), t2 id 7
  # (0+, 1-); t3 none (sample 2's 8 is padding).
  delta, conflict = K.gtpo_token_weights(HAND_TOKENS, HAND_MASK, HAND_ADV_PG)
  np.testing.assert_array_equal(
    delta, [[[2, 2, 2, 1], [0, 1, 0, 1], [1, 0, 1, 0]]]
  )
  np.testing.assert_array_equal(
    conflict, [[[1, 1, 1, 0], [1, 0, 1, 0], [0, 1, 0, 0]]]
  )
  # positions="runs" (the official code). Forward runs from t = 0:
  # sample 0 [1,1,1,0], sample 1 [1,0,0,0], sample 2 none. Backward, with
  # positions counted from each end (ends 4, 4, 3): s = 0 ids 8 / 3 / 8 ->
  # samples 0+, 2- conflict; s = 1 ids 7 / 7 / 6 -> 0+, 1-; s = 2 ids
  # 6 / 9 / 4 -> none. Runs from the end: sample 0 s = 0, 1 (t = 3, 2),
  # sample 2 s = 0 (t = 2), sample 1 none. Weights multiply: sample 0 at
  # t = 2 is in both runs -> W^2 = 4.
  delta, conflict = K.gtpo_token_weights(
    HAND_TOKENS, HAND_MASK, HAND_ADV_PG, positions="runs"
  )
  np.testing.assert_array_equal(
    delta, [[[2, 2, 4, 2], [0, 1, 1, 1], [1, 1, 0, 0]]]
  )
  np.testing.assert_array_equal(
    conflict, [[[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 1, 0]]]
  )


def test_gtpo_stage_by_hand():
  # Entropies 0.5, 0.2, 1.0 (sample 2 > 0.7 is filtered out); the padded
  # token's entropy 50 is ignored.
  ent = np.array([[[0.5] * 4, [0.2] * 4, [1.0, 1.0, 1.0, 50.0]]], np.float32)
  b = rljax.Batch(
    mask_PGT=HAND_MASK,
    advantages_PGT=HAND_ADV_PG[..., None] * HAND_MASK,
    old_entropy_PGT=ent,
    tokens_PGT=HAND_TOKENS,
  )
  out = _prepare(T.gtpo_advantages(), b)
  # Sample 0: (1 - 0.1 * 0.5) * [2, 2, 2, 1]; sample 1: (-0.5 - 0.02) *
  # [0, 1, 0, 1]; sample 2: 0.
  expected = [
    [[1.9, 1.9, 1.9, 0.95], [0.0, -0.52, 0.0, -0.52], [0.0, 0.0, 0.0, 0.0]]
  ]
  np.testing.assert_allclose(out.advantages_PGT, expected, rtol=1e-6)
  np.testing.assert_array_equal(
    out.extra["gtpo_conflict_count_PG"], [[3, 2, 1]]
  )
  # divide_by_conflicts: 1 / max(n, 1) on the policy weights.
  out = _prepare(T.gtpo_advantages(divide_by_conflicts=True), b)
  np.testing.assert_allclose(
    out.policy_weights_PGT[0, :, 0], [1 / 3, 1 / 2, 1.0], rtol=1e-6
  )


def test_gtpo_properties():
  for seed in range(3):
    b = _batch(seed)
    out = _prepare(T.gtpo_advantages(entropy_threshold=None), b)
    mask = _loss_mask(b)
    conflict = np.asarray(out.extra["gtpo_conflict_PGT"]) > 0
    a_seq = (_np(b.advantages_PGT) * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
    h = (_np(b.old_entropy_PGT) * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
    shaped = (_np(b.advantages_PGT) - 0.1 * h[..., None]) * mask
    new = _np(out.advantages_PGT)
    neg = (a_seq < 0)[..., None] & conflict
    pos = (a_seq > 0)[..., None] & conflict
    assert neg.any() and pos.any()
    # A negative completion's conflict tokens get zero weight ...
    np.testing.assert_array_equal(new[neg], 0.0)
    # ... a positive completion's get W (default 2).
    np.testing.assert_allclose(new[pos], 2.0 * shaped[pos], rtol=1e-6)
    # Non-conflict tokens keep the shaped advantage; no conflict in an
    # inactive (A = 0) completion.
    np.testing.assert_allclose(new[~conflict], shaped[~conflict], atol=1e-6)
    assert not conflict[a_seq == 0].any()


def test_gtpo_entropy_filter_zeroes_high_entropy_completions():
  b = _batch(3)
  out = _prepare(T.gtpo_advantages(entropy_threshold=0.5), b)
  mask = _loss_mask(b)
  h = (_np(b.old_entropy_PGT) * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
  high = h > 0.5
  assert high.any() and (~high & (mask.sum(-1) > 0)).any()
  np.testing.assert_array_equal(_np(out.advantages_PGT)[high], 0.0)
  # The pure function, by hand.
  np.testing.assert_allclose(
    K.gtpo_entropy_filter(
      jnp.array([1.0, -1.0, 2.0]), jnp.array([0.3, 0.7, 0.71])
    ),
    [0.97, -1.07, 0.0],
    rtol=1e-6,
  )


def test_gtpo_invalid_samples_and_padding_never_conflict():
  b = _batch(4)
  stage = T.gtpo_advantages(positions="runs")
  base = _prepare(stage, b)
  tokens = np.asarray(b.tokens_PGT).copy()
  mask = np.asarray(b.mask_PGT)
  # Invalid sample (0, 1): copy another sample's tokens into it and flip
  # its advantage; padding: overwrite with the ids of other samples.
  tokens[0, 1] = tokens[0, 0]
  tokens = np.where(mask > 0, tokens, np.roll(tokens, 1, axis=1))
  adv = np.asarray(b.advantages_PGT).copy()
  adv[0, 1] = -adv[0, 0] - 1.0
  changed = _prepare(stage, b._replace(tokens_PGT=tokens, advantages_PGT=adv))
  np.testing.assert_array_equal(changed.advantages_PGT, base.advantages_PGT)
  np.testing.assert_array_equal(
    changed.extra["gtpo_conflict_PGT"], base.extra["gtpo_conflict_PGT"]
  )
  np.testing.assert_array_equal(base.advantages_PGT[0, 1], 0.0)
  np.testing.assert_array_equal(base.extra["gtpo_conflict_PGT"][0, 1], 0.0)
  pad = _loss_mask(b) == 0
  np.testing.assert_array_equal(_np(base.extra["gtpo_conflict_PGT"])[pad], 0)


@pytest.mark.parametrize("positions", ["all", "runs"])
def test_gtpo_is_per_group_under_p_splits(positions):
  b = _batch(5)
  stage = T.gtpo_advantages(positions=positions, divide_by_conflicts=True)
  whole = _prepare(stage, b)
  halves = [_prepare(stage, _half(b, i)) for i in (0, 1)]
  for name in ("advantages_PGT", "policy_weights_PGT"):
    joined = np.concatenate([getattr(h, name) for h in halves])
    np.testing.assert_array_equal(joined, getattr(whole, name))


def test_gtpo_bfloat16_gives_finite_float32():
  b = _batch(6, dtype=jnp.bfloat16)
  out = _prepare(T.gtpo_advantages(positions="runs"), b)
  assert out.advantages_PGT.dtype == jnp.float32
  assert np.isfinite(np.asarray(out.advantages_PGT)).all()


def test_gtpo_missing_fields_raise():
  b = _batch(0)
  with pytest.raises(ValueError, match="tokens_PGT.*Trainer"):
    _prepare(T.gtpo_advantages(), b._replace(tokens_PGT=None))
  with pytest.raises(ValueError, match="advantages_PGT.*advantage stage"):
    _prepare(T.gtpo_advantages(), b._replace(advantages_PGT=None))
  with pytest.raises(ValueError, match="old_entropy_PGT.*entropy_threshold"):
    _prepare(T.gtpo_advantages(), b._replace(old_entropy_PGT=None))
  # Without the filter no entropies are needed.
  _prepare(
    T.gtpo_advantages(entropy_threshold=None, entropy_scale=0.0),
    b._replace(old_entropy_PGT=None),
  )
  with pytest.raises(ValueError, match="positions"):
    T.gtpo_advantages(positions="prefix")
  with pytest.raises(ValueError, match="integer token ids"):
    _prepare(
      T.gtpo_advantages(),
      b._replace(tokens_PGT=np.asarray(b.tokens_PGT, np.float32)),
    )


def test_gtpo_policy_gradient_skips_negative_conflicts():
  """REINFORCE after GTPO, token-mean: dL/dlogp = -A' m / sum m, so the
  negative completions' conflict tokens get exactly zero gradient."""
  b = _batch(7)
  algo = rljax.Algorithm(
    rljax.chain(
      T.gtpo_advantages(entropy_threshold=None),
      objectives.policy(losses.reinforce),
    ),
    aggregate.token_mean,
  )
  pb, st = algo.prepare(b, algo.init())
  logp = np.asarray(b.old_logp_PGT, np.float32)
  grad = jax.grad(lambda lp: algo.loss(lp, pb, st)[0].value)(logp)
  mask = _loss_mask(b)
  expected = -_np(pb.advantages_PGT) * mask / mask.sum()
  np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)
  adv_seq = (_np(b.advantages_PGT) * mask).sum(-1)
  neg = (adv_seq < 0)[..., None] & (_np(pb.extra["gtpo_conflict_PGT"]) > 0)
  assert neg.any()
  np.testing.assert_array_equal(np.asarray(grad)[neg], 0.0)


# ---------------------------------------------------------------------------
# HICRA.
# ---------------------------------------------------------------------------


def np_gram_mask(tokens, mask, grams):
  out = np.zeros(tokens.shape, bool)
  for idx in np.ndindex(tokens.shape[:-1]):
    tok, ok = tokens[idx], mask[idx] > 0
    n_t = tok.shape[-1]
    for g in grams:
      for s in range(n_t - len(g) + 1):
        if all(ok[s + k] and tok[s + k] == g[k] for k in range(len(g))):
          out[idx][s : s + len(g)] = True
  return out


GRAMS = ((1, 2), (0,), (2, 2, 1), (1, 0, 2, 1), (2, 1, 0, 0, 1))


@pytest.mark.parametrize("seed", [0, 1])
def test_strategic_gram_mask_matches_numpy(seed):
  b = _batch(seed, tokens=9)
  mask = _loss_mask(b)
  got = jax.jit(lambda t, m: K.strategic_gram_mask(t, m, GRAMS))(
    b.tokens_PGT, mask
  )
  expected = np_gram_mask(np.asarray(b.tokens_PGT), mask, GRAMS)
  np.testing.assert_array_equal(got, expected)
  assert expected.any() and not expected.all()


def test_strategic_gram_mask_by_hand():
  tokens = np.array([[7, 1, 2, 9, 1, 2]], np.int32)
  mask = np.array([[1, 1, 1, 1, 1, 0]], np.float32)
  # (1, 2) at s = 1 -> t 1, 2; at s = 4 it runs into padding: no match.
  got = K.strategic_gram_mask(tokens, mask, ((1, 2),))
  np.testing.assert_array_equal(got, [[0, 1, 1, 0, 0, 0]])
  # + (9,) at t 3 and (2, 9, 1) at s = 2 -> t 2..4; a gram longer than T
  # never matches.
  grams = ((1, 2), (9,), (2, 9, 1), (7, 1, 2, 9, 1, 2, 5))
  got = K.strategic_gram_mask(tokens, mask, grams)
  np.testing.assert_array_equal(got, [[0, 1, 1, 1, 1, 0]])
  # Empty grams and a masked token inside an occurrence.
  np.testing.assert_array_equal(
    K.strategic_gram_mask(tokens, mask, ()), np.zeros((1, 6), bool)
  )
  hole = np.array([[1, 1, 0, 1, 1, 1]], np.float32)
  np.testing.assert_array_equal(
    K.strategic_gram_mask(tokens, hole, ((1, 2),)), [[0, 0, 0, 0, 1, 1]]
  )


def test_hicra_amplify_by_hand():
  adv = jnp.array([1.0, -1.0, 1.0, -1.0, 0.0, 2.0])
  planning = jnp.array([1, 1, 0, 0, 1, 1])
  np.testing.assert_allclose(
    K.hicra_amplify(adv, planning, alpha=0.2),
    [1.2, -0.8, 1.0, -1.0, 0.0, 2.4],
    rtol=1e-6,
  )


def test_hicra_stage_matches_numpy_and_properties():
  b = _batch(8, tokens=9)
  out = _prepare(T.hicra(GRAMS, alpha=0.3), b)
  mask = _loss_mask(b)
  planning = np_gram_mask(np.asarray(b.tokens_PGT), mask, GRAMS)
  adv = _np(b.advantages_PGT)
  expected = np.where(planning, adv + 0.3 * np.abs(adv), adv)
  np.testing.assert_allclose(out.advantages_PGT, expected, rtol=1e-6)
  np.testing.assert_array_equal(out.extra["hicra_planning_PGT"], planning)
  new = _np(out.advantages_PGT)
  up, down = planning & (adv > 0), planning & (adv < 0)
  assert up.any() and down.any()
  np.testing.assert_allclose(new[up], 1.3 * adv[up], rtol=1e-6)
  np.testing.assert_allclose(new[down], 0.7 * adv[down], rtol=1e-6)
  # The invalid sample and the padding are never planning tokens.
  np.testing.assert_array_equal(_np(out.extra["hicra_planning_PGT"])[0, 1], 0)
  assert not planning[mask == 0].any()


def test_hicra_from_an_extra_mask_and_p_splits():
  b = _batch(9, tokens=9)
  tagged = np_gram_mask(np.asarray(b.tokens_PGT), _loss_mask(b), GRAMS)
  from_mask = _prepare(
    T.hicra(mask_name="tagged_PGT"), b.with_extra(tagged_PGT=tagged)
  )
  from_grams = _prepare(T.hicra(GRAMS), b)
  np.testing.assert_allclose(
    from_mask.advantages_PGT, from_grams.advantages_PGT, rtol=1e-6
  )
  halves = [_prepare(T.hicra(GRAMS), _half(b, i)) for i in (0, 1)]
  np.testing.assert_array_equal(
    np.concatenate([h.advantages_PGT for h in halves]),
    from_grams.advantages_PGT,
  )


def test_hicra_bfloat16_and_errors():
  b = _batch(10, dtype=jnp.bfloat16)
  out = _prepare(T.hicra(GRAMS), b)
  assert out.advantages_PGT.dtype == jnp.float32
  assert np.isfinite(np.asarray(out.advantages_PGT)).all()
  with pytest.raises(ValueError, match="exactly one"):
    T.hicra()
  with pytest.raises(ValueError, match="exactly one"):
    T.hicra(GRAMS, mask_name="x_PGT")
  with pytest.raises(ValueError, match="_PGT"):
    T.hicra(mask_name="planning")
  with pytest.raises(ValueError, match="token-id tuples"):
    T.hicra("let me think")
  with pytest.raises(ValueError, match=">= 0"):
    T.hicra(GRAMS, alpha=-0.1)
  with pytest.raises(ValueError, match="tokens_PGT"):
    _prepare(T.hicra(GRAMS), b._replace(tokens_PGT=None))
  with pytest.raises(ValueError, match="advantages_PGT"):
    _prepare(T.hicra(GRAMS), b._replace(advantages_PGT=None))
  with pytest.raises(ValueError, match="planning_PGT"):
    _prepare(T.hicra(mask_name="planning_PGT"), b)


# ---------------------------------------------------------------------------
# AdaCoT Selective Loss Masking.
# ---------------------------------------------------------------------------


def np_after_trigger(tokens, mask, ids, count, first_only, at_start):
  out = np.zeros(tokens.shape, bool)
  for idx in np.ndindex(tokens.shape[:-1]):
    tok, ok = tokens[idx], mask[idx] > 0
    n_t = tok.shape[-1]
    starts = [t for t in range(n_t) if ok[t] and tok[t] in ids]
    if first_only:
      starts = starts[:1]
    for s in starts:
      for k in range(1, count + 1):
        if s + k < n_t and ok[s + k]:
          out[idx][s + k] = True
    if at_start and not starts:
      for t in range(min(count, n_t)):
        out[idx][t] = ok[t]
  return out


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("first_only", [True, False])
@pytest.mark.parametrize("at_start", [True, False])
def test_tokens_after_trigger_matches_numpy(count, first_only, at_start):
  b = _batch(11, vocab=6, tokens=8)
  mask = _loss_mask(b)
  kw = dict(count=count, first_only=first_only, at_start=at_start)
  got = jax.jit(lambda t, m: K.tokens_after_trigger(t, m, (1, 4), **kw))(
    b.tokens_PGT, mask
  )
  expected = np_after_trigger(np.asarray(b.tokens_PGT), mask, (1, 4), **kw)
  np.testing.assert_array_equal(got, expected)
  assert expected.any()


THINK = 50


def test_decision_token_mask_by_hand():
  tokens = np.array(
    [
      [
        [THINK, 7, 8, THINK, 9],  # decision at t 1 (first trigger only)
        [3, 4, THINK, 0, 0],  # trigger at t 2; t 3 is padding
        [3, 4, 5, 6, 7],  # no trigger
      ]
    ],
    np.int32,
  )
  mask = np.array(
    [[[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]], np.float32
  )
  b = rljax.Batch(mask_PGT=mask, tokens_PGT=tokens)
  out = _prepare(T.decision_token_mask([THINK]), b)
  np.testing.assert_array_equal(
    out.policy_weights_PGT,
    [[[1, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]],
  )
  out = _prepare(T.decision_token_mask([THINK], at_start=True), b)
  np.testing.assert_array_equal(
    out.extra["decision_tokens_PGT"],
    [[[0, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]]],
  )
  # Every trigger, two tokens each; existing policy weights are multiplied.
  out = _prepare(
    T.decision_token_mask([THINK], count=2, first_only=False),
    b._replace(policy_weights_PGT=np.full(mask.shape, 0.5, np.float32)),
  )
  np.testing.assert_array_equal(
    out.policy_weights_PGT,
    0.5 * np.array([[[1, 0, 0, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]]),
  )


def test_decision_token_mask_gradient_is_zero_on_the_decision_token():
  b = _batch(12, vocab=6, tokens=8)
  algo = rljax.Algorithm(
    rljax.chain(
      T.decision_token_mask((1, 4), at_start=True),
      objectives.policy(losses.reinforce),
    ),
    aggregate.token_mean,
  )
  pb, st = algo.prepare(b, algo.init())
  logp = np.asarray(b.old_logp_PGT, np.float32)
  grad = jax.grad(lambda lp: algo.loss(lp, pb, st)[0].value)(logp)
  mask = _loss_mask(b)
  selected = _np(pb.extra["decision_tokens_PGT"])
  expected = -_np(b.advantages_PGT) * (1 - selected) * mask / mask.sum()
  np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)
  assert selected.any()
  np.testing.assert_array_equal(np.asarray(grad)[selected > 0], 0.0)


def test_decision_token_mask_splits_invalid_bf16_and_errors():
  b = _batch(13, vocab=6, tokens=8, dtype=jnp.bfloat16)
  stage = T.decision_token_mask((1, 4), at_start=True)
  whole = _prepare(stage, b)
  assert whole.policy_weights_PGT.dtype == jnp.float32
  halves = [_prepare(stage, _half(b, i)) for i in (0, 1)]
  np.testing.assert_array_equal(
    np.concatenate([h.policy_weights_PGT for h in halves]),
    whole.policy_weights_PGT,
  )
  # Invalid sample (0, 1) and padding are never selected.
  sel = _np(whole.extra["decision_tokens_PGT"])
  np.testing.assert_array_equal(sel[0, 1], 0.0)
  np.testing.assert_array_equal(sel[_loss_mask(b) == 0], 0.0)
  with pytest.raises(ValueError, match="trigger_ids"):
    T.decision_token_mask([])
  with pytest.raises(ValueError, match="count"):
    T.decision_token_mask([1], count=0)
  with pytest.raises(ValueError, match="tokens_PGT"):
    _prepare(stage, b._replace(tokens_PGT=None))


def test_the_trainer_sees_which_fields_the_stages_read():
  from rljax.training import _build

  def algo(stage):
    return rljax.Algorithm(
      rljax.chain(
        rljax.transforms.group_advantages(rljax.advantages.grpo),
        stage,
        objectives.policy(losses.reinforce),
      ),
      aggregate.token_mean,
    )

  gtpo = algo(T.gtpo_advantages())
  assert _build.needs_field(gtpo, "old_entropy_PGT")
  assert _build.needs_field(gtpo, "tokens_PGT")
  off = algo(T.gtpo_advantages(entropy_threshold=None, entropy_scale=0.0))
  assert not _build.needs_field(off, "old_entropy_PGT")
  assert _build.needs_field(algo(T.hicra(GRAMS)), "tokens_PGT")
  assert not _build.needs_field(algo(T.hicra(mask_name="p_PGT")), "tokens_PGT")
  assert _build.needs_field(algo(T.decision_token_mask([1])), "tokens_PGT")
