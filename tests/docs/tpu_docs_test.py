"""docs/tpu_pods.md works as written, checked without a TPU, gcloud or network.

Every command in the page's ```bash blocks is either an experiments/tpu
script, which runs here with --dry-run appended and must print the gcloud /
xpk / docker commands the page promises, or `python -m rljax.training ...`,
whose arguments go through the train CLI's own parser, config loader and
overrides (no training). The train commands that the scripts build for the
workers are parsed the same way, and the remote shell commands they send are
checked with `bash -n`. The error messages the page quotes are produced here
by rljax and compared verbatim. The scripts themselves: `bash -n`, --help,
and a clear message on a bad argument.
"""

import math
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import types

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tpu_pods.md"
TPU = ROOT / "experiments" / "tpu"
TEXT = DOC.read_text()
SCRIPTS = sorted(p.name for p in TPU.glob("*.sh") if not p.name.startswith("_"))
TOOLS = {"gcloud", "xpk", "docker", "tar", "tensorboard"}
# The page's example slice: a v5litepod-16, 16 chips on 4 hosts.
POD_CHIPS, POD_HOSTS = 16, 4
# Flags of the scripts that take no value.
SWITCHES = {
  "--spot",
  "--wait",
  "--detach",
  "--train-dry-run",
  "--fresh",
  "--with-assets",
  "--skip-create",
  "--skip-install",
  "--skip-check",
  "--delete",
  "--logs",
  "--stop",
  "--allow-local-checkpoints",
  "--copy-only",
  "--on-demand",
  "--dry-run",
}


def _commands(block: str) -> list[list[str]]:
  """The commands of a bash block: continuations joined, comments dropped."""
  joined = re.sub(r"\\\n\s*", " ", block)
  return [
    shlex.split(line, comments=True)
    for line in joined.splitlines()
    if line.strip() and not line.lstrip().startswith("#")
  ]


BASH = [
  c for b in re.findall(r"```bash\n(.*?)```", TEXT, re.S) for c in _commands(b)
]
SCRIPT_CALLS = [c for c in BASH if c[0].startswith("experiments/tpu/")]
TRAIN_CALLS = [c for c in BASH if c[:3] == ["python", "-m", "rljax.training"]]


def _id(argv):
  return " ".join(argv)[:160]


def _options(argv: list[str]) -> tuple[str, dict[str, str], list[str]]:
  """(action, {flag: value}, overrides) of a script invocation."""
  rest = argv[1:]
  action = rest.pop(0) if rest and not rest[0].startswith("-") else ""
  flags, overrides, i = {}, [], 0
  while i < len(rest):
    item = rest[i]
    if item in SWITCHES:
      flags[item] = ""
    elif item.startswith("--"):
      flags[item], i = rest[i + 1], i + 1
    else:
      overrides.append(item)
    i += 1
  return action, flags, overrides


@pytest.fixture(scope="module")
def fake_tools(tmp_path_factory):
  """A PATH whose gcloud, xpk, ... fail loudly: a dry run must call none."""
  bin_dir = tmp_path_factory.mktemp("bin")
  for tool in TOOLS:
    path = bin_dir / tool
    path.write_text(f"#!/bin/sh\necho 'dry run called {tool}' >&2\nexit 97\n")
    path.chmod(0o755)
  return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _run(argv, env):
  return subprocess.run(
    ["bash", str(ROOT / argv[0]), *argv[1:]],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=30,
  )


def _dry_run(argv, env) -> list[list[str]]:
  """The commands a script prints with --dry-run, each as an argv."""
  out = _run([*argv, "--dry-run"], env)
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert lines, f"{argv[0]} printed no command"
  for line in lines:
    assert line.startswith("+ "), f"not a command line: {line!r}"
  commands = [shlex.split(line[2:]) for line in lines]
  for command in commands:
    assert command[0] in TOOLS, command
  return commands


def _flag(command, name):
  """The value of --name=value in a printed command (None when absent)."""
  values = [a.split("=", 1)[1] for a in command if a.startswith(f"--{name}=")]
  return values[-1] if values else None


def _remote(command) -> str:
  """The shell command an ssh / xpk command sends, checked with bash -n."""
  script = _flag(command, "command")
  assert script, command
  check = subprocess.run(["bash", "-n", "-c", script], capture_output=True)
  assert check.returncode == 0, (script, check.stderr)
  return script


def _train_argv(script: str) -> list[str]:
  """The arguments after `-m rljax.training` in a remote shell command."""
  words = shlex.split(script)
  start = next(
    i + 2
    for i in range(len(words) - 1)
    if words[i : i + 2] == ["-m", "rljax.training"]
  )
  end = start
  while end < len(words) and not re.match(r"^([0-9]?[<>|&]|&&|;)", words[end]):
    end += 1
  return words[start:end]


def _check_train(argv, *, devices=None, processes=1, distributed=None):
  """Parse `python -m rljax.training` arguments as the CLI does (no run) and
  check the batch / mesh / model divisibility the page teaches."""
  from rljax import training
  from rljax.launch import _cli

  args = _cli._parser().parse_args(argv)
  config = training.override(
    training.load_config(str(ROOT / args.config)), args.overrides
  )
  if distributed is not None:
    assert args.distributed == distributed, argv
  if devices is None:
    return config
  sizes = list(config.train.mesh)
  if -1 in sizes:
    known = math.prod(s for s in sizes if s != -1)
    assert devices % known == 0, (argv, sizes, devices)
    sizes[sizes.index(-1)] = devices // known
  data, fsdp, tensor = sizes
  assert data * fsdp * tensor == devices, (argv, sizes, devices)
  t = config.train
  for divisor in (data * fsdp, processes, t.minibatches):
    assert t.prompts_per_step % divisor == 0, (
      argv,
      t.prompts_per_step,
      divisor,
    )
  assert (t.prompts_per_step // t.minibatches) % t.microbatches == 0, argv
  m = config.model
  if m.source == "scratch":
    assert m.hidden_size % fsdp == 0, argv
    for size in (m.num_heads, m.num_kv_heads, m.intermediate_size):
      assert size % tensor == 0, (argv, size, tensor)
  return config


def _check_pod_output(config):
  """A pod run: process 0 logs to a local output.directory, every host
  writes its checkpoint shards to shared storage."""
  assert "://" not in config.output.directory, config.output
  assert not pathlib.PurePosixPath(config.output.directory).is_absolute()
  assert (config.output.checkpoint_directory or "").startswith("gs://"), (
    config.output
  )


# --- the page -----------------------------------------------------------------


def test_every_command_on_the_page_is_a_script_or_the_train_cli():
  assert len(SCRIPT_CALLS) >= 20 and len(TRAIN_CALLS) >= 3
  for argv in BASH:
    assert argv in SCRIPT_CALLS or argv in TRAIN_CALLS, argv
    if argv in SCRIPT_CALLS:
      assert (ROOT / argv[0]).is_file(), argv[0]
  assert {pathlib.Path(c[0]).name for c in SCRIPT_CALLS} == set(SCRIPTS)


def test_the_page_walks_through_every_step():
  headings = re.findall(r"^##+ (.*)$", TEXT, re.M)
  for step in (
    "Prerequisites",
    "Create the pod",
    "Or queue for it",
    "Install",
    "Dry run",
    "Launch",
    "Watch",
    "Resume",
    "Tear down",
    "GKE with xpk",
    "Choosing the mesh",
    "Errors you may meet",
  ):
    assert any(step in h for h in headings), step
  # Placeholders are concrete values, so that every command parses.
  for placeholder in ("BUCKET", "<name>", "NAME ", "ZONE "):
    for argv in BASH:
      assert placeholder.strip() not in " ".join(argv), (placeholder, argv)


@pytest.mark.parametrize("argv", TRAIN_CALLS, ids=_id)
def test_train_commands_on_the_page_parse(argv):
  from rljax.launch import _cli

  args = _cli._parser().parse_args(argv[3:])
  if args.plan:  # a plan runs on any one machine, for the slice it names
    from rljax import plan

    chips = plan.parse_slice(args.plan).chips
    config = _check_train(argv[3:], devices=chips)
    assert _cli.validate(config).model.source.startswith("shape:")
  elif args.num_processes:  # the one-machine rehearsal: 1 CPU device each
    assert args.coordinator_address and args.process_id is not None
    config = _check_train(
      argv[3:], devices=args.num_processes, processes=args.num_processes
    )
    # Both processes share one disk: local logs and local checkpoints.
    assert "://" not in config.output.directory
    assert "://" not in (config.output.checkpoint_directory or "")
  else:  # the command every pod host runs
    config = _check_train(
      argv[3:], devices=POD_CHIPS, processes=POD_HOSTS, distributed="on"
    )
    _check_pod_output(config)


@pytest.mark.parametrize("argv", SCRIPT_CALLS, ids=_id)
def test_script_commands_on_the_page_dry_run(argv, fake_tools):
  commands = _dry_run(argv, fake_tools)
  script = pathlib.Path(argv[0]).name
  action, flags, overrides = _options(argv)
  zone, project = flags.get("--zone"), flags.get("--project")
  for command in commands:
    if command[0] in ("gcloud", "xpk") and zone:
      assert _flag(command, "zone") == zone, command
    if command[0] in ("gcloud", "xpk"):
      assert _flag(command, "project") == project, command
  heads = [" ".join(c[:5]) for c in commands]
  name = flags.get("--name")

  if script == "create_pod.sh":
    if "--delete" in flags:
      assert commands == [
        [
          "gcloud",
          "compute",
          "tpus",
          "tpu-vm",
          "delete",
          name,
          f"--zone={zone}",
          "--quiet",
        ]
      ]
      return
    created = [
      c
      for c in commands
      if c[:5] == "gcloud compute tpus tpu-vm create".split()
    ]
    assert len(created) == (0 if "--skip-create" in flags else 1), heads
    for c in created:
      assert c[5] == name
      assert _flag(c, "accelerator-type") == flags.get(
        "--accelerator-type", "v5litepod-16"
      )
      assert _flag(c, "version") == "v2-alpha-tpuv5-lite"
      assert ("--spot" in c) == ("--spot" in flags)
    ssh = [c for c in commands if c[3:5] == ["tpu-vm", "ssh"]]
    assert all(c[5] == name and "--worker=all" in c for c in ssh), ssh
    install = _remote(ssh[0])
    assert (
      "-m venv .venv" in install and "pip install -q -e . 'jax[tpu]'" in install
    )
    assert ("requirements-assets.txt" in install) == ("--with-assets" in flags)
    if "--copy-from" in flags:
      assert commands[-len(ssh) - 2][0] == "tar"
      scp = commands[-len(ssh) - 1]
      assert scp[3:5] == ["tpu-vm", "scp"] and "--worker=all" in scp
      assert scp[6] == f"{name}:rljax-src.tar.gz"
    checks = [c for c in ssh if "check_devices.py" in _remote(c)]
    assert len(checks) == (0 if "--skip-check" in flags else 1)
    assert (TPU / "check_devices.py").is_file()

  elif script == "launch_pod.sh":
    (ssh,) = commands
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", name]
    remote = _remote(ssh)
    if "--logs" in flags:
      assert _flag(ssh, "worker") == flags.get("--worker", "0")
      assert remote.startswith("tail ")
    elif "--stop" in flags:
      assert "--worker=all" in ssh and "pkill" in remote
    else:
      assert "--worker=all" in ssh
      train = _train_argv(remote)
      assert train[:2] == ["--config", flags["--config"]]
      assert "--distributed=on" in train
      assert ("--dry_run" in train) == ("--train-dry-run" in flags)
      # The script adds the local output.directory=runs/RUN, named after the
      # checkpoint directory (without a trailing /checkpoints).
      assert not any(o.startswith("output.directory=") for o in overrides)
      config = _check_train(
        train, devices=POD_CHIPS, processes=POD_HOSTS, distributed="on"
      )
      _check_pod_output(config)
      checkpoints = pathlib.PurePosixPath(config.output.checkpoint_directory)
      if checkpoints.name == "checkpoints":
        checkpoints = checkpoints.parent
      run_name = flags.get("--run-name", checkpoints.name)
      assert [a for a in train if "=" in a and not a.startswith("-")] == [
        f"output.directory=runs/{run_name}",
        *overrides,
      ]
      assert ("nohup" in remote) == ("--detach" in flags)
      assert f"~/rljax-logs/{run_name}.$(hostname).log" in remote

  elif script == "queued_resources.sh":
    qr = ["gcloud", "compute", "tpus", "queued-resources"]
    if action == "create":
      create = commands[0]
      assert create[:6] == [*qr, "create", name]
      assert _flag(create, "node-id") == flags.get("--node-id", name)
      assert _flag(create, "accelerator-type") == flags["--accelerator-type"]
      assert _flag(create, "runtime-version") == "v2-alpha-tpuv5-lite"
      assert ("--spot" in create) == ("--spot" in flags)
      if "--wait" in flags:
        assert commands[1][:6] == [*qr, "describe", name]
        assert _flag(commands[1], "format") == "value(state.state)"
    elif action == "delete":
      assert commands == [
        [*qr, "delete", name, f"--zone={zone}", "--force", "--quiet"]
      ]
    else:
      assert commands[0][:6] == [*qr, "describe", name]

  elif script == "xpk_workload.sh":
    image = flags.get("--docker-image")
    if action == "image":
      assert commands == [
        [
          "docker",
          "build",
          "-f",
          "experiments/tpu/Dockerfile",
          "--build-arg",
          "WITH_ASSETS=0",
          "-t",
          image,
          ".",
        ],
        ["docker", "push", image],
      ]
      assert (TPU / "Dockerfile").is_file()
      return
    (command,) = commands
    assert command[0] == "xpk"
    assert _flag(command, "cluster") == flags["--cluster"]
    if action == "cluster":
      assert command[1:3] == ["cluster", "create"]
      assert _flag(command, "tpu-type") == flags["--tpu-type"]
      assert _flag(command, "num-slices") == flags["--num-slices"]
      assert "--spot" in command
    elif action == "create":
      assert command[1:3] == ["workload", "create"]
      for key in (
        "workload",
        "tpu-type",
        "num-slices",
        "docker-image",
        "max-restarts",
      ):
        assert _flag(command, key) == flags[f"--{key}"], key
      remote = _remote(command)
      assert remote.startswith("python -m rljax.training ")
      train = _train_argv(remote)
      assert [
        a for a in train if "=" in a and not a.startswith("-")
      ] == overrides
      config = _check_train(
        train, devices=POD_CHIPS, processes=POD_HOSTS, distributed="on"
      )
      _check_pod_output(config)
    elif action in ("list", "delete"):
      assert command[1:3] == ["workload", action]
    else:
      assert command[1:3] == ["cluster", "delete"]

  elif script == "tensorboard.sh":
    # Process 0's local output.directory (launch_pod.sh: runs/RUN) is copied
    # from worker 0; TensorBoard runs on the copy.
    local = flags.get("--to", f"runs/{name}")
    remote = f"{name}:rljax/runs/{flags.get('--run-name', '*')}"
    copy = [
      "gcloud",
      "compute",
      "tpus",
      "tpu-vm",
      "scp",
      "--recurse",
      remote,
      local,
      "--worker=0",
      f"--zone={zone}",
    ]
    serve = ["tensorboard", f"--logdir={local}", "--port=6006"]
    assert commands == ([copy] if "--copy-only" in flags else [copy, serve]), (
      commands
    )

  else:
    raise AssertionError(f"no expectations for {script}")


def test_the_printed_dry_run_on_the_page_is_what_the_script_prints(fake_tools):
  pairs = re.findall(
    r"```bash\n([^\n]*--dry-run)\n```\s*```text\n(.*?)```", TEXT, re.S
  )
  assert pairs
  for command, printed in pairs:
    out = _run(shlex.split(command), fake_tools)
    assert out.returncode == 0, out.stderr
    assert out.stdout == printed


def test_train_commands_shown_as_text_parse():
  shown = [
    line
    for block in re.findall(r"```text\n(.*?)```", TEXT, re.S)
    for line in block.splitlines()
    if "-m rljax.training" in line and not line.startswith("+ ")
  ]
  assert shown
  for line in shown:
    _check_train(
      _train_argv(line),
      devices=POD_CHIPS,
      processes=POD_HOSTS,
      distributed="on",
    )


def test_the_quoted_error_messages_are_rljaxs(monkeypatch):
  from flax import nnx

  from rljax import models
  from rljax import sharding
  from rljax import training
  from rljax.models import _transformer
  from rljax.training import Trainer
  from rljax.training import _hosts
  from rljax.training import _trainer_setup

  messages = []

  def message(fn, *args, **kwargs):
    with pytest.raises(ValueError) as error:
      fn(*args, **kwargs)
    messages.append(str(error.value))

  # The mesh against a 16-chip slice (these checks run before any device is
  # touched, so stand-ins for the 16 devices do).
  chips = [object()] * POD_CHIPS
  for sizes in ((4, 4, 2), (-1, 3, 1), (-1, -1, 1)):
    message(sharding.make_mesh, *sizes, devices=chips)
  # Part of a pod.
  monkeypatch.setattr(jax, "process_count", lambda: POD_HOSTS)
  monkeypatch.setattr(jax, "device_count", lambda: POD_CHIPS)
  monkeypatch.setattr(jax, "devices", lambda: chips)
  part = training.override(training.RunConfig(), ["train.mesh=(2,2,1)"])
  message(_trainer_setup.run_meshes, part)
  monkeypatch.undo()
  # Batch sizes.
  mesh16 = types.SimpleNamespace(
    shape={"data": POD_CHIPS, "fsdp": 1, "tensor": 1}
  )
  smollm2 = _check_train(["--config", "configs/smollm2_grpo.py"])
  message(_trainer_setup.check_sizes, smollm2, mesh16)
  for override in ("train.minibatches=3", "train.microbatches=3"):
    grpo = _check_train(["--config", "configs/grpo.py", override])
    message(_trainer_setup.check_sizes, grpo, mesh16)
  # A bucket as output.directory: the Trainer refuses it before it builds
  # anything (in check_sizes: no model, no directory, no checkpointer).
  message(
    Trainer,
    _check_train(
      [
        "--config",
        "configs/grpo.py",
        "output.directory=gs://my-bucket/rljax/grpo",
      ]
    ),
  )
  # A SmolLM2-135M-shaped model (9 heads, 3 KV heads) with tensor=2.
  config = models.ModelConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=2,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    tie_embeddings=True,
  )
  model = nnx.eval_shape(lambda: models.Transformer(config, rngs=nnx.Rngs(0)))
  message(
    sharding.param_shardings, nnx.state(model), sharding.make_mesh(-1, 1, 2)
  )
  # Explicit mesh axes.
  explicit = jax.make_mesh(
    (jax.device_count(),),
    ("data",),
    axis_types=(jax.sharding.AxisType.Explicit,),
  )
  tokens = jax.device_put(
    jax.numpy.zeros((jax.device_count(), 4), jax.numpy.int32),
    jax.sharding.NamedSharding(explicit, jax.sharding.PartitionSpec("data")),
  )
  message(_transformer._check_auto_mesh, tokens)
  # A coordinator address alone.
  for name in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(_hosts, "on_tpu_pod", lambda: False)
  message(_hosts.initialize, "auto", coordinator_address="10.0.0.2:1234")

  quoted = re.findall(r"```text\n(.*?)\n```", TEXT, re.S)
  for text in messages:
    assert text in quoted, f"not quoted verbatim on the page:\n{text}"


# --- the scripts ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(p.name for p in TPU.glob("*.sh")))
def test_scripts_parse(name):
  text = (TPU / name).read_text()
  assert subprocess.run(["bash", "-n", str(TPU / name)]).returncode == 0
  if not name.startswith("_"):
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text
    assert os.access(TPU / name, os.X_OK), f"{name} is not executable"


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_help(name, fake_tools):
  out = _run([f"experiments/tpu/{name}", "--help"], fake_tools)
  assert out.returncode == 0, out.stderr
  assert out.stdout.startswith("Usage: ") and "--dry-run" in out.stdout


BAD = [
  (
    "create_pod.sh --name my-pod --zone us-west4-a --copy-from . --bogus",
    "unknown argument '--bogus'",
  ),
  ("create_pod.sh --zone us-west4-a --copy-from .", "--name is required"),
  (
    "create_pod.sh --name My_Pod --zone us-west4-a --copy-from .",
    "is not a valid name",
  ),
  (
    "create_pod.sh --name my-pod --zone us-west4 --copy-from .",
    "is not a zone name",
  ),
  ("create_pod.sh --name my-pod --zone us-west4-a", "--copy-from DIR"),
  (
    "create_pod.sh --name my-pod --zone us-west4-a --copy-from docs",
    "not an rljax checkout",
  ),
  (
    "create_pod.sh --name my-pod --zone us-west4-a --copy-from . --accelerator-type v5e",
    "is not a TPU type",
  ),
  (
    "create_pod.sh --name my-pod --zone us-west4-a --copy-from . --repo https://x/y.git",
    "not both",
  ),
  ("create_pod.sh --name", "--name needs a value"),
  (
    "launch_pod.sh --name my-pod --zone us-west4-a --config configs/grpo.py",
    "set output.checkpoint_directory=gs://",
  ),
  (
    "launch_pod.sh --name my-pod --zone us-west4-a --config configs/grpo.py output.checkpoint_directory=runs/x",
    "is not a gs:// path",
  ),
  (
    "launch_pod.sh --name my-pod --zone us-west4-a --config configs/grpo.py output.checkpoint_directory=gs://x",
    "is not a valid gs://BUCKET/PATH",
  ),
  (
    "launch_pod.sh --name my-pod --zone us-west4-a --config configs/grpo.py output.directory=gs://my-bucket/x",
    "logs are appended locally by process 0, so this must be a local path",
  ),
  (
    "launch_pod.sh --name my-pod --zone us-west4-a --config configs/grpo.py output.directory=runs/x output.checkpoint_directory=gs://my-bucket/x",
    "choose RUN with --run-name",
  ),
  (
    "launch_pod.sh --name my-pod --zone us-west4-a --config configs/grpo.py output.checkpoint_directory=gs://my-bucket/x --run-name ..",
    "may hold only letters",
  ),
  (
    "launch_pod.sh --name my-pod --zone us-west4-a --config configs/nope.py output.checkpoint_directory=gs://my-bucket/x",
    "not found",
  ),
  (
    "launch_pod.sh --name my-pod --zone us-west4-a --config configs/grpo.py output.checkpoint_directory=gs://my-bucket/x --dry_run",
    "--train-dry-run",
  ),
  (
    "launch_pod.sh --name my-pod --zone us-west4-a --config configs/grpo.py output.checkpoint_directory=gs://my-bucket/x steps",
    "not an option or a section.field=value",
  ),
  (
    "launch_pod.sh --name my-pod --zone us-west4-a --logs --worker two",
    "must be a worker number",
  ),
  ("queued_resources.sh", "create, wait, describe or delete"),
  (
    "queued_resources.sh start --name my-pod --zone us-west4-a",
    "unknown action 'start'",
  ),
  (
    "queued_resources.sh delete --name my-pod --zone us-west4-a --wait",
    "--wait only applies to create",
  ),
  (
    "queued_resources.sh create --name my-pod --zone us-west4-a --valid-until-duration soon",
    "must look like 30m",
  ),
  (
    "xpk_workload.sh create --cluster c --workload w --docker-image img --config configs/grpo.py",
    "set output.checkpoint_directory=gs://",
  ),
  (
    "xpk_workload.sh create --cluster c --workload w --docker-image img --config configs/grpo.py output.directory=gs://my-bucket/x output.checkpoint_directory=gs://my-bucket/x",
    "logs are appended locally by process 0, so this must be a local path",
  ),
  (
    "xpk_workload.sh cluster --cluster c --zone us-west4-a",
    "--on-demand, --spot or --reservation",
  ),
  ("xpk_workload.sh deploy", "unknown action 'deploy'"),
  ("tensorboard.sh --zone us-west4-a", "--name is required"),
  ("tensorboard.sh --logdir gs://my-bucket/x", "unknown argument '--logdir'"),
  (
    "tensorboard.sh --name my-pod --zone us-west4-a --port 99999",
    "is not a port number",
  ),
  (
    "tensorboard.sh --name my-pod --zone us-west4-a --to my-pod:runs",
    "must be a plain local path",
  ),
]


@pytest.mark.parametrize("command,expected", BAD, ids=[b[0][:60] for b in BAD])
def test_scripts_reject_bad_arguments_clearly(command, expected, fake_tools):
  argv = shlex.split(command)
  out = _run([f"experiments/tpu/{argv[0]}", *argv[1:], "--dry-run"], fake_tools)
  assert out.returncode != 0
  assert out.stdout == ""
  assert "error: " in out.stderr and expected in out.stderr, out.stderr
  assert "--help" in out.stderr


def test_scripts_need_their_tools_when_not_dry(tmp_path):
  """Without --dry-run a missing gcloud is named, nothing half-runs."""
  for tool in ("dirname", "basename"):  # all the scripts use besides bash
    (tmp_path / tool).symlink_to(shutil.which(tool))
  env = dict(os.environ, PATH=str(tmp_path))  # no gcloud
  out = subprocess.run(
    [
      "/bin/bash",
      str(TPU / "launch_pod.sh"),
      "--name",
      "my-pod",
      "--zone",
      "us-west4-a",
      "--stop",
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=30,
  )
  assert out.returncode != 0 and "gcloud not found" in out.stderr, out.stderr


def test_check_devices_reports_and_refuses_a_cpu():
  """The install check runs anywhere: it reports, and fails off a TPU."""
  script = str(TPU / "check_devices.py")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  ok = subprocess.run(
    [sys.executable, script, "--allow-cpu"],
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert ok.returncode == 0, ok.stderr
  assert "process 0 of 1: 1 local devices, 1 global" in ok.stdout
  refused = subprocess.run(
    [sys.executable, script, "--no-distributed"],
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert refused.returncode == 1
  assert "error: the backend is cpu, not tpu." in refused.stdout
