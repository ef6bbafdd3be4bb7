"""LLVM optimisation level 0 against XLA's default on CPU: compile and step
time of a training program.

The tests run the default set at level 0 (its programs are tiny: compiling
dominates) and the slow set at XLA's default (whole trainings: running
dominates). This measures the second half of that trade on the agent demo's
supervised warm start (configs/agent_calculator.py: batch 128, 48 tokens):
each run is a fresh process (XLA_FLAGS is read once per process) that
compiles the warm-start step (timed with its first call) and then times
--steps steps. The two settings run in turns, the order alternating, for
--repeats pairs; the report gives the median level-0 / default ratio of the
step time and of the first call, with their ranges. `uptime` is printed
first: the CPU is shared.

Run: python experiments/benchmarks/llvm_level.py [--steps 40] [--repeats 3]
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
LEVEL0 = "--xla_backend_optimization_level=0"


def _child(steps: int) -> None:
  """One process: (first-call seconds, seconds per step) as JSON."""
  from rljax.training import _build
  from rljax.training import _warm_start
  from rljax.training import load_config
  from rljax.training import override

  config = load_config(ROOT / "configs" / "agent_calculator.py")
  task = _build.build_task(config.task, config.sandbox)
  model, tokenizer = _build.build_policy(config.model, task.alphabet, 0)
  first = override(config, ["train.warm_start_steps=1"])
  start = time.perf_counter()
  _warm_start.warm_start_model(model, task, tokenizer, first)
  compiled = time.perf_counter() - start
  timed = override(config, [f"train.warm_start_steps={steps}"])
  start = time.perf_counter()
  _warm_start.warm_start_model(model, task, tokenizer, timed)
  step = (time.perf_counter() - start) / steps
  print(json.dumps({"first_call": compiled, "step": step}))


def _run(level0: bool, steps: int) -> dict:
  env = dict(
    os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=LEVEL0 if level0 else ""
  )
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # compile for real each time
  out = subprocess.run(
    [sys.executable, __file__, "--child", str(steps)],
    env=env,
    capture_output=True,
    text=True,
    check=True,
  )
  return json.loads(out.stdout.strip().splitlines()[-1])


def _ratio(pairs, key):
  ratios = [a[key] / b[key] for a, b in pairs]
  return statistics.median(ratios), min(ratios), max(ratios)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    _child(args.child)
    return
  print(subprocess.run(["uptime"], capture_output=True, text=True).stdout)
  pairs = []
  for i in range(args.repeats):
    order = (True, False) if i % 2 == 0 else (False, True)
    runs = {level0: _run(level0, args.steps) for level0 in order}
    pairs.append((runs[True], runs[False]))
    print(f"pair {i + 1}: level 0 {runs[True]}, default {runs[False]}")
  for key in ("step", "first_call"):
    median, low, high = _ratio(pairs, key)
    print(
      f"{key}: level 0 / default = {median:.2f}x (range {low:.2f}-{high:.2f})"
    )


if __name__ == "__main__":
  main()
