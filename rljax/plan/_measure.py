"""What a compiled program needs: its memory analysis and cost analysis,
and the roofline time of that cost on a chip."""

import contextlib
import dataclasses
import re
import time

import jax
from jax.experimental.compilation_cache import compilation_cache

from rljax._src.errors import UserError
from rljax.plan._chips import Chip


@dataclasses.dataclass(frozen=True)
class Measured:
  """One compiled program, per device (XLA's analyses of the SPMD program).

  Attributes:
    name: the program ("update", "score", "prefill", "decode_segment", ...).
    argument_bytes, output_bytes, temp_bytes, code_bytes, alias_bytes:
      `memory_analysis()`: arguments, outputs, temporaries, generated code,
      and outputs that reuse (donated) argument buffers.
    peak_bytes: the program's peak, XLA's ``peak_memory_in_bytes`` where the
      backend reports one, else arguments + outputs + temporaries + code -
      aliased.
    flops, bytes_accessed: `cost_analysis()` (each loop body counted once).
    pallas: whether the program holds a Pallas TPU (Mosaic) kernel.
    compile_seconds: how long the compile took.
    error: the compiler's refusal when the program does not fit (then
      only ``temp_bytes`` and ``peak_bytes``, the need it states, are set).
  """

  name: str
  argument_bytes: int
  output_bytes: int
  temp_bytes: int
  code_bytes: int
  alias_bytes: int
  peak_bytes: int
  flops: float
  bytes_accessed: float
  pallas: bool
  compile_seconds: float
  error: str = ""

  def seconds(self, chip: Chip, devices_per_chip: int = 1) -> float:
    """The roofline time: max(FLOPs / peak FLOP/s, bytes / HBM bandwidth)
    of a device's share of `chip`."""
    return max(
      self.flops * devices_per_chip / chip.peak_flops,
      self.bytes_accessed * devices_per_chip / chip.hbm_bandwidth,
    )


def _cost(compiled) -> dict:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return cost or {}


@contextlib.contextmanager
def _no_persistent_cache():
  """JAX's persistent compilation cache off: a program compiled for
  devices that are not attached (a TPU topology) cannot be loaded back.
  JAX decides once a process whether it uses the cache, so the flag alone
  does not turn it off: the cache is reset on the way in and out, and
  initialises again, as configured, at the next compile."""
  enabled = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", enabled)
    compilation_cache.reset_cache()


_SIZE = re.compile(r"([\d.]+)([KMGT])\b")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _required_bytes(message: str) -> int:
  """The bytes a TPU compile that ran out of HBM says it needed: the first
  size in its message ("... HLO temporaries (61.74G) exceeds ...")."""
  found = _SIZE.search(message)
  if found is None:
    return 0
  return int(float(found.group(1)) * _UNITS[found.group(2)])


def _over(name: str, error: Exception, seconds: float) -> Measured:
  """A program the TPU compiler refused for HBM: its stated need."""
  need = _required_bytes(str(error))
  return Measured(
    name,
    0,
    0,
    need,
    0,
    0,
    need,
    0.0,
    0.0,
    False,
    seconds,
    error=str(error).splitlines()[0][:300],
  )


def measure(name: str, lowered) -> Measured:
  """Compile `lowered` (a `jax.stages.Lowered`) and measure it; a program
  the TPU compiler refuses for lack of HBM is measured by the need it
  states (`Measured.error`)."""
  start = time.perf_counter()
  try:
    with _no_persistent_cache():
      compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    if "vmem" in str(e).lower():  # a kernel's blocks, not the program's HBM
      raise UserError(
        f"program {name!r}: a Pallas TPU kernel does not fit the chip's"
        f" VMEM ({str(e).splitlines()[0][:200]}); pallas_kernels fits its"
        " blocks to the VMEM of v4, v5e, v5p and v6e: for another chip,"
        " pass smaller block_n / block_v."
      ) from e
    return _over(name, e, time.perf_counter() - start)
  seconds = time.perf_counter() - start
  m = compiled.memory_analysis()
  total = (
    m.argument_size_in_bytes
    + m.output_size_in_bytes
    + m.temp_size_in_bytes
    + m.generated_code_size_in_bytes
    - m.alias_size_in_bytes
  )
  cost = _cost(compiled)
  return Measured(
    name=name,
    argument_bytes=int(m.argument_size_in_bytes),
    output_bytes=int(m.output_size_in_bytes),
    temp_bytes=int(m.temp_size_in_bytes),
    code_bytes=int(m.generated_code_size_in_bytes),
    alias_bytes=int(m.alias_size_in_bytes),
    peak_bytes=int(getattr(m, "peak_memory_in_bytes", 0) or total),
    flops=float(cost.get("flops", 0.0)),
    bytes_accessed=float(cost.get("bytes accessed", 0.0)),
    pallas="tpu_custom_call" in compiled.as_text(),
    compile_seconds=seconds,
  )
