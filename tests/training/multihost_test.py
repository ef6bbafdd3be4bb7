"""Multi-host training on one machine: two processes with four CPU devices
each (gloo collectives on 127.0.0.1), started through the train CLI as on a
pod, against one process with eight devices."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

from rljax import sharding
from rljax import testing
from rljax import training
from rljax._src.errors import UserError
from rljax.training import Trainer
from rljax.training import _hosts
from rljax.training import _trainer_setup

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "grpo.py"
# All 8 devices (4 per process), 3 steps, a checkpoint after the last; a
# prompt sampler that learns from every process's rewards.
RUN = (
  "train.steps=3",
  "train.mesh=(-1, 1, 1)",
  "output.checkpoint_every=3",
  "sampler.prompts='uncertainty'",
)


def _free_port() -> str:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return str(s.getsockname()[1])


def _launch_two_hosts(directory, *extra, base=RUN) -> None:
  """`python -m rljax.training` once per "host", as the TPU scripts do."""
  port = _free_port()
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    XLA_FLAGS="--xla_force_host_platform_device_count=4"
    " --xla_backend_optimization_level=0",
  )
  overrides = [
    *testing.TINY_RUN,
    f"output.directory={directory}",
    *base,
    *extra,
  ]
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        "-m",
        "rljax.training",
        "--config",
        str(CONFIG),
        *overrides,
        f"--coordinator_address=127.0.0.1:{port}",
        "--num_processes=2",
        f"--process_id={i}",
      ],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
    )
    for i in range(2)
  ]
  for i, proc in enumerate(procs):
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"process {i}:\n{out.decode()[-3000:]}"


def _one_process_equals_two(tmp_path, run) -> Trainer:
  """Runs `run` on one process (8 devices) and restores the two processes'
  checkpoint in it: the same parameters (within the processes' reduction
  order) and the same prompt-sampler state (saved by process 0 after both
  processes updated it with the whole batch). Returns the one-process
  run."""
  single = Trainer(testing.tiny_run_config(CONFIG, tmp_path / "single", *run))
  single.run()
  resumed = Trainer(testing.tiny_run_config(CONFIG, tmp_path / "hosts", *run))
  assert resumed.start_step == 3
  for a, b in zip(
    jax.tree.leaves(single.state.policy.params),
    jax.tree.leaves(resumed.state.policy.params),
  ):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
  for key in ("alpha", "beta"):
    np.testing.assert_array_equal(
      resumed.prompt_state[key], single.prompt_state[key]
    )
  return single


@pytest.mark.slow  # minutes of CPU: the slow set
def test_two_processes_equal_one_and_their_checkpoint_restores_in_one(
  tmp_path,
):
  assert jax.device_count() == 8  # tests/conftest.py
  _launch_two_hosts(tmp_path / "hosts")
  # Process 0 alone logged: one record per step, plus the two evaluations.
  records = [
    json.loads(line)
    for line in (tmp_path / "hosts" / "metrics.jsonl").read_text().splitlines()
  ]
  assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
  assert len(records) == 5

  single = _one_process_equals_two(tmp_path, RUN)
  state = single.prompt_state
  assert (state["alpha"] + state["beta"] > 2).sum() >= 16  # prompts seen
  # Same prompts and rollouts: the logged rewards agree too.
  single_records = [
    json.loads(line)
    for line in (tmp_path / "single" / "metrics.jsonl").read_text().splitlines()
  ]
  for got, want in zip(records[1:4], single_records[1:4]):
    assert got["reward"] == pytest.approx(want["reward"])
    assert got["tokens"] == pytest.approx(want["tokens"])


# A disaggregated one_step_off run: each process gives the rollouts one of
# its four devices (sampler.mesh takes an equal share of every process) and
# the update the other three; the producer samples on the rollout devices
# while the update runs, evaluates at step 2 (the producer held still) and
# checkpoints. XLA's CPU client deadlocks when two programs that each span
# two devices of every process run at once, so the rollout mesh has one per
# process here.
DISAGGREGATED = (
  "train.steps=3",
  "train.mesh=(-1, 1, 1)",
  "sampler.mesh=(2, 1, 1)",
  "train.prompts_per_step=6",
  "train.warm_start_batch=6",
  "train.eval_every=2",
  "output.checkpoint_every=3",
  "sampler.prompts='uncertainty'",
)


def _records(directory):
  return [
    json.loads(line)
    for line in (directory / "metrics.jsonl").read_text().splitlines()
  ]


@pytest.mark.slow
@pytest.mark.parametrize(
  "mode, staleness",
  [
    ("train.async_mode='one_step_off'", [0, 1, 1]),
    # The processes agree on each rollout's weights (the newest any has).
    ("train.async_mode='async',train.max_staleness=0", [0, 0, 0]),
  ],
)
def test_two_processes_equal_one_for_a_disaggregated_async_run(
  tmp_path, mode, staleness
):
  run = (*DISAGGREGATED, *mode.split(","))
  _launch_two_hosts(tmp_path / "hosts", *run, base=())
  records = _records(tmp_path / "hosts")
  steps = [r for r in records if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2, 3]
  assert [r["staleness"] for r in steps] == staleness
  assert "eval_accuracy" in steps[1]
  _one_process_equals_two(tmp_path, run)
  for got, want in zip(steps, _records(tmp_path / "single")[1:4]):
    assert got["reward"] == pytest.approx(want["reward"])
    assert got["tokens"] == pytest.approx(want["tokens"])
    assert got.get("eval_accuracy") == want.get("eval_accuracy")


@pytest.mark.slow
def test_two_processes_agree_on_the_weights_of_an_async_run(tmp_path):
  """async with partial rollouts: which weights a rollout starts and
  continues with depends on timing, so the processes agree on each
  version; the run ends, within the bound, and its checkpoint restores."""
  run = (
    *DISAGGREGATED,
    "train.async_mode='async'",
    "train.max_staleness=2",
    "train.partial_rollouts=True",
    "sampler.engine='continuous'",
  )
  _launch_two_hosts(tmp_path / "hosts", *run, base=())
  steps = [r for r in _records(tmp_path / "hosts") if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2, 3]
  assert all(0 <= r["staleness"] <= 2 for r in steps)
  assert all(r["token_staleness_max"] <= 2 for r in steps)
  resumed = Trainer(testing.tiny_run_config(CONFIG, tmp_path / "hosts", *run))
  assert resumed.start_step == 3


def test_rollouts_take_an_equal_share_of_every_process(monkeypatch):
  hosts = [types.SimpleNamespace(id=i, process_index=i // 4) for i in range(8)]
  config = training.override(training.RunConfig(), ["sampler.mesh=(2,1,1)"])
  train, rollout = _trainer_setup.split_devices(config, hosts)
  assert [d.id for d in train] == [0, 1, 2, 4, 5, 6]
  assert [d.id for d in rollout] == [3, 7]
  for sizes, match in (("(3,1,1)", "multiple of 2"), ("(6,1,1)", "1 \\+ 3")):
    config = training.override(training.RunConfig(), [f"sampler.mesh={sizes}"])
    with pytest.raises(UserError, match=match):
      _trainer_setup.split_devices(config, hosts)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  for override, match in (
    ("train.async_mode='async'", "sampler.mesh"),
    ("train.queue_order='freshest'", "queue_order='oldest'"),
  ):
    config = training.override(
      training.RunConfig(),
      ["train.async_mode='async'", "sampler.mesh=(2,1,1)", override],
    )
    if "sampler.mesh" == match:
      config = training.override(config, ["sampler.mesh=()"])
    with pytest.raises(UserError, match=match):
      _trainer_setup._check_processes(config)


# HAPO's per-prompt table of the shortest correct length so far.
# Every answer counts as correct here (the tiny model is rarely right), so
# every prompt seen gets a record.
PER_PROMPT = (
  "algorithm.name=hapo",
  "algorithm.kwargs.num_prompts=10000",
  "algorithm.kwargs.correct_threshold=-100.0",
)


@pytest.mark.slow
def test_per_prompt_state_is_the_same_on_two_processes_as_on_one(tmp_path):
  _launch_two_hosts(tmp_path / "hosts", *PER_PROMPT)
  single = Trainer(
    testing.tiny_run_config(CONFIG, tmp_path / "single", *RUN, *PER_PROMPT)
  )
  single.run()
  resumed = Trainer(
    testing.tiny_run_config(CONFIG, tmp_path / "hosts", *RUN, *PER_PROMPT)
  )
  assert resumed.start_step == 3
  want = jax.device_get(single.state.policy.algo_state[0])
  got = jax.device_get(resumed.state.policy.algo_state[0])
  assert int((want.seen > 0).sum()) >= 16  # 3 steps x 8 prompts, repeats
  np.testing.assert_array_equal(got.seen, want.seen)
  np.testing.assert_allclose(got.values, want.values)


def test_own_rows_follow_the_batch_sharding():
  mesh = sharding.make_mesh(4, 2, 1)
  np.testing.assert_array_equal(_hosts.own_rows(mesh, 16), np.arange(16))
  with pytest.raises(ValueError, match="the batch has 12 rows"):
    _hosts.own_rows(mesh, 12)


def test_to_global_and_back():
  mesh = sharding.make_mesh(8, 1, 1)
  tree = {"a": np.arange(24.0).reshape(8, 3), "b": np.arange(8)}
  glob = _hosts.to_global(tree, mesh, 8)
  assert glob["a"].sharding.spec[0] == ("data", "fsdp")
  back = _hosts.to_local(glob, mesh)
  np.testing.assert_array_equal(back["a"], tree["a"])
  np.testing.assert_array_equal(back["b"], tree["b"])
  np.testing.assert_array_equal(_hosts.process_sum({"x": np.ones(2)})["x"], 1)


def test_mesh_collectives_and_the_weight_transfer_on_one_process():
  devices = jax.devices()
  train = sharding.make_mesh(6, 1, 1, devices=devices[:6])
  rollout = sharding.make_mesh(2, 1, 1, devices=devices[6:])
  got = _hosts.allgather({"a": np.arange(3)}, rollout)
  np.testing.assert_array_equal(got["a"], [[0, 1, 2]])
  assert _hosts.process_max(5, rollout) == 5
  twin = _hosts.twin_mesh(train, rollout)
  assert twin.devices.shape == (2, 1, 1, 3)  # three update devices each
  assert set(twin.devices.flat) == set(devices[:6])
  x = jax.device_put(
    np.arange(24.0).reshape(6, 4),
    jax.sharding.NamedSharding(train, jax.sharding.PartitionSpec("data")),
  )
  target = jax.sharding.NamedSharding(
    rollout, jax.sharding.PartitionSpec("data")
  )
  y = _hosts.transfer({"x": x}, target, twin)["x"]  # a prefix, as device_put
  assert y.sharding == target
  np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
  with pytest.raises(ValueError, match="cannot serve"):
    _hosts.twin_mesh(sharding.make_mesh(5, 1, 1, devices=devices[:5]), rollout)


def test_initialize_modes(monkeypatch):
  monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
  assert _hosts.initialize("off") is False
  assert _hosts.initialize("auto") is False  # no coordinator, no TPU pod
  with pytest.raises(ValueError, match="distributed must be one of"):
    _hosts.initialize("yes")
  with pytest.raises(ValueError, match="--num_processes N --process_id I"):
    _hosts.initialize("auto", coordinator_address="127.0.0.1:1234")
