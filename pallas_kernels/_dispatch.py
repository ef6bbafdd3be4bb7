"""Choosing a schedule: the backend, the dtypes and what is installed.

"auto" runs dense when the logits are small (`DENSE_AUTO_BYTES`), else
picks the Pallas TPU kernel on a TPU backend, the Pallas GPU (Triton)
kernel on a GPU backend and the chunked XLA schedule elsewhere. The backend
is the default one, or the platform of `compile_for` while code is traced
for other devices (a TPU topology compiled ahead of time on a CPU host). When a Pallas
schedule cannot run (wrong backend, unsupported dtype, its dependencies fail
to import) the chunked schedule runs instead and the logger
"pallas_kernels" warns once per distinct reason, never silently. An explicit
request for a Pallas schedule whose module is not installed at all raises.
"""

import contextlib
import contextvars
import functools
import importlib
import logging
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels import _chunked
from pallas_kernels import _partition
from pallas_kernels import _reference
from pallas_kernels._contract import Backward
from pallas_kernels._contract import Forward

SCHEDULES = (
  "auto",
  "dense",
  "chunked",
  "pallas_tpu",
  "pallas_gpu",
  "pallas_interpret",
)
# (block_n, block_v) per schedule. Chunked: tuned on a 2-core CPU (see
# experiments/benchmarks/token_logprob.py); Pallas: tokamax-like TPU tiles and
# power-of-two Triton tiles.
DEFAULT_BLOCKS = {
  "dense": (None, None),
  "chunked": (1024, 2048),
  "pallas_tpu": (512, 2048),
  "pallas_interpret": (512, 2048),
  "pallas_gpu": (64, 128),
}
# "auto" runs dense when a call's float32 logits take at most this many
# bytes (the logits, their softmax and their gradient then fit in three
# times it): the fused schedules save memory, not time, and tiling small
# logits costs more than it saves (chunked is 1.2-1.3x dense's time on CPU;
# experiments/benchmarks/token_logprob.py). `dense_up_to` changes it.
DENSE_AUTO_BYTES = 256 << 20
_DENSE_UP_TO = contextvars.ContextVar("pallas_kernels_dense", default=None)


@contextlib.contextmanager
def dense_up_to(nbytes: int):
  """Within this context "auto" runs dense for float32 logits of at most
  `nbytes` (default `DENSE_AUTO_BYTES`; 0: always a fused schedule)."""
  if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
    raise ValueError(f"nbytes must be an int >= 0; got {nbytes!r}.")
  token = _DENSE_UP_TO.set(nbytes)
  try:
    yield
  finally:
    _DENSE_UP_TO.reset(token)


def dense_limit() -> int:
  """The logits bytes up to which "auto" runs dense here."""
  limit = _DENSE_UP_TO.get()
  return DENSE_AUTO_BYTES if limit is None else limit


_BACKEND = {"pallas_tpu": "tpu", "pallas_gpu": "gpu"}
_MODULE = {
  "pallas_tpu": "pallas_kernels._pallas_tpu",
  "pallas_interpret": "pallas_kernels._pallas_tpu",
  "pallas_gpu": "pallas_kernels._pallas_gpu",
}
_PALLAS_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))

logger = logging.getLogger("pallas_kernels")
# Reasons already logged in this process: each fallback warns once.
_WARNED: set[str] = set()


class Schedule(NamedTuple):
  """A resolved schedule: its name and its contract pair, blocks bound.

  Attributes:
    name: one of SCHEDULES other than "auto".
    forward: `pallas_kernels._contract.Forward` with the blocks bound.
    backward: `pallas_kernels._contract.Backward` with the blocks bound.
  """

  name: str
  forward: Forward
  backward: Backward


def _warn_once(reason: str) -> None:
  """Log `reason` at WARNING the first time it occurs in this process."""
  if reason not in _WARNED:
    _WARNED.add(reason)
    logger.warning(reason)


_TARGET = contextvars.ContextVar("pallas_kernels_target", default=None)
PLATFORMS = ("cpu", "gpu", "tpu")


_KIND = contextvars.ContextVar("pallas_kernels_device_kind", default=None)


@contextlib.contextmanager
def compile_for(platform: str, device_kind: str | None = None):
  """Within this context, choose schedules for `platform` ("tpu", "gpu" or
  "cpu") instead of the default backend's: for code traced and compiled
  ahead of time for other devices, e.g. lowered for a TPU topology
  (`jax.experimental.topologies`) on a CPU host, whose programs must hold
  the Pallas TPU kernel that the TPU will run. `device_kind` (a
  `jax.Device.device_kind`, "TPU v5 lite") sizes the TPU kernels' blocks to
  that chip's VMEM.

  Raises:
    ValueError: `platform` is not one of `PLATFORMS`.
  """
  if platform not in PLATFORMS:
    raise ValueError(
      f"platform must be one of {list(PLATFORMS)}; got {platform!r}."
    )
  token, kind = _TARGET.set(platform), _KIND.set(device_kind)
  try:
    yield
  finally:
    _KIND.reset(kind)
    _TARGET.reset(token)


def target_device_kind() -> str | None:
  """The device kind kernels are compiled for: `compile_for`'s, else the
  default backend's first device's when that backend is the target."""
  kind = _KIND.get()
  if kind is None and _TARGET.get() in (None, jax.default_backend()):
    kind = jax.devices()[0].device_kind
  return kind


def _backend() -> str:
  """The platform schedules are chosen for ("cpu", "gpu", "tpu"): that of
  `compile_for`, else the default backend's."""
  return _TARGET.get() or jax.default_backend()


def _auto() -> str:
  """The schedule "auto" means on the default backend."""
  backend = _backend()
  return {"tpu": "pallas_tpu", "gpu": "pallas_gpu"}.get(backend, "chunked")


def _unusable(name: str, dtypes) -> str | None:
  """Why the Pallas schedule `name` cannot run here, or None if it can."""
  backend = _backend()
  if name in _BACKEND and backend != _BACKEND[name]:
    return f"{name} needs a {_BACKEND[name]} backend; this one is {backend}"
  bad = [str(d) for d in dtypes if jnp.dtype(d) not in _PALLAS_DTYPES]
  if bad:
    return f"{name} supports float32 and bfloat16 inputs; got {bad}"
  return None


def _import(name: str, explicit: bool):
  """The kernel module of `name`, or (None, reason) when it fails to import."""
  module = _MODULE[name]
  try:
    return importlib.import_module(module), None
  except ModuleNotFoundError as e:
    if explicit and e.name == module:
      raise ModuleNotFoundError(
        f"schedule={name!r} needs {module}, which is not installed; use"
        " schedule='chunked' (or 'auto') instead.",
        name=module,
      ) from e
    return None, f"{name} unavailable ({module} failed to import: {e!r})"
  except ImportError as e:
    return None, f"{name} unavailable ({module} failed to import: {e!r})"


def _check_blocks(block_n, block_v) -> None:
  """Raise unless each given block size is a positive int."""
  for name, value in (("block_n", block_n), ("block_v", block_v)):
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    if value is not None and not ok:
      raise ValueError(f"{name} must be a positive int or None; got {value!r}.")


def _bind(name: str, module, block_n, block_v) -> Schedule:
  """The contract pair of `module` with blocks (and interpret) bound."""
  default_n, default_v = DEFAULT_BLOCKS[name]
  kw = dict(
    block_n=default_n if block_n is None else block_n,
    block_v=default_v if block_v is None else block_v,
  )
  if name.startswith("pallas"):
    kw["interpret"] = name == "pallas_interpret"
  forward = functools.partial(module.forward, **kw)
  backward = functools.partial(module.backward, **kw)
  if name.startswith("pallas"):  # kernels XLA cannot partition
    forward, backward = (
      _partition.forward(forward),
      _partition.backward(backward),
    )
  return Schedule(name, forward, backward)


def _pallas_or_fallback(name: str, explicit: bool, dtypes):
  """(name, module) to run: the Pallas kernel if usable, else chunked."""
  reason = _unusable(name, dtypes)
  module = None
  if reason is None:
    module, reason = _import(name, explicit)
  if reason is None:
    return name, module
  _warn_once(f"falling back to schedule='chunked': {reason}.")
  return "chunked", _chunked


def resolve(schedule: str, dtypes, block_n=None, block_v=None) -> Schedule:
  """The schedule to run for inputs of `dtypes` on this backend.

  Args:
    schedule: one of SCHEDULES.
    dtypes: dtypes of the hidden states and the unembedding.
    block_n, block_v: tile sizes; None takes the schedule's default.

  Returns:
    A `Schedule`; "dense" carries the reference contract pair.
  """
  if schedule not in SCHEDULES:
    raise ValueError(
      f"schedule must be one of {list(SCHEDULES)}; got {schedule!r}."
    )
  _check_blocks(block_n, block_v)
  name = _auto() if schedule == "auto" else schedule
  module = {"dense": _reference, "chunked": _chunked}.get(name)
  if module is None:
    name, module = _pallas_or_fallback(name, schedule != "auto", dtypes)
  return _bind(name, module, block_n, block_v)
