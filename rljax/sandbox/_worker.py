"""The sandbox worker process, and the framing both sides of its pipes use.

Run as a script (``python -I _worker.py READ_FD WRITE_FD``), normally under
bubblewrap's namespaces (`_jail`), it imports only the standard library until
its settings arrive, imports the preload modules, runs the initializer, sets
its resource limits and then serves batches of calls: each call in a fresh
fork (`fresh_process`) or in the worker itself. Before any untrusted input
is touched, the call's process restricts itself with Landlock
(`_landlock`), the seccomp allow-list (`_seccomp`) and the audit hook.
Outside a jail (`allow_weaker`), the worker first enters a new network
namespace and, as root, drops to uid 65534.

Frames are an 8-byte big-endian length and a payload. Payloads from the
parent are pickles (trusted); payloads to the parent start with a status
byte, and the parent unpickles only plain data from them.
"""

import ctypes
import importlib
import importlib.util
import os
import pathlib
import pickle
import re
import resource
import select
import signal
import struct
import sys
import time

HEADER = struct.Struct(">Q")
OK, ERROR, TIMEOUT, CRASHED, READY, FAILED = b"o", b"e", b"t", b"c", b"r", b"f"
NOBODY = 65534
MAX_MESSAGE = 1 << 32
_MAX_TEXT = 2000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38

# Audit events refused outright: process creation, signals to other
# processes, sockets, ctypes, new interpreters (they would not carry the
# hook), changing resource limits and loading native sqlite extensions.
_REFUSED = frozenset(
  {
    "os.system",
    "os.exec",
    "os.fork",
    "os.forkpty",
    "os.posix_spawn",
    "os.spawn",
    "os.startfile",
    "os.kill",
    "os.killpg",
    "pty.spawn",
    "signal.pthread_kill",
    "subprocess.Popen",
    "webbrowser.open",
    "resource.prlimit",
    "resource.setrlimit",
    "cpython.PyInterpreterState_New",
    "sqlite3.enable_load_extension",
    "sqlite3.load_extension",
  }
)
_REFUSED_PREFIXES = ("socket.", "ctypes.", "_winapi.", "winreg.")
# Events that write or remove files: (indices of path arguments, indices of
# dir_fd arguments). Every path must resolve inside the scratch directory.
_WRITES = {
  "os.remove": ((0,), (1,)),
  "os.rmdir": ((0,), (1,)),
  "os.rename": ((0, 1), (2, 3)),
  "os.mkdir": ((0,), (2,)),
  "os.symlink": ((1,), (2,)),
  "os.link": ((0, 1), (2, 3)),
  "os.truncate": ((0,), ()),
  "os.chmod": ((0,), (2,)),
  "os.chown": ((0,), (3,)),
  "os.chflags": ((0,), ()),
  "os.lchflags": ((0,), ()),
  "os.utime": ((0,), (3,)),
  "os.setxattr": ((0,), ()),
  "os.removexattr": ((0,), ()),
  "shutil.rmtree": ((0,), (1,)),
  "shutil.copyfile": ((1,), ()),
  "shutil.copymode": ((1,), ()),
  "shutil.copystat": ((1,), ()),
  "shutil.copytree": ((1,), ()),
  "shutil.move": ((0, 1), ()),
  "shutil.chown": ((0,), ()),
  "shutil.make_archive": ((0,), ()),
  "shutil.unpack_archive": ((1,), ()),
  "sqlite3.connect": ((0,), ()),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
# /proc entries of a process: another process's are refused (its environment,
# memory and command line are the host's, readable as root).
_PROC_ENTRY = re.compile(r"/proc/([0-9]+)(?:/|$)")
_PATH_TYPES = (str, bytes, pathlib.PurePosixPath, pathlib.PosixPath)


def _sibling(name: str):
  """A standard-library-only module of this folder, loaded by its path.

  The worker runs as a script and may not import rljax (its package
  imports much more than the sandbox needs).
  """
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
  spec = importlib.util.spec_from_file_location(f"_rljax_sandbox{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_seccomp = _sibling("_seccomp")
_landlock = _sibling("_landlock")


class ParentGone(Exception):
  """The parent closed its end of the pipe while a call was running."""


def write_frame(fd: int, payload: bytes) -> None:
  """Write one length-prefixed frame to `fd`."""
  view = memoryview(HEADER.pack(len(payload)) + payload)
  while view:
    view = view[os.write(fd, view) :]


def read_frame(
  fd: int,
  max_bytes: int,
  deadline: float | None = None,
  watch: int | None = None,
) -> bytes | None:
  """Read one frame from `fd`.

  Args:
    fd: the pipe to read.
    max_bytes: the largest payload accepted.
    deadline: a `time.monotonic()` time, or None to wait for ever.
    watch: another fd; data or a hang-up there raises `ParentGone`.

  Returns:
    The payload, or None at end of file (also mid-frame).

  Raises:
    TimeoutError: the deadline passed first.
    ValueError: the frame is longer than `max_bytes`.
    ParentGone: `watch` became readable.
  """
  header = _read_exact(fd, HEADER.size, deadline, watch)
  if header is None:
    return None
  (size,) = HEADER.unpack(header)
  if size > max_bytes:
    raise ValueError(f"a message of {size} bytes exceeds {max_bytes} bytes")
  return _read_exact(fd, size, deadline, watch)


def _read_exact(fd, size, deadline, watch) -> bytes | None:
  """`size` bytes from `fd`, None at end of file."""
  chunks, got = [], 0
  poller = None
  if deadline is not None or watch is not None:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if watch is not None:
      poller.register(watch, select.POLLIN)
  while got < size:
    if poller is not None:
      _wait(poller, fd, deadline, watch)
    chunk = os.read(fd, min(size - got, 1 << 20))
    if not chunk:
      return None
    chunks.append(chunk)
    got += len(chunk)
  return b"".join(chunks)


def _wait(poller, fd, deadline, watch) -> None:
  """Block until `fd` is readable (or hung up); see `read_frame`."""
  while True:
    if deadline is None:
      timeout_ms = None
    else:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        raise TimeoutError
      timeout_ms = max(1, int(remaining * 1000))
    ready = dict(poller.poll(timeout_ms))
    if watch is not None and watch in ready:
      raise ParentGone
    if fd in ready:
      return


def describe(error: BaseException) -> bytes:
  """'Type: message' of an exception, bounded, never raising."""
  try:
    text = f"{type(error).__name__}: {error}"
  except BaseException:
    text = type(error).__name__
  return text[:_MAX_TEXT].encode("utf-8", "replace")


def main(argv: list[str]) -> int:
  """Set up from the settings on the pipe, then serve calls until EOF."""
  read_fd, write_fd = int(argv[1]), int(argv[2])
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    settings = pickle.loads(read_frame(read_fd, MAX_MESSAGE))
    if settings["jail"]:
      layers = _jailed()
    else:
      layers = {"network": _unshare_network(settings)}
    _prepare(settings)
    if not settings["jail"]:
      layers.update(_drop_privileges(settings))
    layers.update(_set_limits(settings))
    if settings["fresh_process"]:
      layers.update(_probe_call_layers(settings))
    else:
      _pdeathsig()
      layers.update(_enter_call(settings, persistent=True))
  except BaseException as e:
    write_frame(write_fd, FAILED + describe(e))
    return 1
  write_frame(write_fd, READY + pickle.dumps(layers))
  _serve(read_fd, write_fd, settings)
  return 0


def _jailed() -> dict[str, str]:
  """The layers bubblewrap set up, as this process sees them."""
  with open("/proc/self/uid_map") as f:
    identity = f.read().split() == ["0", "0", "4294967295"]
  with open("/proc/self/status") as f:
    caps = [line.split()[1] for line in f if line.startswith("CapEff:")]
  return {
    "namespaces": "no user namespace" if identity else "",
    "network": "",
    "unprivileged_uid": "running as uid 0" if os.getuid() == 0 else "",
    "no_capabilities": "" if caps == ["0000000000000000"] else "has some",
    "no_new_privs": _libc_call("prctl", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
  }


def _unshare_network(settings) -> str:
  """A new network namespace (and user namespace when not root); why not."""
  if not settings["isolate_network"]:
    return "not requested"
  flags = _CLONE_NEWNET if os.geteuid() == 0 else _CLONE_NEWUSER | _CLONE_NEWNET
  return _libc_call("unshare", flags)


def _drop_privileges(settings) -> dict[str, str]:
  """As root, switch to uid/gid nobody; {layer: why not or ""}."""
  layers = {"unprivileged_uid": ""}
  if os.geteuid() == 0:
    layers["unprivileged_uid"] = "not requested"
    if settings["drop_privileges"]:
      layers["unprivileged_uid"] = _become_nobody(settings["scratch"])
  layers["no_new_privs"] = _libc_call("prctl", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
  return layers


def _become_nobody(scratch: str) -> str:
  """setuid(nobody) if nobody can read the import path; "" or why not."""
  folders = [p for p in sys.path if os.path.isdir(p)]
  pid = os.fork()
  if pid == 0:  # a probe: can nobody list every import folder?
    try:
      _setuid_nobody()
      for folder in folders:
        os.listdir(folder)
    except BaseException:
      os._exit(1)
    os._exit(0)
  if os.waitpid(pid, 0)[1] != 0:
    return "uid 65534 cannot read the interpreter's import path"
  try:
    os.chown(scratch, NOBODY, NOBODY)
    _setuid_nobody()
  except OSError as e:
    return describe(e).decode()
  return ""


def _setuid_nobody() -> None:
  """Drop every group and switch to uid/gid 65534 for good."""
  os.setgroups([])
  os.setgid(NOBODY)
  os.setuid(NOBODY)


def _libc_call(name: str, *args: int) -> str:
  """Call a libc function; "" when it returned 0, else why not."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) == 0:
      return ""
    return f"{name} failed: {os.strerror(ctypes.get_errno())}"
  except (OSError, AttributeError) as e:
    return f"{name} unavailable: {e}"


def _pdeathsig() -> None:
  """Die with the parent (a stuck call cannot outlive it)."""
  _libc_call("prctl", _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _prepare(settings) -> None:
  """The parent's sys.path, the preload imports and the initializer."""
  sys.dont_write_bytecode = True
  path = list(settings["path"])
  sys.path[:] = path + [p for p in sys.path if p not in path]
  for name in settings["preload"]:
    importlib.import_module(name)
  if settings["initializer"] is not None:
    fn, args = pickle.loads(settings["initializer"])
    fn(*args)


def _set_limits(settings) -> dict[str, str]:
  """Address space, file size, open files and core size for the worker."""
  limits = (
    (resource.RLIMIT_AS, settings["memory_bytes"]),
    (resource.RLIMIT_FSIZE, settings["file_bytes"]),
    (resource.RLIMIT_NOFILE, settings["open_files"]),
    (resource.RLIMIT_CORE, 0),
  )
  failed = []
  for which, value in limits:
    try:
      _, hard = resource.getrlimit(which)
      if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
      resource.setrlimit(which, (value, value))
    except (OSError, ValueError) as e:
      failed.append(describe(e).decode())
  return {"rlimits": "; ".join(failed)}


def _enter_call(settings, persistent: bool) -> dict[str, str]:
  """Limits for running untrusted input: CPU, Landlock, seccomp, the hook."""
  if not persistent:
    cpu = settings["call_cpu_seconds"]
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    new_hard = cpu + 1 if hard == resource.RLIM_INFINITY else min(cpu + 1, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, new_hard), new_hard))
  layers = _kernel_layers(settings)
  for name in ("landlock", "seccomp"):
    if layers[name] and settings.get(name) == "":  # it worked in the probe
      raise OSError(f"the {name} layer failed here: {layers[name]}")
  if layers["seccomp"]:  # then RLIMIT_NPROC 0 is what stops fork
    layers["process_limit"] = _process_limit()
  install_hook(settings["scratch"], allow_cpu_limit=persistent)
  layers["audit_hook"] = ""
  return layers


def _process_limit() -> str:
  """RLIMIT_NPROC 0 (no fork, no threads either); "" or why not."""
  if os.getuid() == 0:
    return "running as root"
  try:
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
  except (OSError, ValueError) as e:
    return describe(e).decode()
  return ""


def _kernel_layers(settings) -> dict[str, str]:
  """Landlock then the seccomp allow-list in this process; {layer: why not}."""
  layers = {
    "landlock": _landlock.restrict(_read_roots(settings), [settings["scratch"]])
  }
  if _seccomp.supported():
    layers["seccomp"] = _seccomp.install(_seccomp.allow_list(os.getpid()))
  else:
    layers["seccomp"] = f"no seccomp table for {os.uname().machine}"
  return layers


def _read_roots(settings) -> list[str]:
  """What a call may read: the jail's whole view, or (outside one) the
  interpreter, the import path, the scratch directory and its own /proc."""
  if settings["jail"]:
    return ["/"]
  devices = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"]
  own = [f"/proc/{os.getpid()}", "/sys/devices/system/cpu", "/etc/localtime"]
  return list(settings["read_roots"]) + devices + own


def _probe_call_layers(settings) -> dict[str, str]:
  """Landlock and seccomp as a call's process gets them; {layer: why not}."""
  read_end, write_end = os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      why = _kernel_layers(settings)
      if why["seccomp"]:
        why["process_limit"] = "running as root" if os.getuid() == 0 else ""
      os.write(write_end, pickle.dumps(why))
    finally:
      os._exit(0)
  os.close(write_end)
  with os.fdopen(read_end, "rb") as f:
    data = f.read()
  os.waitpid(pid, 0)
  try:
    layers = pickle.loads(data)
  except Exception:  # the probe died: neither layer is known to work
    layers = {"landlock": "the probe failed", "seccomp": "the probe failed"}
  settings.update(landlock=layers["landlock"], seccomp=layers["seccomp"])
  return layers


def install_hook(scratch: str, allow_cpu_limit: bool = False) -> None:
  """The audit hook that refuses processes, sockets, ctypes, outside writes.

  It also refuses opening another process's /proc/<pid> entries (as root
  they hold the host's environment) and os.open of directories (a
  directory fd would let dir_fd= paths escape the path checks).

  Defence in depth only: code running in the same interpreter can undo a
  hook's rules, so the boundary is the kernel's (namespaces, Landlock,
  seccomp). The rules are copied into the hook's closure, and paths are
  checked as exact `str` copies (a `str` subclass cannot answer the checks
  differently from what the system call sees).

  Args:
    scratch: the only directory under which files may be written, created,
      renamed or removed.
    allow_cpu_limit: let `resource.setrlimit` change RLIMIT_CPU (the
      persistent worker re-arms it before each call).
  """
  root = os.path.realpath(scratch)
  refused, prefixes = frozenset(_REFUSED), tuple(_REFUSED_PREFIXES)
  writes, write_flags = dict(_WRITES), _WRITE_FLAGS
  cpu_limit = resource.RLIMIT_CPU
  realpath, exact = os.path.realpath, _exact_path

  def inside(path, allow_fd) -> bool:
    if type(path) is int:
      return allow_fd
    path = exact(path)
    if path is None:
      return False
    real = realpath(path)
    return real == root or real.startswith(root + "/")

  def allowed(event, args) -> bool:
    if event in refused:
      return (
        allow_cpu_limit
        and event == "resource.setrlimit"
        and (args[0] == cpu_limit)
      )
    if event.startswith(prefixes):
      return False
    if event == "open":
      path, mode, flags = args
      if _another_process(path):
        return False
      if mode is None and _opens_directory(path, flags):
        return False
      writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        isinstance(flags, int) and flags & write_flags
      )
      return not writing or inside(path, allow_fd=True)
    spec = writes.get(event)
    if spec is None:
      return True
    paths, dir_fds = spec
    # A dir_fd resolves relative paths elsewhere; -1 is the default (none).
    if any(i < len(args) and args[i] not in (None, -1) for i in dir_fds):
      return False
    allow_fd = event == "os.truncate"
    return all(inside(args[i], allow_fd) for i in paths if i < len(args))

  def hook(event, args):
    if not allowed(event, args):
      raise PermissionError(f"the rljax sandbox refuses {event}")

  sys.addaudithook(hook)


def _exact_path(path) -> str | None:
  """A path as an exact `str` the caller's object cannot change; None if not
  a plain path (a custom __fspath__ could answer differently twice)."""
  if isinstance(path, str):
    return str.__getitem__(path, slice(None))  # an exact copy, methods unused
  if isinstance(path, bytes):
    return os.fsdecode(bytes.__getitem__(path, slice(None)))
  if type(path) in _PATH_TYPES:
    return str(path)
  return None


def _another_process(path) -> bool:
  """Whether an opened path is a /proc/<pid> entry of another process."""
  if isinstance(path, int):
    return False
  path = _exact_path(path)
  if path is None:
    return True
  found = _PROC_ENTRY.match(os.path.realpath(path))
  return found is not None and int(found.group(1)) != os.getpid()


def _opens_directory(path, flags) -> bool:
  """Whether os.open (its audit event) opens a directory.

  A directory's fd would let relative paths under dir_fd= escape the hook's
  checks (the "open" event does not carry dir_fd), so none is handed out.
  """
  if isinstance(flags, int) and flags & os.O_DIRECTORY:
    return True
  if isinstance(path, int):
    return False
  path = _exact_path(path)
  return path is None or os.path.isdir(path)


def _serve(read_fd: int, write_fd: int, settings) -> None:
  """Answer batches of calls until the parent closes the pipe."""
  while True:
    message = read_frame(read_fd, MAX_MESSAGE)
    if message is None:
      return
    count, timeout, cpu, payload = pickle.loads(message)
    settings["call_cpu_seconds"] = cpu
    try:
      fn, calls = pickle.loads(payload)
    except BaseException as e:
      failure = ERROR + b"cannot load the call in the worker: " + describe(e)
      for _ in range(count):
        write_frame(write_fd, failure)
      continue
    for args in calls:
      if settings["fresh_process"]:
        reply = _run_forked(fn, args, timeout, read_fd, write_fd, settings)
      else:
        reply = _run_here(fn, args, cpu)
      write_frame(write_fd, reply)


def _call(fn, args) -> bytes:
  """fn(*args) as a reply payload: OK + pickle, or ERROR + description."""
  try:
    value = fn(*args)
  except BaseException as e:
    return ERROR + describe(e)
  try:
    return OK + pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
  except BaseException as e:
    return ERROR + b"the result cannot be pickled: " + describe(e)


def _run_here(fn, args, cpu: int) -> bytes:
  """A call in the persistent worker, with its CPU budget re-armed."""
  usage = resource.getrusage(resource.RUSAGE_SELF)
  used = int(usage.ru_utime + usage.ru_stime) + 1
  _, hard = resource.getrlimit(resource.RLIMIT_CPU)
  soft = used + cpu if hard == resource.RLIM_INFINITY else min(used + cpu, hard)
  resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
  return _call(fn, args)


def _run_forked(fn, args, timeout, read_fd, write_fd, settings) -> bytes:
  """A call in a fresh fork, killed at the deadline; its reply payload."""
  result_r, result_w = os.pipe()
  pid = os.fork()
  if pid == 0:  # the call's process: it never returns from here
    try:
      os.close(result_r)
      os.close(read_fd)
      os.close(write_fd)
      _pdeathsig()
      _enter_call(settings, persistent=False)
      write_frame(result_w, _call(fn, args))
    finally:
      os._exit(0)
  os.close(result_w)
  deadline = time.monotonic() + timeout
  try:
    body = read_frame(result_r, settings["max_result_bytes"], deadline, read_fd)
  except TimeoutError:
    _kill(pid)
    return TIMEOUT + f"timed out after {timeout:g} s".encode()
  except ValueError as e:
    _kill(pid)
    return ERROR + describe(e)
  except ParentGone:
    _kill(pid)
    os._exit(0)
  finally:
    os.close(result_r)
  status = _kill(pid)
  if body is None or body[:1] not in (OK, ERROR):
    return CRASHED + _exit_reason(status).encode()
  return body


def _kill(pid: int) -> int:
  """SIGKILL a call's process (harmless once it exited); its wait status."""
  try:
    os.kill(pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  return os.waitpid(pid, 0)[1]


def _exit_reason(status: int) -> str:
  """How a call's process ended without a result."""
  if os.WIFSIGNALED(status):
    number = os.WTERMSIG(status)
    try:
      name = signal.Signals(number).name
    except ValueError:
      name = str(number)
    return f"the call's process died of signal {name} without a result"
  code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
  return f"the call's process exited with status {code} without a result"


if __name__ == "__main__":
  sys.exit(main(sys.argv))
