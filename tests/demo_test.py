"""The README's main command: the tabular demo learns, for any preset."""

import importlib.util
import pathlib

import pytest

DEMO = (
  pathlib.Path(__file__).resolve().parents[1]
  / "experiments"
  / "tabular_arithmetic.py"
)


def _demo():
  spec = importlib.util.spec_from_file_location("tabular_arithmetic", DEMO)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("algo", ["grpo", "dapo"])
def test_demo_improves_greedy_accuracy(algo, capsys):
  before, after = _demo().main(["--algo", algo, "--steps", "40"])
  # From a uniform table (accuracy 0), 40 steps reach well above chance.
  assert before == 0.0
  assert after >= 0.15, capsys.readouterr().out
