"""A run continues correctly or stops with a message that says what to do.

Each test reproduces a defect of issue 11 (they failed before the fix):
fresh starts that mixed two runs, NaN updates trained on and checkpointed,
two runs in one directory, resumes that ignored a changed config, re-ran the
warm start and repeated log records, bad settings found late or with a
traceback, and kill -9 during saves (the resumed run must end exactly where
an uninterrupted one does).
"""

import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from rljax import checkpointing
from rljax import monitoring
from rljax import testing
from rljax._src.errors import NonFiniteError
from rljax._src.errors import UserError
from rljax.training import RunConfig
from rljax.training import Trainer
from rljax.training import _run_dir
from rljax.training import override
from rljax.training import validate

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "grpo.py"
ONE_DEVICE = ("train.mesh=(1, 1, 1)",)


def _config(directory, *extra):
  return testing.tiny_run_config(CONFIG, directory, *ONE_DEVICE, *extra)


def _cli(directory, *args, timeout=600, wait=True):
  """``python -m rljax.training`` on the tiny config, in a subprocess."""
  command = [
    sys.executable,
    "-m",
    "rljax.training",
    "--config",
    str(CONFIG),
    *testing.TINY_RUN,
    *ONE_DEVICE,
    f"output.directory={directory}",
    *args,
  ]
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    XLA_FLAGS="--xla_force_host_platform_device_count=1"
    " --xla_backend_optimization_level=0",
  )
  if not wait:
    return subprocess.Popen(
      command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
  return subprocess.run(
    command, env=env, capture_output=True, text=True, timeout=timeout
  )


def _one_line_error(proc, *fragments):
  """The CLI failed with exit code 2 and one line naming `fragments`."""
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  errors = [line for line in lines if line.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
  for fragment in fragments:
    assert fragment in errors[0], errors[0]
  return errors[0]


def _params(trainer):
  return [np.asarray(x) for x in jax.tree.leaves(trainer.state.policy.params)]


# --- 8: config validation before any work ----------------------------------


@pytest.mark.parametrize(
  "item,fragment",
  [
    ("optim.learning_rate=0.0", "optim.learning_rate=0.0: must be > 0"),
    ("optim.learning_rate=-1e-4", "optim.learning_rate=-0.0001"),
    ("optim.learning_rate=1e400", "optim.learning_rate=inf: must be finite"),
    ("optim.grad_clip=0.0", "optim.grad_clip=0.0: must be > 0"),
    ("optim.b1=1.0", "optim.b1=1.0: must be in [0.0, 1.0)"),
    ("optim.b2=-0.1", "optim.b2=-0.1"),
    ("optim.warmup_steps=-1", "optim.warmup_steps=-1: must be >= 0"),
    ("train.epochs=0", "train.epochs=0: must be >= 1"),
    ("train.eval_every=-5", "train.eval_every=-5"),
    ("train.prompts_per_step=0", "train.prompts_per_step=0: must be >= 1"),
    ("train.minibatches=0", "train.minibatches=0"),
    ("train.minibatches=3", "multiple of train.minibatches=3"),
    ("train.microbatches=3", "train.microbatches=3: must divide"),
    ("train.mesh=(0, 1, 1)", "train.mesh=(0, 1, 1)"),
    ("train.mesh=(-1, -1, 1)", "train.mesh=(-1, -1, 1)"),
    ("train.nonfinite=ignore", "train.nonfinite='ignore'"),
    ("sampler.num_samples=0", "sampler.num_samples=0: must be >= 1"),
    ("sampler.temperature=0.0", "sampler.temperature=0.0: must be > 0"),
    ("sampler.top_p=1.5", "sampler.top_p=1.5: must be in (0.0, 1.0]"),
    ("sampler.top_k=0", "sampler.top_k=0: must be >= 1"),
    ("sampler.max_new_tokens=0", "sampler.max_new_tokens=0"),
    ("model.num_kv_heads=3", "model.num_kv_heads=3: must divide"),
    ("model.source=llama", "model.source='llama': must be one of"),
    ("output.keep_checkpoints=0", "output.keep_checkpoints=0"),
    (
      "train.max_tokens_per_microbatch=-8",
      "train.max_tokens_per_microbatch=-8: must be >= 0",
    ),
    ("model.remat=some", "model.remat='some': must be 'none'"),
    ("model.update_unroll=-1", "model.update_unroll=-1: must be >= 0"),
  ],
)
def test_bad_settings_fail_before_any_work(tmp_path, item, fragment):
  config = override(_config(tmp_path), [item])
  with pytest.raises(UserError) as error:
    validate(config)
  assert fragment in str(error.value)
  assert "\n" not in str(error.value)
  with pytest.raises(UserError, match="must"):
    Trainer(config)  # the trainer checks too, before building anything
  assert not (tmp_path / "metrics.jsonl").exists()


def test_the_defaults_and_every_config_validate():
  validate(RunConfig())
  for path in CONFIG.parent.glob("[!_]*.py"):
    validate(testing.tiny_run_config(path, "/tmp/unused"))


@pytest.mark.slow  # default-run time; run with -m slow
def test_the_cli_prints_a_user_error_in_one_line(tmp_path):
  proc = _cli(tmp_path, "optim.grad_clip=0.0", "train.warm_start_steps=100000")
  _one_line_error(proc, "optim.grad_clip=0.0", "must be > 0", "1.0")
  proc = _cli(tmp_path, "task.name=nonsense")
  _one_line_error(proc, "task: unknown task 'nonsense'")


# --- 2: a fresh start never mixes two runs -----------------------------------


@pytest.mark.slow  # minutes of CPU: the slow set
def test_fresh_moves_the_old_run_aside(tmp_path):
  run = tmp_path / "run"
  old = Trainer(_config(run, "train.steps=3", "output.checkpoint_every=1"))
  old.run()
  assert old.checkpointer.all_steps() == [1, 2, 3]
  # A fresh, shorter run: before the fix its saves at steps 1 and 2 were
  # skipped (not after the old latest, 3) and a resume restored step 3.
  proc = _cli(run, "--fresh", "train.steps=2", "output.checkpoint_every=1")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "moved the previous run" in proc.stderr
  (aside,) = tmp_path.glob("run.previous-*")
  assert checkpointing.Checkpointer(aside / "checkpoints").all_steps() == [
    1,
    2,
    3,
  ]
  assert checkpointing.Checkpointer(run / "checkpoints").all_steps() == [1, 2]
  steps = [r["step"] for r in monitoring.read_metrics(run / "metrics.jsonl")]
  assert max(steps) == 2
  resumed = Trainer(_config(run, "train.steps=3", "output.checkpoint_every=1"))
  assert resumed.start_step == 2


def test_fresh_refuses_remote_checkpoints_it_cannot_move(tmp_path, monkeypatch):
  class Remote:  # a gs:// checkpoint directory holding a previous run
    def __init__(self, directory, **kwargs):
      assert str(directory).startswith("gs://")

    def all_steps(self):
      return [4]

    def __enter__(self):
      return self

    def __exit__(self, *exc_info):
      pass

  monkeypatch.setattr(checkpointing, "Checkpointer", Remote)
  config = _config(
    tmp_path, "output.checkpoint_directory=gs://bucket/run/checkpoints"
  )
  with pytest.raises(UserError, match=r"holds the checkpoints.*steps \[4\]"):
    Trainer(config, resume=False)


# --- 4: one run per output directory -----------------------------------------


def test_a_second_run_in_a_busy_directory_is_refused(tmp_path):
  with _run_dir.lock(tmp_path):
    proc = _cli(tmp_path, "train.steps=1")
  line = _one_line_error(proc, "is in use by another run", f"pid {os.getpid()}")
  assert "another output.directory" in line
  assert not (tmp_path / "metrics.jsonl").exists()
  # Released: the same directory is usable again.
  with _run_dir.lock(tmp_path):
    pass


def test_a_killed_run_leaves_no_stale_lock(tmp_path):
  proc = _cli(tmp_path, "train.steps=1000", wait=False)
  deadline = time.time() + 300
  while not (tmp_path / "metrics.jsonl").exists():
    assert proc.poll() is None, proc.stderr.read()
    assert time.time() < deadline
    time.sleep(0.5)
  with pytest.raises(UserError, match=f"pid {proc.pid}"):
    with _run_dir.lock(tmp_path):
      pass
  proc.kill()
  proc.wait()
  with _run_dir.lock(tmp_path):  # the kernel released it with the process
    pass


# --- 3: non-finite updates are never applied nor checkpointed ---------------


@pytest.mark.slow  # default-run time; run with -m slow
def test_a_nonfinite_update_stops_the_run_naming_the_cause(tmp_path):
  # A learning rate beyond float32 makes every parameter infinite.
  proc = _cli(
    tmp_path,
    "optim.learning_rate=1e39",
    "train.steps=3",
    "output.checkpoint_every=1",
  )
  line = _one_line_error(
    proc, "step 1:", "the updated policy parameters", "train.nonfinite=skip"
  )
  assert "optim.learning_rate=1e+39" in line
  # Nothing non-finite was saved: no checkpoint after the failed step.
  assert checkpointing.Checkpointer(tmp_path / "checkpoints").all_steps() == []


@pytest.mark.slow  # minutes of CPU: the slow set
def test_skip_mode_leaves_the_state_unchanged_and_counts(tmp_path):
  config = _config(
    tmp_path,
    "optim.learning_rate=1e39",
    "train.nonfinite=skip",
    "train.max_skipped_updates=3",
    "train.steps=2",
    "output.checkpoint_every=1",
  )
  trainer = Trainer(config)
  start = _params(trainer)
  summary = trainer.run()
  assert [h["skipped_updates"] for h in summary["history"]] == [1.0, 2.0]
  for a, b in zip(start, _params(trainer)):
    np.testing.assert_array_equal(a, b)
  assert trainer.checkpointer.all_steps() == [1, 2]
  records = (tmp_path / "metrics.jsonl").read_text()
  assert "NaN" not in records and "Infinity" not in records
  # The third skip in a row stops the run.
  again = Trainer(override(config, ["train.steps=5"]))
  assert again.skipped_updates == 2
  with pytest.raises(NonFiniteError, match="3 updates in a row"):
    again.run()


def test_a_nonfinite_state_is_never_checkpointed(tmp_path):
  trainer = Trainer(_config(tmp_path, "output.checkpoint_every=1"))
  params = trainer.state.policy.params
  poisoned = jax.tree.map(lambda x: x * np.float32("nan"), params)
  trainer.state = trainer.state._replace(
    policy=trainer.state.policy._replace(params=poisoned)
  )
  with pytest.raises(NonFiniteError, match=r"not checkpointed.*"):
    trainer.save(1, force=True)
  assert trainer.checkpointer.all_steps() == []


# --- 5 and 10: resume the same run, once ------------------------------------


@pytest.mark.slow  # default-run time; run with -m slow
def test_resume_refuses_another_config_unless_allowed(tmp_path):
  common = ("train.steps=2", "output.checkpoint_every=1")
  Trainer(_config(tmp_path, *common)).run()
  changed = _config(tmp_path, *common, "train.seed=1", "algorithm.name=dapo")
  with pytest.raises(UserError) as error:
    Trainer(changed)
  message = str(error.value)
  assert "train.seed 0 -> 1" in message
  assert "algorithm.name 'grpo' -> 'dapo'" in message
  assert "--allow_change algorithm.name,train.seed" in message
  assert "--fresh" in message
  # Length, logging and mesh may change; named fields when allowed.
  longer = _config(tmp_path, "train.steps=5", "output.checkpoint_every=2")
  assert Trainer(longer).start_step == 2
  reseeded = _config(tmp_path, *common, "train.seed=1")
  assert Trainer(reseeded, allow_changes=["train.*"]).start_step == 2


@pytest.mark.slow  # default-run time; run with -m slow
def test_resume_skips_the_warm_start_and_repeated_log_records(tmp_path):
  common = (
    "train.steps=3",
    "output.checkpoint_every=2",
    "output.rollouts_every=1",
  )
  first = Trainer(_config(tmp_path, *common, "train.warm_start_steps=5"))
  assert len(first.warm_start_losses) == 5
  first.run()
  # A crash after step 3 was logged but before it was saved.
  shutil.rmtree(tmp_path / "checkpoints" / "3")
  resumed = Trainer(_config(tmp_path, *common, "train.warm_start_steps=5"))
  assert resumed.start_step == 2
  assert resumed.warm_start_losses == []  # not re-run, not discarded
  resumed.run()
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  train_steps = [json.loads(x)["step"] for x in lines if '"loss"' in x]
  assert train_steps == [1, 2, 3]
  rollout_steps = [
    json.loads(x)["step"]
    for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()
  ]
  assert sorted(set(rollout_steps)) == [1, 2, 3]
  assert len(rollout_steps) == 3 * 8 * 4


def test_logs_are_strict_json(tmp_path):
  with monitoring.MetricsLogger(tmp_path, tensorboard=False) as logger:
    logger.log(1, {"loss": float("nan"), "kl": float("inf"), "reward": 0.5})
  line = (tmp_path / "metrics.jsonl").read_text()
  record = json.loads(line, parse_constant=pytest.fail)
  assert record == {"step": 1, "loss": None, "kl": None, "reward": 0.5}
  assert monitoring.read_metrics(tmp_path / "metrics.jsonl")[0]["loss"] is None
  writer = monitoring.RolloutWriter(tmp_path / "r.jsonl", every=1)
  writer.maybe_write(1, ["p"], ["c"], [float("nan")])
  row = json.loads(
    (tmp_path / "r.jsonl").read_text(), parse_constant=pytest.fail
  )
  assert row["reward"] is None


# --- kill -9 during saves, then resume: exact --------------------------------


def _saved_steps(directory):
  folder = directory / "checkpoints"
  names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
  return {int(n) for n in names if n.isdigit()}


def _next_save(proc, directory, after):
  """Wait until `directory` holds a checkpoint newer than step `after`;
  its step, or None when `proc` ended first."""
  deadline = time.time() + 300
  while (step := max(_saved_steps(directory), default=0)) <= after:
    if proc.poll() is not None:
      return None
    assert time.time() < deadline
    time.sleep(0.01)
  return step


def _killed_and_resumed(directory, kills, steps, seed, *extra):
  """Start the run and kill -9 it `kills` times, each at a random moment of
  a step-and-save period (measured between two saves of that process, so
  the kills land during saves however fast the steps are); then let it
  finish. Returns how many kills hit a running process."""
  rng = random.Random(seed)
  args = (f"train.steps={steps}", "output.checkpoint_every=1", *extra)
  landed = 0
  for _ in range(kills):
    proc = _cli(directory, *args, wait=False)
    first = _next_save(proc, directory, max(_saved_steps(directory), default=0))
    start = time.time()
    if first is not None and _next_save(proc, directory, first) is not None:
      time.sleep(rng.uniform(0.0, time.time() - start))
    if proc.poll() is None:
      proc.kill()
      landed += 1
    proc.wait()
  proc = _cli(directory, *args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return landed


def _prompts_by_step(directory):
  """Each logged step's prompts (``rollouts.jsonl``), in order."""
  by_step = {}
  for line in (directory / "rollouts.jsonl").read_text().splitlines():
    record = json.loads(line)
    by_step.setdefault(record["step"], []).append(record["prompt"])
  return by_step


def _kill_test(tmp_path, kills, *extra, exact=True):
  """Killed `kills` times and resumed, the run logs every step once and
  trains the straight run's prompts at every step; with `exact`, it ends
  with the straight run's parameters, bit for bit."""
  steps = 3 * kills + 6  # each kill takes two or three steps
  args = ("output.checkpoint_every=1", "output.rollouts_every=1", *extra)
  straight = _cli(tmp_path / "straight", f"train.steps={steps}", *args)
  assert straight.returncode == 0, straight.stderr[-3000:]
  landed = _killed_and_resumed(
    tmp_path / "killed", kills, steps, kills, *args[1:]
  )
  assert landed >= kills // 2, landed  # most kills hit a running process
  finals = []
  for name in ("straight", "killed"):
    ckpt = checkpointing.Checkpointer(tmp_path / name / "checkpoints")
    assert ckpt.latest_step() == steps
    trainer = Trainer(_config(tmp_path / name, f"train.steps={steps}", *args))
    assert trainer.start_step == steps
    finals.append(_params(trainer))
  if exact:
    for a, b in zip(*finals):
      np.testing.assert_array_equal(a, b)
  # Every step logged once, in order, after all the kills.
  lines = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(x)["step"] for x in lines if '"loss"' in x] == list(
    range(1, steps + 1)
  )
  # No prompt lost or repeated: each step trained the straight run's.
  assert _prompts_by_step(tmp_path / "killed") == _prompts_by_step(
    tmp_path / "straight"
  )


@pytest.mark.slow  # minutes of CPU: the slow set
def test_kill_during_saves_then_resume_is_exact(tmp_path):
  _kill_test(tmp_path, kills=2)


@pytest.mark.slow  # 20 restarts of the CLI: several minutes
def test_twenty_kills_during_saves_then_resume_is_exact(tmp_path):
  _kill_test(tmp_path, kills=20)


@pytest.mark.slow  # minutes of CPU: the slow set
def test_an_async_run_without_staleness_resumes_exactly(tmp_path):
  _kill_test(
    tmp_path, 3, "train.async_mode=async", "train.max_staleness=0", exact=True
  )


@pytest.mark.slow  # minutes of CPU: the slow set
@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_an_async_run_killed_loses_no_prompt_and_logs_each_step_once(
  tmp_path, mode
):
  # Not exact: the rollouts in flight at a kill are sampled again after the
  # resume, from the checkpointed prompt sampler's state and keys, with the
  # restored weights (the README's section on asynchronous RL says why).
  _kill_test(
    tmp_path,
    3,
    f"train.async_mode={mode}",
    "train.max_staleness=2",
    exact=False,
  )


# --- 6: a damaged latest checkpoint falls back -------------------------------


@pytest.mark.slow  # minutes of CPU: the slow set
def test_a_damaged_latest_checkpoint_falls_back_with_a_warning(
  tmp_path, caplog
):
  common = ("train.steps=3", "output.checkpoint_every=1")
  straight = Trainer(_config(tmp_path, *common))
  straight.run()
  # Flip one byte of the newest step's array data.
  data = max(
    (
      p
      for p in (tmp_path / "checkpoints" / "3" / "state").rglob("*")
      if p.is_file()
    ),
    key=lambda p: p.stat().st_size,
  )
  raw = bytearray(data.read_bytes())
  raw[len(raw) // 2] ^= 0xFF
  data.write_bytes(bytes(raw))
  with caplog.at_level("WARNING", logger="rljax"):
    resumed = Trainer(_config(tmp_path, *common))
  assert resumed.start_step == 2
  assert "skipped damaged checkpoints: step 3" in caplog.text
  assert "checksum mismatch" in caplog.text
  resumed.run()  # re-trains step 3 and saves it over the damaged one
  assert resumed.checkpointer.all_steps()[-1] == 3
  for a, b in zip(_params(straight), _params(resumed)):
    np.testing.assert_array_equal(a, b)


def test_fields_an_earlier_checkpoint_lacks_resume_at_their_defaults():
  # A checkpoint saved before train.async_mode and sampler.mesh existed
  # resumes when they hold their defaults (what runs did before), and is
  # refused when they do not.
  from rljax.training import _trainer_resume as resume

  current = resume.config_json(RunConfig())
  saved = resume.config_json(RunConfig())
  del saved["train"]["async_mode"], saved["sampler"]["mesh"]
  resume.check_same_config(saved, current, (), step=1, directory="d")
  changed = override(RunConfig(), ["train.async_mode=async"])
  with pytest.raises(UserError, match="train.async_mode '<unset>' -> 'async'"):
    resume.check_same_config(
      saved, resume.config_json(changed), (), step=1, directory="d"
    )
