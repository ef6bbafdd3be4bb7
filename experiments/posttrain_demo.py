"""The post-training demo on 2-digit addition, from a scratch model:

1. SFT (configs/sft.py), exported to <runs>/sft/model;
2. GRPO from it (configs/sft_grpo.py): the public SFT run in place of the
   presets' private warm start;
3. DPO (configs/dpo.py) on pairs built offline from the task's reward: the
   SFT model's samples of each training prompt, the best against the worst
   (`rljax.posttrain.sample_pairs`), and held-out pairs from test prompts.

Reports greedy task accuracy before and after each run and DPO's held-out
reward accuracy (implicit reward of the chosen above the rejected) and
margin, to docs/figures/posttrain_demo.{json,png}.

Run: python experiments/posttrain_demo.py [--seed 0] [--runs runs/demo]
(--plot redraws the figure from the JSON.)
"""

import argparse
import json
import pathlib

import dpo_demo  # experiments/dpo_demo.py, beside this script
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rljax import posttrain
from rljax.training import Trainer
from rljax.training import load_config
from rljax.training import override

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "figures"


def _config(name, runs, seed, *extra):
  config = load_config(ROOT / "configs" / f"{name}.py")
  return override(
    config,
    [f"output.directory={runs / name}", f"train.seed={seed}", *extra],
  )


def _history(summary, key):
  return [(h["step"], h[key]) for h in summary["history"] if key in h]


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--runs", default=str(ROOT / "runs" / "demo"))
  parser.add_argument("--pairs", type=int, default=2048)
  parser.add_argument("--plot", action="store_true")
  args = parser.parse_args(argv)
  if args.plot:
    report = json.loads((OUT / "posttrain_demo.json").read_text())
    _plot(report)
    return report
  runs = pathlib.Path(args.runs)
  report = {"seed": args.seed}

  sft = posttrain.SFTRun(_config("sft", runs, args.seed), resume=False)
  summary = sft.run()
  sft_model = summary["model"]
  model = f"model.source=hf:{sft_model}"
  report["sft"] = {
    "before": summary["before"]["eval_accuracy"],
    "after": summary["after"]["eval_accuracy"],
    "loss": _history(summary, "loss"),
  }

  grpo = Trainer(_config("sft_grpo", runs, args.seed, model), resume=False)
  summary = grpo.run()
  report["grpo"] = {
    "before": summary["before"]["eval_accuracy"],
    "after": summary["after"]["eval_accuracy"],
    "eval": _history(summary, "eval_accuracy"),
  }

  # Pairs from the SFT model's own samples, scored by the task's reward.
  sampler = dpo_demo.sampler(sft_model, runs / "pairs", args.seed)
  train, held_out, stats = dpo_demo.make_pairs(
    sampler, args.seed, args.pairs, 512
  )
  file = runs / "pairs.jsonl"
  dpo_demo.write_jsonl(file, train)
  report["pairs"] = {**stats, "train": len(train), "held_out": len(held_out)}

  config = _config("dpo", runs, args.seed, model, f"data.source=jsonl:{file}")
  dpo = posttrain.PreferenceRun(config, resume=False)
  before = dpo.evaluate_pairs(held_out)
  summary = dpo.run()
  after = dpo.evaluate_pairs(held_out)
  report["dpo"] = {
    "task_before": summary["before"]["eval_accuracy"],
    "task_after": summary["after"]["eval_accuracy"],
    "held_out_before": before,
    "held_out_after": after,
    "reward_accuracy": _history(summary, "reward_accuracy"),
    "eval": _history(summary, "eval_accuracy"),
  }
  OUT.mkdir(parents=True, exist_ok=True)
  (OUT / "posttrain_demo.json").write_text(json.dumps(report, indent=1))
  _plot(report)
  print(json.dumps({k: v for k, v in report.items() if k != "sft"}, indent=1))
  return report


def _plot(report) -> None:
  fig = Figure(figsize=(12, 3.6))
  FigureCanvasAgg(fig)
  ax = fig.add_subplot(1, 3, 1)
  steps, loss = zip(*report["sft"]["loss"])
  ax.plot(steps, loss)
  ax.set(title="SFT: token loss", xlabel="step", yscale="log")
  ax = fig.add_subplot(1, 3, 2)
  steps, acc = zip((0, report["grpo"]["before"]), *report["grpo"]["eval"])
  ax.plot(steps, acc, marker="o", label="GRPO")
  ax.axhline(report["sft"]["before"], color="gray", ls=":", label="scratch")
  ax.set_ylim(-0.02, 1.0)
  ax.set(
    title="GRPO from the SFT model", xlabel="step", ylabel="held-out accuracy"
  )
  ax.legend()
  ax = fig.add_subplot(1, 3, 3)
  steps, acc = zip(*report["dpo"]["reward_accuracy"])
  ax.plot(steps, acc, label="train pairs")
  ax.axhline(
    report["dpo"]["held_out_after"]["eval_reward_accuracy"],
    color="C1",
    ls="--",
    label="held-out pairs (after)",
  )
  ax.set(title="DPO: reward accuracy", xlabel="step", ylim=(0, 1.02))
  ax.legend()
  fig.tight_layout()
  fig.savefig(OUT / "posttrain_demo.png", dpi=110)


if __name__ == "__main__":
  main()
