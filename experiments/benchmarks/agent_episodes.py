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

Run: python experiments/benchmarks/agent_episodes.py [--repeats 3]
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


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--work", type=int, default=1_500_000)
  args = parser.parse_args()
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
  }
  print(json.dumps(report, indent=1))
  OUT.mkdir(parents=True, exist_ok=True)
  (OUT / "agent_episodes.json").write_text(json.dumps(report, indent=1))
  executor.close()


if __name__ == "__main__":
  main()
