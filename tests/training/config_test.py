"""Run configs: key=value overrides, config files, the CLI's errors."""

import pathlib
import subprocess
import sys

import pytest

from rljax import algorithms
from rljax import rollouts
from rljax import selection
from rljax.training import RunConfig
from rljax.training import load_config
from rljax.training import override

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
PRESET_CONFIGS = sorted(p.stem for p in CONFIGS.glob("[!_]*.py"))


def test_overrides_parse_literals_and_strings():
  config = override(
    RunConfig(),
    [
      "train.steps=7",
      "optim.learning_rate=1",  # an int for a float field becomes 1.0
      "train.mesh=(2, 2, 2)",
      "algorithm.name=dapo",
      "algorithm.kwargs.eps_high=0.3",
      "sampler.top_p=0.9",
    ],
  )
  assert config.train.steps == 7
  assert config.optim.learning_rate == 1.0
  assert isinstance(config.optim.learning_rate, float)
  assert config.train.mesh == (2, 2, 2)
  assert config.algorithm.name == "dapo"
  assert config.algorithm.kwargs == {"eps_high": 0.3}
  assert config.sampler.top_p == 0.9
  assert RunConfig().train.steps != 7  # the original is untouched


@pytest.mark.parametrize(
  "item,match",
  [
    ("train.stepz=3", r"TrainSpec has no field 'stepz'"),
    ("train.steps=many", r"expected a int for 'steps'"),
    ("train", "must look like section.field=value"),
    ("model=3", "expected a ModelSpec"),
  ],
)
def test_bad_overrides_name_the_field(item, match):
  with pytest.raises(ValueError, match=match):
    override(RunConfig(), [item])


# Configs of the seed papers' mechanisms that are not presets of their own:
# a prompt sampler (sampler.prompts) or a group strategy (sampler.groups).
MECHANISM_CONFIGS = {
  "knapsack": "grpo",
  "gvm": "grpo",
  "vas": "grpo",
  "xrpo": "grpo",
  "v0": "grpo",
  "vspo": "grpo",
  "cascade_rl": "grpo",
  "scaf_grpo": "grpo",
  "ghpo": "grpo",
  "arpo_replay": "grpo",
  "campo": "dapo",
  "train_long_think_short": "tlts",
  "kimi_partial": "kimi_opmd",
  "inspo": "grpo",
  "gigpo_grid": "gigpo",
  "agent_calculator": "grpo",
  "agent_python": "grpo",
  "arpo": "episode_grpo",
  "sft_grpo": "grpo",  # RL from the SFT run's model
  "opd": "opd_grpo",
  "grpo_lora": "grpo",  # LoRA adapters on SmolLM2
}
# Post-training runs (`rljax.posttrain`): their kind and objective.
POSTTRAIN_CONFIGS = {
  "sft": ("sft", "grpo"),  # no algorithm: the section's default
  "dpo": ("preference", "dpo"),
  "online_dpo": ("preference", "dpo"),
  "gkd": ("distill", "gkd"),
}


def test_one_config_per_preset():
  presets = (
    set(PRESET_CONFIGS)
    - {"smollm2_grpo"}
    - set(MECHANISM_CONFIGS)
    - set(POSTTRAIN_CONFIGS)
  )
  assert presets == {
    "grpo",
    "dapo",
    "dr_grpo",
    "gspo",
    "sapo",
    "cispo",
    "gmpo",
    "ppo",
    "rloo",
    "reinforce_pp",
    "remax",
    "spo",
    "icpo",
    "aepo_arbitrary",
    "hbpo",
    "treepo",
    "c3po_pp",
    "tppo",
    "spo_segment",
    "spo_tree",
    "brpo",
    "delethink",
    "remix",
    "aepo_agentic",
    "portool",
  }
  for name in PRESET_CONFIGS:
    config = load_config(CONFIGS / f"{name}.py")
    if name in POSTTRAIN_CONFIGS:
      assert (config.kind, config.algorithm.name) == POSTTRAIN_CONFIGS[name]
      continue
    want = MECHANISM_CONFIGS.get(name, name.removeprefix("smollm2_"))
    assert config.algorithm.name == want
    # valid hyperparameters, prompt sampler and group strategy
    algorithms.get(config.algorithm.name, **config.algorithm.kwargs)
    selection.get(
      config.sampler.prompts,
      **{"num_samples": config.sampler.num_samples}
      | config.sampler.prompts_kwargs,
    )
    if config.sampler.groups is not None:
      rollouts.get(config.sampler.groups, **config.sampler.groups_kwargs)


def test_load_config_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="not found"):
    load_config(tmp_path / "missing.py")
  bad = tmp_path / "bad.py"
  bad.write_text("x = 1\n")
  with pytest.raises(ValueError, match="must define get_config"):
    load_config(bad)


def test_cli_help_runs():
  out = subprocess.run(
    [sys.executable, "-m", "rljax.training", "--help"],
    capture_output=True,
    text=True,
    check=True,
  )
  assert "--config" in out.stdout and "--dry_run" in out.stdout
