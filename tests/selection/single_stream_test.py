"""Single-stream SPO's prioritized prompt sampler, and a G = 1 training
run with the `spo` preset."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import selection
from rljax import testing
from rljax.checkpointing import _json
from rljax.training import Trainer

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def _feedback(ids, rewards, valid=None):
  rewards = np.asarray(rewards, np.float32)
  valid = np.ones(rewards.shape, bool) if valid is None else valid
  return selection.Feedback(
    prompt_ids=np.asarray(ids, np.int64),
    rewards=rewards,
    correct=rewards > 0,
    lengths=np.ones(rewards.shape, np.int32),
    valid=np.asarray(valid, bool),
    step=0,
  )


def test_priority_weights_by_hand():
  sampler = selection.SingleStream()
  state = sampler.init(3, seed=0)
  state = {**state, "alpha": np.array([0.5, 3.0, 1.0]), "beta": [0.5, 1, 0]}
  # p = 1/2: sqrt(1/4) + .05 = .55; p = 3/4: sqrt(3/16) + .05 = .48301;
  # p = 1: 0 + .05 = .05 (a solved prompt keeps a small chance).
  np.testing.assert_allclose(
    sampler.weights(state), [0.55, 0.48301, 0.05], 1e-5
  )


def test_draws_follow_the_priorities():
  sampler = selection.SingleStream()
  state = {
    **sampler.init(3, seed=1),
    "alpha": np.array([0.5, 3.0, 1.0]),
    "beta": np.array([0.5, 1.0, 0.0]),
  }
  counts = np.zeros(3)
  for _ in range(3000):
    chosen, state = sampler.select(state, 0, 1)
    counts[chosen.prompt_ids[0]] += 1
  want = np.array([0.55, 0.48301, 0.05]) / 1.08301
  np.testing.assert_allclose(counts / counts.sum(), want, atol=0.03)


def test_selection_is_deterministic_and_distinct():
  sampler = selection.SingleStream()
  state = sampler.init(50, seed=4)
  a, state_a = sampler.select(state, 0, 20)
  b, _ = sampler.select(state, 0, 20)
  np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)  # same state
  assert len(set(a.prompt_ids.tolist())) == 20  # no repeats within a step
  np.testing.assert_array_equal(a.num_samples, 1)
  assert state_a["counter"] == 1
  c, _ = sampler.select(state_a, 1, 20)
  assert not np.array_equal(a.prompt_ids, c.prompt_ids)  # the counter moved
  other, _ = sampler.select(sampler.init(50, seed=5), 0, 20)
  assert not np.array_equal(a.prompt_ids, other.prompt_ids)
  more, _ = sampler.select(sampler.init(5, seed=4), 0, 8)  # > the set
  assert more.prompt_ids.shape == (8,)


def test_pool_is_the_shuffled_stream():
  sampler = selection.SingleStream(pool_size=6)
  state = sampler.init(20, seed=2)
  pool, _ = selection.Shuffled(1).select(sampler.init(20, seed=2), 0, 6)
  chosen, state = sampler.select(state, 0, 4)
  assert set(chosen.prompt_ids) <= set(pool.prompt_ids)
  assert len(set(chosen.prompt_ids.tolist())) == 4
  assert state["position"] == 6


def test_update_by_hand():
  sampler = selection.SingleStream(rho=0.5)
  state = sampler.init(4, seed=0)
  # Prompt 1 twice (one discount): alpha = .5 * .5 + 1 + 0 = 1.25, beta =
  # .25 + 1 = 1.25. Prompt 2: r = 2 clipped to 1, one invalid sample:
  # alpha = .25 + 1, beta = .25. Prompt 3: r = .5: alpha = beta = .75.
  state = sampler.update(
    state,
    _feedback(
      [1, 2, 1, 3],
      [[1.0, 0.0], [2.0, 0.0], [0.0, 0.0], [0.5, 0.5]],
      [[1, 0], [1, 0], [1, 0], [1, 0]],
    ),
  )
  np.testing.assert_allclose(state["alpha"], [0.5, 1.25, 1.25, 0.75])
  np.testing.assert_allclose(state["beta"], [0.5, 1.25, 0.25, 0.75])


def test_host_tracker_matches_the_transform():
  rng = np.random.default_rng(0)
  sampler = selection.SingleStream()
  state = sampler.init(6, seed=0)
  algo = rljax.Algorithm(
    rljax.transforms.single_stream_advantages(6), rljax.aggregate.token_mean
  )
  table = algo.init()
  for step in range(4):
    chosen, state = sampler.select(state, step, 4)
    r = rng.choice([0.0, 1.0], size=(4, 1))
    batch = rljax.Batch(
      mask_PGT=jnp.ones((4, 1, 2)),
      rewards_PG=jnp.asarray(r, jnp.float32),
      prompt_ids_P=jnp.asarray(chosen.prompt_ids, jnp.int32),
    )
    _, table = jax.jit(algo.prepare)(batch, table)
    state = sampler.update(state, _feedback(chosen.prompt_ids, r))
  np.testing.assert_allclose(table.values[:, 0], state["alpha"], rtol=1e-6)
  np.testing.assert_allclose(table.values[:, 1], state["beta"], rtol=1e-6)


def test_state_survives_a_json_round_trip():
  sampler = selection.get("single_stream", num_samples=1)
  state = sampler.init(30, seed=7)
  state = sampler.update(state, _feedback([1, 2], [[1.0], [0.0]]))
  _, state = sampler.select(state, 0, 5)
  text = json.dumps(_json.encode(state, "prompt_state"))
  restored = _json.decode(json.loads(text))
  a, _ = sampler.select(state, 1, 5)
  b, _ = sampler.select(restored, 1, 5)
  np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)
  np.testing.assert_array_equal(restored["alpha"], state["alpha"])


def test_offline_initialisation_and_bad_settings():
  sampler = selection.SingleStream(
    initial_successes=[3, 0], initial_trials=[4, 0]
  )
  state = sampler.init(2, seed=0)
  np.testing.assert_allclose(state["alpha"], [5.6, 0.5])  # 8 * 3.5 / 5
  with pytest.raises(ValueError, match=r"must both have shape \(3,\)"):
    sampler.init(3, seed=0)
  with pytest.raises(ValueError, match="rho"):
    selection.SingleStream(rho=0.0)
  with pytest.raises(ValueError, match="pool_size"):
    selection.SingleStream(pool_size=0)
  with pytest.raises(ValueError, match="num_samples"):
    selection.SingleStream(num_samples=0)


@pytest.mark.slow  # two steps and a resume (~60 s)
def test_trainer_runs_spo_with_one_sample_per_prompt(tmp_path):
  config = testing.tiny_run_config(
    CONFIGS / "spo.py",
    tmp_path,
    "train.steps=2",
    "sampler.num_samples=1",
    "output.checkpoint_every=2",
  )
  trainer = Trainer(config)
  out = trainer.run()
  assert [h["samples"] for h in out["history"]] == [8.0, 8.0]
  assert trainer._last.rollout.tokens_PGT.shape[1] == 1
  assert all(np.isfinite(h["loss"]) for h in out["history"])
  state = trainer.prompt_state
  assert state["counter"] == 2
  assert np.sum(state["alpha"] + state["beta"] != 1.0) > 0  # it learned
  resumed = Trainer(config)
  assert resumed.start_step == 2
  np.testing.assert_array_equal(resumed.prompt_state["alpha"], state["alpha"])


@pytest.mark.slow  # a short run up to the first step's trace (~30 s)
def test_group_presets_refuse_one_sample_per_prompt(tmp_path):
  config = testing.tiny_run_config(
    CONFIGS / "grpo.py", tmp_path, "train.steps=1", "sampler.num_samples=1"
  )
  with pytest.raises(ValueError, match=r"sampler\.num_samples.*'spo'"):
    Trainer(config).run()
