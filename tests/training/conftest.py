"""Fixtures shared by the training tests."""

import json
import pathlib

import filelock
import pytest

from rljax.training import Trainer
from rljax.training import load_config
from rljax.training import override

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
# The demo's 800-step warm start is the same in every demo training of a
# process and of later runs: trained once, then restored (its key covers the
# program, the initial parameters, the data and the devices).
WARM_START_CACHE = ROOT / ".cache" / "warm_start"


def _train_demo(directory, *overrides):
  """The README's demo (configs/grpo.py) with `overrides`, trained to the
  end in `directory`; its summary."""
  config = override(
    load_config(CONFIGS / "grpo.py"),
    [
      f"output.directory={directory}",
      f"train.warm_start_cache={WARM_START_CACHE}",
      *overrides,
    ],
  )
  return Trainer(config).run()


@pytest.fixture(scope="session")
def train_demo():
  """``train_demo(directory, *overrides) -> summary``: the README's demo
  with overrides, trained to the end."""
  return _train_demo


@pytest.fixture(scope="session")
def grpo_demo(tmp_path_factory, train_demo):
  """(directory, summary) of the README's demo, trained once per test run
  for the tests that compare with it: the first test process to need it
  trains it, under a lock, and the others read its summary."""
  shared = tmp_path_factory.getbasetemp().parent  # one per run (xdist too)
  directory = shared / "grpo_demo"
  record = directory / "summary.json"
  with filelock.FileLock(str(shared / "grpo_demo.lock")):
    if not record.exists():
      summary = train_demo(directory)
      record.write_text(json.dumps(summary, default=str))
  return directory, json.loads(record.read_text())
