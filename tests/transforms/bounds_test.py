"""Batch stages for the adaptive-bound objectives: DCPO's SAS table over
several steps, ETR's per-sample ranges, HAPO's entropy scores and
token-level group advantages."""

import math

import jax
import numpy as np
import pytest

import rljax
from rljax import aggregate
from rljax import testing
from rljax.transforms import _bounds as T


def _algo(*stages):
  return rljax.Algorithm(rljax.chain(*stages), aggregate.token_mean)


class _NpSas:
  """Independent per-prompt running statistics (the official loop)."""

  def __init__(self):
    self.stats = {}  # id -> (times, mean, std)

  def step(self, ids, rewards, valid):
    out = np.zeros(rewards.shape)
    for p, pid in enumerate(ids):
      r = np.asarray(rewards[p], np.float64)[valid[p] > 0]
      if len(r) < 2:
        continue
      times, mean, std = self.stats.get(pid, (0, 0.0, 0.0))
      mu_new, s_new = r.mean(), r.std(ddof=1)
      if times == 0:
        mean, std = mu_new, s_new
      else:
        n = times + 1
        var = (times * std**2 + s_new**2 + times / n * (mu_new - mean) ** 2) / n
        mean, std = (mean * times + mu_new) / n, math.sqrt(var)
      i = times + 1
      a_new = (r - mu_new) / s_new if s_new > 0 else 0 * r
      a_tot = (r - mean) / std if std > 0 else 0 * r
      s1 = (i - 1) / i * a_new + a_tot / i
      s2 = a_new / i + (i - 1) / i * a_tot
      out[p, valid[p] > 0] = np.where(np.abs(s1) < np.abs(s2), s1, s2)
      self.stats[pid] = (times + 1, mean, std)
    return out


def test_dcpo_sas_stage_over_steps_equals_numpy_running_stats():
  algo = _algo(T.dcpo_sas_advantages(num_prompts=5))
  prepare = jax.jit(algo.prepare)
  state = algo.init()
  ref = _NpSas()
  rng = np.random.default_rng(0)
  schedule = [[0, 1, 2, 3], [2, 3, 4, 0], [0, 2, 1, 4], [3, 0, 2, 2]]
  for step, ids in enumerate(schedule):
    batch = testing.random_batch(step)
    rewards = rng.integers(0, 2, batch.shape[:2]).astype(np.float32)
    rewards[1] = 1.0  # an all-equal group: A_new = 0, the history speaks
    rewards[0, 0] = 0.5
    valid = np.ones(batch.shape[:2], np.float32)
    valid[2, 1:] = 0.0  # one valid sample: A = 0, no update
    if step == 3:  # prompt 2 twice: the first row updates, both read
      valid[2] = 1.0
    batch = batch._replace(
      rewards_PG=rewards,
      sample_mask_PG=valid,
      prompt_ids_P=np.asarray(ids, np.int32),
      token_rewards_PGT=None,
    )
    out, state = prepare(batch, state)
    saved = dict(ref.stats)
    want = ref.step(ids[:3] if step == 3 else ids, rewards, valid)
    if step == 3:  # the duplicate row reads the history before the step
      before = _NpSas()
      before.stats = dict(saved)
      want[3] = before.step([2], rewards[3:], valid[3:])[0]
    adv = np.asarray(out.advantages_PGT)[..., 0]
    lengths = np.asarray(batch.mask_PGT).sum(-1)
    np.testing.assert_allclose(
      adv * (lengths > 0), want * (lengths > 0), rtol=1e-5, atol=1e-6
    )
  table = state[0].table
  for pid, (times, mean, std) in ref.stats.items():
    assert int(table.seen[pid]) == times
    np.testing.assert_allclose(table.values[pid], [mean, std], rtol=1e-5)
  # Step 1's all-equal group (prompt 3, seen before) still gets a signal.
  assert ref.stats[3][0] >= 2


def test_dcpo_sas_first_step_is_grpo_without_eps():
  batch = testing.random_batch(1)._replace(token_rewards_PGT=None)
  algo = _algo(T.dcpo_sas_advantages(num_prompts=4))
  out, _ = algo.prepare(batch, algo.init())
  r = np.asarray(batch.rewards_PG, np.float64)
  mean, std = r.mean(-1, keepdims=True), r.std(-1, ddof=1, keepdims=True)
  want = np.where(std > 0, (r - mean) / np.where(std > 0, std, 1), 0)
  np.testing.assert_allclose(
    np.asarray(out.advantages_PGT)[..., 0], want, rtol=1e-5, atol=1e-6
  )


def test_etr_bounds_stage_matches_numpy():
  batch = testing.random_batch(2)._replace(token_rewards_PGT=None)
  algo = _algo(
    rljax.transforms.group_advantages(rljax.advantages.grpo),
    T.etr_bounds(eps_low=0.2, eps_high=0.28),
  )
  out, _ = algo.prepare(batch, algo.init())
  r = np.asarray(batch.rewards_PG, np.float64)
  mask = np.asarray(out.loss_mask(), np.float64)
  adv = (np.asarray(out.advantages_PGT) * mask).sum(-1) / np.maximum(
    mask.sum(-1), 1
  )
  scale = (1 + 0.5 * np.abs(adv)) * (1 + 4 * r.var(-1, keepdims=True))
  np.testing.assert_allclose(
    out.extra["etr_eps_low_PG"], 0.2 * scale, rtol=1e-5
  )
  np.testing.assert_allclose(
    out.extra["etr_eps_high_PG"], 0.28 * scale, rtol=1e-5
  )
  # Custom g and h.
  algo = _algo(
    rljax.transforms.group_advantages(rljax.advantages.grpo),
    T.etr_bounds(g=lambda a: 1.0 + 0.0 * a, h=lambda v: 2.0 + 0.0 * v),
  )
  out, _ = algo.prepare(batch, algo.init())
  np.testing.assert_allclose(out.extra["etr_eps_low_PG"], 0.4, rtol=1e-6)
  with pytest.raises(ValueError, match="advantages_PGT"):
    _algo(T.etr_bounds()).prepare(batch, ((),))


def test_hapo_stages():
  batch = testing.random_batch(3)._replace(token_rewards_PGT=None)
  algo = _algo(T.hapo_token_advantages(), T.hapo_entropy_scores(pivot=0.5))
  out, _ = algo.prepare(batch, algo.init())
  mask = out.loss_mask()
  want = rljax.losses.hapo_entropy_scores(
    batch.old_entropy_PGT, mask, pivot=0.5
  )
  np.testing.assert_allclose(out.extra["hapo_entropy_scores_PGT"], want)
  # Token-level group average by hand for prompt 0 (no fallback there).
  r = np.asarray(batch.rewards_PG[0], np.float64)
  n = np.asarray(mask[0]).sum(-1)
  mu = (n * r).sum() / n.sum()
  sd = math.sqrt((n * (r - mu) ** 2).sum() / n.sum())
  want0 = (r - mu) / (sd + 1e-6) if sd > 0 else 0 * r
  assert np.all(np.abs(want0) < 5)
  np.testing.assert_allclose(
    np.asarray(out.advantages_PGT)[0, :, 0], want0, rtol=1e-5, atol=1e-6
  )
  with pytest.raises(ValueError, match="old_entropy_PGT"):
    stage = _algo(T.hapo_entropy_scores())
    stage.prepare(batch._replace(old_entropy_PGT=None), stage.init())


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="num_prompts"):
    T.dcpo_sas_advantages(0)
  with pytest.raises(ValueError, match="eps_low"):
    T.etr_bounds(eps_low=0.0)
  with pytest.raises(ValueError, match="pivot"):
    T.hapo_entropy_scores(pivot=1.5)
  with pytest.raises(ValueError, match="sign"):
    T.hapo_entropy_scores(sign="neither")
