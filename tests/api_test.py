"""The public API: every exported name exists and is documented."""

import importlib
import inspect

import pytest

import rljax

NAMESPACES = [
  "pallas_kernels",
  "rljax",
  "rljax.advantages",
  "rljax.aggregate",
  "rljax.algorithms",
  "rljax.checkpointing",
  "rljax.checkpoints",
  "rljax.filters",
  "rljax.losses",
  "rljax.masks",
  "rljax.models",
  "rljax.monitoring",
  "rljax.objectives",
  "rljax.rewards",
  "rljax.sandbox",
  "rljax.sampling",
  "rljax.shaping",
  "rljax.sharding",
  "rljax.tasks",
  "rljax.tokenizers",
  "rljax.training",
  "rljax.transforms",
]


@pytest.mark.parametrize("name", NAMESPACES)
def test_every_public_symbol_has_a_docstring(name):
  module = importlib.import_module(name)
  assert module.__doc__, f"{name} has no module docstring"
  undocumented = [
    symbol
    for symbol in module.__all__
    if (
      inspect.isfunction(obj := getattr(module, symbol)) or inspect.isclass(obj)
    )
    and not inspect.getdoc(obj)
  ]
  assert not undocumented, f"{name}: {undocumented}"


def test_every_preset_is_exported_and_named_like_its_function():
  for name, factory in rljax.algorithms.PRESETS.items():
    assert factory.__name__ == name
    assert getattr(rljax.algorithms, name) is factory
