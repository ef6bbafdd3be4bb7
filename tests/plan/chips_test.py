"""TPU chips and slice names (`rljax.plan`)."""

import pytest

from rljax import plan


@pytest.mark.parametrize(
  "name,topology,chips",
  [
    ("v5e:4x4", "v5e:4x4", 16),
    ("v5e-64", "v5e:8x8", 64),
    ("v5e-32", "v5e:4x8", 32),
    ("V6E-16", "v6e:4x4", 16),
    ("v6e-256", "v6e:16x16", 256),
    ("v5p-8", "v5p:2x2x1", 4),  # 8 TensorCores: 4 chips
    ("v5p-128", "v5p:4x4x4", 64),
    ("v5p-32", "v5p:2x2x4", 16),
    ("v5p:4x4x8", "v5p:4x4x8", 128),
    ("v4-32", "v4:2x2x4", 16),
  ],
)
def test_slice_names(name, topology, chips):
  got = plan.parse_slice(name)
  assert got.name == topology and got.chips == chips


@pytest.mark.parametrize(
  "name,match",
  [
    ("v7x-8", "expected <version>:<shape>"),
    ("v5e:4x4x4", "a v5e shape has 2 positive axes"),
    ("v5p-7", "n must be a multiple of it"),
    ("v5e-24", "must be a power of two"),
    ("tpu", "expected"),
  ],
)
def test_bad_slice_names_say_the_forms(name, match):
  with pytest.raises(ValueError, match=match):
    plan.parse_slice(name)


def test_chip_figures_are_the_cloud_pages():
  v5p = plan.CHIPS["v5p"]
  assert (v5p.peak_flops, v5p.hbm_bandwidth) == (459e12, 2765e9)
  assert plan.CHIPS["v5e"].hbm_bytes == 16 * 2**30
  assert all(
    c.source.startswith("https://cloud.google.com/tpu/docs/")
    for c in plan.CHIPS.values()
  )
