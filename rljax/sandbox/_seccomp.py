"""The seccomp allow-list of a sandboxed call's process (standard library only).

Default deny: a system call not listed fails with EPERM (an `OSError` in
Python, never a kill, so a library probing for a feature degrades). What is
listed is what a Python program computing, reading its view of the file
system and writing its scratch directory needs; what is not is, among
others: execve/execveat, fork/vfork and clone without CLONE_THREAD (no new
process), socket/connect/bind (no network, including Unix sockets on the
file system), mknod/mknodat (no fifos or device nodes), ptrace,
process_vm_*, pidfd_*, setns/unshare/mount/pivot_root (no way out of the
namespaces), io_uring_* (it runs system calls the filter never sees), bpf,
perf_event_open, keyctl, userfaultfd, personality, prctl and seccomp.

Conditional entries (a 32-bit argument compared in the filter):
  clone        only with CLONE_THREAD (threads, not processes);
  kill/tgkill  only the process itself (its pid fixed when the filter is
               built: `raise_signal`, `abort` and thread signals work);
  prlimit64    only on itself (pid 0): reading, or lowering, its own limits.
clone3 fails with ENOSYS: its flags live in memory a filter cannot read, and
glibc then falls back to clone.

The worker loads this file by path (it may not import rljax), so it uses
the standard library only.
"""

import ctypes
import os
import struct

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_CLONE_THREAD = 0x00010000
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_BIT = 0x40000000
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_EPERM, _ENOSYS = 1, 38
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data

ALLOWED = (
  # files and descriptors (the mount namespace and Landlock decide where)
  "read write readv writev pread64 pwrite64 preadv pwritev preadv2"
  " pwritev2 close close_range lseek fstat stat lstat newfstatat statx"
  " statfs fstatfs access faccessat faccessat2 readlink readlinkat open"
  " openat openat2 getdents getdents64 getcwd chdir fchdir mkdir mkdirat"
  " rmdir unlink unlinkat rename renameat renameat2 link linkat symlink"
  " symlinkat chmod fchmod fchmodat utime utimes utimensat futimesat"
  " truncate ftruncate fsync fdatasync fallocate fadvise64 flock fcntl dup"
  " dup2 dup3 pipe pipe2 ioctl copy_file_range sendfile splice tee"
  " memfd_create"
  # memory
  " mmap munmap mprotect mremap madvise brk mincore msync mlock munlock"
  # signals delivered to itself, waiting
  " rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigtimedwait"
  " rt_sigsuspend sigaltstack poll ppoll select pselect6 epoll_create"
  " epoll_create1 epoll_ctl epoll_wait epoll_pwait epoll_pwait2 eventfd"
  " eventfd2 futex futex_waitv set_robust_list get_robust_list"
  " set_tid_address rseq membarrier restart_syscall wait4 waitid"
  # time, timers signalling itself (SIGALRM time-outs), identity
  " alarm setitimer getitimer timer_create timer_settime timer_gettime"
  " timer_getoverrun timer_delete timerfd_create timerfd_settime"
  " timerfd_gettime pause"
  " nanosleep clock_nanosleep clock_gettime clock_getres gettimeofday time"
  " times getrusage sysinfo uname getpid gettid getppid getuid geteuid"
  " getgid getegid getresuid getresgid getgroups getpgrp getpgid getsid"
  " sched_yield sched_getaffinity sched_getparam sched_getscheduler"
  " sched_get_priority_max sched_get_priority_min getcpu getpriority"
  " getrandom umask arch_prctl exit exit_group"
  # an unnamed connected pair (asyncio's self-pipe); no socket() or connect()
  " socketpair sendto recvfrom sendmsg recvmsg shutdown getsockopt"
  " getsockname getpeername"
).split()
CONDITIONAL = ("clone", "kill", "tgkill", "prlimit64")
NOT_IMPLEMENTED = ("clone3",)

# System call numbers, from the kernel's uapi headers (asm/unistd_64.h on
# x86_64, asm-generic/unistd.h on aarch64), for the names above and the
# refusals the tests check.
# fmt: off
SYSCALLS = {
  "x86_64": {
    "read": 0, "write": 1, "open": 2, "close": 3, "stat": 4, "fstat": 5,
    "lstat": 6, "poll": 7, "lseek": 8, "mmap": 9, "mprotect": 10,
    "munmap": 11, "brk": 12, "rt_sigaction": 13, "rt_sigprocmask": 14,
    "rt_sigreturn": 15, "ioctl": 16, "pread64": 17, "pwrite64": 18,
    "readv": 19, "writev": 20, "access": 21, "pipe": 22, "select": 23,
    "sched_yield": 24, "mremap": 25, "msync": 26, "mincore": 27,
    "madvise": 28, "dup": 32, "dup2": 33, "pause": 34, "nanosleep": 35,
    "getitimer": 36, "alarm": 37, "setitimer": 38, "getpid": 39,
    "sendfile": 40, "socket": 41, "connect": 42, "accept": 43, "sendto": 44,
    "recvfrom": 45, "sendmsg": 46, "recvmsg": 47, "shutdown": 48, "bind": 49,
    "listen": 50, "getsockname": 51, "getpeername": 52, "socketpair": 53,
    "getsockopt": 55, "clone": 56, "fork": 57, "vfork": 58, "execve": 59,
    "exit": 60, "wait4": 61, "kill": 62, "uname": 63, "fcntl": 72,
    "flock": 73, "fsync": 74, "fdatasync": 75, "truncate": 76,
    "ftruncate": 77, "getdents": 78, "getcwd": 79, "chdir": 80, "fchdir": 81,
    "rename": 82, "mkdir": 83, "rmdir": 84, "link": 86, "unlink": 87,
    "symlink": 88, "readlink": 89, "chmod": 90, "fchmod": 91, "umask": 95,
    "gettimeofday": 96, "getrusage": 98, "sysinfo": 99, "times": 100,
    "ptrace": 101, "getuid": 102, "getgid": 104, "geteuid": 107,
    "getegid": 108, "getppid": 110, "getpgrp": 111, "setsid": 112,
    "getgroups": 115, "getresuid": 118, "getresgid": 120, "getpgid": 121,
    "getsid": 124, "rt_sigpending": 127, "rt_sigtimedwait": 128,
    "rt_sigsuspend": 130, "sigaltstack": 131, "utime": 132, "mknod": 133,
    "personality": 135, "statfs": 137, "fstatfs": 138, "getpriority": 140,
    "sched_getparam": 143, "sched_getscheduler": 145,
    "sched_get_priority_max": 146, "sched_get_priority_min": 147,
    "mlock": 149, "munlock": 150, "pivot_root": 155, "prctl": 157,
    "arch_prctl": 158, "chroot": 161, "mount": 165, "umount2": 166,
    "gettid": 186, "tkill": 200, "time": 201, "futex": 202,
    "sched_getaffinity": 204, "epoll_create": 213, "getdents64": 217,
    "set_tid_address": 218, "restart_syscall": 219, "fadvise64": 221,
    "timer_create": 222, "timer_settime": 223, "timer_gettime": 224,
    "timer_getoverrun": 225, "timer_delete": 226, "clock_gettime": 228,
    "clock_getres": 229, "clock_nanosleep": 230, "exit_group": 231,
    "epoll_wait": 232, "epoll_ctl": 233, "tgkill": 234, "utimes": 235,
    "waitid": 247, "keyctl": 250, "openat": 257, "mkdirat": 258,
    "mknodat": 259, "futimesat": 261, "newfstatat": 262, "unlinkat": 263,
    "renameat": 264, "linkat": 265, "symlinkat": 266, "readlinkat": 267,
    "fchmodat": 268, "faccessat": 269, "pselect6": 270, "ppoll": 271,
    "unshare": 272, "set_robust_list": 273, "get_robust_list": 274,
    "splice": 275, "tee": 276, "utimensat": 280, "epoll_pwait": 281,
    "timerfd_create": 283, "eventfd": 284, "fallocate": 285,
    "timerfd_settime": 286, "timerfd_gettime": 287, "accept4": 288,
    "eventfd2": 290, "epoll_create1": 291, "dup3": 292, "pipe2": 293,
    "preadv": 295, "pwritev": 296, "perf_event_open": 298, "prlimit64": 302,
    "setns": 308, "getcpu": 309, "process_vm_readv": 310,
    "process_vm_writev": 311, "renameat2": 316, "seccomp": 317,
    "getrandom": 318, "memfd_create": 319, "bpf": 321, "execveat": 322,
    "userfaultfd": 323, "membarrier": 324, "copy_file_range": 326,
    "preadv2": 327, "pwritev2": 328, "statx": 332, "rseq": 334,
    "pidfd_send_signal": 424, "io_uring_setup": 425, "pidfd_open": 434,
    "clone3": 435, "close_range": 436, "openat2": 437, "pidfd_getfd": 438,
    "faccessat2": 439, "epoll_pwait2": 441, "futex_waitv": 449,
  },
  "aarch64": {
    "getcwd": 17, "eventfd2": 19, "epoll_create1": 20, "epoll_ctl": 21,
    "epoll_pwait": 22, "dup": 23, "dup3": 24, "fcntl": 25, "ioctl": 29,
    "flock": 32, "mknodat": 33, "mkdirat": 34, "unlinkat": 35,
    "symlinkat": 36, "linkat": 37, "renameat": 38, "umount2": 39, "mount": 40,
    "pivot_root": 41, "statfs": 43, "fstatfs": 44, "truncate": 45,
    "ftruncate": 46, "fallocate": 47, "faccessat": 48, "chdir": 49,
    "fchdir": 50, "chroot": 51, "fchmod": 52, "fchmodat": 53, "openat": 56,
    "close": 57, "pipe2": 59, "getdents64": 61, "lseek": 62, "read": 63,
    "write": 64, "readv": 65, "writev": 66, "pread64": 67, "pwrite64": 68,
    "preadv": 69, "pwritev": 70, "sendfile": 71, "pselect6": 72, "ppoll": 73,
    "splice": 76, "tee": 77, "readlinkat": 78, "newfstatat": 79, "fstat": 80,
    "fsync": 82, "fdatasync": 83, "timerfd_create": 85, "timerfd_settime": 86,
    "timerfd_gettime": 87, "utimensat": 88, "personality": 92, "exit": 93,
    "exit_group": 94, "waitid": 95, "set_tid_address": 96, "unshare": 97,
    "futex": 98, "set_robust_list": 99, "get_robust_list": 100,
    "nanosleep": 101, "getitimer": 102, "setitimer": 103, "timer_create": 107,
    "timer_gettime": 108, "timer_getoverrun": 109, "timer_settime": 110,
    "timer_delete": 111, "clock_gettime": 113, "clock_getres": 114,
    "clock_nanosleep": 115, "ptrace": 117, "sched_getscheduler": 120,
    "sched_getparam": 121, "sched_getaffinity": 123, "sched_yield": 124,
    "sched_get_priority_max": 125, "sched_get_priority_min": 126,
    "restart_syscall": 128, "kill": 129, "tkill": 130, "tgkill": 131,
    "sigaltstack": 132, "rt_sigsuspend": 133, "rt_sigaction": 134,
    "rt_sigprocmask": 135, "rt_sigpending": 136, "rt_sigtimedwait": 137,
    "rt_sigreturn": 139, "getpriority": 141, "getresuid": 148,
    "getresgid": 150, "times": 153, "getpgid": 155, "getsid": 156,
    "setsid": 157, "getgroups": 158, "uname": 160, "getrusage": 165,
    "umask": 166, "prctl": 167, "getcpu": 168, "gettimeofday": 169,
    "getpid": 172, "getppid": 173, "getuid": 174, "geteuid": 175,
    "getgid": 176, "getegid": 177, "gettid": 178, "sysinfo": 179,
    "socket": 198, "socketpair": 199, "bind": 200, "listen": 201,
    "accept": 202, "connect": 203, "getsockname": 204, "getpeername": 205,
    "sendto": 206, "recvfrom": 207, "getsockopt": 209, "shutdown": 210,
    "sendmsg": 211, "recvmsg": 212, "brk": 214, "munmap": 215, "mremap": 216,
    "keyctl": 219, "clone": 220, "execve": 221, "mmap": 222, "fadvise64": 223,
    "mprotect": 226, "msync": 227, "mlock": 228, "munlock": 229,
    "mincore": 232, "madvise": 233, "perf_event_open": 241, "accept4": 242,
    "wait4": 260, "prlimit64": 261, "setns": 268, "process_vm_readv": 270,
    "process_vm_writev": 271, "renameat2": 276, "seccomp": 277,
    "getrandom": 278, "memfd_create": 279, "bpf": 280, "execveat": 281,
    "userfaultfd": 282, "membarrier": 283, "copy_file_range": 285,
    "preadv2": 286, "pwritev2": 287, "statx": 291, "rseq": 293,
    "pidfd_send_signal": 424, "io_uring_setup": 425, "pidfd_open": 434,
    "clone3": 435, "close_range": 436, "openat2": 437, "pidfd_getfd": 438,
    "faccessat2": 439, "epoll_pwait2": 441, "futex_waitv": 449,
  },
}
# fmt: on


def supported(machine: str | None = None) -> bool:
  """Whether there is a filter for this machine's architecture."""
  return (machine or os.uname().machine) in SYSCALLS


def allow_list(pid: int, machine: str | None = None) -> bytes:
  """The classic-BPF program of the allow-list for process `pid`.

  Args:
    pid: the process the filter is for (kill and tgkill may target only it).
    machine: `os.uname().machine`; default this machine's.

  Returns:
    The program as packed `struct sock_filter`s.

  Raises:
    ValueError: no table for `machine`.
  """
  machine = machine or os.uname().machine
  if machine not in SYSCALLS:
    raise ValueError(f"no seccomp table for {machine}")
  table = SYSCALLS[machine]
  deny, enosys = _RET_ERRNO | _EPERM, _RET_ERRNO | _ENOSYS
  code = [
    (_LD, 0, 0, _ARCH),
    (_JEQ, 1, 0, _AUDIT_ARCH[machine]),
    (_RET, 0, 0, deny),
    (_LD, 0, 0, _NR),
  ]
  if machine == "x86_64":  # the x32 ABI numbers its calls from 0x40000000
    code += [(_JGE, 0, 1, _X32_BIT), (_RET, 0, 0, deny)]
  for name in ALLOWED:
    if name in table:
      code += [(_JEQ, 0, 1, table[name]), (_RET, 0, 0, _RET_ALLOW)]
  for name in NOT_IMPLEMENTED:
    code += [(_JEQ, 0, 1, table[name]), (_RET, 0, 0, enosys)]
  code += _argument_rule(table["clone"], _JSET, _CLONE_THREAD)
  code += _argument_rule(table["kill"], _JEQ, pid)
  code += _argument_rule(table["tgkill"], _JEQ, pid)
  code += _argument_rule(table["prlimit64"], _JEQ, 0)
  code.append((_RET, 0, 0, deny))
  return b"".join(struct.pack("=HBBI", *insn) for insn in code)


def _argument_rule(nr: int, test: int, value: int) -> list[tuple]:
  """Allow call `nr` when its first argument's low 32 bits pass `test`.

  The accumulator holds the call number on entry; another call skips the
  rule with it unchanged, this one is decided inside the rule.
  """
  return [
    (_JEQ, 0, 4, nr),
    (_LD, 0, 0, _ARG0),  # the low 32 bits (little-endian)
    (test, 0, 1, value),
    (_RET, 0, 0, _RET_ALLOW),
    (_RET, 0, 0, _RET_ERRNO | _EPERM),
  ]


def install(program: bytes) -> str:
  """Install `program` in this process (no_new_privs first); "" or why not."""

  class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

  code = ctypes.create_string_buffer(program, len(program))
  fprog = Program(len(program) // 8, ctypes.addressof(code))
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
      return f"no_new_privs: {os.strerror(ctypes.get_errno())}"
    status = libc.prctl(
      _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0
    )
  except (OSError, AttributeError) as e:
    return f"prctl unavailable: {e}"
  return "" if status == 0 else f"seccomp: {os.strerror(ctypes.get_errno())}"
