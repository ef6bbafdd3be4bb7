"""rljax.testing's compilation cache: the test run's programs land in it."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def test_compiled_programs_are_written_to_the_cache():
  directory = jax.config.jax_compilation_cache_dir
  if not directory:
    pytest.skip("the environment turned the compilation cache off")
  assert os.environ["JAX_COMPILATION_CACHE_DIR"] == directory  # subprocesses
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
  before = set(os.listdir(directory)) if os.path.isdir(directory) else set()
  # A constant no earlier run compiled: a program that is not in the cache.
  c = float(np.random.default_rng().integers(1, 2**30))
  out = jax.jit(lambda x: x * c + 1.0)(jnp.arange(3.0))
  np.testing.assert_allclose(out, np.arange(3.0) * c + 1.0)
  assert set(os.listdir(directory)) - before
