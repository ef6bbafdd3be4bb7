"""RolloutWriter: one JSON line per sample every K steps."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.monitoring import RolloutWriter


def _read(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def test_writes_every_k_steps_one_line_per_sample(tmp_path):
  path = tmp_path / "logs" / "rollouts.jsonl"
  writer = RolloutWriter(path, every=2)
  written = [
    writer.maybe_write(
      step,
      prompts=["1+1=", "2+2="],
      completions=["2", "3"],
      rewards=jnp.asarray([1.0, 0.0]),
      extra={"accuracy": np.asarray([True, False]), "length": [1, 1]},
    )
    for step in range(5)
  ]
  assert written == [True, False, True, False, True]
  rows = _read(path)
  assert [r["step"] for r in rows] == [0, 0, 2, 2, 4, 4]
  assert rows[0] == {
    "step": 0,
    "prompt": "1+1=",
    "completion": "2",
    "reward": 1.0,
    "accuracy": True,
    "length": 1,
  }
  assert rows[1]["reward"] == 0.0 and rows[1]["completion"] == "3"


def test_one_prompt_per_group_of_g_samples(tmp_path):
  path = tmp_path / "r.jsonl"
  writer = RolloutWriter(path, every=1)
  rewards_PG = jnp.asarray([[1.0, 0.0, 0.5], [0.0, 0.0, 1.0]])
  writer.maybe_write(3, ["a", "b"], ["x", "y", "z", "u", "v", "w"], rewards_PG)
  rows = _read(path)
  assert [r["prompt"] for r in rows] == ["a"] * 3 + ["b"] * 3
  assert [r["reward"] for r in rows] == [1.0, 0.0, 0.5, 0.0, 0.0, 1.0]


def test_mismatched_lengths_name_the_argument(tmp_path):
  writer = RolloutWriter(tmp_path / "r.jsonl", every=1)
  with pytest.raises(ValueError, match="rewards has 3 values for 2"):
    writer.maybe_write(0, ["p"], ["a", "b"], [1.0, 0.0, 1.0])
  with pytest.raises(ValueError, match="prompts has 2 entries"):
    writer.maybe_write(0, ["p", "q"], ["a", "b", "c"], [1.0, 0.0, 1.0])
  with pytest.raises(ValueError, match=r"extra\['acc'\] has 1 values"):
    writer.maybe_write(0, ["p"], ["a", "b"], [1.0, 0.0], {"acc": [1]})
  with pytest.raises(ValueError, match="'reward' clashes"):
    writer.maybe_write(0, ["p"], ["a"], [1.0], {"reward": [1]})
  with pytest.raises(ValueError, match="every"):
    RolloutWriter(tmp_path / "r.jsonl", every=0)
  assert not (tmp_path / "r.jsonl").exists()


def test_other_processes_write_nothing(tmp_path, monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  writer = RolloutWriter(tmp_path / "r.jsonl", every=1)
  assert not writer.maybe_write(0, ["p"], ["a"], [1.0])
  assert not (tmp_path / "r.jsonl").exists()
