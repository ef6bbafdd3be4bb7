"""docs/papers.md names only what rljax has: every public name and preset in
its rljax column resolves, and it has one row per class A-E seed paper."""

import pathlib
import re

import pytest

import rljax
from rljax import envs  # noqa: F401 (rljax.envs by attribute)
from rljax import models  # noqa: F401 (rljax.models by attribute)
from rljax import posttrain  # noqa: F401 (rljax.posttrain by attribute)
from rljax import rewards  # noqa: F401 (rljax.rewards by attribute)
from rljax import rollouts  # noqa: F401 (rljax.rollouts by attribute)
from rljax import sandbox  # noqa: F401 (rljax.sandbox by attribute)
from rljax import selection  # noqa: F401 (rljax.selection by attribute)
from rljax import tools  # noqa: F401 (rljax.tools by attribute)

PAPERS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "papers.md"


def _rows():
  rows = []
  for line in PAPERS.read_text().splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 7 and re.fullmatch(r"[12]\.\d+", cells[0]):
      rows.append(cells)
  return rows


def test_one_row_per_class_a_to_e_paper():
  rows = _rows()
  assert len(rows) == 101 + 45
  assert len({r[0] for r in rows}) == len(rows)
  assert {r[3][0] for r in rows} == set("ABCDE")
  assert sum(r[3][0] == "E" for r in rows) == 45


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r[0])
def test_every_name_resolves(row):
  names = row[4]
  for preset in re.findall(r"preset `(\w+)`", names):
    assert preset in rljax.algorithms.PRESETS, preset
  for dotted in re.findall(r"`([a-z_]+\.[A-Za-z_]+)`", names):
    package, name = dotted.split(".")
    assert hasattr(getattr(rljax, package), name), dotted
  if row[6].startswith("works"):
    assert names != "—", row
