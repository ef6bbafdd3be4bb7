"""Notebooks that take minutes run in the slow set (`pytest -m slow`); the
quickstart runs in the default one."""

import pytest

SLOW = {
  "prototype_objective.ipynb",
  "inspect_rollouts.ipynb",
  "new_environment.ipynb",
}


def pytest_collection_modifyitems(config, items):
  del config
  for item in items:
    if item.path.name in SLOW:
      item.add_marker(pytest.mark.slow)
