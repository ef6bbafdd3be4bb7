"""Attacks on the sandbox through the public tool path, as a model would.

Each payload is a Hermes ``<tool_call>`` turn given to
`envs.ToolEnvironment.step`, which runs it through the Toolbox and the
Python tool in `rljax.sandbox`. The classes are issue 26's: fifos and
device nodes, signals through pidfds, `str` subclasses against path checks,
rebinding the audit hook's rules, setns into the trainer's namespaces then a
TCP connection, plus raw system calls and reads of host secrets. Most run
twice: as written, and after disabling the audit hook from inside (its
closure rewritten through `gc`), so that the kernel's layers alone are what
hold. Every attack must come back as an error observation; afterwards the
next call works, nothing exists outside the scratch directory, the victim
process (with a secret in its environment) got no signal, the listener got
no connection and the secret appears nowhere.

Run as root (this machine) and, where the machine allows, again as uid
65534 (`test_attacks_as_an_unprivileged_user`).
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

from rljax import envs
from rljax import sandbox
from rljax import tools
from rljax.sandbox import _jail
from rljax.sandbox import _seccomp

SECRET_NAME = "RLJAX_ATTACK_SECRET"
SECRET = "s3cr3t-7f2c9d"
TIMEOUT = 3.0
JAILED = sandbox.kernel_isolation_error() is None
pytestmark = pytest.mark.skipif(
  not JAILED, reason=f"no kernel isolation: {sandbox.kernel_isolation_error()}"
)

# Disables the audit hook from inside the call, then proves it: ctypes
# (refused by the hook) loads. What follows meets the kernel's layers only.
NO_HOOK = """
import gc
for _f in gc.get_objects():
  if (type(_f).__name__ == "function" and _f.__name__ == "hook"
      and _f.__code__.co_filename.endswith("_worker.py")):
    for _c in _f.__closure__:
      _c.cell_contents = lambda event, args: True
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
  r = libc.syscall(nr, *args)
  if r < 0:
    e = ctypes.get_errno()
    raise OSError(e, os.strerror(e))
  return r
"""
# System call numbers of this machine (the tables are checked against the
# kernel headers in kernel_test.py).
NR = {
  name: _seccomp.SYSCALLS[os.uname().machine][name]
  for name in (
    "mknodat kill pidfd_send_signal pidfd_open setns socket connect ptrace"
    " unshare io_uring_setup process_vm_readv execve mount"
  ).split()
}


class Host:
  """What the attacks aim at: a victim process, a listener, canaries."""

  def __init__(self, folder: pathlib.Path):
    self.folder = folder
    self.home = pathlib.Path(os.path.expanduser("~"))
    self.canaries = [
      folder / "canary",
      self.home / "rljax_attack_canary",
      pathlib.Path("/tmp/rljax_attack_canary"),
    ]
    self.secret_file = folder / "secret.txt"
    self.secret_file.write_text(SECRET)
    env = {**os.environ, SECRET_NAME: SECRET}
    self.victim = subprocess.Popen(
      [sys.executable, "-c", "import time; time.sleep(3600)"], env=env
    )
    self.listener = socket.socket()
    self.listener.bind(("127.0.0.1", 0))
    self.listener.listen(8)
    self.listener.setblocking(False)
    self.port = self.listener.getsockname()[1]

  def fields(self) -> dict:
    return dict(
      victim=self.victim.pid,
      canary=self.canaries[0],
      home_canary=self.canaries[1],
      tmp_canary=self.canaries[2],
      secret_file=self.secret_file,
      port=self.port,
      **NR,
    )

  def assert_untouched(self):
    for canary in self.canaries:
      assert not os.path.lexists(canary), canary
    assert self.victim.poll() is None, "the victim got a signal"
    try:
      connection, _ = self.listener.accept()
      connection.close()
      raise AssertionError("a connection reached the host's listener")
    except BlockingIOError:
      pass

  def close(self):
    self.victim.kill()
    self.victim.wait()
    self.listener.close()
    for canary in self.canaries:
      if os.path.lexists(canary):
        os.remove(canary)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
  h = Host(tmp_path_factory.mktemp("host"))
  yield h
  h.close()


@pytest.fixture(scope="module", params=["jail", "weaker"])
def env(request):
  """The tool path; "weaker": as on a machine without user namespaces
  (allow_weaker: Landlock, seccomp, rlimits, the hook; no namespaces but
  the network's)."""
  weaker = request.param == "weaker"
  tool = tools.python_tool(
    timeout=TIMEOUT, max_output_chars=2000, allow_weaker=weaker
  )
  toolbox = tools.Toolbox([tool], max_output_chars=4000)
  environment = envs.ToolEnvironment(
    toolbox, tools.HermesFormat(), lambda text, example: 0.0, max_turns=99
  )
  environment.reset({"question": "attack"})
  with pytest.MonkeyPatch.context() as patch:
    if weaker:
      patch.setattr(_jail, "unavailable", lambda: "disabled by the test")
    assert_still_works(environment)  # the worker starts here
  assert tool.fn.sandbox.layers["namespaces"] is not weaker
  yield environment
  toolbox.close()


def call(env, code: str) -> tuple[str, int, float]:
  """The observation text, the failed-call count and the seconds taken."""
  payload = {"name": "python", "arguments": {"code": code}}
  text = f"<tool_call>\n{json.dumps(payload)}\n</tool_call>"
  start = time.monotonic()
  step = env.step(envs.Action(text, (), 0))
  seconds = time.monotonic() - start
  return step.observation[0]["content"], step.tool_errors, seconds


def assert_still_works(env):
  text, errors, _ = call(env, "print(sum(range(10)))")
  assert errors == 0 and "45" in text, text


ATTACKS = {
  # Fifos and device nodes (no audit event for either).
  "mkfifo_tmp": "import os\nos.mkfifo('/tmp/fifo')\nprint('made')",
  "mkfifo_home": "import os\nos.mkfifo(os.path.expanduser('~/fifo'))",
  "mkfifo_host": "import os\nos.mkfifo('{canary}')",
  "mknod_host_home": "import os, stat\nos.mknod('{home_canary}', stat.S_IFIFO)",
  "mknod_dev": (
    "import os, stat\nos.mknod('/tmp/null', stat.S_IFCHR | 0o666,"
    " os.makedev(1, 3))"
  ),
  # Signals to the trainer, other processes and the worker.
  "pidfd_signal": (
    "import os, signal\n"
    "signal.pidfd_send_signal(os.pidfd_open({victim}), signal.SIGKILL)"
  ),
  "kill_victim": "import os\nos.kill({victim}, 9)",
  "kill_worker": "import os\nos.kill(os.getppid(), 9)",
  "kill_init": "import os\nos.kill(1, 9)",
  "killpg": "import os\nos.killpg(0, 9)",
  # str subclasses against the hook's path checks.
  "str_subclass_write": (
    "class P(str):\n"
    "  def startswith(self, *a): return True\n"
    "  def partition(self, *a): return ('', '', '')\n"
    "  def __fspath__(self): return self\n"
    "open(P('{home_canary}'), 'w').write('x')"
  ),
  "str_subclass_environ": (
    "class P(str):\n"
    "  def startswith(self, *a): return False\n"
    "  def __fspath__(self): return self\n"
    "print(open(P('/proc/{victim}/environ'), 'rb').read())"
  ),
  # The hook's rules rebound as module globals.
  "rebind_rules": (
    "import sys\nm = sys.modules['__main__']\n"
    "for name in ('_REFUSED', '_WRITES'):\n"
    "  if hasattr(m, name): setattr(m, name, type(getattr(m, name))())\n"
    "m._REFUSED_PREFIXES = ()\n"
    "open('{home_canary}', 'w').write('x')"
  ),
  "rebind_rules_environ": (
    "import sys\nm = sys.modules['__main__']\n"
    "m._PROC_ENTRY = __import__('re').compile('^$')\n"
    "print(open('/proc/{victim}/environ', 'rb').read())"
  ),
  # Reading host secrets.
  "victim_environ": "print(open('/proc/{victim}/environ', 'rb').read())",
  "secret_file": "print(open('{secret_file}').read())",
  "shadow": "print(open('/etc/shadow').read())",
  "ssh_dir": "import os\nprint(os.listdir(os.path.expanduser('/root/.ssh')))",
  # Writing into what the jail shows read-only.
  "write_package": (
    "import os, rljax\n"
    "open(os.path.join(os.path.dirname(rljax.__file__), 'x.py'), 'w')"
  ),
  "write_interpreter": (
    "import os, sys\nopen(os.path.join(sys.prefix, 'x'), 'w')"
  ),
  # Network.
  "connect_host": (
    "import socket\nsocket.create_connection(('127.0.0.1', {port}), 1)"
  ),
  "unix_socket": "import socket\nsocket.socket(socket.AF_UNIX).connect('/x')",
}
# These need the hook out of the way first (ctypes), then meet the kernel.
RAW = {
  "raw_mknodat": "sc({mknodat}, -100, b'{canary}', 0o10644, 0)",
  "raw_mknodat_tmp": "sc({mknodat}, -100, b'/tmp/fifo', 0o10644, 0)",
  "raw_kill": "sc({kill}, {victim}, 9)",
  "raw_pidfd": "sc({pidfd_send_signal}, sc({pidfd_open}, {victim}, 0), 9, 0, 0)",
  "raw_setns_connect": (
    "fd = sc({pidfd_open}, {victim}, 0)\nsc({setns}, fd, 0x40000000)\n"
    "import socket\nsocket.create_connection(('127.0.0.1', {port}), 1)"
  ),
  "raw_socket": "sc({socket}, 2, 1, 0)",
  "raw_unshare": "sc({unshare}, 0x10000000)",
  "raw_ptrace_worker": "sc({ptrace}, 16, os.getppid(), 0, 0)",
  "raw_io_uring": (
    "p = ctypes.create_string_buffer(120)\nsc({io_uring_setup}, 8, p)"
  ),
  "raw_execve": "sc({execve}, b'/bin/sh', None, None)",
  "raw_mount": "sc({mount}, b'none', b'/tmp', b'tmpfs', 0, None)",
  "write_package_no_hook": (
    "import rljax\nopen(os.path.join(os.path.dirname(rljax.__file__),"
    " 'x.py'), 'w')"
  ),
  "write_home_no_hook": "open('{home_canary}', 'w').write('x')",
  "fork_no_hook": "os.fork()",
  "victim_environ_no_hook": (
    "print(open('/proc/{victim}/environ', 'rb').read())"
  ),
}


def _check(env, host, code):
  text, errors, seconds = call(env, code.format(**host.fields()))
  assert errors == 1, f"not refused:\n{code}\n->\n{text}"
  assert SECRET not in text
  assert seconds < TIMEOUT + 5
  host.assert_untouched()
  assert_still_works(env)
  return text


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_is_refused(env, host, name):
  _check(env, host, ATTACKS[name])


@pytest.mark.parametrize("name", sorted(ATTACKS) + sorted(RAW))
def test_attack_is_refused_with_the_audit_hook_disabled(env, host, name):
  code = ATTACKS.get(name) or RAW[name]
  text = _check(env, host, NO_HOOK.replace("{", "{{").replace("}", "}}") + code)
  assert "the rljax sandbox refuses" not in text, text  # the hook was off


def test_disabling_the_hook_works_so_the_raw_attacks_are_real(env):
  text, errors, _ = call(env, NO_HOOK + "print(libc.getpid() > 0)")
  assert errors == 0 and text.strip() == "True", text


def test_the_jail_shows_no_host_process_and_no_secret(env, host):
  if not env.toolbox["python"].fn.sandbox.layers["namespaces"]:
    pytest.skip("no jail in the weaker mode")
  code = (
    "import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
    "print(sorted(map(int, pids)))\n"
    "for p in pids:\n"
    "  try: print(open(f'/proc/{{p}}/environ', 'rb').read())\n"
    "  except OSError as e: print(e)\n"
    "print(os.getuid(), os.listdir('/'), os.listdir('/tmp'))"
  )
  text, errors, _ = call(env, code.format(**host.fields()))
  assert errors == 0, text
  assert SECRET not in text and SECRET_NAME not in text
  pids = json.loads(text.splitlines()[0])
  assert len(pids) == 3, pids  # its own pid space: init, worker, the call
  assert " 1000 " in text or text.splitlines()[-1].startswith("1000 ")


@pytest.mark.parametrize(
  "code",
  [
    "while True:\n  pass",
    "import os\nwhile True:\n  os.fork()",
    "x = bytearray(10 * 2**30)",
    "import sys\nwhile True:\n  sys.stdout.write('x' * 2**20)",  # 100 MB+
    "open('big', 'wb').write(b'x' * (2**30))",  # the scratch tmpfs
    "open('/tmp/big', 'wb').write(b'x')",  # /tmp itself is read-only
  ],
  ids=["loop", "fork_bomb", "10GB", "output", "fill_scratch", "write_tmp"],
)
def test_resource_attacks_end_within_the_timeout(env, host, code):
  text, errors, seconds = call(env, code)
  assert errors == 1, text
  assert seconds < TIMEOUT + 5
  assert len(text) < 10_000
  host.assert_untouched()
  assert_still_works(env)


def _unprivileged_prefix() -> list[str] | None:
  """A command prefix running as uid 65534 without capabilities, or None.

  As root: switch to uid/gid 65534 where that user can run this interpreter;
  else (its folders unreadable to it, e.g. under /root) a new user namespace
  whose only uid, 65534, maps to ours (`unshare --map-user`): the process
  has no capability in the host's namespace, as an unprivileged trainer.
  """
  probe = [sys.executable, "-c", "import rljax.sandbox"]
  runner = [
    sys.executable,
    "-c",
    "import os, sys; os.setgid(65534);"
    " os.setgroups([]); os.setuid(65534); os.execv(sys.argv[1],"
    " sys.argv[1:])",
  ]
  unshare = ["unshare", "--user", "--map-user=65534", "--map-group=65534"]
  for prefix in (runner, unshare):
    try:
      done = subprocess.run(prefix + probe, capture_output=True, cwd="/")
    except OSError:
      continue
    if done.returncode == 0:
      return prefix
  return None


@pytest.mark.slow  # the whole suite again (about a minute)
def test_attacks_as_an_unprivileged_user(tmp_path):
  if os.environ.get("RLJAX_ATTACKS_UNPRIVILEGED"):
    pytest.skip("this is the unprivileged run")
  if os.geteuid() != 0:
    pytest.skip("already unprivileged: the tests above are that run")
  prefix = _unprivileged_prefix()
  if prefix is None:
    pytest.skip("no way to run as uid 65534 here")
  check = "import os; print(os.getuid())"
  uid = subprocess.run(
    prefix + [sys.executable, "-c", check], capture_output=True, text=True
  ).stdout.strip()
  assert uid == "65534", uid
  home = tmp_path / "home"  # not /tmp itself, which in the jail is scratch
  home.mkdir()
  home.chmod(0o777)
  tmp_path.chmod(0o755)
  done = subprocess.run(
    prefix
    + [
      sys.executable,
      "-m",
      "pytest",
      "-q",
      "-p",
      "no:cacheprovider",
      "-p",
      "no:randomly",
      "-k",
      "not unprivileged",
      __file__,
    ],
    env={**os.environ, "RLJAX_ATTACKS_UNPRIVILEGED": "1", "HOME": str(home)},
    capture_output=True,
    text=True,
    cwd="/",
    timeout=900,
  )
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert " passed" in done.stdout and " failed" not in done.stdout
