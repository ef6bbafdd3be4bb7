"""`experiments/benchmarks/device_check.py --smoke`: every stage runs on a
CPU and reports what a lent accelerator's run would (so the script a
device session runs has not rotted)."""

import importlib.util
import json
import pathlib

import pytest

SCRIPT = (
  pathlib.Path(__file__).resolve().parents[2]
  / "experiments"
  / "benchmarks"
  / "device_check.py"
)


@pytest.mark.slow  # 15 s: a script's check, not a module's
def test_the_smoke_run_reports_every_stage(tmp_path):
  spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  out = tmp_path / "check.json"
  report = module.main(["--smoke", "--out", str(out)])
  assert json.loads(out.read_text()) == json.loads(json.dumps(report))
  for stage in ("kernels", "engine", "update"):
    assert "error" not in report[stage], report[stage]
  kernels = report["kernels"]
  assert kernels["schedule"] == "pallas_interpret"
  assert kernels["float32"]["ok"] and kernels["bfloat16"]["ok"]
  engine = report["engine"]
  # Continuous batching takes fewer steps than the static batches.
  assert 0 < engine["engine_steps"] < engine["static_steps"]
  assert engine["bandwidth_bound_tokens_per_s"] > 0
  update = report["update"]
  assert update["flops"] > 0 and 0 < update["share_of_peak"]
