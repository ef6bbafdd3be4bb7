"""The plan table of docs/tpu_pods.md: each large run of `PLANS` planned for
its TPU slice from this CPU host (``python -m rljax.training --config ...
--plan ...``, which needs libtpu: ``pip install -e ".[tpu]"``).

  python experiments/pod_plans.py            # plan each run, then the table
  python experiments/pod_plans.py --table    # the table from the saved plans
  python experiments/pod_plans.py --only qwen3_8b_grpo@v5e-64  # one again

Each plan's ``plan.json`` is kept as docs/figures/plan_<config>_<slice>.json
with the command's exit status and how long it took; the table (markdown)
goes to stdout. One plan at a time: a plan of an 8B model compiles for
minutes on 2 cores, and one that does not fit also runs the search for the
nearest configuration that does.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"

# (config in configs/pods/, slice): the runs issue 28 asks about.
PLANS = (
  ("qwen3_8b_grpo", "v5e-64"),
  ("qwen3_8b_grpo", "v5p-32"),
  ("qwen3_8b_grpo", "v6e-16"),
  ("qwen3_30b_a3b_grpo", "v5p-64"),
  ("llama3_70b_lora_grpo", "v5p-128"),
  ("gemma3_12b_grpo", "v6e-32"),
)


def _figure(config: str, slice_: str) -> pathlib.Path:
  return FIGURES / f"plan_{config}_{slice_}.json"


def plan_one(config: str, slice_: str) -> dict:
  """Run the plan command; its plan.json with the exit status, the seconds
  it took and its one-line error (when it refused the run) added."""
  with tempfile.TemporaryDirectory() as out:
    start = time.time()
    proc = subprocess.run(
      [
        sys.executable,
        "-m",
        "rljax.training",
        "--config",
        f"configs/pods/{config}.py",
        "--plan",
        slice_,
        f"output.directory={out}",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      check=False,
    )
    seconds = time.time() - start
    found = pathlib.Path(out) / "plan.json"
    if not found.is_file():
      raise SystemExit(f"{config} on {slice_}: no plan\n{proc.stderr[-3000:]}")
    record = json.loads(found.read_text())
  errors = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
  record.update(
    config=f"configs/pods/{config}.py",
    returncode=proc.returncode,
    plan_seconds=round(seconds, 1),
    error=errors[-1][len("error: ") :] if errors else "",
  )
  _figure(config, slice_).write_text(json.dumps(record, indent=2) + "\n")
  return record


def _gib(n: float) -> str:
  return f"{n / 2**30:.1f}"


def _estimate(record: dict) -> tuple[str, str]:
  """(iteration seconds by part, sampled tokens/s) of a plan that fits."""
  seconds = record["iteration_seconds"]
  return (
    f"{seconds['total']:.1f} s (rollout {seconds['rollout']:.1f}, score"
    f" {seconds['score']:.1f}, update {seconds['update']:.1f})",
    f"{record['tokens_per_second']:,.0f}",
  )


def row(config: str, slice_: str, record: dict) -> str:
  """One markdown row: the run, the mesh, fits or not (with the nearest
  configuration that fits), the peak program and its GiB per chip against
  the HBM, and the iteration estimate and tokens/s of the plan that fits."""
  mesh = record["mesh"]
  shape = f"({mesh['data']}, {mesh['fsdp']}, {mesh['tensor']})"
  peak = (
    f"{_gib(record['peak_bytes_per_device'])} of"
    f" {_gib(record['hbm_bytes_per_device'])} ({record['peak_program']})"
  )
  fitted = record if record["fits"] else record.get("suggested_plan")
  if record["fits"]:
    verdict = "fits"
  elif fitted:
    verdict = (
      f"does not fit; fits with `{' '.join(record['suggestion'])}`"
      f" (peak {_gib(fitted['peak_bytes_per_device'])})"
    )
  else:
    verdict = "does not fit; no change tried fits"
  estimate, tokens = _estimate(fitted) if fitted else ("-", "-")
  return (
    f"| `{config}` | {slice_} ({record['devices']} chips) | {shape} |"
    f" {verdict} | {peak} | {estimate} | {tokens} |"
  )


def table(records) -> str:
  head = [
    "| config | slice | mesh (data, fsdp, tensor) | verdict |"
    " peak GiB a chip of HBM (program) | iteration (roofline, of the plan"
    " that fits) | sampled tokens/s |",
    "|---|---|---|---|---|---|---|",
  ]
  return "\n".join(head + [row(c, s, r) for (c, s), r in records.items()])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--table", action="store_true", help="only print the saved plans' table"
  )
  parser.add_argument(
    "--only",
    nargs="+",
    default=[],
    metavar="CONFIG@SLICE",
    help="plan these again (e.g. qwen3_8b_grpo@v5e-64); the saved others",
  )
  args = parser.parse_args(argv)
  only = {tuple(x.split("@")) for x in args.only}
  records = {}
  for config, slice_ in PLANS:
    if args.table or (only and (config, slice_) not in only):
      if _figure(config, slice_).is_file():  # planned before
        records[config, slice_] = json.loads(
          _figure(config, slice_).read_text()
        )
      continue
    print(f"planning {config} on {slice_}...", file=sys.stderr, flush=True)
    records[config, slice_] = plan_one(config, slice_)
  print(table(records))
  return 0


if __name__ == "__main__":
  sys.exit(main())
