"""Asynchronous RL in the trainer (``train.async_mode``): the same run as
the synchronous one where the schedule says so, bit for bit, and never a
rollout older than the bound."""

import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import testing
from rljax.training import Trainer

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "grpo.py"
# Metrics that time the run or describe the overlap itself.
TIMING = {
  "seconds",
  "staleness",
  "dropped_samples",
  "queue_depth",
  "rollout_wait_fraction",
  "producer_wait_seconds",
  "weight_transfer_bytes",
  "weight_wait_seconds",
}


def _config(directory, *extra):
  return testing.tiny_run_config(
    CONFIG,
    directory,
    "train.mesh=(1, 1, 1)",
    "train.eval_prompts=4",
    "output.plot=False",
    # Large steps: the next rollout is sampled differently (with small
    # ones, a step's samples would be the same tokens either way).
    "optim.learning_rate=0.1",
    *extra,
  )


def _params(trainer):
  return [np.asarray(x) for x in jax.tree.leaves(trainer.state.policy.params)]


def _same_run(a, b):
  """Two trainers' runs are the same: parameters bit for bit, and every
  step's metrics but the timings."""
  for x, y in zip(_params(a[0]), _params(b[0])):
    np.testing.assert_array_equal(x, y)
  for step_a, step_b in zip(a[1]["history"], b[1]["history"], strict=True):
    keys = (set(step_a) | set(step_b)) - TIMING
    assert {k: step_a[k] for k in keys} == {k: step_b[k] for k in keys}


def _length(samples):
  return np.asarray(samples.num_tokens, np.float32)


def _run(trainer_class, directory, *extra, steps=3):
  """A tiny run rewarded by length, which varies within the groups of a
  barely trained model (the task's reward is 0 for all of them, and then
  nothing would move); checks that its weights moved."""
  config = _config(directory, f"train.steps={steps}", *extra)
  trainer = trainer_class(config, rewards=[("length", _length, 1.0)])
  first = _params(trainer)
  summary = trainer.run()
  assert any(not np.array_equal(a, b) for a, b in zip(first, _params(trainer)))
  return trainer, summary


@pytest.mark.slow  # two tiny runs (the default run's time: 9.5 of 10 min)
def test_async_with_no_staleness_is_the_sync_run_bit_for_bit(tmp_path):
  sync = _run(Trainer, tmp_path / "sync")
  run = _run(
    Trainer,
    tmp_path / "async",
    "train.async_mode=async",
    "train.max_staleness=0",
  )
  _same_run(sync, run)
  assert [h["staleness"] for h in run[1]["history"]] == [0.0, 0.0, 0.0]


class _OneStepBehind(Trainer):
  """The one-step-off schedule run synchronously: each step's rollout is
  sampled, in the trainer's own thread, with the weights of one update
  before (the run's first weights for the first two steps)."""

  def _take(self, step):
    if not hasattr(self, "_held"):
      self._held = jax.tree.map(jnp.copy, self._weights())
    return super()._take(step)

  def _publish(self, version):
    held, self._held = self._held, jax.tree.map(jnp.copy, self._weights())
    self._overlap.publish(version, held)


@pytest.mark.slow  # two tiny runs, four steps each
def test_one_step_off_is_its_schedule_run_in_one_thread(tmp_path):
  steps = 4
  behind = _run(_OneStepBehind, tmp_path / "behind", steps=steps)
  run = _run(
    Trainer, tmp_path / "off", "train.async_mode=one_step_off", steps=steps
  )
  _same_run(behind, run)
  assert [h["staleness"] for h in run[1]["history"]] == [0.0] + [1.0] * 3
  # Not the synchronous run: its rollouts were a step behind.
  sync = _run(Trainer, tmp_path / "sync", steps=steps)
  assert any(
    not np.array_equal(x, y) for x, y in zip(_params(sync[0]), _params(run[0]))
  )


class _SlowTrainer(Trainer):
  """A trainer whose every update takes longer (the producer runs ahead)."""

  def _publish(self, version):
    time.sleep(0.3)
    super()._publish(version)


@pytest.mark.slow  # two tiny runs, six steps each
@pytest.mark.parametrize("order", ["oldest", "freshest"])
def test_a_slow_trainer_never_trains_past_the_bound(tmp_path, order):
  _, summary = _run(
    _SlowTrainer,
    tmp_path,
    "train.async_mode=async",
    "train.max_staleness=2",
    f"train.queue_order={order}",
    steps=6,
  )
  history = summary["history"]
  assert max(h["staleness"] for h in history) <= 2
  assert all(np.isfinite(h["loss"]) for h in history)
  if order == "oldest":
    assert history[-1]["dropped_samples"] == 0


def test_async_settings_are_checked(tmp_path):
  with pytest.raises(ValueError, match="train.async_mode='eager'"):
    Trainer(_config(tmp_path, "train.async_mode=eager"))
  with pytest.raises(ValueError, match="train.max_staleness=-1"):
    Trainer(_config(tmp_path, "train.max_staleness=-1"))
  with pytest.raises(ValueError, match="train.queue_order='newest'"):
    Trainer(_config(tmp_path, "train.queue_order=newest"))


@pytest.mark.slow  # two tiny runs on 8 devices
def test_rollouts_on_a_mesh_of_their_own_are_the_colocated_run(tmp_path):
  # 8 devices as 4 + 4: rollouts on the last four, the update on the first
  # four; the weights move across after every update. Without staleness it
  # is the synchronous colocated run on four devices, bit for bit.
  assert jax.device_count() == 8
  four = ("train.mesh=(4, 1, 1)",)
  colocated = _run(Trainer, tmp_path / "colocated", *four)
  split = _run(
    Trainer,
    tmp_path / "split",
    *four,
    "sampler.mesh=(4, 1, 1)",
    "train.async_mode=async",
    "train.max_staleness=0",
  )
  trainer, summary = split
  assert trainer.rollout_mesh.devices.flatten().tolist() == jax.devices()[4:]
  assert trainer.mesh.devices.flatten().tolist() == jax.devices()[:4]
  leaves = jax.tree.leaves(trainer.state.policy.params)
  assert all(x.sharding.device_set <= set(jax.devices()[:4]) for x in leaves)
  size = sum(x.nbytes for x in leaves)
  assert summary["history"][-1]["weight_transfer_bytes"] == size
  _same_run(colocated, split)


def test_a_rollout_mesh_needs_devices_left_for_the_update(tmp_path):
  with pytest.raises(ValueError, match=r"sampler.mesh=\(8, 1, 1\) takes 8"):
    Trainer(_config(tmp_path, "sampler.mesh=(8, 1, 1)"))
  with pytest.raises(ValueError, match=r"sampler.mesh=\(0, 1, 1\)"):
    Trainer(_config(tmp_path, "sampler.mesh=(0, 1, 1)"))


@pytest.mark.slow  # a tiny run of six steps
def test_partial_rollouts_record_the_version_of_every_token(tmp_path):
  # A slow trainer publishes while the producer samples: rollouts in flight
  # continue under the new weights (segments of one token, so a rollout
  # meets several publishes), and the batch carries each token's version.
  seen = []

  class Recording(_SlowTrainer):
    def _step_batch(self, r, seqs, packing=None):
      batch = super()._step_batch(r, seqs, packing)
      real = np.asarray(batch.mask_PGT) > 0
      seen.append((self._step, np.asarray(batch.version_PGT)[real]))
      return batch

  _, summary = _run(
    Recording,
    tmp_path,
    "train.async_mode=async",
    "train.max_staleness=2",
    "train.partial_rollouts=True",
    "sampler.segment=1",
    "sampler.slots=8",
    steps=6,
  )
  history = summary["history"]
  for (step, versions), h in zip(seen, history, strict=True):
    assert versions.min() >= step - 2 and versions.max() <= step
    assert h["token_staleness_max"] <= h["staleness"] <= 2
  assert all(np.isfinite(h["loss"]) for h in history)


def test_partial_rollouts_need_the_async_mode(tmp_path):
  with pytest.raises(ValueError, match="train.partial_rollouts=True"):
    Trainer(_config(tmp_path, "train.partial_rollouts=True"))
