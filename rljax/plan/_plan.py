"""A run plan: every program of an RL iteration compiled for a TPU slice
from any host, measured against the slice's chips.

`plan_run(config, "v5p:4x4x4")` lowers the run's programs with abstract
inputs (`rljax.training._abstract`; no weight is allocated) inside
`pallas_kernels.compile_for("tpu")`, compiles them for the topology
(`jax.experimental.topologies`, which needs libtpu: ``pip install -e
".[tpu]"``) and reports per program the memory analysis per device, and per
run the peak against the chip's HBM, a roofline time per program and an
iteration estimate. A run that does not fit is refused with the nearest
configuration that does (`search`).

The roofline needs whole-program costs, but XLA's cost analysis counts a
loop body once, and the model's layers are one `lax.scan`. So costs come
from two more compiles of each program at 1 and 2 layers, unrolled:
cost = c1 + (layers - 1) (c2 - c1); the update's micro-batch and
optimizer-step loops are scaled to their trip counts, the decode segment's
loop counts one decode step (times ``sampler.max_new_tokens``). A program
the compiler refuses for HBM has no cost (and the plan does not fit).
"""

import dataclasses
import math
import os
from typing import Any, Optional

import jax

from rljax._src.errors import UserError
from rljax.plan._chips import GIB
from rljax.plan._chips import Slice
from rljax.plan._chips import parse_slice
from rljax.plan._measure import Measured
from rljax.plan._measure import measure


def topology_devices(slice_: Slice) -> list:
  """The devices of `slice_` as JAX's TPU compiler sees them (no TPU needs
  to be attached; libtpu must be installed)."""
  from jax.experimental import topologies

  # libtpu takes a lock file (one process a host) even to compile for a
  # topology; nothing runs on a chip here, so plans may run side by side.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    return list(
      topologies.get_topology_desc(
        platform="tpu", topology_name=slice_.name
      ).devices
    )
  except Exception as e:  # noqa: BLE001 - libtpu missing or too old
    raise UserError(
      f"cannot compile for {slice_.name}: {str(e).splitlines()[0][:200]}."
      ' Install libtpu with pip install -e ".[tpu]" (about 680 MB).'
    ) from e


@dataclasses.dataclass(frozen=True)
class Cost:
  """A program's whole cost per device (layers and loops counted) and its
  roofline time."""

  flops: float
  bytes_accessed: float
  seconds: float


@dataclasses.dataclass
class Plan:
  """What `plan_run` found; `to_json` is plan.json.

  Attributes:
    slice: the `Slice`.
    devices: JAX devices in it (chips; v4 shows one per TensorCore).
    mesh: {"data": ..., "fsdp": ..., "tensor": ...}.
    programs: each program compiled at the run's shapes.
    costs: name -> `Cost` (whole program, per device).
    hbm_bytes: HBM per device.
    parameter_bytes: the policy's parameter bytes per device.
    iteration: seconds of an RL iteration by part (rollout, score,
      update, total), from the roofline times.
    tokens_per_second: sampled tokens per second at that estimate.
    overrides: the config overrides this plan was made with.
    rollout_mesh: the rollouts' own mesh (``sampler.mesh``, on the last
      devices; the engine's programs are compiled there), or None.
  """

  slice: Slice
  devices: int
  mesh: dict
  programs: list[Measured]
  costs: dict[str, Cost]
  hbm_bytes: int
  parameter_bytes: int
  iteration: dict[str, float]
  tokens_per_second: float
  overrides: tuple[str, ...] = ()
  rollout_mesh: Optional[dict] = None

  @property
  def peak(self) -> Measured:
    """The program with the largest per-device peak."""
    return max(self.programs, key=lambda p: p.peak_bytes)

  @property
  def fits(self) -> bool:
    return self.peak.peak_bytes <= self.hbm_bytes

  def to_json(self) -> dict[str, Any]:
    chip = self.slice.chip
    return {
      "slice": self.slice.name,
      "chip": {
        **dataclasses.asdict(chip),
      },
      "devices": self.devices,
      "mesh": self.mesh,
      "rollout_mesh": self.rollout_mesh,
      "overrides": list(self.overrides),
      "fits": self.fits,
      "hbm_bytes_per_device": self.hbm_bytes,
      "peak_bytes_per_device": self.peak.peak_bytes,
      "peak_program": self.peak.name,
      "parameter_bytes_per_device": self.parameter_bytes,
      "programs": [dataclasses.asdict(p) for p in self.programs],
      "costs": {k: dataclasses.asdict(v) for k, v in self.costs.items()},
      "iteration_seconds": self.iteration,
      "tokens_per_second": self.tokens_per_second,
    }


def _lowered(config, devices, task, stacks):
  """The abstract run and its lowered programs, traced for the devices'
  platform (the Pallas kernels of a TPU). `stacks`: the `ModelConfig` of
  the policy and (where the run reads one) the teacher."""
  import pallas_kernels
  from rljax.training import _abstract

  run = _abstract.abstract_run(
    config,
    devices,
    task=task,
    policy_config=stacks["policy"],
    teacher_config=stacks.get("teacher"),
  )
  with pallas_kernels.compile_for(
    devices[0].platform, device_kind=devices[0].device_kind
  ):
    return run, _abstract.lowered_programs(run)


def _measured(config, devices, task, stacks):
  run, lowered = _lowered(config, devices, task, stacks)
  return run, [measure(name, low) for name, low in lowered.items()]


def _layers(model_config, n: int):
  """`model_config` cut to `n` layers, unrolled (its loop body is then the
  whole stack, which the cost analysis counts)."""
  types = model_config.layer_types
  return dataclasses.replace(
    model_config,
    num_layers=n,
    scan_unroll=n,
    layer_types=None if types is None else tuple(types[:n]),
  )


def _loop_factor(config) -> float:
  """How many times the update's whole work is its counted work: its
  optimizer steps and micro-batches are `lax.scan` loops whose bodies the
  cost analysis counts once."""
  t = config.train
  return float(t.microbatches * t.epochs * t.minibatches)


def _depths(stacks) -> list[tuple[Any, dict[str, int]]]:
  """(the stack made deeper or None, {stack: layers}) to compile for whole
  costs: a base (each stack at 1 layer, or whole up to 2 layers: exact)
  then, per stack deeper than 2 layers, the base with that stack at 2."""
  base = {k: 1 if c.num_layers > 2 else c.num_layers for k, c in stacks.items()}
  deeper = [(k, {**base, k: 2}) for k, c in stacks.items() if c.num_layers > 2]
  return [(None, base), *deeper]


def _costs(config, devices, task, stacks, chip, per_chip, full=()):
  """name -> whole-program `Cost` per device. Compiled at `_depths` (each
  stack unrolled), a program's cost is linear in each stack's layers:
  cost = c_base + sum over stacks of (layers - 1) (c_stack_at_2 - c_base);
  the update's loops are counted in full (`_loop_factor`), the decode
  segment's as one decode step. `full`: the programs as measured at full
  depth, whose costs are whole when every stack is unrolled already (no
  more compiles)."""
  if full and all(c.scan_unroll >= c.num_layers for c in stacks.values()):
    by_depth = {None: {m.name: m for m in full}}
  else:
    by_depth = {
      deeper: {
        m.name: m
        for m in _measured(
          config,
          devices,
          task,
          {k: _layers(stacks[k], n) for k, n in depth.items()},
        )[1]
      }
      for deeper, depth in _depths(stacks)
    }
  base = by_depth.pop(None)
  scale = _loop_factor(config)
  out = {}
  for name, m in base.items():
    at_2 = {k: d[name] for k, d in by_depth.items()}
    if m.error or any(x.error for x in at_2.values()):
      continue  # refused for HBM: no cost to extrapolate
    k = scale if name == "update" else 1.0
    flops, moved = m.flops, m.bytes_accessed
    for stack, x in at_2.items():
      layers = stacks[stack].num_layers - 1
      flops += layers * (x.flops - m.flops)
      moved += layers * (x.bytes_accessed - m.bytes_accessed)
    whole = dataclasses.replace(m, flops=k * flops, bytes_accessed=k * moved)
    out[name] = Cost(
      whole.flops, whole.bytes_accessed, whole.seconds(chip, per_chip)
    )
  return out


def _iteration(config, costs, slots: int) -> tuple[dict, float]:
  """Seconds of an RL iteration by part, and sampled tokens per second.

  The parts add up, except in an asynchronous run whose rollouts have
  devices of their own (``sampler.mesh``): there they run beside the
  scoring and update, and the iteration is the longer of the two."""
  c = config
  rows = c.train.prompts_per_step * c.sampler.num_samples
  width = c.sampler.max_new_tokens
  waves = math.ceil(rows / slots)
  chunks = math.ceil(max(c.task.max_prompt_tokens - 1, 1) / 256)
  none = Cost(0.0, 0.0, 0.0)
  rollout = waves * (
    chunks * costs.get("prefill", none).seconds
    + width * costs.get("decode_segment", none).seconds
  )
  parts = {
    "rollout": rollout,
    "score": costs.get("score", none).seconds,
    "update": costs.get("update", none).seconds,
  }
  if c.sampler.mesh and c.train.async_mode != "sync":
    parts["total"] = max(rollout, parts["score"] + parts["update"])
  else:
    parts["total"] = sum(parts.values())
  tokens = rows * width / parts["total"] if parts["total"] else 0.0
  return parts, tokens


def _parameter_bytes(params) -> int:
  """Bytes of one device's shards of `params` (abstract, sharded)."""
  return sum(
    math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
    for x in jax.tree.leaves(params)
  )


def _engine_slots(config) -> int:
  from rljax.training import _trainer_rollouts

  return _trainer_rollouts.engine_settings(config)["slots"]


def _check_kind(config) -> None:
  if config.kind != "rl":
    raise UserError(
      f"kind={config.kind!r}: --plan plans RL runs (their rollout, scoring"
      " and update programs); a supervised, preference or distillation"
      " run's step can be checked with --dry_run."
    )
  if config.sampler.engine != "continuous":
    raise UserError(
      f"sampler.engine={config.sampler.engine!r}: --plan compiles the"
      " continuous engine's prefill and decode programs; plan with"
      " sampler.engine='continuous' (the default; the static sampler's"
      " single program keeps every row to the longest completion)."
    )


class _Context:
  """What every plan of one config on one slice shares."""

  def __init__(self, config, topology: str, task=None):
    from rljax.training import _abstract
    from rljax.training import _trainer_setup

    _check_kind(config)
    self.slice = parse_slice(topology)
    self.devices = topology_devices(self.slice)
    self.per_chip = max(1, len(self.devices) // self.slice.chips)
    self.hbm = self.slice.chip.hbm_bytes // self.per_chip
    self.task = task or _abstract.run_task(config)
    self.policy_config = _abstract.model_config(
      config.model, self.task.alphabet
    )
    # The frozen model an algorithm scores with (OPD's, say), when it does.
    self.teacher_config = None
    if config.teacher is not None and _abstract.reads_teacher(
      _trainer_setup.algorithm(config)
    ):
      self.teacher_config = _abstract.model_config(
        config.teacher, self.task.alphabet
      )

  def policy(self, config):
    """The policy's `ModelConfig` under `config`'s model settings (a
    candidate may turn remat on or change dtypes)."""
    m = config.model
    return dataclasses.replace(
      self.policy_config,
      remat=m.remat,
      dtype=m.dtype,
      param_dtype=m.param_dtype,
      scan_unroll=m.scan_unroll,
    )

  def stacks(self, config) -> dict:
    """{"policy": its `ModelConfig`, "teacher": the teacher's, if read}."""
    out = {"policy": self.policy(config)}
    if self.teacher_config is not None:
      out["teacher"] = self.teacher_config
    return out

  def memory(self, config):
    """(abstract run, measured programs) of `config` at full depth."""
    return _measured(config, self.devices, self.task, self.stacks(config))

  def plan(self, config, overrides=(), *, measured=None) -> Plan:
    """The `Plan` of `config`; `measured` is its `memory` when known."""
    run, programs = measured or self.memory(config)
    fits = max(p.peak_bytes for p in programs) <= self.hbm
    # A run that does not fit gets no costs (nor their compiles).
    costs = {}
    if fits:
      costs = _costs(
        config,
        self.devices,
        self.task,
        self.stacks(config),
        self.slice.chip,
        self.per_chip,
        full=programs,
      )
    iteration, tokens = _iteration(config, costs, _engine_slots(config))
    return Plan(
      slice=self.slice,
      devices=len(self.devices),
      mesh=dict(run.mesh.shape),
      rollout_mesh=None
      if run.rollout_mesh is None
      else dict(run.rollout_mesh.shape),
      programs=programs,
      costs=costs,
      hbm_bytes=self.hbm,
      parameter_bytes=_parameter_bytes(run.state.policy.params),
      iteration=iteration,
      tokens_per_second=tokens,
      overrides=tuple(overrides),
    )


def plan_run(config, topology: str, *, task=None) -> Plan:
  """The `Plan` of RL run `config` on TPU slice `topology` ("v5e:4x4",
  "v5p-128", ...; see `parse_slice`).

  Raises:
    UserError: libtpu is missing, the run is not RL, or ``train.mesh`` does
      not fit the slice or the model.
  """
  return _Context(config, topology, task).plan(config)


def _candidates(config, mesh: dict) -> list[tuple[str, ...]]:
  """Override sets that lower per-device memory, nearest first: remat, more
  fsdp (from the data axis), more micro-batches, fewer decode slots, LoRA,
  QLoRA (an int8 base); then remat with the most fsdp and micro-batches,
  then with LoRA, then with QLoRA too."""
  d, f, t = mesh["data"], mesh["fsdp"], mesh["tensor"]
  fsdp = [
    (f"train.mesh=({d // k},{f * k},{t})",)
    for k in (2, 4, 8, 16, 32, 64)
    if d % k == 0
  ]
  # A micro-batch's prompts still split over the batch axes' devices (each
  # device a whole share: fewer would leave devices padding or idle).
  t = config.train
  micro = t.microbatches
  micros = [
    (f"train.microbatches={micro * k}",)
    for k in (2, 4, 8)
    if (t.prompts_per_step // (t.minibatches * micro * k)) % (d * f) == 0
    and t.prompts_per_step % (t.minibatches * micro * k) == 0
  ]
  slots = _engine_slots(config)
  fewer = [(f"sampler.slots={slots // k}",) for k in (2, 4) if slots % k == 0]
  m = config.model
  lora = () if m.lora_rank else ("model.lora_rank=16",)
  qlora = () if m.lora_quantize_base else ("model.lora_quantize_base=True",)
  qlora = lora + qlora if qlora else ()
  remat = () if m.remat else ("model.remat=True",)
  out = [remat, *fsdp, *micros, *fewer, lora, qlora]
  both = remat + (fsdp[-1] if fsdp else ()) + (micros[-1] if micros else ())
  out += [both, both + lora, both + qlora]
  unique = []
  for c in out:
    if c and c not in unique:
      unique.append(c)
  return unique


def search(config, topology: str, *, task=None, limit: int = 12):
  """The first of `_candidates` (at most `limit` compiled) whose peak fits
  the slice's HBM, as (overrides, `Plan`); None when none does."""
  from rljax import sharding
  from rljax.training import override
  from rljax.training._validate import validate

  context = _Context(config, topology, task)
  mesh = sharding.make_mesh(*config.train.mesh, devices=context.devices)
  for items in _candidates(config, dict(mesh.shape))[:limit]:
    try:
      candidate = validate(override(config, list(items)))
      measured = context.memory(candidate)
    except (UserError, ValueError):
      continue  # not a valid run here (a batch the mesh cannot split)
    if max(m.peak_bytes for m in measured[1]) <= context.hbm:
      return items, context.plan(candidate, items, measured=measured)
  return None


def _gib(n: float) -> str:
  """Bytes in GiB, or MiB below one GiB."""
  if abs(n) < GIB:
    return f"{n / 2**20:.2f} MiB"
  return f"{n / GIB:.2f} GiB"


def table(plan: Plan) -> str:
  """The plan as text: one row per program, then the run."""
  chip = plan.slice.chip
  head = (
    f"{'program':<16}{'args':>11}{'outputs':>11}{'temps':>11}{'code':>11}"
    f"{'peak':>11}{'TFLOP':>9}{'GB moved':>10}{'roofline':>10}  pallas"
  )
  meshes = f"mesh {plan.mesh}"
  if plan.rollout_mesh is not None:
    meshes = f"update mesh {plan.mesh}, rollout mesh {plan.rollout_mesh}"
  lines = [
    f"plan for {plan.slice.name}: {plan.devices} devices, {meshes},"
    f" {_gib(plan.hbm_bytes)} HBM a device ({chip.source})",
    head,
  ]
  for m in plan.programs:
    cost = plan.costs.get(m.name, Cost(m.flops, m.bytes_accessed, 0.0))
    lines.append(
      f"{m.name:<16}"
      + "".join(
        f"{_gib(b):>11}"
        for b in (
          m.argument_bytes,
          m.output_bytes,
          m.temp_bytes,
          m.code_bytes,
          m.peak_bytes,
        )
      )
      + f"{cost.flops / 1e12:>9.3f}{cost.bytes_accessed / 1e9:>10.2f}"
      + f"{cost.seconds * 1e3:>8.2f}ms  {'yes' if m.pallas else 'no'}"
    )
    if m.error:
      lines.append(f"  refused by the compiler: {m.error}")
  it = plan.iteration
  if not plan.costs:
    it = {"rollout": 0.0, "score": 0.0, "update": 0.0, "total": 0.0}
  lines += [
    f"parameters: {_gib(plan.parameter_bytes)} a device; peak"
    f" {_gib(plan.peak.peak_bytes)} in {plan.peak.name}:"
    f" {'fits' if plan.fits else 'does NOT fit'}",
    f"iteration (roofline): rollout {it['rollout']:.3f} s"
    f" {'beside' if _overlapped(plan, it) else '+'} score"
    f" {it['score']:.3f} s + update {it['update']:.3f} s = {it['total']:.3f}"
    f" s; {plan.tokens_per_second:,.0f} sampled tokens/s",
  ]
  return "\n".join(lines)


def _overlapped(plan: Plan, it: dict) -> bool:
  """Whether the iteration's rollout ran beside its update (its total is
  not the sum of the parts)."""
  parts = it["rollout"] + it["score"] + it["update"]
  return plan.rollout_mesh is not None and it["total"] < parts


def over_message(plan: Plan, found) -> str:
  """The one-line refusal of a plan that does not fit, with the nearest
  configuration that does (`search`'s) or none found."""
  peak = plan.peak
  message = (
    f"{plan.slice.name}: program {peak.name!r} needs"
    f" {_gib(peak.peak_bytes)} a device,"
    f" {_gib(peak.peak_bytes - plan.hbm_bytes)} over the"
    f" {plan.slice.chip.name}'s {_gib(plan.hbm_bytes)} HBM"
  )
  if found is None:
    return message + "; no configuration tried fits: use a larger slice."
  items, fitted = found
  return (
    f"{message}; nearest that fits (peak {_gib(fitted.peak.peak_bytes)}):"
    f" {' '.join(items)}"
  )
