"""Learning-curve PNGs: written, non-empty, without a display or pyplot."""

import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest

from rljax.monitoring import plot_learning_curves
from rljax.monitoring import plot_runs
from rljax.monitoring import read_metrics


def _png_size(path):
  data = path.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n"
  return struct.unpack(">II", data[16:24])  # IHDR width, height


def _records(scale=1.0):
  return [
    {"step": s, "reward": scale * s / 10, "loss": 1 - s / 10} for s in range(10)
  ]


def test_read_metrics_merges_records_of_a_repeated_step(tmp_path):
  path = tmp_path / "metrics.jsonl"
  lines = [
    {"step": 2, "loss": 2.0, "reward": 0.1},
    {"step": 1, "loss": 3.0},
    {"step": 2, "loss": 1.5},  # a resumed run logs step 2 again
    {"step": 2, "eval_accuracy": 0.5},  # an evaluation at step 2
  ]
  path.write_text("".join(json.dumps(x) + "\n" for x in lines))
  assert read_metrics(path) == [
    {"step": 1, "loss": 3.0},
    {"step": 2, "loss": 1.5, "reward": 0.1, "eval_accuracy": 0.5},
  ]
  assert read_metrics(str(path)) == read_metrics(lines)
  with pytest.raises(ValueError, match="no 'step'"):
    read_metrics([{"loss": 1.0}])


def test_learning_curves_one_subplot_per_present_key(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in _records()))
  one = plot_learning_curves(path, tmp_path / "a.png", keys=("reward",))
  two = plot_learning_curves(path, tmp_path / "plots" / "b.png", title="GRPO")
  assert one == tmp_path / "a.png" and two.exists()
  # "reward" and "loss" are present: two columns, each 4.2 in at 100 dpi.
  assert _png_size(one) == (420, 300) and _png_size(two) == (840, 300)
  assert one.stat().st_size > 1000


def test_learning_curves_without_any_key_lists_the_logged_ones(tmp_path):
  with pytest.raises(ValueError, match=r"found \['loss', 'reward'\]"):
    plot_learning_curves(_records(), tmp_path / "x.png", keys=("accuracy",))


def test_plot_runs_overlays_runs_on_one_axis(tmp_path):
  runs = {"grpo": _records(1.0), "sapo": _records(1.2), "mine": _records(0.8)}
  path = plot_runs(runs, tmp_path / "cmp.png", key="reward", title="reward")
  assert _png_size(path) == (600, 400) and path.stat().st_size > 1000
  with pytest.raises(ValueError, match="run 'grpo' never logged 'accuracy'"):
    plot_runs(runs, tmp_path / "no.png", key="accuracy")


_HEADLESS = """
import sys
from rljax.monitoring import plot_learning_curves
plot_learning_curves([{"step": 0, "reward": 0.1}, {"step": 1, "reward": 0.3}],
                     sys.argv[1])
assert "matplotlib.pyplot" not in sys.modules
"""


def test_plots_need_no_display_and_no_pyplot(tmp_path):
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in ("DISPLAY", "WAYLAND_DISPLAY")
  }
  env["MPLBACKEND"] = (
    "tkagg"  # an interactive backend that would need a display
  )
  out = tmp_path / "headless.png"
  subprocess.run(
    [sys.executable, "-c", textwrap.dedent(_HEADLESS), str(out)],
    check=True,
    env=env,
    timeout=120,
  )
  assert out.stat().st_size > 1000
