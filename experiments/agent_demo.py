"""The agent demo: the calculator against its no-tool baseline.

Runs `configs/agent_calculator.py` twice, with the calculator and without
(``task.kwargs.use_tools=False``: every call fails and no warm-start
demonstration calls it), then plots held-out greedy accuracy and the share
of episodes that call the tool, before RL and every 10 steps, for both, to
docs/figures/agent_calculator.{png,json}. With --plot only, it plots the
runs already in runs/agent_calculator{,_notool}.

Run: python experiments/agent_demo.py [--plot] [--seed 0]
"""

import argparse
import json
import pathlib
import subprocess
import sys

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNS = {
  "calculator": ROOT / "runs" / "agent_calculator",
  "no tool": ROOT / "runs" / "agent_calculator_notool",
}
OUT = ROOT / "docs" / "figures"
KEYS = ("eval_accuracy", "eval_tool_call_rate")


def _run(seed: int) -> None:
  for name, directory in RUNS.items():
    extra = ["task.kwargs.use_tools=False"] if name == "no tool" else []
    subprocess.run(
      [
        sys.executable,
        "-m",
        "rljax.training",
        "--config",
        str(ROOT / "configs" / "agent_calculator.py"),
        "--fresh",
        f"output.directory={directory}",
        f"train.seed={seed}",
        *extra,
      ],
      check=True,
      cwd=ROOT,
    )


def _curves(directory: pathlib.Path) -> dict[str, list]:
  """Each eval metric by step (the last record of a step wins)."""
  by_step = {}
  for line in (directory / "metrics.jsonl").read_text().splitlines():
    record = json.loads(line)
    if KEYS[0] in record:
      by_step[record["step"]] = {k: record[k] for k in KEYS}
  steps = sorted(by_step)
  return {"step": steps, **{k: [by_step[s][k] for s in steps] for k in KEYS}}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--plot", action="store_true", help="plot only")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  if not args.plot:
    _run(args.seed)
  data = {name: _curves(directory) for name, directory in RUNS.items()}
  fig = Figure(figsize=(9, 3.5))
  FigureCanvasAgg(fig)
  for i, (key, title) in enumerate(
    zip(KEYS, ("held-out greedy accuracy", "episodes that call the tool"))
  ):
    ax = fig.add_subplot(1, 2, i + 1)
    for name, curve in data.items():
      ax.plot(curve["step"], curve[key], marker="o", label=name)
    ax.set_xlabel("GRPO step (0: after the warm start)")
    ax.set_title(title)
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(loc="center right")
  fig.suptitle("3-digit multiplication, scratch model, 200 held-out problems")
  fig.tight_layout()
  OUT.mkdir(parents=True, exist_ok=True)
  fig.savefig(OUT / "agent_calculator.png", dpi=100)
  (OUT / "agent_calculator.json").write_text(json.dumps(data, indent=1))
  for name, curve in data.items():
    print(
      f"{name}: accuracy {curve[KEYS[0]][0]:.3f} -> {curve[KEYS[0]][-1]:.3f},"
      f" tool-call rate {curve[KEYS[1]][0]:.3f} -> {curve[KEYS[1]][-1]:.3f}"
    )


if __name__ == "__main__":
  main()
