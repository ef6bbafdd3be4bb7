"""How robust is the default demo? Held-out accuracy over seeds x devices.

Runs ``python -m rljax.training --config configs/grpo.py`` once per (seed,
device count, variant), each in its own subprocess (XLA_FLAGS must be set
before jax starts), and records the held-out greedy accuracy before RL (after
the supervised warm start) and after it. A variant is a list of extra
overrides, e.g. the warm start's learning-rate schedule:

  python experiments/demo_robustness.py --seeds 0 1 2 --devices 1 8 \\
    --variant constant=train.warm_start_schedule=constant \\
    --variant cosine=train.warm_start_schedule=cosine

Writes ``--out`` (JSON: one record per run) and a PNG beside it (before ->
after per run). Runs one demo at a time (each uses both cores of a 2-core
machine for about two minutes); prints the machine's load first.
"""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULT = re.compile(r"eval accuracy: before ([\d.]+), after ([\d.]+)")


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--devices", type=int, nargs="+", default=[1, 8])
  parser.add_argument(
    "--variant",
    action="append",
    default=[],
    metavar="NAME=OVERRIDE[,OVERRIDE...]",
    help="a named list of extra overrides (default: the config as it is)",
  )
  parser.add_argument(
    "--out", default=str(ROOT / "runs" / "demo_robustness" / "results.json")
  )
  return parser


def run_demo(seed: int, devices: int, overrides: list[str]) -> dict:
  """One demo run in a subprocess; its before/after accuracy and time."""
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
  )
  with tempfile.TemporaryDirectory() as out:
    command = [
      sys.executable,
      "-m",
      "rljax.training",
      "--config",
      str(ROOT / "configs" / "grpo.py"),
      f"train.seed={seed}",
      f"output.directory={out}",
      "output.plot=False",
      *overrides,
    ]
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
  found = RESULT.search(proc.stdout)
  if proc.returncode or not found:
    raise RuntimeError(
      f"demo failed ({proc.returncode}): {proc.stderr[-2000:]}"
    )
  before, after = map(float, found.groups())
  return {"before": before, "after": after, "seconds": round(seconds, 1)}


def plot(records: list[dict], png: pathlib.Path) -> None:
  """Before -> after per run, one colour per variant."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  fig = Figure(figsize=(7.0, 4.0), layout="constrained")
  ax = fig.add_subplot()
  variants = sorted({r["variant"] for r in records})
  for i, variant in enumerate(variants):
    rows = [r for r in records if r["variant"] == variant]
    for j, r in enumerate(rows):
      x = i * (len(rows) + 2) + j
      ax.plot([x, x], [r["before"], r["after"]], color=f"C{i}", lw=2)
      ax.scatter([x], [r["before"]], color=f"C{i}", marker="o", s=18)
      ax.scatter([x], [r["after"]], color=f"C{i}", marker="^", s=30)
      ax.annotate(
        f"s{r['seed']}/{r['devices']}d",
        (x, r["before"] - 0.03),
        ha="center",
        fontsize=7,
      )
    ax.plot([], [], color=f"C{i}", lw=2, label=variant)
  values = [r[k] for r in records for k in ("before", "after")]
  ax.set_ylim(min(values) - 0.06, max(values) + 0.03)
  ax.set(
    ylabel="held-out greedy accuracy",
    title="Demo: before (o) and after (^) RL, per seed / device count",
    xticks=[],
  )
  ax.grid(alpha=0.3)
  ax.legend()
  png.parent.mkdir(parents=True, exist_ok=True)
  FigureCanvasAgg(fig).print_png(str(png))


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  variants = {"config": []}
  if args.variant:
    variants = {}
    for item in args.variant:
      name, _, overrides = item.partition("=")
      variants[name] = [o for o in overrides.split(",") if o]
  print("load:", os.getloadavg(), flush=True)
  out = pathlib.Path(args.out)
  records = []
  runs = [(v, s, d) for v in variants for s in args.seeds for d in args.devices]
  for i, (variant, seed, devices) in enumerate(runs):
    result = run_demo(seed, devices, variants[variant])
    record = {"variant": variant, "seed": seed, "devices": devices, **result}
    records.append(record)
    print(f"[{i + 1}/{len(runs)}] {json.dumps(record)}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1))
  plot(records, out.with_suffix(".png"))
  for variant in variants:
    gains = sorted(
      r["after"] - r["before"] for r in records if r["variant"] == variant
    )
    befores = [r["before"] for r in records if r["variant"] == variant]
    print(
      f"{variant}: gain median {gains[len(gains) // 2]:+.3f}, range"
      f" [{gains[0]:+.3f}, {gains[-1]:+.3f}]; before range"
      f" [{min(befores):.3f}, {max(befores):.3f}]"
    )
  print(f"wrote {out} and {out.with_suffix('.png')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
