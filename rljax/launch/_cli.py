"""The command line of every run kind and of the plan.

``python -m rljax.training --config configs/grpo.py [key=value ...]`` (or
``python -m rljax.launch``, the same program) trains the config's kind, RL
or post-training (`rljax.posttrain.run_for`); ``--plan TOPOLOGY`` plans it for a TPU slice
(`rljax.plan`), ``--dry_run`` compiles and runs one step. This package sits
above `rljax.training`, `rljax.posttrain` and `rljax.plan`, which never
import it.
"""

import argparse
import dataclasses
import json
import pathlib
import sys

import jax

from rljax import plan
from rljax import posttrain
from rljax._src.errors import UserError
from rljax.training import _hosts
from rljax.training._config import override
from rljax.training._config_files import _load
from rljax.training._config_files import check_inputs
from rljax.training._validate import validate


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
