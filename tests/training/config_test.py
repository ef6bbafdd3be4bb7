"""Run configs: key=value overrides, config files, the CLI's errors."""

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from rljax import algorithms
from rljax import rollouts
from rljax import selection
from rljax.launch import _cli
from rljax.training import RunConfig
from rljax.training import _config_files
from rljax.training import load_config
from rljax.training import override
from rljax.training import validate

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
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
  "grpo_async": "grpo",  # rollouts beside the update (train.async_mode)
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


# --- every config runs on a fresh clone, or names what makes its inputs ----


def _makes(command: str, path: str) -> None:
  """`command` (run from the repository root) exists and makes `path`."""
  words = shlex.split(command)
  assert words[0] == "python", command
  if words[1:3] == ["-m", "rljax.training"]:
    config = ROOT / words[words.index("--config") + 1]
    assert config.is_file(), command
    made = load_config(config)
    # A post-training run exports its policy to <output.directory>/model.
    assert made.kind != "rl", command
    assert os.path.normpath(path) == os.path.normpath(
      f"{made.output.directory}/model"
    ), command
  else:
    script = ROOT / words[1]
    assert words[1].startswith("experiments/") and script.is_file(), command
    assert path in script.read_text(), f"{script} does not say it makes {path}"


def test_every_config_names_files_and_commands_that_exist():
  """Each config loads and validates; each file it names exists; each path
  it reads is in the repository or in its PREREQUISITES, with a command that
  exists and makes it (runs/ is output, absent from a fresh clone)."""
  for file in sorted(CONFIGS.glob("[!_]*.py")):
    config, prerequisites = _config_files._load(file)
    validate(config)
    for named in re.findall(
      r"(?:configs|experiments)/\w+\.py", file.read_text()
    ):
      assert (ROOT / named).is_file(), f"{file.name} names {named}"
    for field, value, path in _config_files.inputs(config):
      tracked = (ROOT / path).exists() and not path.startswith("runs/")
      assert tracked or path in prerequisites, (
        f"{file.name}: {field}={value!r} reads {path}, which a fresh clone"
        " lacks; add it and the command that makes it to PREREQUISITES"
      )
    for path, command in prerequisites.items():
      _makes(command, path)


def test_a_missing_input_names_the_command_that_makes_it(
  tmp_path, monkeypatch, capsys
):
  monkeypatch.chdir(tmp_path)  # a fresh clone: no runs/
  args = ["--config", str(CONFIGS / "dpo.py"), "--dry_run"]
  assert _cli.main(args) == 2
  error = capsys.readouterr().err.strip()
  assert error == (
    "error: model.source='hf:runs/sft/model': 'runs/sft/model' does not"
    f" exist (from {tmp_path}); make it first, from the repository root:"
    " python -m rljax.training --config configs/sft.py"
  )
  (tmp_path / "runs" / "sft" / "model").mkdir(parents=True)
  assert _cli.main(args) == 2
  error = capsys.readouterr().err.strip()
  assert error.startswith("error: data.source='jsonl:runs/pairs.jsonl'")
  assert error.endswith("python experiments/dpo_demo.py --pairs_only")
  assert _cli.main([*args, "data.source=jsonl:elsewhere.jsonl"]) == 2
  error = capsys.readouterr().err.strip()
  assert error.endswith(f"'elsewhere.jsonl' does not exist (from {tmp_path}).")


def _fresh_clone_cli(cwd, *args, timeout=1200, stdin=None):
  """``python <args>`` (``-m rljax.training ...``) in `cwd` on one CPU
  device, as a user runs it; `cwd` holds links to configs/ and experiments/
  and no runs/."""
  for name in ("configs", "experiments"):
    if not (cwd / name).exists():
      (cwd / name).symlink_to(ROOT / name)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  # One device (no fake ones); LLVM level 0 compiles faster (conftest.py).
  env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
  return subprocess.run(
    [sys.executable, *args],
    cwd=cwd,
    env=env,
    input=stdin,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


# The configs of SmolLM2 (135M parameters) dry-run a smaller batch: their
# full step is minutes of CPU, and what a fresh clone can get wrong (a
# missing file or package, a bad field, a model that does not load or
# compile) shows at any batch.
SMALLER_BATCH = ("train.prompts_per_step=2", "sampler.num_samples=2")
DRY_RUN_OVERRIDES = {
  "agent_python": (
    "train.prompts_per_step=1",
    "train.microbatches=1",
    "sampler.num_samples=2",
    "task.kwargs.max_turns=2",
  ),
  "smollm2_grpo": (*SMALLER_BATCH, "train.microbatches=1"),
  "grpo_lora": (*SMALLER_BATCH, "train.microbatches=1"),
  "opd": SMALLER_BATCH,
}


# One process dry-runs a shard of the configs in turn (`_cli.main` for
# each, its output captured): one import of JAX and rljax a shard, and the
# programs configs share (the demo model's) compiled once; four shards keep
# both test workers busy.
DRY_RUN_SHARDS = 4
_DRY_RUNS = """
import contextlib, gc, io, json, sys
from rljax.launch import _cli

for line in sys.stdin:
  args = json.loads(line)
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      code = _cli.main(args)
    except BaseException as e:  # a crash is reported, not fatal to the rest
      import traceback
      traceback.print_exc(file=err)
      code = 1
  gc.collect()
  print(json.dumps([code, out.getvalue(), err.getvalue()]), flush=True)
"""


def _dry_run_args(name, out):
  return [
    "--config",
    f"configs/{name}.py",
    "--dry_run",
    f"output.directory={out}",
    *DRY_RUN_OVERRIDES.get(name, ()),
  ]


@pytest.mark.slow  # each config compiles its run: ~5-60 s a config
@pytest.mark.parametrize("shard", range(DRY_RUN_SHARDS))
def test_every_config_dry_runs_on_a_fresh_clone(tmp_path, shard):
  """Each config runs (--dry_run), or stops with one error line that names
  a command that exists and makes what it lacks."""
  names = PRESET_CONFIGS[shard::DRY_RUN_SHARDS]
  lines = "".join(
    json.dumps(_dry_run_args(name, tmp_path / name)) + "\n" for name in names
  )
  proc = _fresh_clone_cli(tmp_path, "-c", _DRY_RUNS, stdin=lines)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = [json.loads(line) for line in proc.stdout.splitlines()]
  assert len(results) == len(names), proc.stderr[-3000:]
  for name, (code, stdout, stderr) in zip(names, results):
    _check_dry_run(name, code, stdout, stderr)


def _check_dry_run(name, code, stdout, stderr):
  if code == 0:
    assert "step_seconds_with_compile" in stdout, (name, stdout[-2000:])
    return
  assert code == 2, (name, stderr[-3000:])
  errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in stderr, (name, stderr)
  path, command = re.fullmatch(
    r"error: \S+: '(\S+)' does not exist .*; make it first, from the"
    r" repository root: (.+)",
    errors[0],
  ).groups()
  _makes(command, path)


@pytest.mark.slow  # SFT, the pairs, then DPO's dry run: a few minutes
def test_the_named_commands_make_what_dpo_needs(tmp_path):
  """configs/dpo.py's PREREQUISITES, run as named (smaller) from a fresh
  clone, make what its dry run then needs."""
  _, prerequisites = _config_files._load(CONFIGS / "dpo.py")
  small = {
    "configs/sft.py": ["train.steps=2", "train.eval_prompts=8"],
    "experiments/dpo_demo.py": ["--pairs", "16", "--held_out", "8"],
  }
  for path, command in prerequisites.items():
    words = shlex.split(command)[1:]
    extra = next(v for k, v in small.items() if k in words)
    proc = _fresh_clone_cli(tmp_path, *words, *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / path).exists(), path
  pairs = tmp_path / "runs" / "pairs.jsonl"
  if not pairs.read_text():  # a two-step model may tie every group
    pairs.write_text(
      json.dumps({"prompt": "1+2=", "chosen": "3", "rejected": "4"}) + "\n"
    )
  proc = _fresh_clone_cli(
    tmp_path,
    "-m",
    "rljax.training",
    "--config",
    "configs/dpo.py",
    "--dry_run",
    "train.prompts_per_step=8",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_dry_run_runs_one_step_of_the_warm_start(capsys):
  config, _ = _config_files._load(CONFIGS / "grpo.py")
  assert config.train.warm_start_steps == 800
  dry = _cli._dry_run_config(config)
  assert dry.train.warm_start_steps == 1
  assert dry.train.warm_start_lr == config.train.warm_start_lr
  assert dry.model == config.model and dry.sampler == config.sampler
  assert "warm_start_steps=800 runs 1 step" in capsys.readouterr().err
  none = override(config, ["train.warm_start_steps=0"])
  assert _cli._dry_run_config(none) is none
