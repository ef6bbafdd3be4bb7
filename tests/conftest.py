"""Test setup: 8 fake CPU devices and strict rank promotion for every test."""

import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

from rljax import testing  # noqa: E402

# Compiled programs are kept in .cache/jax (see `use_compilation_cache`).
testing.use_compilation_cache(
  pathlib.Path(__file__).resolve().parents[1] / ".cache" / "jax"
)

# LLVM's optimisation level 0 (see `pytest_configure`).
FAST_COMPILE = "--xla_backend_optimization_level=0"


def pytest_configure(config):
  """XLA_FLAGS, before jax initialises its backends (importing it does not).

  8 fake CPU devices. In the default run (``-m "not slow"``) also LLVM's
  optimisation level 0: its programs are tiny, so compiling dominates
  running, and level 0 compiles them faster (the README's Tests section;
  XLA's HLO passes still run). The slow set runs whole trainings, where
  level 0's slower code costs more than it saves (a warm-start step takes
  1.28x as long: experiments/benchmarks/llvm_level.py), so it keeps LLVM's
  default.
  """
  flags = "--xla_force_host_platform_device_count=8"
  markexpr = config.option.markexpr or ""
  if "not slow" in markexpr:
    flags += f" {FAST_COMPILE}"
  elif "slow" in markexpr and hasattr(config.option, "maxschedchunk"):
    # The slow set's longest tests run first (`pytest_collection_modify
    # items`) and xdist hands each worker one test at a time: longest first
    # onto whichever worker is free, so the workers finish together.
    config.option.maxschedchunk = config.option.maxschedchunk or 1
  os.environ.setdefault("XLA_FLAGS", flags)


# A [B] vs [B, T] broadcast is almost always a bug; make it an error.
jax.config.update("jax_numpy_rank_promotion", "raise")

import pytest  # noqa: E402

from rljax import sandbox  # noqa: E402

# On a machine without user namespaces (some CI containers) the Python tool
# would refuse to start; there the suite runs it on the weaker layers, and
# the jail's own tests skip, naming why.
if sandbox.kernel_isolation_error() is not None:
  os.environ.setdefault("RLJAX_SANDBOX_ALLOW_WEAKER", "1")

# Parametrized cases that run only with `-m slow` (default-run time); their
# other cases stay in the default run.
SLOW_CASES = {
  "tests/parity/gemma_test.py::test_greedy_generation_matches_transformers[gemma]",
  "tests/parity/gemma_test.py::test_greedy_generation_matches_transformers[gemma3_capped]",
  "tests/parity/gemma_test.py::test_greedy_generation_matches_transformers[gemma3]",
  "tests/models/gemma_test.py::test_windowed_cache_equals_full_cache_and_forward[layer_types2-2-3]",
  "tests/training/step_test.py::test_microbatches_give_the_whole_minibatch_gradient[dr_grpo]",
  "tests/models/gemma_test.py::test_windowed_cache_equals_full_cache_and_forward[layer_types1-5-2]",
  "tests/training/step_test.py::test_measured_statistics_are_the_whole_minibatch[2-mesh_sizes2]",
  "tests/training/step_test.py::test_measured_statistics_are_the_whole_minibatch[1-mesh_sizes1]",
  "tests/training/step_test.py::test_microbatches_give_the_whole_minibatch_gradient[ppo]",
  "tests/posttrain/runs_test.py::test_cli_dry_runs_each_kind[distill]",
  "tests/posttrain/runs_test.py::test_cli_dry_runs_each_kind[preference]",
}


# The slow set's longest tests (minutes each on 2 cores), longest first: they
# start first (see `pytest_configure`).
LONGEST_FIRST = (
  "tests/envs/tools_env_test.py::test_agent_demo_beats_its_no_tool_baseline",
  "tests/training/config_test.py::test_every_config_dry_runs_on_a_fresh_clone",
  "tests/training/reliability_test.py::test_twenty_kills",
  "notebooks/new_environment.ipynb",
  # The README demo is trained once (`grpo_demo`) by the first test that
  # asks; the next two do not need it, so the other worker runs them
  # instead of waiting for the demo's lock.
  "tests/training/demo_test.py::test_grpo_demo_raises_held_out_accuracy",
  "tests/posttrain/demo_test.py",
  "tests/training/lora_test.py::test_grpo_lora_config_runs_two_iterations",
  "tests/training/demo_test.py",
  "tests/training/lora_test.py::test_lora_on_the_demo_model",
  "notebooks/prototype_objective.ipynb",
  "tests/readme_test.py::test_readme_model_example_runs",
  "notebooks/quickstart.ipynb",
  # The TPU compile step's longest (`-m tpu`): first, before the kernel
  # compiles' state grows the process (57 s alone, 73 s after them).
  "tests/plan/plan_test.py::test_the_smollm2_config_plans_on_a_v5e_2x2",
)


def _rank(item) -> int:
  for i, prefix in enumerate(LONGEST_FIRST):
    if item.nodeid.startswith(prefix):
      return i
  return len(LONGEST_FIRST)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
  for item in items:
    if item.nodeid in SLOW_CASES:
      item.add_marker(pytest.mark.slow)
  items.sort(key=_rank)  # stable: the rest keep their order
