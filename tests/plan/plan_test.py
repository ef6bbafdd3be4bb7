"""Run plans compiled for a TPU slice from this CPU host (`rljax.plan`;
needs libtpu, the ``tpu`` extra)."""

import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest

import pallas_kernels
from rljax import plan
from rljax._src.errors import UserError
from rljax.launch import _cli as _cli_main
from rljax.plan import _plan
from rljax.plan._chips import parse_slice
from rljax.plan._measure import Measured
from rljax.training import load_config
from rljax.training import override

pytest.importorskip(
  "libtpu", reason="compiling for a TPU needs libtpu: pip install -e '.[tpu]'"
)

# Every test here is in the TPU compile step (`-m tpu`; CI runs it after the
# default run), the longest as well in the slow set.
pytestmark = pytest.mark.tpu

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
# The demo on v5e:2x2 with fsdp 2 x tensor 2: every weight is split; its
# two layers unrolled, so their compiles' costs are whole (no more compiles).
DEMO = ("train.mesh=(1,2,2)", "model.scan_unroll=2")


def _demo(*extra):
  return override(load_config(CONFIGS / "grpo.py"), [*DEMO, *extra])


# The demo's programs.
PROGRAMS = ["score", "update", "prefill", "decode_segment"]


@pytest.fixture(scope="module")
def demo_plan():
  return plan.plan_run(_demo(), "v5e:2x2")


@pytest.mark.parametrize("name", PROGRAMS)
def test_each_programs_bytes_are_its_compiled_memory_analysis(demo_plan, name):
  config = _demo()
  context = _plan._Context(config, "v5e:2x2")
  _, lowered = _plan._lowered(
    config, context.devices, context.task, context.stacks(config)
  )
  assert [p.name for p in demo_plan.programs] == list(lowered) == PROGRAMS
  with _plan_no_cache():
    for program in [p for p in demo_plan.programs if p.name == name]:
      m = lowered[program.name].compile().memory_analysis()
      assert (
        program.argument_bytes,
        program.output_bytes,
        program.temp_bytes,
        program.code_bytes,
        program.alias_bytes,
      ) == (
        m.argument_size_in_bytes,
        m.output_size_in_bytes,
        m.temp_size_in_bytes,
        m.generated_code_size_in_bytes,
        m.alias_size_in_bytes,
      )


def _plan_no_cache():
  from rljax.plan import _measure

  return _measure._no_persistent_cache()


# Three compiles of each program: 57 s alone.
def test_the_smollm2_config_plans_on_a_v5e_2x2():
  # configs/smollm2_grpo.py as it is (SmolLM2-135M from its GGUF file, 30
  # layers): every program fits a v5e's 16 GiB and holds a cost.
  found = plan.plan_run(load_config(CONFIGS / "smollm2_grpo.py"), "v5e:2x2")
  assert found.fits and found.devices == 4
  assert set(found.costs) == {p.name for p in found.programs}
  assert found.iteration["total"] > 0


@pytest.mark.slow  # two SmolLM2s, four compiles of each program: 3 min
def test_the_opd_config_plans_its_teachers_pass():
  # configs/opd.py: a 10-layer student of SmolLM2-135M scored by the whole
  # 30-layer model. The score program runs the teacher; its cost counts the
  # teacher's 30 layers and the policy's 10 apart (`_depths`).
  config = load_config(CONFIGS / "opd.py")
  found = plan.plan_run(config, "v5e:2x2")
  assert found.fits and set(found.costs) == {p.name for p in found.programs}
  context = _plan._Context(config, "v5e:2x2")
  assert [s.num_layers for s in context.stacks(config).values()] == [10, 30]
  # The teacher's forward dominates the score pass: 3x the student's
  # layers, so more FLOPs than a student forward (a third of its update).
  assert found.costs["score"].flops > found.costs["update"].flops / 3


def test_parameter_bytes_are_each_weights_share_of_the_mesh(demo_plan):
  # The demo model (vocabulary 16, width 64, 2 layers, 4 heads, 2 KV heads
  # of 16, MLP 192), float32, fsdp=2 over "embed" and tensor=2 over vocab,
  # heads, KV heads and MLP (sharding.DEFAULT_RULES), elements per device:
  #   embed 16x64/4 = 256; final_norm 64/2 = 32; two norms 2x64/2 = 64 each;
  #   gate, up, down 2x64x192/4 = 6144 each; q, o 2x64x4x16/4 = 2048 each;
  #   k, v 2x64x2x16/4 = 1024 each.
  elements = 256 + 32 + 2 * 64 + 3 * 6144 + 2 * 2048 + 2 * 1024
  assert demo_plan.parameter_bytes == 4 * elements == 99_968
  assert demo_plan.mesh == {"data": 1, "fsdp": 2, "tensor": 2}


def test_the_update_uses_the_pallas_tpu_kernel(demo_plan):
  # The demo's logits (a 16-token vocabulary) are small: "auto" runs them
  # dense. Told to fuse at any size, the update lowers the Mosaic kernel.
  update = next(p for p in demo_plan.programs if p.name == "update")
  assert not update.pallas
  config = _demo()
  context = _plan._Context(config, "v5e:2x2")
  with pallas_kernels.dense_up_to(0):
    _, lowered = _plan._lowered(
      config, context.devices, context.task, context.stacks(config)
    )
  assert "tpu_custom_call" in lowered["update"].as_text()
  assert demo_plan.fits and demo_plan.peak.peak_bytes < demo_plan.hbm_bytes
  assert demo_plan.hbm_bytes == 16 * 2**30  # v5e
  it = demo_plan.iteration
  assert it["total"] == pytest.approx(
    it["rollout"] + it["score"] + it["update"]
  )
  assert it["update"] > 0 and it["rollout"] > 0
  record = json.loads(json.dumps(demo_plan.to_json()))
  assert record["peak_program"] == demo_plan.peak.name
  assert "roofline" in plan.table(demo_plan)


@dataclasses.dataclass(frozen=True)
class _Stack:  # what `_plan._layers` reads of a model config
  num_layers: int
  scan_unroll: int = 1
  layer_types: tuple | None = None


def _measured_at(name, flops, moved):
  return Measured(name, 0, 0, 0, 0, 0, 0, flops, moved, False, 0.0)


def test_costs_extrapolate_the_layers_linearly(monkeypatch):
  # Hand-worked: at 1 layer a program costs 10 FLOPs and moves 100 bytes,
  # at 2 layers 13 and 140; a layer is then 3 and 40, the rest 7 and 60, so
  # 5 layers cost 7 + 5 x 3 = 22 FLOPs and move 60 + 5 x 40 = 260 bytes.
  # The update (4 micro-batches in a scan whose body is counted once, one
  # optimizer step) is four times that. A 2-layer model is one compile of
  # its whole stack, exact.
  depths = []

  def fake(config, devices, task, stacks):
    (stack,) = stacks.values()
    depths.append(stack.num_layers)
    assert stack.scan_unroll == stack.num_layers  # unrolled: all counted
    n = stack.num_layers
    return None, [
      _measured_at(name, 7 + 3 * n, 60 + 40 * n) for name in ("score", "update")
    ]

  monkeypatch.setattr(_plan, "_measured", fake)
  chip = parse_slice("v5e:2x2").chip
  config = _demo("train.microbatches=4")
  costs = _plan._costs(config, None, None, {"policy": _Stack(5)}, chip, 1)
  assert depths == [1, 2]
  assert (costs["score"].flops, costs["score"].bytes_accessed) == (22, 260)
  assert (costs["update"].flops, costs["update"].bytes_accessed) == (88, 1040)
  assert costs["score"].seconds == max(
    22 / chip.peak_flops, 260 / chip.hbm_bandwidth
  )
  depths.clear()
  costs = _plan._costs(config, None, None, {"policy": _Stack(2)}, chip, 1)
  assert depths == [2] and costs["score"].flops == 13
  # An unrolled stack's own compiles are whole: no more compiles.
  depths.clear()
  full = [_measured_at("score", 13, 140)]
  stacks = {"policy": _Stack(2, 2)}
  costs = _plan._costs(config, None, None, stacks, chip, 1, full=full)
  assert depths == [] and costs["score"].flops == 13


def test_a_teachers_layers_are_extrapolated_on_their_own(monkeypatch):
  # Hand-worked: the score program reads a 10-layer policy and a 30-layer
  # teacher. A policy layer costs 3 FLOPs, a teacher layer 5, the rest 7:
  # compiled at (1, 1) layers 15, at (2, 1) 18, at (1, 2) 20; whole:
  # 15 + 9 x (18 - 15) + 29 x (20 - 15) = 187 = 7 + 10 x 3 + 30 x 5. The
  # update does not read the teacher (its teacher difference is 0).
  seen = []

  def fake(config, devices, task, stacks):
    p, t = stacks["policy"].num_layers, stacks["teacher"].num_layers
    seen.append((p, t))
    return None, [
      _measured_at("score", 7 + 3 * p + 5 * t, 0),
      _measured_at("update", 7 + 3 * p, 0),
    ]

  monkeypatch.setattr(_plan, "_measured", fake)
  chip = parse_slice("v5e:2x2").chip
  stacks = {"policy": _Stack(10), "teacher": _Stack(30)}
  costs = _plan._costs(_demo(), None, None, stacks, chip, 1)
  assert seen == [(1, 1), (2, 1), (1, 2)]
  assert costs["score"].flops == 187 == 7 + 10 * 3 + 30 * 5
  assert costs["update"].flops == 7 + 10 * 3


def test_a_teachers_pass_is_planned_in_the_score_program():
  # On-policy distillation reads a frozen 3-layer teacher's log-probs: the
  # score program takes its weights (one device's shards) and runs it.
  config = _demo("algorithm.name=opd", "teacher.num_layers=3")
  context = _plan._Context(config, "v5e:2x2")
  stacks = context.stacks(config)
  assert stacks["teacher"].num_layers == 3
  run, lowered = _plan._lowered(config, context.devices, context.task, stacks)
  teacher_bytes = _plan._parameter_bytes(run.teacher[1])
  assert teacher_bytes > 0
  score = _plan.measure("score", lowered["score"])
  assert score.argument_bytes >= teacher_bytes and score.flops > 0
  # Without a teacher the run is refused in one line naming the field.
  with pytest.raises(UserError, match="teacher=ModelSpec"):
    _plan._Context(_demo("algorithm.name=opd"), "v5e:2x2").memory(
      _demo("algorithm.name=opd")
    )


# Two compiles of the demo's programs for a TPU.
def test_the_demos_costs_are_its_unrolled_compiles(demo_plan):
  # The 2-layer demo (one micro-batch, one optimizer step) costs exactly
  # what its 2-layer unrolled compile's cost analysis says.
  config = _demo()
  context = _plan._Context(config, "v5e:2x2")
  _, measured = _plan._measured(
    config,
    context.devices,
    context.task,
    {"policy": _plan._layers(context.policy_config, 2)},
  )
  for m in measured:
    assert demo_plan.costs[m.name].flops == pytest.approx(m.flops)


# The demo's programs compiled again, micro-batched.
def test_a_micro_batched_update_costs_what_the_whole_batch_does(demo_plan):
  # XLA's cost analysis counts a loop body once; scaled to its trip count
  # (`_loop_factor`), 4 micro-batches of the demo's batch cost what one
  # whole batch does, up to the gradients' accumulation (a few adds).
  config = _demo("train.microbatches=4")
  context = _plan._Context(config, "v5e:2x2")
  stacks = context.stacks(config)
  _, programs = _plan._measured(config, context.devices, context.task, stacks)
  costs = _plan._costs(
    config,
    context.devices,
    context.task,
    stacks,
    context.slice.chip,
    1,
    full=programs,
  )
  whole = demo_plan.costs["update"].flops
  assert costs["update"].flops == pytest.approx(whole, rel=0.02)


def test_the_update_loops_are_counted_to_their_trip_counts():
  # 4 micro-batches and 2 epochs x 3 mini-batches: each loop's body is
  # traced once in its scan and counted once: 1 counted of 4 x 6.
  config = _demo(
    "train.microbatches=4", "train.epochs=2", "train.minibatches=3"
  )
  assert _plan._loop_factor(config) == 4 * 6
  assert _plan._loop_factor(_demo()) == 1.0


def _cli(tmp_path, *args):
  return subprocess.run(
    [
      sys.executable,
      "-m",
      "rljax.training",
      *args,
      f"output.directory={tmp_path}",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
  )


def test_a_mesh_that_does_not_divide_the_kv_heads_is_one_line(tmp_path):
  proc = _cli(
    tmp_path,
    "--config",
    "configs/grpo.py",
    "--plan",
    "v5e:2x2",
    "train.mesh=(1,1,4)",
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
  assert "train.mesh=(1, 1, 4)" in line and "kv_heads" in line, line
  assert "Traceback" not in proc.stderr


@pytest.mark.slow  # the demo's plan again, in a fresh process
def test_the_cli_prints_the_plan_and_writes_plan_json(tmp_path):
  proc = _cli(
    tmp_path, "--config", "configs/grpo.py", "--plan", "v5e:2x2", *DEMO
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "update" in proc.stdout and "fits" in proc.stdout
  record = json.loads((tmp_path / "plan.json").read_text())
  assert record["fits"] and record["slice"] == "v5e:2x2"


def test_the_cli_prints_the_table_and_writes_plan_json(
  demo_plan, tmp_path, monkeypatch, capsys
):
  # The command's own path, given the module's plan (not made again).
  monkeypatch.setattr(plan, "plan_run", lambda config, topology: demo_plan)
  code = _cli_main.main(
    [
      "--config",
      str(CONFIGS / "grpo.py"),
      "--plan",
      "v5e:2x2",
      *DEMO,
      f"output.directory={tmp_path}",
    ]
  )
  assert code == 0
  out = capsys.readouterr().out
  assert out.startswith(plan.table(demo_plan))
  assert json.loads((tmp_path / "plan.json").read_text()) == json.loads(
    json.dumps(demo_plan.to_json())
  )


def test_a_candidates_model_settings_reach_the_policy():
  # The search's "model.remat=True" must compile a rematerialised policy,
  # not the first config's.
  context = _plan._Context(_demo(), "v5e:2x2")
  assert not context.policy(_demo()).remat
  assert context.policy(_demo("model.remat=True")).remat
  candidates = _plan._candidates(_demo(), {"data": 1, "fsdp": 2, "tensor": 2})
  assert candidates[0] == ("model.remat=True",)
  assert ("train.microbatches=2",) in candidates
  # 16 prompts over 8 batch devices: 2 micro-batches of 8 split evenly, 4
  # of 4 would leave half the devices without a prompt.
  wide = _plan._candidates(_demo(), {"data": 1, "fsdp": 8, "tensor": 1})
  assert [c for c in wide if c[0].startswith("train.micro")] == [
    ("train.microbatches=2",)
  ]


# Qwen3-32B, full fine-tuning with Adam, on 4 v5e chips (64 GiB in all; its
# parameters alone take 61 GiB in bfloat16), at a small batch.
QWEN3_32B_SMALL = (
  "train.prompts_per_step=4",
  "sampler.num_samples=4",
  "sampler.max_new_tokens=256",
  "task.max_prompt_tokens=256",
  "train.microbatches=1",
)


@pytest.mark.slow  # a 64-layer model's programs, compiled for each candidate
def test_a_run_that_cannot_fit_is_refused_with_a_suggestion_that_fits(
  tmp_path, capsys
):
  pods = "configs/pods/qwen3_32b_grpo.py"
  args = ["--config", pods, "--plan", "v5e:2x2", *QWEN3_32B_SMALL]
  code = _cli_main.main([*args, f"output.directory={tmp_path / 'full'}"])
  assert code == 2
  (line,) = [
    x for x in capsys.readouterr().err.splitlines() if x.startswith("error: ")
  ]
  suggestion = json.loads((tmp_path / "full" / "plan.json").read_text())[
    "suggestion"
  ]
  assert suggestion and line.endswith(" ".join(suggestion)), line
  assert "v5e:2x2: program" in line and "over the v5e's" in line
  config = override(load_config(ROOT / pods), [*QWEN3_32B_SMALL, *suggestion])
  assert plan.plan_run(config, "v5e:2x2").fits


def test_a_disaggregated_run_plans_its_rollouts_on_their_own_mesh():
  # v5e:2x2 as 2 + 2: the update on the first two chips, the engine on the
  # last two; an async run's iteration is the longer side, not the sum.
  config = _demo(
    "train.mesh=(2,1,1)",
    "sampler.mesh=(2,1,1)",
    "train.async_mode=async",
  )
  found = plan.plan_run(config, "v5e:2x2")
  assert found.mesh == {"data": 2, "fsdp": 1, "tensor": 1}
  assert found.rollout_mesh == {"data": 2, "fsdp": 1, "tensor": 1}
  assert found.fits
  it = found.iteration
  assert it["total"] == pytest.approx(
    max(it["rollout"], it["score"] + it["update"])
  )
  assert "rollout mesh" in plan.table(found) and "beside" in plan.table(found)
  run = found.to_json()
  assert run["rollout_mesh"] == {"data": 2, "fsdp": 1, "tensor": 1}
  devices = plan.topology_devices(plan.parse_slice("v5e:2x2"))
  from rljax.training import _abstract

  task = _abstract.run_task(config)
  abstract = _abstract.abstract_run(
    config,
    devices,
    task=task,
    policy_config=_abstract.model_config(config.model, task.alphabet),
  )
  assert list(abstract.rollout_mesh.devices.flat) == devices[2:]
  assert list(abstract.mesh.devices.flat) == devices[:2]


def test_a_packed_run_plans_its_packed_update(demo_plan):
  # 16 prompts x 16 samples of 10 tokens on 2 batch shards; a budget of
  # 256 tokens a device holds 25 full rows: 8 micro-batches of 2 prompts
  # (16 rows a device), planned at full length, as padded rows would be.
  packed = plan.plan_run(
    _demo("train.max_tokens_per_microbatch=256"), "v5e:2x2"
  )
  mine, padded = (
    next(p for p in found.programs if p.name == "update")
    for found in (packed, demo_plan)
  )
  assert packed.fits
  # The packing's index arrays arrive with the batch, and the micro-batch
  # loop's body (what the cost analysis counts) is an eighth of the rows.
  assert mine.argument_bytes > padded.argument_bytes
  assert mine.flops < padded.flops / 4
