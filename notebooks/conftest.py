"""The notebooks run in the slow set (`pytest -m slow`): each trains for a
minute or more, and the quickstart's check (held-out accuracy rises) is the
README demo's learning check at notebook size. The default run covers what
they call (tests/training/trainer_test.py runs the same config end to end,
tests/monitoring the plots)."""

import pathlib

import pytest

from rljax import testing

# The kernels inherit the test run's compilation cache (.cache/jax).
testing.use_compilation_cache(
  pathlib.Path(__file__).resolve().parents[1] / ".cache" / "jax"
)

SLOW = {
  "quickstart.ipynb",
  "prototype_objective.ipynb",
  "inspect_rollouts.ipynb",
  "new_environment.ipynb",
}


def pytest_collection_modifyitems(config, items):
  del config
  for item in items:
    if item.path.name in SLOW:
      item.add_marker(pytest.mark.slow)
