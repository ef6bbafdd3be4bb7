"""``python -m rljax.training --config configs/grpo.py [key=value ...]``."""

import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import sys

import jax

from rljax._src.errors import UserError
from rljax.training import _hosts
from rljax.training._config import RunConfig
from rljax.training._config import override
from rljax.training._validate import validate


class ConfigNotFoundError(UserError, FileNotFoundError):
  """The config file does not exist."""


def load_config(path: str) -> RunConfig:
  """`get_config()` of a Python config file (its folder joins sys.path, so
  configs can share a base module).

  A config file is Python and runs with the caller's rights: it is trusted
  input, like a training script. Load only configs you wrote or reviewed.
  """
  return _load(path)[0]


def _load(path: str) -> tuple[RunConfig, dict[str, str]]:
  """`load_config`, and the file's ``PREREQUISITES`` (a path the run reads
  -> the command that makes it; none when the file defines none)."""
  file = pathlib.Path(path)
  if not file.is_file():
    raise ConfigNotFoundError(
      f"config file {path!r} not found; see configs/ for examples."
    )
  sys.path.insert(0, str(file.parent.resolve()))
  spec = importlib.util.spec_from_file_location(f"_config_{file.stem}", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise UserError(f"{path} must define get_config() -> RunConfig.")
  config = module.get_config()
  if not isinstance(config, RunConfig):
    raise UserError(
      f"{path}: get_config() returned {type(config).__name__}, not RunConfig."
    )
  return config, dict(vars(module).get("PREREQUISITES", {}))


def inputs(config: RunConfig) -> list[tuple[str, str, str]]:
  """(field, value, local path) of each file or directory `config` reads:
  an "hf:" or "gguf:" model or teacher, "jsonl:" data."""
  out = []
  models = [("model.source", config.model.source)]
  if config.teacher is not None:
    models.append(("teacher.source", config.teacher.source))
  for field, value in models:
    for prefix in ("hf:", "gguf:"):
      if value.startswith(prefix):
        out.append((field, value, value[len(prefix) :]))
  if config.data.source.startswith("jsonl:"):
    source = config.data.source
    out.append(("data.source", source, source[len("jsonl:") :]))
  return out


def check_inputs(config: RunConfig, prerequisites: dict[str, str]) -> None:
  """Raise a `UserError` at the first path `config` reads that does not
  exist, naming the command that makes it where `prerequisites` (a config
  file's ``PREREQUISITES``) has one."""
  for field, value, path in inputs(config):
    if os.path.exists(path):
      continue
    message = f"{field}={value!r}: {path!r} does not exist"
    if not os.path.isabs(path):
      message += f" (from {os.getcwd()})"
    known = {os.path.normpath(k): v for k, v in prerequisites.items()}
    command = known.get(os.path.normpath(path))
    if not command:
      raise UserError(message + ".")
    raise UserError(
      f"{message}; make it first, from the repository root: {command}"
    )


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="python -m rljax.training",
    description="Train a policy from a config file: RL, supervised"
    " fine-tuning, preference optimisation or distillation (its kind).",
  )
  parser.add_argument("--config", required=True, help="configs/<name>.py")
  parser.add_argument(
    "overrides",
    nargs="*",
    help="section.field=value, e.g. train.steps=20 algorithm.kwargs.kl_coef=0.01",
  )
  parser.add_argument(
    "--dry_run",
    action="store_true",
    help="compile and run one step at the full shapes; report memory (a"
    " supervised warm start runs one of its steps)",
  )
  parser.add_argument(
    "--plan",
    metavar="TOPOLOGY",
    help="compile every program of the run for a TPU slice (v5e:4x4,"
    " v5p:4x4x4, v6e:8x8, v5e-64, v5p-128) on this host, with no weights"
    " and nothing allocated; print memory per device against the chip's"
    " HBM, roofline times and an iteration estimate, write plan.json to"
    " output.directory, and name the nearest configuration that fits when"
    " the run does not (needs libtpu: pip install -e '.[tpu]')",
  )
  parser.add_argument(
    "--fresh",
    action="store_true",
    help="start over: move a previous run in output.directory (logs and"
    " checkpoints) aside to <directory>.previous-<time>",
  )
  parser.add_argument(
    "--allow_change",
    action="append",
    default=[],
    metavar="FIELD[,FIELD...]",
    help="resume although these config fields (fnmatch patterns, e.g."
    " optim.learning_rate or sampler.*) differ from the checkpoint's;"
    " logging, evaluation, checkpointing, train.steps and train.mesh may"
    " always change",
  )
  hosts = parser.add_argument_group(
    "multi-host (one process per host, the same command on every host)"
  )
  hosts.add_argument(
    "--distributed",
    choices=_hosts.MODES,
    default="auto",
    help="initialize jax.distributed: auto (when a coordinator is given or"
    " a Cloud TPU pod / GKE TPU job is detected), on (always; JAX detects"
    " TPU, SLURM, Open MPI, Kubernetes), off",
  )
  hosts.add_argument(
    "--coordinator_address",
    help="HOST:PORT of process 0 (default: $JAX_COORDINATOR_ADDRESS)",
  )
  hosts.add_argument(
    "--num_processes", type=int, help="default: $JAX_NUM_PROCESSES"
  )
  hosts.add_argument("--process_id", type=int, help="default: $JAX_PROCESS_ID")
  return parser


def main(argv=None) -> int:
  """Entry point; returns the process exit code (2 for a user error).

  A `UserError` (a bad setting, a damaged checkpoint, a directory in use, a
  non-finite update, ...) prints its message on one line, without a
  traceback; anything else is a bug in rljax and keeps its traceback.
  """
  try:
    return _main(argv)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


def _dry_run_config(config):
  """The config a dry run builds: its warm start cut to one step, which
  compiles and runs the warm start's program without training for minutes
  (a resumed run does not re-run the warm start, so resuming is unchanged)."""
  steps = config.train.warm_start_steps
  if steps <= 1:
    return config
  print(f"dry run: train.warm_start_steps={steps} runs 1 step", file=sys.stderr)
  train = dataclasses.replace(config.train, warm_start_steps=1)
  return dataclasses.replace(config, train=train)


def _plan(config, topology: str) -> int:
  """--plan: the table, plan.json, and a one-line refusal (exit 2) with the
  nearest configuration that fits when the run does not."""
  from rljax import plan

  found = plan.plan_run(config, topology)
  print(plan.table(found))
  directory = pathlib.Path(config.output.directory)
  directory.mkdir(parents=True, exist_ok=True)
  record = found.to_json()
  fitted = None
  if not found.fits:
    print(
      "searching for the nearest configuration that fits...", file=sys.stderr
    )
    fitted = plan.search(config, topology)
    record["suggestion"] = None if fitted is None else list(fitted[0])
    # The suggestion's own plan: its peak, costs and iteration estimate.
    record["suggested_plan"] = None if fitted is None else fitted[1].to_json()
  (directory / "plan.json").write_text(json.dumps(record, indent=2))
  if not found.fits:
    raise UserError(plan.over_message(found, fitted))
  print(f"plan: {directory / 'plan.json'}")
  return 0


def _main(argv) -> int:
  # Flags may come between overrides (`... --fresh train.steps=2`).
  args = _parser().parse_intermixed_args(argv)
  # Before anything touches a device (loading the config does not).
  _hosts.initialize(
    args.distributed,
    coordinator_address=args.coordinator_address,
    num_processes=args.num_processes,
    process_id=args.process_id,
  )
  config, prerequisites = _load(args.config)
  config = validate(override(config, args.overrides))
  check_inputs(config, prerequisites)  # before any model is built
  if args.plan:
    return _plan(config, args.plan)
  if args.dry_run:
    config = _dry_run_config(config)
  # Imported here so that --help works without initialising JAX.
  from rljax import posttrain

  allowed = [f for item in args.allow_change for f in item.split(",") if f]
  run = posttrain.run_for(config)
  trainer = run(config, resume=not args.fresh, allow_changes=allowed)
  if args.dry_run:
    report = trainer.dry_run()
    if jax.process_index() == 0:
      print(json.dumps(report, indent=2))
    return 0
  summary = trainer.run()
  if jax.process_index():
    return 0
  print(
    "eval accuracy: before"
    f" {summary['before']['eval_accuracy']:.3f}, after"
    f" {summary['after']['eval_accuracy']:.3f}"
  )
  if summary["plot"]:
    print(f"learning curves: {summary['plot']}")
  return 0
