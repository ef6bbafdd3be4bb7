"""On-policy distillation against plain GRPO, at equal sampled tokens.

The student is SmolLM2-135M-Instruct cut to its first layers
(``model.keep_layers``), the teacher the whole model (configs/opd.py), on
one-digit addition where the teacher is better. Two arms per seed, the same
prompts, samples and steps: ``opd_grpo`` (GRPO advantages plus the teacher's
per-token reverse-KL term) and ``grpo`` (the reward alone, no teacher).
Greedy held-out accuracy is measured every ``--eval_every`` steps against
the cumulative number of sampled completion tokens; the report is each
arm's accuracy gain per 1,000 sampled tokens and the OPD - GRPO difference
at the end, per seed, to docs/figures/opd_demo.{json,png}.

The defaults fit a 2-core CPU (about 5 minutes a run): a 26-layer student
(the 10-layer one of configs/opd.py answers nothing right, so GRPO alone
gets no signal), 4 prompts x 4 samples a step, 8 steps, 32 held-out prompts.

Run: python experiments/opd_demo.py [--seeds 0 1 2] [--steps 8]
"""

import argparse
import dataclasses
import json
import pathlib

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
import numpy as np

from rljax.training import Trainer
from rljax.training import load_config
from rljax.training import override

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "figures"
ARMS = ("opd_grpo", "grpo")


def _arm(arm, seed, args, runs):
  config = override(
    load_config(ROOT / "configs" / "opd.py"),
    [
      f"algorithm.name={arm}",
      f"train.seed={seed}",
      f"train.steps={args.steps}",
      f"train.eval_every={args.eval_every}",
      f"train.eval_prompts={args.eval_prompts}",
      f"model.keep_layers={args.keep_layers}",
      f"train.prompts_per_step={args.prompts}",
      f"sampler.num_samples={args.samples}",
      f"output.directory={runs / f'{arm}_{seed}'}",
      "output.rollouts_every=0",
    ],
  )
  if arm == "grpo":
    config = dataclasses.replace(
      config,
      teacher=None,
      algorithm=dataclasses.replace(config.algorithm, kwargs={}),
    )
  if not args.collect:
    Trainer(config, resume=False).run()
  return _curve(config)


def _curve(config):
  """(sampled completion tokens so far, held-out accuracy) from a run's
  metrics.jsonl: the evaluation before, every one during, the one after."""
  per_step = config.train.prompts_per_step * config.sampler.num_samples
  records = [
    json.loads(line)
    for line in (pathlib.Path(config.output.directory) / "metrics.jsonl")
    .read_text()
    .splitlines()
  ]
  tokens, points = 0.0, []
  for r in records:
    if "response_length" in r:
      tokens += r["response_length"] * per_step
    if "eval_accuracy" in r:
      points.append((tokens, r["eval_accuracy"]))
  return points


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--steps", type=int, default=8)
  parser.add_argument("--eval_every", type=int, default=0)  # 0: ends only
  parser.add_argument("--eval_prompts", type=int, default=32)
  parser.add_argument("--keep_layers", type=int, default=26)
  parser.add_argument("--prompts", type=int, default=4)
  parser.add_argument("--samples", type=int, default=4)
  parser.add_argument("--runs", default=str(ROOT / "runs" / "opd_demo"))
  parser.add_argument(
    "--collect", action="store_true", help="report the runs already there"
  )
  args = parser.parse_args(argv)
  runs = pathlib.Path(args.runs)
  report = {"args": vars(args), "seeds": {}}
  for seed in args.seeds:
    curves = {arm: _arm(arm, seed, args, runs) for arm in ARMS}
    gains = {
      arm: (c[-1][1] - c[0][1]) / max(c[-1][0], 1.0) * 1000
      for arm, c in curves.items()
    }
    report["seeds"][seed] = {
      "curves": curves,
      "gain_per_1k_tokens": gains,
      "final": {arm: c[-1][1] for arm, c in curves.items()},
    }
    print(seed, json.dumps(report["seeds"][seed]["final"]), gains, flush=True)
  diffs = [
    s["final"]["opd_grpo"] - s["final"]["grpo"]
    for s in report["seeds"].values()
  ]
  report["opd_minus_grpo_final"] = diffs
  report["median_difference"] = float(np.median(diffs))
  OUT.mkdir(parents=True, exist_ok=True)
  (OUT / "opd_demo.json").write_text(json.dumps(report, indent=1))
  _plot(report)
  return report


def _plot(report) -> None:
  fig = Figure(figsize=(6, 4))
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  for seed, s in report["seeds"].items():
    for arm, color in zip(ARMS, ("C0", "C1")):
      x, y = zip(*s["curves"][arm])
      label = arm if seed == next(iter(report["seeds"])) else None
      ax.plot(np.asarray(x) / 1000, y, color=color, marker="o", label=label)
  ax.set(
    xlabel="sampled completion tokens (thousands)",
    ylabel="held-out greedy accuracy",
    title="SmolLM2 student: OPD + GRPO vs GRPO",
  )
  ax.legend()
  fig.tight_layout()
  fig.savefig(OUT / "opd_demo.png", dpi=110)


if __name__ == "__main__":
  main()
