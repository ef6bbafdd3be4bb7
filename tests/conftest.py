"""Test setup: 8 fake CPU devices and strict rank promotion for every test."""

import os

# Must be set before jax initialises its backends.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

# A [B] vs [B, T] broadcast is almost always a bug; make it an error.
jax.config.update("jax_numpy_rank_promotion", "raise")
