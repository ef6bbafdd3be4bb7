"""The kernel layers on their own: the seccomp program, Landlock, the jail.

The seccomp program is checked against an independent classic-BPF
interpreter written here (what the kernel would answer for each call), and
in a forked process against the real kernel.
"""

import asyncio
import os
import pathlib
import re
import socket
import struct
import sys
import tempfile
import threading

import pytest

from rljax import sandbox
from rljax import tasks
from rljax import tools
from rljax._src.errors import UserError
from rljax.sandbox import _jail
from rljax.sandbox import _landlock
from rljax.sandbox import _seccomp
from rljax.training import RunConfig
from rljax.training import SandboxSpec
from rljax.training import TaskSpec
from rljax.training import _build
from rljax.training import override
from rljax.training import validate

ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050001, 0x00050026
HEADERS = {
  "x86_64": ("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", r"__NR_(\w+)"),
  "aarch64": ("/usr/include/asm-generic/unistd.h", r"__NR(?:3264)?_(\w+)"),
}


def run_bpf(program: bytes, nr: int, arch: int, args=(0,) * 6) -> int:
  """What a classic-BPF seccomp program returns for one system call.

  Implements the instructions the filter may use (ld abs, jeq, jge, jset,
  ret k) over `struct seccomp_data` (nr, arch, ip, args), little-endian.
  """
  data = struct.pack("<iIQ6Q", nr, arch, 0, *args)
  code = [
    struct.unpack("=HBBI", program[i : i + 8])
    for i in range(0, len(program), 8)
  ]
  pc, acc = 0, 0
  while True:
    op, jt, jf, k = code[pc]
    if op == 0x20:  # BPF_LD | BPF_W | BPF_ABS
      acc = struct.unpack_from("<I", data, k)[0]
      pc += 1
    elif op in (0x15, 0x35, 0x45):  # jeq, jge, jset (BPF_K)
      taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
      pc += 1 + (jt if taken else jf)
    elif op == 0x06:  # ret k
      return k
    else:
      raise AssertionError(f"unexpected instruction {op:#x}")


@pytest.mark.parametrize("machine", sorted(_seccomp.SYSCALLS))
def test_syscall_numbers_match_the_kernel_headers(machine):
  path, pattern = HEADERS[machine]
  if not os.path.exists(path):
    pytest.skip(f"{path} is not on this machine")
  numbers = {}
  for line in open(path):
    found = re.match(rf"#define {pattern}\s+(\d+)", line)
    if found:
      name = found.group(1)
      name = "newfstatat" if (machine, name) == ("aarch64", "fstatat") else name
      numbers[name] = int(found.group(2))
  table = _seccomp.SYSCALLS[machine]
  assert {n: numbers[n] for n in table} == table
  listed = set(_seccomp.ALLOWED) | set(_seccomp.CONDITIONAL)
  assert listed & set(numbers) <= set(table)  # nothing allowed is skipped


@pytest.mark.parametrize("machine", sorted(_seccomp.SYSCALLS))
def test_the_allow_list_program(machine):
  arch = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}[machine]
  table = _seccomp.SYSCALLS[machine]
  program = _seccomp.allow_list(pid=7, machine=machine)
  ask = lambda name, *args: run_bpf(  # noqa: E731
    program, table[name], arch, (*args, *(0,) * (6 - len(args)))
  )
  for name in ("read", "write", "openat", "mmap", "futex", "exit_group"):
    assert ask(name) == ALLOW, name
  for name in (
    "execve",
    "socket",
    "connect",
    "mknodat",
    "ptrace",
    "setns",
    "unshare",
    "pidfd_open",
    "pidfd_send_signal",
    "io_uring_setup",
    "bpf",
    "mount",
    "prctl",
    "seccomp",
    "process_vm_readv",
  ):
    assert ask(name) == EPERM, name
  assert ask("clone", 0x3D0F00) == ALLOW  # pthread_create's flags
  assert ask("clone", 0x1200011) == EPERM  # fork()'s flags
  assert ask("clone3") == ENOSYS
  assert ask("kill", 7, 9) == ALLOW and ask("kill", 1, 9) == EPERM
  assert ask("kill", (1 << 32) - 7, 9) == EPERM  # kill(-7): a group
  assert ask("tgkill", 7, 8, 6) == ALLOW and ask("tgkill", 2, 2, 9) == EPERM
  assert ask("prlimit64", 0, 7) == ALLOW and ask("prlimit64", 1, 7) == EPERM
  assert run_bpf(program, table["read"], arch ^ 1) == EPERM  # other ABI
  if machine == "x86_64":  # x32 numbers
    assert run_bpf(program, 0x40000000 | table["read"], arch) == EPERM
  assert ask("kill", 7, 9) == ALLOW


def _in_child(fn) -> str:
  """fn() in a forked child; what it returned (a str) or its error."""
  read_end, write_end = os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      out = str(fn())
    except BaseException as e:  # noqa: BLE001
      out = f"{type(e).__name__}: {e}"
    os.write(write_end, out.encode()[:60000])
    os._exit(0)
  os.close(write_end)
  with os.fdopen(read_end, "rb") as f:
    out = f.read().decode()
  os.waitpid(pid, 0)
  return out


def _under_seccomp():
  why = _seccomp.install(_seccomp.allow_list(os.getpid()))
  assert not why, why
  results = []
  box = []
  t = threading.Thread(target=box.append, args=(1,))
  t.start()
  t.join()
  results.append(f"thread={box == [1]}")
  a, b = socket.socketpair()
  a.send(b"x")
  results.append(f"pair={b.recv(1) == b'x'}")
  results.append(f"asyncio={asyncio.run(asyncio.sleep(0, 'ok'))}")
  for name, attempt in (
    ("fork", os.fork),
    ("socket", socket.socket),
    ("mkfifo", lambda: os.mkfifo(tempfile.mktemp())),
    ("kill1", lambda: os.kill(1, 0)),
  ):
    try:
      attempt()
      results.append(f"{name}=allowed")
    except OSError as e:
      results.append(f"{name}={e.errno}")
  return " ".join(results)


def test_the_allow_list_in_the_kernel():
  if not _seccomp.supported():
    pytest.skip(f"no table for {os.uname().machine}")
  out = _in_child(_under_seccomp)
  assert out == (
    "thread=True pair=True asyncio=ok fork=1 socket=1 mkfifo=1 kill1=1"
  ), out


def test_landlock_confines_reads_and_writes(tmp_path):
  if _landlock.abi() < 1:
    pytest.skip("no Landlock in this kernel")
  readable, writable, hidden = (tmp_path / n for n in ("r", "w", "h"))
  for folder in (readable, writable, hidden):
    folder.mkdir()
    (folder / "f").write_text("x")

  def confined():
    roots = [str(readable), sys.prefix, sys.base_prefix]
    assert not _landlock.restrict(roots, [str(writable)])
    out = [(readable / "f").read_text(), (writable / "f").read_text()]
    (writable / "g").write_text("y")
    out.append((writable / "g").read_text())
    for attempt in (
      lambda: (hidden / "f").read_text(),
      lambda: (readable / "g").write_text("z"),
      lambda: os.listdir(hidden),
      lambda: os.remove(readable / "f"),
    ):
      try:
        attempt()
        out.append("allowed")
      except PermissionError:
        out.append("denied")
    return " ".join(out)

  assert _in_child(confined) == "x x y denied denied denied denied"
  assert not (readable / "g").exists() and (readable / "f").exists()


def test_the_jail_shows_the_import_path_but_not_the_working_directory(
  tmp_path, monkeypatch
):
  (tmp_path / "secret.txt").write_text("s")
  (tmp_path / "helper_mod_for_jail.py").write_text("X = 1\n")
  monkeypatch.chdir(tmp_path)
  monkeypatch.syspath_prepend("")
  monkeypatch.delitem(sys.modules, "helper_mod_for_jail", raising=False)
  roots = _jail.read_roots(("helper_mod_for_jail", "rljax.tools._python"))
  assert str(tmp_path) not in roots
  assert str(tmp_path / "helper_mod_for_jail.py") in roots
  rljax_folder = str(pathlib.Path(sandbox.__file__).parents[1])
  assert any(
    rljax_folder == r or rljax_folder.startswith(r + "/") for r in roots
  )
  assert sys.base_prefix in roots or any(
    sys.base_prefix.startswith(r + "/") for r in roots
  )
  assert not any(r in ("/", "/tmp", "/proc", "/usr") for r in roots)
  argv = _jail.argv("bwrap", roots, 1 << 20)
  for flag in (
    "--unshare-user",
    "--unshare-pid",
    "--unshare-net",
    "--unshare-ipc",
    "--unshare-uts",
    "--die-with-parent",
    "--new-session",
  ):
    assert flag in argv
  assert argv[argv.index("--cap-drop") + 1] == "ALL"
  assert argv[argv.index("--tmpfs") + 1] == "/tmp" and argv[-1] == "--"


@pytest.mark.parametrize("jail", [True, False], ids=["jail", "weaker"])
def test_a_module_imported_later_restarts_the_worker(
  jail, tmp_path, monkeypatch
):
  if jail and sandbox.kernel_isolation_error():
    pytest.skip("no jail here")
  if not jail:  # Landlock's read rules follow the same roots
    monkeypatch.setattr(_jail, "unavailable", lambda: "disabled by the test")
  (tmp_path / "late_mod_for_jail.py").write_text(
    "def double(x):\n  return 2 * x\n"
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  with sandbox.Sandbox() as box:
    assert box.call(abs, -1) == 1
    import late_mod_for_jail  # noqa: PLC0415  (after the worker started)

    try:
      assert box.call(late_mod_for_jail.double, 4) == 8
    finally:
      del sys.modules["late_mod_for_jail"]


def test_the_python_tool_refuses_without_the_jail(monkeypatch):
  monkeypatch.setattr(_jail, "unavailable", lambda: "no user namespaces")
  monkeypatch.delenv("RLJAX_SANDBOX_ALLOW_WEAKER", raising=False)
  with pytest.raises(UserError, match=r"sandbox\.allow_weaker=True"):
    tools.python_tool()
  monkeypatch.setenv("RLJAX_SANDBOX_ALLOW_WEAKER", "1")  # machine policy
  tools.python_tool().fn.close()
  monkeypatch.delenv("RLJAX_SANDBOX_ALLOW_WEAKER")
  with pytest.raises(UserError, match="no user namespaces"):
    _build.build_task(TaskSpec(name="python:arithmetic"), SandboxSpec())
  task = _build.build_task(
    TaskSpec(name="python:arithmetic"), SandboxSpec(allow_weaker=True)
  )
  env = task.environment()
  try:
    tool = env.toolbox["python"]
    result = env.toolbox.execute(tools.ToolCall("python", {"code": "6*7"}))
    assert result.text == "42"
    assert not tool.fn.sandbox.layers["namespaces"]
  finally:
    env.toolbox.close()
  assert tasks.PYTHON_PREFIX == "python:"
  config = override(RunConfig(), ["sandbox.allow_weaker=True"])
  assert validate(config).sandbox == SandboxSpec(allow_weaker=True)
  with pytest.raises(UserError, match="sandbox.allow_weaker"):
    override(RunConfig(), ["sandbox.allow_weaker=3"])


def test_kernel_isolation_is_reported():
  why = sandbox.kernel_isolation_error()
  assert why is None or (isinstance(why, str) and why)
  if why is None:
    with sandbox.Sandbox() as box:
      layers = box.layers
    assert all(
      layers[n]
      for n in (
        "namespaces",
        "network",
        "unprivileged_uid",
        "no_capabilities",
        "seccomp",
        "audit_hook",
        "rlimits",
      )
    ), layers
