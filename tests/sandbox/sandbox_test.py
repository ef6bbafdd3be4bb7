"""Sandbox: timeouts, crashes, the audit hook, scratch, env, network, data.

The sandboxed functions are standard-library ones (the worker imports them
by name); `exec` runs small untrusted snippets in the worker.
"""

import ctypes
import faulthandler
import fractions
import logging
import operator
import os
import pathlib
import pickle
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from rljax import sandbox
from rljax._src.errors import UserError
from rljax.sandbox import _jail
from rljax.sandbox import _sandbox

JAILED = sandbox.kernel_isolation_error() is None


@pytest.fixture(scope="module", params=[True, False], ids=["fresh", "shared"])
def box(request):
  with sandbox.Sandbox(
    timeout=20, memory_bytes=2 << 30, fresh_process=request.param
  ) as box:
    yield box


@pytest.fixture(scope="module")
def fresh():
  with sandbox.Sandbox(timeout=20) as box:
    yield box


@pytest.fixture(scope="module")
def weaker():
  """A sandbox as on a machine without user namespaces: no jail."""
  with sandbox.Sandbox(timeout=20) as box:
    with pytest.MonkeyPatch.context() as patch:
      patch.setattr(_jail, "unavailable", lambda: "disabled by the test")
      box.call(os.getpid)  # started without the jail
    yield box


def test_calls_batches_and_plain_results(box):
  assert box.call(operator.add, 1, 2) == 3
  outcomes = box.map(operator.mul, [(i, i) for i in range(5)])
  assert [o.value for o in outcomes] == [0, 1, 4, 9, 16]
  assert all(o.ok and o.status == "ok" and o.error == "" for o in outcomes)
  assert box.call(sorted, {3, 1, 2}) == [1, 2, 3]
  assert box.call(dict, [("a", (1, 2.5))]) == {"a": (1, 2.5)}


def test_exceptions_are_outcomes_and_call_raises(box):
  outcome = box.run(operator.truediv, 1, 0)
  assert outcome.status == "error"
  assert outcome.error.startswith("ZeroDivisionError")
  with pytest.raises(sandbox.SandboxError, match="ZeroDivisionError") as info:
    box.call(operator.truediv, 1, 0)
  assert info.value.outcome == outcome


def test_timeout_kills_the_call_and_the_next_call_works(box):
  box.call(exec, "import builtins; builtins.MARK = 1")
  outcome = box.run(time.sleep, 600, timeout=0.5)
  assert outcome.status == "timeout"
  assert "0.5 s" in outcome.error
  assert box.call(operator.add, 2, 2) == 4
  # A new process (a fresh fork, or a restarted shared worker).
  assert not box.call(eval, "hasattr(__import__('builtins'), 'MARK')")


def test_a_timeout_in_a_batch_spares_the_other_calls(box):
  outcomes = box.map(time.sleep, [(0,), (600,), (0,)], timeout=0.5)
  assert [o.status for o in outcomes] == ["ok", "timeout", "ok"]


@pytest.mark.parametrize(
  "fn, args, status",
  [
    (os._exit, (3,), "crashed"),
    (faulthandler._sigsegv, (), "crashed"),
    (bytearray, (8 << 30,), "error"),  # MemoryError under RLIMIT_AS
  ],
)
def test_crashes_never_reach_the_caller(box, fn, args, status):
  outcome = box.run(fn, *args)
  assert outcome.status == status, outcome
  assert box.call(operator.add, 1, 1) == 2


def test_fresh_process_keeps_no_state_between_calls(box):
  box.call(exec, "import builtins; builtins.TAINTED = True")
  tainted = box.call(eval, "hasattr(__import__('builtins'), 'TAINTED')")
  assert tainted is (not box.layers["fresh_process"])


def _refusals(canary, outside):
  return [
    (os.system, (f"touch {canary}",)),
    (subprocess.run, (["touch", str(canary)],)),
    (os.posix_spawn, ("/usr/bin/touch", ["touch", str(canary)], {})),
    (os.execv, ("/usr/bin/touch", ["touch", str(canary)])),
    (os.fork, ()),
    (os.kill, (os.getpid(), 0)),
    (socket.socket, ()),
    (socket.create_connection, (("127.0.0.1", 9),)),
    (ctypes.CDLL, (None,)),
    (exec, (f"open({str(canary)!r}, 'w').write('x')",)),
    (exec, (f"import os; os.open({str(canary)!r}, os.O_CREAT | os.O_WRONLY)",)),
    (exec, (f"import pathlib; pathlib.Path({str(canary)!r}).touch()",)),
    (os.remove, (str(outside / "keep"),)),
    (os.rename, (str(outside / "keep"), str(canary))),
    (os.mkdir, (str(canary),)),
    (shutil.rmtree, (str(outside),)),
    (os.symlink, ("/etc/passwd", str(canary))),
    (sqlite3.connect, (str(canary),)),
    (
      exec,
      ("import resource; resource.setrlimit(resource.RLIMIT_AS, (-1, -1))",),
    ),
  ]


@pytest.mark.parametrize("which", ["fresh", "weaker"])
def test_processes_sockets_ctypes_and_outside_writes_are_refused(
  which, request, tmp_path
):
  # Without the jail the audit hook refuses each (PermissionError); in the
  # jail the host's folders do not exist and the hook sees writes to the
  # jail's own /tmp: FileNotFoundError for those.
  box = request.getfixturevalue(which)
  outside = tmp_path / "outside"
  outside.mkdir()
  (outside / "keep").write_text("x")
  canary = tmp_path / "canary"
  for fn, args in _refusals(canary, outside):
    outcome = box.run(fn, *args)
    assert outcome.status == "error", (fn, outcome)
    expected = ("PermissionError", "FileNotFoundError", "OperationalError")
    if not box.layers["namespaces"]:
      expected = ("PermissionError",)
    assert outcome.error.startswith(expected), (fn, outcome)
  assert not canary.exists()
  assert (outside / "keep").read_text() == "x"


def test_without_the_jail_the_missing_layer_is_named(weaker):
  assert not weaker.layers["namespaces"]
  assert weaker.layers["audit_hook"] and weaker.layers["seccomp"]
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(_jail, "unavailable", lambda: "disabled by the test")
    with sandbox.Sandbox(allow_weaker=False) as strict:
      with pytest.raises(sandbox.SandboxError, match="allow_weaker=True"):
        strict.run(operator.add, 1, 1)


@pytest.mark.parametrize("jail", [True, False], ids=["jail", "weaker"])
def test_scratch_dir_is_writable_and_removed_on_close(jail):
  if jail and not JAILED:
    pytest.skip(f"no jail here: {sandbox.kernel_isolation_error()}")
  with pytest.MonkeyPatch.context() as patch:
    if not jail:
      patch.setattr(_jail, "unavailable", lambda: "disabled by the test")
    with sandbox.Sandbox(fresh_process=False) as box:
      scratch = box.call(os.getcwd)
      box.call(exec, "open('notes.txt', 'w').write('hi')")
      assert box.call(os.listdir, ".") == ["notes.txt"]
      assert box.call(os.getenv, "HOME") == scratch
      host_scratch = box._worker._scratch
      if jail:  # a tmpfs of the jail's own: nothing on the host's disk
        assert scratch == _jail.SCRATCH and host_scratch is None
      else:
        assert os.path.isdir(scratch) and scratch == host_scratch
  assert host_scratch is None or not os.path.exists(host_scratch)
  with pytest.raises(sandbox.SandboxError, match="closed"):
    box.run(operator.add, 1, 1)


def test_environment_is_not_inherited(monkeypatch):
  monkeypatch.setenv("RLJAX_TEST_SECRET", "hunter2")
  with sandbox.Sandbox() as box:
    assert box.call(os.getenv, "RLJAX_TEST_SECRET") is None
    assert box.call(os.getenv, "PATH") == "/usr/bin:/bin"


def test_network_namespace_has_only_loopback(fresh):
  if not fresh.layers["network"]:
    pytest.skip("the kernel refused a new network namespace here")
  text = fresh.call(pathlib.Path.read_text, pathlib.Path("/proc/self/net/dev"))
  interfaces = {line.split(":")[0].strip() for line in text.splitlines()[2:]}
  assert interfaces == {"lo"}


def test_layers_are_reported_and_missing_ones_warned_once(monkeypatch, caplog):
  monkeypatch.setattr(_sandbox, "_warned", set())
  caplog.set_level(logging.WARNING, logger="rljax.sandbox")
  with sandbox.Sandbox() as box:
    layers = box.layers
  assert set(layers) >= {
    "process",
    "namespaces",
    "rlimits",
    "audit_hook",
    "network",
    "seccomp",
    "landlock",
  }
  assert layers["process"] and layers["audit_hook"] and layers["rlimits"]
  missing = {name for name, active in layers.items() if not active}
  warned = {r.args[0] for r in caplog.records}
  assert warned == missing
  caplog.clear()
  with sandbox.Sandbox() as box:
    assert box.layers
  assert not caplog.records


def test_unprivileged_when_reported(fresh):
  if fresh.layers["unprivileged_uid"]:
    assert fresh.call(os.getuid) != 0
  if fresh.layers.get("process_limit"):
    assert (
      fresh.run(exec, "import threading; threading.Thread().start()").status
      == "error"
    )


def test_only_plain_data_comes_back(fresh, tmp_path):
  outcome = fresh.run(fractions.Fraction, 1, 3)
  assert outcome.status == "error" and "not plain data" in outcome.error
  # A result whose pickle would call os.system when loaded in the parent.
  canary = tmp_path / "canary"
  evil = (
    "type('X', (), {'__reduce__': lambda self: (__import__('os').system,"
    f" ('touch {canary}',))}})()"
  )
  outcome = fresh.run(eval, evil)
  assert outcome.status == "error" and "not plain data" in outcome.error
  assert not canary.exists()


def test_garbage_on_the_pipes_is_survived(box):
  scribble = (
    "import os\n"
    "for fd in range(3, 256):\n"
    "  try: os.write(fd, b'\\xff' * 64)\n"
    "  except OSError: pass\n"
  )
  assert box.run(exec, scribble).status in ("ok", "error", "crashed")
  assert box.call(operator.add, 1, 2) == 3


def test_bad_arguments():
  with pytest.raises(UserError, match="timeout"):
    sandbox.Sandbox(timeout=0)
  with pytest.raises(UserError, match="memory_bytes"):
    sandbox.Sandbox(memory_bytes=1.5)
  with pytest.raises(UserError, match="preload"):
    sandbox.Sandbox(preload="math_verify")
  with sandbox.Sandbox() as box:
    with pytest.raises(TypeError, match="top-level functions"):
      box.run(lambda: 1)
    with pytest.raises(TypeError, match="arguments"):
      box.run(operator.add, threading.Lock(), 1)


def test_pickles_as_its_settings(fresh):
  fresh.call(operator.add, 1, 1)  # started
  copy = pickle.loads(pickle.dumps(fresh))
  try:
    assert repr(copy).startswith("Sandbox(idle")
    assert copy.call(operator.add, 1, 2) == 3
  finally:
    copy.close()


_LEFT_OPEN = """
import os
from rljax import sandbox
box = sandbox.Sandbox()
box.call(os.getcwd)
worker = box._worker
print(worker._scratch)
outer = worker._process.pid  # bwrap, or the worker itself without a jail
with open(f"/proc/{outer}/task/{outer}/children") as f:
  inner = (f.read().split() or [outer])[0]
print(outer, os.readlink(f"/proc/{inner}/ns/pid"))
"""


def _pids_in(namespace):
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      if os.readlink(f"/proc/{pid}/ns/pid") == namespace:
        found.append(pid)
    except OSError:
      pass
  return found


def test_interpreter_exit_kills_the_worker_and_removes_scratch():
  out = subprocess.run(
    [sys.executable, "-c", _LEFT_OPEN],
    capture_output=True,
    text=True,
    check=True,
    timeout=300,
  ).stdout.split()
  scratch, outer, namespace = out[-3], int(out[-2]), out[-1]
  assert scratch == "None" or not os.path.exists(scratch)
  assert not os.path.exists(f"/proc/{outer}")
  if JAILED:  # everything in the jail's pid namespace is gone
    deadline = time.monotonic() + 10
    while _pids_in(namespace) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not _pids_in(namespace)
