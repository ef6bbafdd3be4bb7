"""Does allocating samples by uncertainty reach the demo's accuracy with
fewer sampled tokens than uniform G?

Runs the default demo (``configs/grpo.py``: 16 prompts x 16 samples a step)
once per (prompt sampler, seed), each in its own subprocess, with held-out
evaluation every ``--eval-every`` steps on the task's test problems, RL
drawing from a pool of ``--pool`` training problems (the first of the
task's shuffled training examples, a random sample of all problems, so
the held-out set has the same distribution; 150 steps of 16 prompts visit
each of 256 problems about 9 times, so the samplers learn from a prompt's
earlier visits; on the demo's 10,000 problems, each seen once in 150
steps, every sampler here is uniform; the supervised warm start still
uses the whole training set), and reads each run's ``metrics.jsonl``:
held-out greedy accuracy against the completion tokens sampled so far.
Every sampler spends the same budget of samples a step (P x G = 256;
`Uncertainty` and `Knapsack` only move samples between prompts), so
tokens differ by completion lengths and by how soon a run gets there. The
target of a seed is the uniform run's smoothed final accuracy (the mean of
its last 5 evaluations); the report gives, per sampler and seed, the
tokens sampled until the first evaluation at or above it, the median
ratio to uniform, and the mean held-out accuracy over the run.

  python experiments/sampler_efficiency.py --seeds 0 1 2 \\
    --sampler uniform=shuffled --sampler uncertainty=uncertainty \\
    --sampler "knapsack=knapsack:{'max_samples_per_prompt': 32}"

Writes ``--out`` (JSON) and a PNG beside it (accuracy against sampled
tokens, one panel per seed). Prints the machine's load first: run it on a
quiet machine (each run uses both cores of a 2-core machine).
"""

import argparse
import ast
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOOTH = 5  # evaluations averaged into the target

DEFAULT_SAMPLERS = [
  "uniform=shuffled",
  "uncertainty=uncertainty",
  "knapsack=knapsack:{'min_samples': 2, 'max_samples_per_prompt': 32}",
]


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument(
    "--sampler",
    action="append",
    default=[],
    metavar="NAME=SAMPLER[:KWARGS]",
    help="a prompt sampler (rljax.selection name and a dict of its"
    " arguments); the first is the baseline",
  )
  parser.add_argument(
    "--extra", nargs="*", default=[], help="overrides for every run"
  )
  parser.add_argument("--eval-every", type=int, default=10)
  parser.add_argument(
    "--summarize",
    default=None,
    metavar="JSON",
    help="only summarize and plot an earlier run's results file",
  )
  parser.add_argument(
    "--pool", type=int, default=256, help="training problems RL draws from"
  )
  parser.add_argument("--eval-prompts", type=int, default=256)
  parser.add_argument(
    "--out",
    default=str(ROOT / "runs" / "sampler_efficiency" / "results.json"),
  )
  return parser


def run(seed: int, overrides: list[str], args):
  """One demo run; its evaluation curve (step, tokens so far, accuracy)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  with tempfile.TemporaryDirectory() as out:
    command = [
      sys.executable,
      "-m",
      "rljax.training",
      "--config",
      str(ROOT / "configs" / "grpo.py"),
      f"train.seed={seed}",
      f"train.eval_every={args.eval_every}",
      f"train.eval_prompts={args.eval_prompts}",
      f"output.directory={out}",
      "output.plot=False",
      "output.tensorboard=False",
      *overrides,
    ]
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
      raise RuntimeError(f"run failed: {proc.stderr[-2000:]}")
    rows = [
      json.loads(line)
      for line in (pathlib.Path(out) / "metrics.jsonl").read_text().splitlines()
    ]
  tokens, curve = 0.0, []
  for row in rows:
    tokens += row.get("tokens", 0.0)  # a step's, before its evaluation
    if "eval_accuracy" in row:
      curve.append(
        {
          "step": row.get("step"),
          "tokens": tokens,
          "accuracy": row["eval_accuracy"],
        }
      )
  return {"curve": curve, "seconds": round(seconds, 1)}


def tokens_to_reach(curve: list[dict], target: float):
  """Sampled tokens at the first evaluation at or above `target`."""
  for point in curve:
    if point["accuracy"] >= target - 1e-9:
      return point["tokens"]
  return None


def evaluations(curve: list[dict]) -> list[dict]:
  """A run's evaluations after its first (the warm start), one per step."""
  seen, out = set(), []
  for point in curve[1:]:
    if point["step"] not in seen:
      seen.add(point["step"])
      out.append(point)
  return out


def summarize(records: list[dict], names: list[str], seeds) -> dict:
  """Per sampler: tokens to the target against uniform's, and the mean
  held-out accuracy over the run, per seed; printed and returned.

  A seed's target is the baseline run's smoothed final accuracy (the mean
  of its last SMOOTH evaluations; one evaluation of 256 problems moves by
  a few points between steps)."""
  base, summary = names[0], {}
  for name in names:
    ratios, reached, means, gains = [], [], [], []
    for seed in seeds:
      ref, mine = (
        next(r for r in records if r["sampler"] == n and r["seed"] == seed)
        for n in (base, name)
      )
      tail = [p["accuracy"] for p in evaluations(ref["curve"])[-SMOOTH:]]
      target = sum(tail) / len(tail)
      t_ref = tokens_to_reach(evaluations(ref["curve"]), target)
      t_mine = tokens_to_reach(evaluations(mine["curve"]), target)
      reached.append(t_mine)
      if t_mine is not None and t_ref:
        ratios.append(t_mine / t_ref)
      mean = [p["accuracy"] for p in evaluations(mine["curve"])]
      means.append(sum(mean) / len(mean))
      gains.append(means[-1] - mine["curve"][0]["accuracy"])
    summary[name] = {
      "tokens_to_target": reached,
      "ratios": ratios,
      "mean_accuracy": means,
      "mean_gain_over_warm_start": gains,
    }
    text = (
      f"median {sorted(ratios)[len(ratios) // 2]:.2f}, range"
      f" {min(ratios):.2f}-{max(ratios):.2f}"
      if ratios
      else "never"
    )
    print(
      f"{name}: tokens to the {base} run's smoothed final accuracy /"
      f" {base}'s: {text} (reached in {len(ratios)}/{len(seeds)} seeds);"
      " mean held-out accuracy over the run, per seed: "
      + ", ".join(f"{m:.3f}" for m in means)
    )
  return summary


def plot(records: list[dict], seeds, png: pathlib.Path) -> None:
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  fig = Figure(figsize=(4.0 * len(seeds), 3.4), layout="constrained")
  axes = fig.subplots(1, len(seeds), squeeze=False)[0]
  names = list(dict.fromkeys(r["sampler"] for r in records))
  for ax, seed in zip(axes, seeds):
    for i, name in enumerate(names):
      for r in records:
        if r["sampler"] == name and r["seed"] == seed:
          xs = [p["tokens"] / 1e3 for p in r["curve"]]
          ys = [p["accuracy"] for p in r["curve"]]
          ax.plot(xs, ys, marker="o", ms=3, color=f"C{i}", label=name)
    ax.set(
      title=f"seed {seed}",
      xlabel="sampled completion tokens (thousands)",
      ylabel="held-out greedy accuracy",
    )
    ax.grid(alpha=0.3)
  axes[0].legend()
  png.parent.mkdir(parents=True, exist_ok=True)
  FigureCanvasAgg(fig).print_png(str(png))


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  samplers = {}
  for item in args.sampler or DEFAULT_SAMPLERS:
    name, _, spec = item.partition("=")
    sampler, _, kwargs = spec.partition(":")
    stage = {
      "where": {"index": list(range(args.pool))},
      "sampler": sampler,
      "sampler_kwargs": ast.literal_eval(kwargs) if kwargs else {},
    }
    samplers[name] = [
      "sampler.prompts='stages'",
      f"sampler.prompts_kwargs={{'stages': [{stage!r}]}}",
      *args.extra,
    ]
  if args.summarize:
    path = pathlib.Path(args.summarize)
    data = json.loads(path.read_text())
    records = data["runs"]
    names = list(dict.fromkeys(r["sampler"] for r in records))
    seeds = sorted({r["seed"] for r in records})
    data["summary"] = summarize(records, names, seeds)
    path.write_text(json.dumps(data, indent=1))
    plot(records, seeds, path.with_suffix(".png"))
    return 0
  print("load:", os.getloadavg(), flush=True)
  out = pathlib.Path(args.out)
  records = []
  runs = [(s, name) for s in args.seeds for name in samplers]  # interleaved
  for i, (seed, name) in enumerate(runs):
    result = run(seed, samplers[name], args)
    records.append({"sampler": name, "seed": seed, **result})
    last = result["curve"][-1]
    print(
      f"[{i + 1}/{len(runs)}] {name} seed {seed}: final accuracy"
      f" {last['accuracy']:.3f} after {last['tokens']:.0f} tokens"
      f" ({result['seconds']} s)",
      flush=True,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1))
  summary = summarize(records, list(samplers), args.seeds)
  out.write_text(json.dumps({"runs": records, "summary": summary}, indent=1))
  plot(records, args.seeds, out.with_suffix(".png"))
  print(f"wrote {out} and {out.with_suffix('.png')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
