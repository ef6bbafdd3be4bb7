"""Episodes/s with a Python tool: environment steps overlapped vs serial.

Workload: P x G = 8 x 4 episodes of 3 turns. Each policy turn decodes up to
16 tokens (a random model with SmolLM2-135M's layer shape, 8 layers, so a
decode step costs what a small real model's does); each environment step
runs real code in `rljax.tools.PythonExecutor` (a fresh sandboxed process
per call; the code sums squares for about 0.1 s of CPU) and appends its
output. Both modes decode with the same engine (16 slots):

* serial: ``run_episodes(overlap=False)``: after each decoding segment,
  the segment's stopped episodes run their steps one after another, then
  decoding goes on;
* overlapped: ``overlap=True`` with 4 threads and 4 sandboxes: steps run
  while other episodes decode, and their results join at the next segment.

The two modes sample the same episodes (checked). They alternate, REPEATS
times each after a warm-up; the report gives the median overlapped /
serial episodes/s ratio and its range, and writes
docs/figures/agent_episodes.json.

It first measures the Python tool's own costs, jailed (bubblewrap's
namespaces, Landlock, seccomp, the audit hook) against the weaker in-process
layers (`allow_weaker`, the jail switched off), interleaved: a worker's start
(a new executor's first call: the jail, the interpreter, importing rljax)
and the median of 20 calls of ``print(1)`` (a fresh fork per call). Targets:
start <= 3 s, a call <= 20 ms.

Run: python experiments/benchmarks/agent_episodes.py [--repeats 3]
     [--sandbox_only]
"""

import argparse
import json
import os
import pathlib
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rljax import envs  # noqa: E402
from rljax import models  # noqa: E402
from rljax import sampling  # noqa: E402
from rljax import sandbox  # noqa: E402
from rljax import testing  # noqa: E402
from rljax import tools  # noqa: E402
from rljax.tokenizers import Tokenizer  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parents[2] / "docs" / "figures"
CODE = "print(sum(i * i for i in range({n})) % 97)"


class PythonSteps(envs.Environment):
  """Three turns; each step runs a program in the sandbox."""

  max_turns = 3

  def __init__(self, executor, n):
    self.executor, self.n = executor, n

  def reset(self, example):
    return envs.Start(example["question"])

  def step(self, action):
    out = self.executor(CODE.format(n=self.n + action.turn))
    return envs.Step(observation=f"={out.strip()}=", tool_calls=1)


def _tool_costs(jail: bool, calls: int = 20) -> tuple[float, float]:
  """(seconds to the first result, median seconds a call) of a new tool."""
  from rljax.sandbox import _jail  # noqa: PLC0415

  real = _jail.unavailable
  if not jail:  # as on a machine without user namespaces
    _jail.unavailable = lambda: "switched off by the benchmark"
  try:
    executor = tools.PythonExecutor(allow_weaker=not jail)
    start = time.perf_counter()
    executor("print(1)")
    first = time.perf_counter() - start
  finally:
    _jail.unavailable = real
  seconds = []
  for _ in range(calls):
    start = time.perf_counter()
    executor("print(1)")
    seconds.append(time.perf_counter() - start)
  layers = executor.sandbox.layers
  executor.close()
  assert layers["namespaces"] is jail, layers
  return first, float(np.median(seconds))


def sandbox_costs(repeats: int) -> dict:
  """The Python tool's start and call costs, jailed and weaker, interleaved."""
  costs = {
    "jail": {"start": [], "call": []},
    "weaker": {"start": [], "call": []},
  }
  modes = ["jail", "weaker"] if sandbox.kernel_isolation_error() is None else []
  modes = modes or ["weaker"]
  for r in range(repeats):
    for mode in modes if r % 2 == 0 else modes[::-1]:
      start, call = _tool_costs(mode == "jail")
      costs[mode]["start"].append(start)
      costs[mode]["call"].append(call)
      print(
        f"sandbox {mode}: start {start:.2f} s, call {call * 1000:.1f} ms",
        flush=True,
      )
  return {
    mode: {
      "start_s_median": float(np.median(c["start"])),
      "start_s_range": [min(c["start"]), max(c["start"])],
      "call_ms_median": 1000 * float(np.median(c["call"])),
      "call_ms_range": [1000 * min(c["call"]), 1000 * max(c["call"])],
    }
    for mode, c in costs.items()
    if c["start"]
  }


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--work", type=int, default=1_500_000)
  parser.add_argument("--sandbox_only", action="store_true")
  args = parser.parse_args()
  print(f"load before: {os.getloadavg()}", flush=True)
  tool_costs = sandbox_costs(max(args.repeats, 3))
  print(json.dumps(tool_costs, indent=1))
  if args.sandbox_only:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "agent_episodes.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report["sandbox"] = tool_costs
    path.write_text(json.dumps(report, indent=1))
    return
  tok = Tokenizer.from_characters("0123456789+-=ab")
  config = models.ModelConfig(
    vocab_size=tok.vocab_size,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=8,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    max_position_embeddings=128,
  )
  model = testing.random_model(config, scale=0.5)
  executor = tools.PythonExecutor(workers=4, timeout=30)
  renderer = envs.Renderer(tok, chat=False)
  examples = [{"question": f"{i}+{i}="} for i in range(8)]

  def run(overlap):
    engine = sampling.Engine(
      config, slots=16, page_size=16, max_length=128, stop_ids=tok.stop_ids
    )
    start = time.perf_counter()
    out = envs.run_episodes(
      engine,
      model,
      renderer,
      lambda: PythonSteps(executor, args.work),
      examples,
      [4] * 8,
      key=jax.random.key(0),
      width=80,
      turn_tokens=16,
      max_turns=3,
      overlap=overlap,
      workers=4,
    )
    return time.perf_counter() - start, out

  run(True), run(False)  # compile
  times = {"serial": [], "overlapped": []}
  for r in range(args.repeats):
    for mode in ("serial", "overlapped") if r % 2 else ("overlapped", "serial"):
      seconds, out = run(mode == "overlapped")
      times[mode].append(seconds)
      print(
        f"run {r} {mode}: {seconds:.2f} s, {32 / seconds:.2f} episodes/s,"
        f" environment {out.stats['env_seconds']:.2f} s, turns"
        f" {out.stats['turns']}",
        flush=True,
      )
  a, b = run(True)[1], run(False)[1]
  same = np.array_equal(a.rollout.tokens_PGT, b.rollout.tokens_PGT)
  ratios = np.asarray(times["serial"]) / np.asarray(times["overlapped"])
  report = {
    "episodes": 32,
    "seconds": times,
    "ratio_median": float(np.median(ratios)),
    "ratio_range": [float(ratios.min()), float(ratios.max())],
    "same_episodes": bool(same),
    "load": os.getloadavg(),
    "sandbox": tool_costs,
  }
  print(json.dumps(report, indent=1))
  OUT.mkdir(parents=True, exist_ok=True)
  (OUT / "agent_episodes.json").write_text(json.dumps(report, indent=1))
  executor.close()


if __name__ == "__main__":
  main()
