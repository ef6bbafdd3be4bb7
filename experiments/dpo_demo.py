"""The preference pairs configs/dpo.py trains on, then its run, measured.

The SFT model (runs/sft/model, which ``python -m rljax.training --config
configs/sft.py`` exports) samples 8 completions of each of the first
``--pairs`` training prompts of 2-digit addition; the best against the
worst, where their rewards differ by at least 0.5, are the pairs
(`rljax.posttrain.sample_pairs`), written to runs/pairs.jsonl, and those of
``--held_out`` test prompts to runs/pairs_held_out.jsonl (``--runs``: a
directory other than runs).
Then (without ``--pairs_only``) configs/dpo.py trains on them and the
report prints greedy task accuracy and the held-out reward accuracy
(implicit reward of the chosen above the rejected) before and after.

Run from the repository root (paths are relative, as in the configs):

  python -m rljax.training --config configs/sft.py
  python experiments/dpo_demo.py [--pairs_only] [--pairs 2048] [--seed 0]

experiments/posttrain_demo.py runs the whole pipeline (SFT, GRPO, DPO) in
a directory of its own.
"""

import argparse
import json
import pathlib
import sys

import jax

from rljax import posttrain
from rljax.training import Trainer
from rljax.training import load_config
from rljax.training import override

ROOT = pathlib.Path(__file__).resolve().parents[1]
SFT = "python -m rljax.training --config configs/sft.py"


def sampler(model, directory, seed: int) -> Trainer:
  """configs/sft_grpo.py's run from `model` (an HF directory), used only to
  sample: 8 completions of each of 128 prompts at a time."""
  config = override(
    load_config(ROOT / "configs" / "sft_grpo.py"),
    [
      f"model.source=hf:{model}",
      f"train.seed={seed}",
      "sampler.num_samples=8",
      "train.prompts_per_step=128",
      f"output.directory={directory}",
    ],
  )
  return Trainer(config, resume=False)


def make_pairs(run: Trainer, seed: int, train: int, held_out: int):
  """(training pairs, held-out pairs, stats) from `run`'s samples of the
  first `train` training and `held_out` test prompts."""
  key = jax.random.key(seed)
  pairs, stats = posttrain.sample_pairs(
    run, list(run.task.train)[:train], key=key, min_margin=0.5
  )
  held, _ = posttrain.sample_pairs(
    run, list(run.task.test)[:held_out], key=jax.random.fold_in(key, 1)
  )
  return pairs, held, stats


def write_jsonl(path: pathlib.Path, records) -> None:
  """`records`, one JSON object a line."""
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in records))


def dpo(model, pairs_file, held, runs, seed: int) -> dict:
  """configs/dpo.py on `pairs_file`; the task and held-out figures before
  and after."""
  config = override(
    load_config(ROOT / "configs" / "dpo.py"),
    [
      f"model.source=hf:{model}",
      f"data.source=jsonl:{pairs_file}",
      f"train.seed={seed}",
      f"output.directory={runs / 'dpo'}",
    ],
  )
  run = posttrain.PreferenceRun(config, resume=False)
  before = run.evaluate_pairs(held)
  summary = run.run()
  return {
    "task_before": summary["before"]["eval_accuracy"],
    "task_after": summary["after"]["eval_accuracy"],
    "held_out_before": before,
    "held_out_after": run.evaluate_pairs(held),
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--runs", default="runs")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--pairs", type=int, default=2048)
  parser.add_argument("--held_out", type=int, default=512)
  parser.add_argument("--pairs_only", action="store_true")
  args = parser.parse_args(argv)
  runs = pathlib.Path(args.runs)
  model = runs / "sft" / "model"
  if not (model / "config.json").is_file():
    print(
      f"error: {model} does not exist; make it first: {SFT}", file=sys.stderr
    )
    return 2
  run = sampler(model, runs / "pairs_sampler", args.seed)
  pairs, held, stats = make_pairs(run, args.seed, args.pairs, args.held_out)
  write_jsonl(runs / "pairs.jsonl", pairs)
  write_jsonl(runs / "pairs_held_out.jsonl", held)
  report = {**stats, "pairs": len(pairs), "held_out": len(held)}
  print(f"wrote {runs / 'pairs.jsonl'}: {json.dumps(report)}")
  if not args.pairs_only:
    report = dpo(model, runs / "pairs.jsonl", held, runs, args.seed)
    print(json.dumps(report, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
