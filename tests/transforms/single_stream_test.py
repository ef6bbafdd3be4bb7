"""Single-stream SPO advantages (arXiv 2509.13232): the per-prompt tracker,
the batch z-score and the G = 1 errors of the group estimators."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
import numpy as np
import pytest

import rljax
from rljax import selection
from rljax import transforms as T

# ---------------------------------------------------------------------------
# An independent numpy reference (float64, a dict per prompt).
# ---------------------------------------------------------------------------


def np_zscore(r, p_hat, valid, eps=1e-8):
  a = np.asarray(r, np.float64) - np.asarray(p_hat, np.float64)[:, None]
  x = a[valid]
  std = x.std(ddof=1) if x.size > 1 else 0.0
  return np.where(valid, (a - x.mean()) / (std + eps), 0.0)


class NpTracker:
  """SPO's tracker as the official code writes it, one prompt at a time."""

  def __init__(self, alpha=0.5, beta=0.5):
    self.ab = {}
    self.default = (alpha, beta)

  def p_hat(self, ids):
    return np.array([self._get(i)[0] / sum(self._get(i)) for i in ids])

  def _get(self, i):
    return self.ab.get(int(i), self.default)

  def step(self, ids, r, valid, rho):
    """Advantages from the tracker before the batch, then the update."""
    adv = np_zscore(r, self.p_hat(ids), valid)
    wins, counts = {}, {}
    for i, row_r, row_v in zip(ids, r, valid):
      wins[int(i)] = wins.get(int(i), 0.0) + np.clip(row_r, 0, 1)[row_v].sum()
      counts[int(i)] = counts.get(int(i), 0.0) + row_v.sum()
    for k, (i, rho_i) in enumerate(zip(ids, rho)):
      i = int(i)
      if counts[i] > 0 and i not in ids[:k]:  # one discount per prompt
        a, b = self._get(i)
        self.ab[i] = (rho_i * a + wins[i], rho_i * b + counts[i] - wins[i])
    return adv


def _batch(ids, rewards, valid=None, t=3):
  p, g = np.shape(rewards)
  return rljax.Batch(
    mask_PGT=jnp.ones((p, g, t)),
    rewards_PG=jnp.asarray(rewards, jnp.float32),
    sample_mask_PG=None if valid is None else jnp.asarray(valid, jnp.float32),
    prompt_ids_P=jnp.asarray(ids, jnp.int32),
  )


# ---------------------------------------------------------------------------
# The batch z-score.
# ---------------------------------------------------------------------------


def test_zscore_by_hand():
  # p_hat = 1/2 for three prompts, r = 1, 0, 1: A = .5, -.5, .5, mean 1/6,
  # deviations 1/3, -2/3, 1/3, unbiased var (1/9 + 4/9 + 1/9) / 2 = 1/3:
  # A = (1/3, -2/3, 1/3) * sqrt(3) = .57735, -1.15470, .57735.
  adv = jax.jit(T.single_stream_zscore)(
    jnp.array([[1.0], [0.0], [1.0]]), jnp.full((3,), 0.5)
  )
  np.testing.assert_allclose(adv[:, 0], [0.57735, -1.15470, 0.57735], 1e-5)


def test_zscore_reference_values_and_gradient():
  rng = np.random.default_rng(0)
  r = rng.normal(size=(5, 3))
  p_hat = rng.uniform(size=5)
  valid = rng.uniform(size=(5, 3)) > 0.3
  f = jax.jit(T.single_stream_zscore)
  got = f(r, p_hat, valid)
  np.testing.assert_allclose(got, np_zscore(r, p_hat, valid), atol=1e-5)
  w = rng.normal(size=(5, 3))
  grad = jax.grad(lambda x: jnp.sum(w * f(x, p_hat, valid)))(
    jnp.asarray(r, jnp.float32)
  )
  h = 1e-6
  fd = np.zeros_like(r)
  for i in np.ndindex(r.shape):
    e = np.zeros_like(r)
    e[i] = h
    up = np.sum(w * np_zscore(r + e, p_hat, valid))
    down = np.sum(w * np_zscore(r - e, p_hat, valid))
    fd[i] = (up - down) / (2 * h)
  np.testing.assert_allclose(grad, fd, rtol=1e-3, atol=1e-4)
  assert np.all(np.asarray(grad)[~valid] == 0)


def test_zscore_of_a_constant_batch_is_exactly_zero():
  adv = T.single_stream_zscore(jnp.full((7, 1), 0.7), jnp.full((7,), 0.1))
  np.testing.assert_array_equal(adv, 0.0)


def test_rho_by_hand():
  # 2^(-D / .06) clipped to [.875, .96]: D = 0 -> 1 -> .96; D = .003 ->
  # 2^-.05 = .96594 -> .96; D = .006 -> 2^-.1 = .93303; D = .06 -> .5 -> .875.
  rho = jax.jit(T.single_stream_rho)(jnp.array([0.0, 0.003, 0.006, 0.06]))
  np.testing.assert_allclose(rho, [0.96, 0.96, 0.9330330, 0.875], 1e-6)


# ---------------------------------------------------------------------------
# The transform: tracker state over several steps.
# ---------------------------------------------------------------------------


def _run(transform, batches):
  algo = rljax.Algorithm(transform, rljax.aggregate.token_mean)
  prepare = jax.jit(algo.prepare)
  state = algo.init()
  out = []
  for b in batches:
    prepared, state = prepare(b, state)
    out.append(prepared)
  return out, state


def test_tracker_by_hand():
  # Step 1: ids 0, 1, 2, r = 1, 0, 1, p_hat = 1/2: A as in the z-score case.
  #   Then rho = .875: prompt 0 and 2: alpha = .4375 + 1, beta = .4375;
  #   prompt 1: alpha = .4375, beta = 1.4375.
  # Step 2: ids 0, 1, 1, r = 0, 1, 0: p_hat(0) = 1.4375 / 1.875 = .76667,
  #   p_hat(1) = .4375 / 1.875 = .23333; A = -.76667, .76667, -.23333,
  #   mean -.07778, deviations -.68889, .84444, -.15556, unbiased std
  #   sqrt(1.21185 / 2) = .77841: A = -.88499, 1.08483, -.19984.
  #   Prompt 1 twice: one discount, both samples: alpha = .875 * .4375 + 1
  #   = 1.3828125, beta = .875 * 1.4375 + 1 = 2.2578125; prompt 0: alpha =
  #   .875 * 1.4375 = 1.2578125, beta = .875 * .4375 + 1 = 1.3828125.
  stage = T.single_stream_advantages(4)
  (b1, b2), table = _run(
    stage,
    [
      _batch([0, 1, 2], [[1.0], [0.0], [1.0]]),
      _batch([0, 1, 1], [[0.0], [1.0], [0.0]]),
    ],
  )
  np.testing.assert_allclose(
    b1.advantages_PGT[:, 0, 0], [0.57735, -1.15470, 0.57735], 1e-5
  )
  np.testing.assert_allclose(
    b2.advantages_PGT[:, 0, 0], [-0.88499, 1.08483, -0.19984], 1e-4
  )
  np.testing.assert_allclose(
    table.values,
    [
      [1.2578125, 1.3828125],
      [1.3828125, 2.2578125],
      [1.4375, 0.4375],
      [0.5, 0.5],
    ],
    rtol=1e-6,
  )


@pytest.mark.parametrize("g", [1, 3])
def test_several_steps_against_the_reference(g):
  rng = np.random.default_rng(g)
  ref = NpTracker()
  batches, want = [], []
  for _ in range(5):
    ids = rng.integers(0, 6, size=8)  # repeats across and within steps
    r = rng.choice([0.0, 1.0, 0.5], size=(8, g))
    valid = rng.uniform(size=(8, g)) > 0.2
    batches.append(_batch(ids, r, valid))
    want.append(ref.step(ids, r, valid, np.full(8, 0.875)))
  got, table = _run(T.single_stream_advantages(6), batches)
  for b, w in zip(got, want):
    np.testing.assert_allclose(b.advantages_PGT[..., 0], w, atol=1e-4)
    adv = np.asarray(b.advantages_PGT)  # the same on every token
    np.testing.assert_array_equal(adv, np.broadcast_to(adv[..., :1], adv.shape))
  for i in range(6):
    np.testing.assert_allclose(table.values[i], ref._get(i), rtol=1e-5)


def test_kl_forgetting_reads_the_drift():
  rng = np.random.default_rng(3)
  ref = NpTracker()
  batches = []
  want = []
  for _ in range(4):
    ids = rng.permutation(5)[:4]
    r = rng.choice([0.0, 1.0], size=(4, 1))
    valid = np.ones((4, 1), bool)
    d = rng.uniform(0, 0.1, size=4)
    batches.append(_batch(ids, r).with_extra(policy_drift_P=d))
    rho = np.clip(2.0 ** (-d / 0.06), 0.875, 0.96)
    want.append(ref.step(ids, r, valid, rho))
  got, table = _run(T.single_stream_advantages(5, forgetting="kl"), batches)
  for b, w in zip(got, want):
    np.testing.assert_allclose(b.advantages_PGT[..., 0], w, atol=1e-4)
  for i in range(5):
    np.testing.assert_allclose(table.values[i], ref._get(i), rtol=1e-5)
  with pytest.raises(ValueError, match="policy_drift_P"):
    _run(T.single_stream_advantages(5, forgetting="kl"), [_batch([0], [[1.0]])])


def test_offline_initial_values():
  # Prompt 0: 3 of 4 offline samples right: p_0 = 3.5 / 5 = .7, alpha_0 =
  # 8 * .7 = 5.6, beta_0 = 2.4. Prompt 1: none sampled: .5, .5.
  init = selection.single_stream_prior(2, [3, 0], [4, 0])
  np.testing.assert_allclose(init, [[5.6, 2.4], [0.5, 0.5]])
  stage = T.single_stream_advantages(2, initial=init)
  # p_hat = .7 and .5; r = 1, 1: A = .3, .5 -> z = +-1/sqrt(2).
  (b,), _ = _run(stage, [_batch([0, 1], [[1.0], [1.0]])])
  np.testing.assert_allclose(
    b.advantages_PGT[:, 0, 0], [-0.70711, 0.70711], 1e-4
  )


def test_spo_preset_trains_on_one_sample_per_prompt():
  algo = rljax.algorithms.get("spo", num_prompts=8)
  batch = _batch([0, 3, 5, 7], [[1.0], [0.0], [0.0], [1.0]])
  prepared, state = jax.jit(algo.prepare)(batch, algo.init())
  logp = jnp.full(batch.shape, -1.0)
  grad = jax.grad(lambda x: algo.loss(x, prepared, state)[0].value)(logp)
  assert np.all(np.isfinite(grad)) and np.any(grad != 0)


# ---------------------------------------------------------------------------
# Bad input, and the group estimators at G = 1.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(forgetting="adaptive"), "forgetting"),
    (dict(rho=1.5), "0 < rho <= 1"),
    (dict(rho_min=0.97), "rho_min"),
    (dict(initial=np.ones((3, 2))), r"must be \(4, 2\)"),
    (dict(d_half=0.0), "d_half"),
  ],
)
def test_bad_settings_name_the_argument(kwargs, match):
  with pytest.raises(ValueError, match=match):
    T.single_stream_advantages(4, **kwargs)


def test_bad_batches_name_the_field():
  stage = T.single_stream_advantages(4)
  no_ids = _batch([0], [[1.0]])._replace(prompt_ids_P=None)
  with pytest.raises(ValueError, match="prompt_ids_P"):
    _run(stage, [no_ids])
  with pytest.raises(ValueError, match="p_hat_P"):
    T.single_stream_zscore(jnp.ones((3, 1)), jnp.ones((2,)))
  with pytest.raises(ValueError, match="successes and trials"):
    selection.single_stream_prior(2, [1, 1])


@pytest.mark.parametrize(
  "stage",
  [
    T.group_advantages(rljax.advantages.grpo),
    T.group_advantages(rljax.advantages.rloo),
    T.opo_advantages(),
    T.reinforce_pp_baseline_advantages(),
  ],
  ids=["grpo", "rloo", "opo", "reinforce_pp_baseline"],
)
def test_group_estimators_refuse_one_sample_per_prompt(stage):
  with pytest.raises(ValueError, match=r"sampler\.num_samples.*'spo'"):
    _run(stage, [_batch([0, 1], [[1.0], [0.0]])])


def test_sharded_over_prompts_on_eight_devices():
  rng = np.random.default_rng(5)
  ids = np.array([0, 3, 3, 5, 9, 1, 2, 7])
  r = rng.choice([0.0, 1.0], size=(8, 2))
  batches = [_batch(ids, r), _batch(ids[::-1], r)]
  want, want_table = _run(T.single_stream_advantages(10), batches)
  with jax.set_mesh(jax.make_mesh((8,), ("data",))):
    spec = PartitionSpec("data")
    sharded = [
      jax.tree.map(lambda x: jax.device_put(x, spec), b) for b in batches
    ]
    got, table = _run(T.single_stream_advantages(10), sharded)
    assert jax.typeof(got[0].advantages_PGT).sharding.spec[0] == "data"
  for g, w in zip(got, want):
    np.testing.assert_allclose(g.advantages_PGT, w.advantages_PGT, atol=1e-5)
  np.testing.assert_allclose(table.values, want_table.values, rtol=1e-6)
