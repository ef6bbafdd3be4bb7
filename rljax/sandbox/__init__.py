"""Run functions on untrusted input in a separate, limited process.

Rewards score model-generated text, and some scorers (sympy's `parse_expr`,
which reasoning-gym calls) evaluate the text as Python. `Sandbox` runs such
a function, `fn(*args)`, in a long-lived worker process instead of the
trainer, one fresh fork per call by default:

  with sandbox.Sandbox(preload=("my_scorers",), timeout=5) as box:
    outcomes = box.map(my_scorers.score, [(text, gold) for ...])

Layers (`Sandbox.layers` says which are active; an unavailable one is
logged once as a warning):
  process        a separate interpreter (`python -I`); a crash, a segfault,
                 a MemoryError or `os._exit` in a call is an `Outcome`, never
                 an exception or a crash in the caller.
  timeout        a wall-clock limit per call: the call's process is killed
                 (or the worker, restarted lazily at the next call).
  rlimits        address space, CPU seconds per call, file size, open files,
                 no core files; RLIMIT_NPROC 0 (no fork, no threads) when the
                 worker is not root.
  scratch_dir    a fresh temporary directory as cwd, HOME and TMPDIR, deleted
                 by `close()` or at interpreter exit.
  minimal_env    none of the host's environment variables (the import path
                 is sent over the pipe, not through PYTHONPATH).
  network        a new network namespace, with only a downed loopback
                 (`unshare(CLONE_NEWNET)`, in a new user namespace when not
                 root); where the kernel refuses it, no network isolation.
  unprivileged_uid  as root, the worker switches to uid/gid 65534.
  no_new_privs   `prctl(PR_SET_NO_NEW_PRIVS)`: no set-uid gains.
  no_exec        a seccomp filter in each call's process: no execve, no
                 fork (threads allowed); x86_64 and aarch64.
  audit_hook     `sys.addaudithook` after the worker's imports: refuses
                 process creation (os.system, subprocess, os.exec*,
                 os.posix_spawn, os.fork), signals to other processes,
                 sockets, ctypes, new interpreters, changing rlimits, and
                 writing, creating, renaming or removing files outside the
                 scratch directory, opening another process's /proc/<pid>
                 entries, and os.open of directories.
  fresh_process  each call runs in a new fork of the worker, so a call that
                 monkeypatches a scorer cannot change the next call's score.

Threat model. Model output is untrusted; the functions, their modules and
the configs are trusted. The layers are defence in depth, not a kernel
sandbox: the audit hook and rlimits live inside the same interpreter as the
untrusted input, and code that gains arbitrary execution there can forge
its own call's result, read any file the worker's uid can read, use open
file descriptors, and call native code already loaded (e.g. the private
`_posixsubprocess.fork_exec`, which raises no audit event; the no_exec
seccomp filter, RLIMIT_NPROC and the uid drop stop it). What the parent
guarantees regardless: it unpickles only plain data from the worker (no
class or function is looked up), bounds the size of every reply, and kills
the worker's whole process group at a deadline. Unix-domain sockets on the filesystem are not covered
by the network namespace. For adversarial code (an agent's Python tool),
combine this with a container or gVisor-style sandbox.
"""

from rljax.sandbox._jail import kernel_isolation_error
from rljax.sandbox._sandbox import STATUSES
from rljax.sandbox._sandbox import Outcome
from rljax.sandbox._sandbox import Sandbox
from rljax.sandbox._sandbox import SandboxError

__all__ = [
  "STATUSES",
  "kernel_isolation_error",
  "Outcome",
  "Sandbox",
  "SandboxError",
]
