"""The post-training configs run (slow): SFT, then RL, offline DPO on pairs
built from the task's reward and online DPO from its exported model; OPD
and GKD with the real SmolLM2 as teacher."""

import json
import pathlib

import jax
import numpy as np
import pytest

from rljax import posttrain
from rljax import testing
from rljax.posttrain import _pairs
from rljax.posttrain._data import read_jsonl

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def _run(name, directory, *extra):
  config = testing.tiny_run_config(
    CONFIGS / f"{name}.py",
    directory,
    "train.mesh=(1, 1, 1)",
    "train.steps=2",
    *extra,
  )
  run = posttrain.run_for(config)(config)
  return run, run.run()


@pytest.mark.slow  # four runs, each compiling its own loop
def test_sft_then_rl_dpo_and_online_dpo_configs_run(tmp_path):
  sft, summary = _run("sft", tmp_path / "sft", "data.rows=8")
  assert len(summary["history"]) == 2
  model = f"model.source=hf:{summary['model']}"
  for name in ("sft_grpo", "online_dpo"):
    _, out = _run(name, tmp_path / name, model)
    assert all(np.isfinite(h["loss"]) for h in out["history"])
  records, stats = _pairs.sample_pairs(
    sft, list(sft.task.test)[:16], key=jax.random.key(0)
  )
  assert 0.0 <= stats["pairs_kept"] <= 1.0
  file = tmp_path / "pairs.jsonl"
  # A tiny two-step model may tie every group; keep the file non-empty.
  records = records or [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}]
  file.write_text("".join(json.dumps(r) + "\n" for r in records))
  assert read_jsonl(file) == records
  _, out = _run("dpo", tmp_path / "dpo", model, f"data.source=jsonl:{file}")
  assert all(np.isfinite(h["loss"]) for h in out["history"])


@pytest.mark.slow  # the real SmolLM2 teacher and a one-layer student of it
@pytest.mark.parametrize("name", ["opd", "gkd"])
def test_distillation_configs_run_two_steps(tmp_path, name):
  _, out = _run(
    name,
    tmp_path,
    "model.keep_layers=1",
    "sampler.max_new_tokens=4",
    "task.max_prompt_tokens=48",
    "train.eval_prompts=4",
  )
  history = out["history"]
  assert all(np.isfinite(h["loss"]) for h in history)
  if name == "opd":  # the teacher's signal reaches the advantages
    assert all(h["opd_reverse_kl"] != 0.0 for h in history)
  else:
    assert all(h["loss"] > 0.0 for h in history)
