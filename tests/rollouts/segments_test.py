"""SPO-chain (arXiv 2505.23564): the cutpoint rule, the segment advantage
against a numpy reference and by hand, continuations that start exactly at
their prefix, the strategy's draw on a tiny random model, and one trainer
step with it."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import algorithms
from rljax import rollouts
from rljax import sampling
from rljax import testing
from rljax import transforms as T
from rljax.training import Trainer

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs"
ALPHABET = "0123456789+-=ab"


def np_spo_chain(rewards, cuts, values, mask, low=None, normalize="batch"):
  """Loops over each response's tokens: the value of the segment's cut and
  of the next cut (the reward past the last), then the batch whitening
  over the kept tokens (every token if none is kept)."""
  r = np.asarray(rewards, np.float64)
  cuts, mask = np.asarray(cuts) > 0, np.asarray(mask) > 0
  values = np.asarray(values, np.float64)
  keep = mask if low is None else mask & (np.asarray(low) > 0)
  adv = np.zeros(mask.shape)
  p_size, g_size, t_size = mask.shape
  for i in range(p_size):
    for j in range(g_size):
      at = [t for t in range(t_size) if cuts[i, j, t] and mask[i, j, t]]
      for t in range(t_size):
        before = [c for c in at if c <= t]
        if not before or not keep[i, j, t]:
          continue
        later = [c for c in at if c > t]
        v_next = values[i, j, later[0]] if later else r[i, j]
        adv[i, j, t] = v_next - values[i, j, before[-1]]
  if normalize == "batch":
    w = keep if keep.any() else mask
    mean = adv[w].mean()
    var = adv[w].var(ddof=1) if w.sum() > 1 else 0.0
    adv = np.where(keep, (adv - mean) / np.sqrt(var + 1e-8), 0.0)
  return adv


def _random_case(rng, p_size=3, g_size=4, t_size=6):
  lengths = rng.integers(1, t_size + 1, (p_size, g_size))
  mask = (np.arange(t_size) < lengths[..., None]).astype(np.float32)
  cuts = (rng.random(mask.shape) < 0.4).astype(np.int32)
  values = rng.random(mask.shape).astype(np.float32)
  low = (rng.random(mask.shape) < 0.5).astype(np.int32)
  rewards = rng.integers(0, 2, (p_size, g_size)).astype(np.float32)
  return rewards, cuts, values, mask, low


# ---------------------------------------------------------------------------
# The cutpoint rule.
# ---------------------------------------------------------------------------


def test_cutpoints_by_hand():
  # p = 0.95 0.5 0.99 0.3 0.2 0.95 | 0.1 (padding). Below 0.9: tokens 1, 3
  # and 4 (the padded 0.1 does not count).
  p = np.array([[0.95, 0.5, 0.99, 0.3, 0.2, 0.95, 0.1]])
  mask = np.array([[1, 1, 1, 1, 1, 1, 0]])
  cut = lambda **kw: rollouts.segment_cutpoints(np.log(p), mask, **kw)  # noqa: E731
  np.testing.assert_array_equal(cut()[0], [0, 1, 0, 1, 1, 0, 0])
  # Every 2nd low token starts a segment: the 1st (t=1) and the 3rd (t=4).
  np.testing.assert_array_equal(cut(interval=2)[0], [0, 1, 0, 0, 1, 0, 0])
  np.testing.assert_array_equal(cut(interval=3)[0], [0, 1, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(
    cut(interval=2, cut_at_prompt=True)[0], [1, 1, 0, 0, 1, 0, 0]
  )
  np.testing.assert_array_equal(cut(rho=0.4)[0], [0, 0, 0, 1, 1, 0, 0])
  np.testing.assert_array_equal(cut(rho=1.0)[0], [1, 1, 1, 1, 1, 1, 0])
  with pytest.raises(ValueError, match="rho"):
    cut(rho=0.0)
  with pytest.raises(ValueError, match="interval"):
    cut(interval=0)
  with pytest.raises(ValueError, match="mask_PGT"):
    rollouts.segment_cutpoints(np.log(p), mask[:, :3])
  with pytest.raises(ValueError, match="num_continuations"):
    rollouts.SegmentRollouts(num_continuations=0)
  with pytest.raises(ValueError, match="rho"):
    rollouts.SegmentRollouts(rho=1.5)


# ---------------------------------------------------------------------------
# The segment advantage.
# ---------------------------------------------------------------------------


def test_hand_worked_advantage():
  # One response of 6 tokens, R = 1, cuts before tokens 1 and 4 with
  # V = 0.25 and 0.75, tokens 1 and 4 below rho. Segments: [0] before the
  # first cut gets 0; [1, 2, 3] gets 0.75 - 0.25 = 0.5; [4, 5] gets
  # 1 - 0.75 = 0.25. The mask keeps tokens 1 and 4: A = (0, .5, 0, 0, .25,
  # 0). Whitened over {0.5, 0.25}: mean 0.375, unbiased var 2 * 0.125^2 / 1
  # = 0.03125, so +-0.125 / 0.1767767 = +-0.7071068.
  rewards = np.array([[1.0]])
  cuts = np.array([[[0, 1, 0, 0, 1, 0]]])
  values = np.array([[[0.0, 0.25, 0.0, 0.0, 0.75, 0.0]]])
  mask = np.ones((1, 1, 6))
  low = np.array([[[0, 1, 0, 0, 1, 0]]])
  f = jax.jit(T.spo_chain_advantages_of, static_argnames=("normalize",))
  np.testing.assert_allclose(
    f(rewards, cuts, values, mask, low, normalize="none")[0, 0],
    [0, 0.5, 0, 0, 0.25, 0],
  )
  np.testing.assert_allclose(
    f(rewards, cuts, values, mask, None, normalize="none")[0, 0],
    [0, 0.5, 0.5, 0.5, 0.25, 0.25],
  )
  np.testing.assert_allclose(
    f(rewards, cuts, values, mask, low)[0, 0],
    [0, 0.7071068, 0, 0, -0.7071068, 0],
    rtol=1e-5,
  )


@pytest.mark.parametrize("normalize", ["batch", "none"])
@pytest.mark.parametrize("with_mask", [True, False])
def test_advantage_matches_numpy_reference(normalize, with_mask):
  rng = np.random.default_rng(0)
  f = jax.jit(T.spo_chain_advantages_of, static_argnames=("normalize",))
  for _ in range(5):
    rewards, cuts, values, mask, low = _random_case(rng)
    low = low if with_mask else None
    np.testing.assert_allclose(
      f(rewards, cuts, values, mask, low, normalize=normalize),
      np_spo_chain(rewards, cuts, values, mask, low, normalize),
      rtol=1e-5,
      atol=1e-5,
    )


def test_advantage_gradient_matches_finite_differences():
  rng = np.random.default_rng(1)
  rewards, cuts, values, mask, low = _random_case(rng, 2, 3, 5)
  w = rng.normal(size=mask.shape)

  def f(r, v):
    return jnp.sum(T.spo_chain_advantages_of(r, cuts, v, mask, low) * w)

  def f_np(r, v):
    return np.sum(np_spo_chain(r, cuts, v, mask, low) * w)

  g_r, g_v = jax.jit(jax.grad(f, argnums=(0, 1)))(rewards, values)
  h = 1e-5
  r64, v64 = rewards.astype(np.float64), values.astype(np.float64)
  for x64, grad, which in ((r64, g_r, 0), (v64, g_v, 1)):
    want = np.zeros_like(x64)
    for idx in np.ndindex(x64.shape):
      up, down = x64.copy(), x64.copy()
      up[idx] += h
      down[idx] -= h
      args_up = (up, v64) if which == 0 else (r64, up)
      args_down = (down, v64) if which == 0 else (r64, down)
      want[idx] = (f_np(*args_up) - f_np(*args_down)) / (2 * h)
    np.testing.assert_allclose(grad, want, rtol=1e-3, atol=1e-3)


def _batch(rewards, cuts, values, mask, low):
  return rljax.Batch(
    mask_PGT=jnp.asarray(mask), rewards_PG=jnp.asarray(rewards)
  ).with_extra(
    spo_cuts_PGT=jnp.asarray(cuts),
    spo_values_PGT=jnp.asarray(values),
    spo_low_prob_PGT=jnp.asarray(low),
  )


def test_transform_and_preset_train_only_low_probability_tokens():
  rng = np.random.default_rng(2)
  rewards, cuts, values, mask, low = _random_case(rng)
  t = T.spo_chain_advantages()
  out, _ = jax.jit(t.prepare)(_batch(rewards, cuts, values, mask, low), ())
  np.testing.assert_allclose(
    out.advantages_PGT,
    np_spo_chain(rewards, cuts, values, mask, low),
    rtol=1e-5,
    atol=1e-5,
  )
  np.testing.assert_array_equal(out.mask_PGT, mask * low)
  # Without the probability mask every token keeps its segment advantage.
  t = T.spo_chain_advantages(probability_mask=False, normalize="none")
  out, _ = t.prepare(_batch(rewards, cuts, values, mask, low), t.init())
  np.testing.assert_array_equal(out.mask_PGT, mask)
  np.testing.assert_allclose(
    out.advantages_PGT,
    np_spo_chain(rewards, cuts, values, mask, None, "none"),
    atol=1e-6,
  )
  # The preset: at ratio 1 the token-mean clipped surrogate's gradient is
  # -A / (number of kept tokens) on the kept tokens, 0 elsewhere.
  algo = algorithms.get("spo_segment", kl_coef=0.0)
  logp = rng.uniform(-3, -0.1, mask.shape).astype(np.float32)
  batch = _batch(rewards, cuts, values, mask, low)
  prepared, _ = algo.prepare(
    batch._replace(old_logp_PGT=jnp.asarray(logp)), algo.init()
  )

  def loss(x):
    total = algo.loss(x, prepared, algo.init())[0]
    return total.num / total.den

  grad = jax.grad(loss)(jnp.asarray(logp))
  kept = mask * low
  want = -np_spo_chain(rewards, cuts, values, mask, low) * kept / kept.sum()
  np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)


def test_bad_input_raises():
  rewards, cuts, values, mask, low = _random_case(np.random.default_rng(3))
  f = T.spo_chain_advantages_of
  with pytest.raises(ValueError, match="normalize"):
    f(rewards, cuts, values, mask, low, normalize="group")
  with pytest.raises(ValueError, match="values_PGT"):
    f(rewards, cuts, values[..., :2], mask, low)
  with pytest.raises(ValueError, match="mask_PGT"):
    f(rewards[:1], cuts, values, mask, low)
  t = T.spo_chain_advantages()
  batch = rljax.Batch(mask_PGT=jnp.asarray(mask), rewards_PG=rewards)
  with pytest.raises(ValueError, match="spo_low_prob_PGT"):
    t.prepare(batch, t.init())


# ---------------------------------------------------------------------------
# Sampling: continuations and the strategy's draw.
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def make_engine(model, tokenizer):
  """One engine for the module's tests (its compiled programs kept), its
  pool dropped before each use."""
  engine = sampling.Engine(
    model.config,
    slots=8,
    page_size=4,
    segment=4,
    max_length=24,
    stop_ids=tokenizer.stop_ids,
  )

  def make():
    engine.close()
    return engine

  return make


def test_continuations_start_exactly_at_the_prefix(
  model, tokenizer, make_engine
):
  prompt = tokenizer.encode("12+3=", add_bos=False)
  prefixes = [[], [3, 4], [5]]
  key = jax.random.key(7)
  out = rollouts.sample_continuations(
    make_engine(),
    model,
    [(prompt, prefix) for prefix in prefixes],
    key=key,
    num_samples=3,
    max_new_tokens=6,
    width=6,
    temperature=1.0,
  )
  assert out.tokens_PGT.shape == (3, 3, 6)
  # The same draws as sampling each prompt + prefix as a prompt.
  engine = make_engine()
  alone = [
    engine.add(
      prompt + prefix,
      key=jax.random.fold_in(key, r),
      max_new_tokens=6 - len(prefix),
      num_samples=3,
    )
    for r, prefix in enumerate(prefixes)
  ]
  engine.run(model)
  for r, prefix in enumerate(prefixes):
    for n, seq in enumerate(alone[r]):
      want = prefix + seq.completion
      got = out.tokens_PGT[r, n][out.mask_PGT[r, n] > 0]
      np.testing.assert_array_equal(got, want)
      np.testing.assert_array_equal(out.logp_PGT[r, n, : len(prefix)], 0)
      np.testing.assert_allclose(
        out.logp_PGT[r, n, len(prefix) : len(want)],
        seq.logp,
        rtol=1e-5,
        # Batched vs alone: the float32 forward's reductions (n <= 64) may
        # be reordered, ~n * eps32 * |logit| apart, however small logp is.
        atol=2e-5,
      )


def _count_threes(rollout, rows):
  """A deterministic reward: the number of token 3 in each completion."""
  del rows
  return (
    (np.asarray(rollout.tokens_PGT) == 3) * (np.asarray(rollout.mask_PGT) > 0)
  ).sum(-1)


def test_draw_values_cuts_by_their_continuations(model, tokenizer, make_engine):
  prompts = [
    tokenizer.encode("12+3=", add_bos=False),
    tokenizer.encode("4+5=", add_bos=False),
  ]
  seen = []

  def score(rollout, rows):
    seen.append((rollout, list(rows)))
    return _count_threes(rollout, rows)

  # rho = 1: every token starts a segment (the prompt state included).
  strategy = rollouts.SegmentRollouts(rho=1.0, interval=1, num_continuations=3)
  drawn = strategy.draw(
    make_engine(),
    model,
    prompts,
    np.array([3, 2]),
    key=jax.random.key(3),
    max_new_tokens=4,
    width=5,
    temperature=1.0,
    score=score,
  )
  rollout, extra = drawn.rollout, drawn.extra
  assert rollout.tokens_PGT.shape == (2, 3, 5)
  np.testing.assert_array_equal(rollout.sample_mask_PG, [[1, 1, 1], [1, 1, 0]])
  cuts = extra["spo_cuts_PGT"]
  np.testing.assert_array_equal(cuts, rollout.mask_PGT)
  want_low = np.exp(rollout.full_logp_PGT) < 1.0
  np.testing.assert_array_equal(
    extra["spo_low_prob_PGT"], want_low & (rollout.mask_PGT > 0)
  )
  ((cont, rows),) = seen
  # One request per distinct (group, prefix): the empty prefix of each
  # group is valued once for all its responses.
  keys = [
    (i, tuple(rollout.tokens_PGT[i, j, :t]))
    for i, j, t in zip(*np.nonzero(cuts))
  ]
  assert len(rows) == len(set(keys)) == cont.tokens_PGT.shape[0]
  rewards = _count_threes(cont, rows)
  for i, j, t in zip(*np.nonzero(cuts)):
    prefix = rollout.tokens_PGT[i, j, :t]
    match = [
      r
      for r in range(len(rows))
      if rows[r] == i
      and all(
        np.array_equal(cont.tokens_PGT[r, n, :t], prefix)
        and cont.mask_PGT[r, n, :t].all()
        for n in range(3)
      )
      and cont.prompt_tokens_PGS[r, 0][cont.prompt_mask_PGS[r, 0] > 0].tolist()
      == prompts[i]
    ]
    assert match, (i, j, t)
    np.testing.assert_allclose(
      extra["spo_values_PGT"][i, j, t], rewards[match[0]].mean(), rtol=1e-6
    )
  np.testing.assert_array_equal(extra["spo_values_PGT"][cuts == 0], 0)


def test_draw_needs_the_scorer(model, make_engine):
  strategy = rollouts.SegmentRollouts(rho=1.0, interval=1, num_continuations=2)
  with pytest.raises(ValueError, match="score="):
    strategy.draw(
      make_engine(),
      model,
      [[3, 4]],
      np.array([2]),
      key=jax.random.key(0),
      max_new_tokens=3,
      width=3,
      temperature=1.0,
    )


@pytest.mark.slow
def test_trainer_step_with_segment_rollouts(tmp_path):
  config = testing.tiny_run_config(
    CONFIG / "spo_segment.py", tmp_path, "train.steps=1"
  )
  trainer = Trainer(config)
  trainer.step(0)
  extra = trainer._last.extra
  mask = trainer._last.rollout.mask_PGT
  assert extra["spo_values_PGT"].shape == mask.shape == (8, 4, 4)
  np.testing.assert_array_equal(extra["spo_cuts_PGT"][mask == 0], 0)
