"""MetricsLogger: JSONL lines, TensorBoard events read back, W&B on request,
process 0 only, one host transfer per log call."""

import json
import struct
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from rljax.monitoring import MetricsLogger


def _read_events(path):
  """Scalars (tag, step, value) from a TFRecord file of Event protos."""
  data = path.read_bytes()
  scalars, pos = [], 0
  while pos < len(data):
    header = data[pos : pos + 8]
    (length,) = struct.unpack("Q", header)
    (header_crc,) = struct.unpack("I", data[pos + 8 : pos + 12])
    assert header_crc == masked_crc32c(header)
    payload = data[pos + 12 : pos + 12 + length]
    (payload_crc,) = struct.unpack(
      "I", data[pos + 12 + length : pos + 16 + length]
    )
    assert payload_crc == masked_crc32c(payload)
    pos += 16 + length
    event = event_pb2.Event.FromString(payload)
    for value in event.summary.value:
      scalars.append((value.tag, event.step, value.simple_value))
  return scalars


def test_jsonl_has_one_line_per_log_with_float_values(tmp_path):
  with MetricsLogger(tmp_path / "run", tensorboard=False) as logger:
    logger.log(1, {"reward": jnp.float32(0.5), "tokens": np.int64(120)})
    logger.log(2, {"reward": 0.75, "kl_ref": jnp.asarray([1e-3])})
  lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  records = [json.loads(line) for line in lines]
  assert records[0] == {"step": 1, "reward": 0.5, "tokens": 120.0}
  assert records[1]["step"] == 2 and records[1]["reward"] == 0.75
  assert records[1]["kl_ref"] == pytest.approx(1e-3)
  assert not list((tmp_path / "run").glob("events.out.tfevents*"))


def test_jsonl_is_appended_to_by_a_resumed_run(tmp_path):
  with MetricsLogger(tmp_path, tensorboard=False) as logger:
    logger.log(1, {"loss": 1.0})
  with MetricsLogger(tmp_path, tensorboard=False) as logger:
    logger.log(2, {"loss": 0.5})
  steps = [json.loads(x)["step"] for x in open(tmp_path / "metrics.jsonl")]
  assert steps == [1, 2]


def test_tensorboard_events_hold_the_logged_scalars(tmp_path):
  with MetricsLogger(tmp_path) as logger:
    logger.log(0, {"reward": 0.25, "entropy": jnp.float32(1.5)})
    logger.log(10, {"reward": 0.625})
  (events,) = tmp_path.glob("events.out.tfevents*")
  scalars = sorted(_read_events(events))
  assert scalars == [
    ("entropy", 0, 1.5),
    ("reward", 0, 0.25),
    ("reward", 10, 0.625),
  ]


def test_one_device_get_per_log_call(tmp_path, monkeypatch):
  calls = []
  real = jax.device_get
  monkeypatch.setattr(jax, "device_get", lambda x: calls.append(x) or real(x))
  with MetricsLogger(tmp_path, tensorboard=False) as logger:
    logger.log(3, {f"m{i}": jnp.float32(i) for i in range(5)})
  assert len(calls) == 1


def test_non_scalar_metric_names_the_metric(tmp_path):
  with MetricsLogger(tmp_path, tensorboard=False) as logger:
    with pytest.raises(
      ValueError, match="'adv' must be a number.*shape \\(3,\\)"
    ):
      logger.log(0, {"adv": jnp.ones(3)})
    with pytest.raises(ValueError, match="'name' must be a number"):
      logger.log(0, {"name": "grpo"})


def test_log_after_close_is_an_error(tmp_path):
  logger = MetricsLogger(tmp_path, tensorboard=False)
  logger.close()
  with pytest.raises(ValueError, match="closed"):
    logger.log(0, {"loss": 1.0})


def test_other_processes_write_nothing(tmp_path, monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  with MetricsLogger(tmp_path / "run", wandb=True) as logger:
    logger.log(0, {"loss": jnp.ones(3)})  # not even converted
  assert not (tmp_path / "run").exists()


def test_wandb_missing_says_how_to_install(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` fail
  with pytest.raises(ImportError, match=r"pip install rljax\[wandb\]"):
    MetricsLogger(tmp_path, wandb=True)


def test_wandb_gets_the_project_config_and_values(tmp_path, monkeypatch):
  calls = []

  class Run:
    def log(self, values, step):
      calls.append(("log", values, step))

    def finish(self):
      calls.append(("finish",))

  def init(**kwargs):
    calls.append(("init", kwargs))
    return Run()

  monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
  run_dir = tmp_path / "grpo-seed0"
  with MetricsLogger(
    run_dir, tensorboard=False, wandb="rl", config={"lr": 2e-4}
  ) as logger:
    logger.log(4, {"reward": jnp.float32(0.5)})
  assert calls == [
    (
      "init",
      {
        "project": "rl",
        "name": "grpo-seed0",
        "dir": str(run_dir),
        "config": {"lr": 2e-4},
      },
    ),
    ("log", {"reward": 0.5}, 4),
    ("finish",),
  ]
