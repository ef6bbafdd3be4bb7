"""Trained tokens per second: sync vs one_step_off vs async RL.

Two workloads, each a short RL run per mode (``train.async_mode``):

* agent: configs/agent_python.py (SmolLM2-135M-Instruct with the sandboxed
  Python tool: every tool call starts a fresh jailed process, host-side
  latency the producer can hide behind the update), shrunk to 2 prompts x
  2 episodes, 64 new tokens, 32 a turn;
* smollm2: configs/smollm2_grpo.py (SmolLM2-135M's shape, its completions'
  lengths long-tailed: most answers stop within a few tokens, some run to
  the 12-token cap), 4 prompts x 8 samples.

Each run trains ``--steps`` steps in a subprocess of its own; its first
step (compiles) is left out. Trained tokens/s = completion tokens of the
measured steps / their seconds. The update's wait fraction is the share of
those seconds the update waited for its rollout (sync: the whole rollout).
Modes alternate within each repeat (their order rotates), ``--repeats``
times; the report gives, per workload, the median tokens/s of each mode
and the median ratio to sync with its range, and writes
docs/figures/async_throughput.json and a plot beside it.

On CPU the rollout and the update run on the same two cores: an async
producer takes cores from the update, so the figure shows what overlapping
hides (host latency: tool processes, rewards, Python scheduling) and what
it costs (contention), not the device overlap of an accelerator, where the
engine and the update would each hold a device.

Run: python experiments/benchmarks/async_throughput.py [--repeats 3]
     [--steps 4] [--workloads agent smollm2]
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "figures" / "async_throughput.json"
MODES = {
  "sync": (),
  "one_step_off": ("train.async_mode=one_step_off",),
  "async": ("train.async_mode=async", "train.max_staleness=2"),
}
WORKLOADS = {
  "agent": (
    "configs/agent_python.py",
    (
      "train.prompts_per_step=2",
      "sampler.num_samples=2",
      "sampler.max_new_tokens=64",
      "sampler.groups_kwargs={'turn_tokens': 32, 'step_timeout': 30.0}",
      "train.microbatches=2",
      "sandbox.allow_weaker=True",
    ),
  ),
  "smollm2": ("configs/smollm2_grpo.py", ()),
}
# The child: one run, its per-step history as JSON on the last line.
_CHILD = """
import json, sys
from rljax.training import Trainer, load_config, override
config = override(load_config(sys.argv[1]), sys.argv[2:])
summary = Trainer(config).run()
print(json.dumps(summary["history"]))
"""


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--steps", type=int, default=4)
  parser.add_argument(
    "--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS)
  )
  parser.add_argument("--out", default=str(OUT))
  return parser


def run(workload: str, mode: str, steps: int) -> dict:
  """One run in a subprocess; its measured steps' figures."""
  config, extra = WORKLOADS[workload]
  with tempfile.TemporaryDirectory() as out:
    args = [
      str(ROOT / config),
      *extra,
      *MODES[mode],
      f"train.steps={steps}",
      "train.eval_prompts=1",
      "train.eval_every=0",
      f"output.directory={out}",
      "output.plot=False",
      "output.tensorboard=False",
      "output.rollouts_every=0",
    ]
    proc = subprocess.run(
      [sys.executable, "-c", _CHILD, *args],
      capture_output=True,
      text=True,
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
      cwd=ROOT,
    )
  if proc.returncode:
    raise RuntimeError(f"{workload}/{mode} failed: {proc.stderr[-3000:]}")
  history = json.loads(proc.stdout.strip().splitlines()[-1])[1:]
  seconds = sum(h["seconds"] for h in history)
  waited = sum(
    h.get("rollout_wait_fraction", 0.0) * h["seconds"] for h in history
  )
  return {
    "tokens_per_second": sum(h["tokens"] for h in history) / seconds,
    "wait_fraction": waited / seconds,
    "staleness": statistics.mean(h.get("staleness", 0.0) for h in history),
    "seconds": seconds,
  }


def plot(records: list[dict], png: pathlib.Path) -> None:
  """Tokens/s of each mode per workload: the median, and each run."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  workloads = sorted({r["workload"] for r in records})
  fig = Figure(figsize=(3.2 * len(workloads), 3.4), layout="constrained")
  for i, workload in enumerate(workloads):
    ax = fig.add_subplot(1, len(workloads), i + 1)
    for j, mode in enumerate(MODES):
      tps = [
        r["tokens_per_second"]
        for r in records
        if r["workload"] == workload and r["mode"] == mode
      ]
      ax.bar(j, statistics.median(tps), color=f"C{j}", alpha=0.6)
      ax.scatter([j] * len(tps), tps, color="k", s=10, zorder=3)
    ax.set_xticks(range(len(MODES)), list(MODES))
    ax.set(title=workload, ylabel="trained tokens / s")
    ax.grid(alpha=0.3, axis="y")
  FigureCanvasAgg(fig).print_png(str(png))


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  print("load:", os.getloadavg(), flush=True)
  records = []
  modes = list(MODES)
  for workload in args.workloads:
    for repeat in range(args.repeats):
      order = modes[repeat % 3 :] + modes[: repeat % 3]
      for mode in order:
        result = run(workload, mode, args.steps)
        record = {"workload": workload, "mode": mode, "repeat": repeat}
        records.append(record | result)
        print(json.dumps(records[-1]), flush=True)
        pathlib.Path(args.out).write_text(json.dumps(records, indent=1))
  for workload in args.workloads:
    rows = [r for r in records if r["workload"] == workload]
    sync = {
      r["repeat"]: r["tokens_per_second"] for r in rows if r["mode"] == "sync"
    }
    for mode in modes:
      mine = [r for r in rows if r["mode"] == mode]
      ratios = sorted(r["tokens_per_second"] / sync[r["repeat"]] for r in mine)
      tps = statistics.median(r["tokens_per_second"] for r in mine)
      wait = statistics.median(r["wait_fraction"] for r in mine)
      print(
        f"{workload} {mode}: {tps:.1f} tokens/s, x{statistics.median(ratios):.2f}"
        f" of sync (range {ratios[0]:.2f}-{ratios[-1]:.2f}), update waiting"
        f" {wait:.0%}"
      )
  png = pathlib.Path(args.out).with_suffix(".png")
  plot(records, png)
  print(f"wrote {args.out} and {png}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
