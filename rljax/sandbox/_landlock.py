"""Landlock rules for a sandboxed call's process (standard library only).

Landlock (Linux 5.13+) lets an unprivileged process restrict itself, for
good, in the kernel: here, reading only beneath the given roots, writing
(creating, removing, renaming, truncating) only beneath the scratch
directory and into /dev/null, executing nothing, and, where the kernel's
Landlock ABI has them, no TCP bind or connect (ABI 4) and no signals or
abstract Unix sockets reaching processes outside the call (ABI 6). Rights
the kernel does not know are left out, as Landlock's documentation
prescribes (best effort).

The worker loads this file by path (it may not import rljax).
"""

import ctypes
import os
import struct

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # every arch
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1, 2, 4, 8
_REMOVE_DIR, _REMOVE_FILE, _MAKE_CHAR, _MAKE_DIR = 16, 32, 64, 128
_MAKE_REG, _MAKE_SOCK, _MAKE_FIFO, _MAKE_BLOCK = 256, 512, 1024, 2048
_MAKE_SYM, _REFER, _TRUNCATE, _IOCTL_DEV = 4096, 8192, 16384, 32768
_READ = _READ_FILE | _READ_DIR
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2


def abi() -> int:
  """The kernel's Landlock ABI version; 0 where it has none (or disabled)."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(
      _CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION
    )
  except (OSError, AttributeError):
    return 0
  return max(int(version), 0)


def handled_fs(version: int) -> int:
  """The file-system rights ABI `version` can restrict."""
  rights = (1 << 13) - 1  # ABI 1: execute .. make_sym
  if version >= 2:
    rights |= _REFER
  if version >= 3:
    rights |= _TRUNCATE
  if version >= 5:
    rights |= _IOCTL_DEV
  return rights


def restrict(read_roots, write_roots, write_files=("/dev/null",)) -> str:
  """Restrict this process (and its future threads) for good; "" or why not.

  Args:
    read_roots: directories (or files) beneath which files may be read.
    write_roots: directories beneath which files may also be written,
      created, removed and renamed.
    write_files: single files that may be opened for writing.

  Returns:
    "" when the rules are in force, else why not (no Landlock here, a
    missing root is skipped silently).
  """
  version = abi()
  if version < 1:
    return "the kernel has no Landlock (Linux 5.13+, lsm=landlock)"
  libc = ctypes.CDLL(None, use_errno=True)
  libc.syscall.restype = ctypes.c_long
  fs = handled_fs(version)
  attr = struct.pack("=Q", fs)
  if version >= 4:
    attr += struct.pack("=Q", _NET_BIND_TCP | _NET_CONNECT_TCP)
  if version >= 6:
    attr += struct.pack("=Q", _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL)
  buffer = ctypes.create_string_buffer(attr, len(attr))
  ruleset = libc.syscall(_CREATE_RULESET, buffer, ctypes.c_size_t(len(attr)), 0)
  if ruleset < 0:
    return f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}"
  try:
    rules = [(p, _READ) for p in read_roots]
    rules += [(p, fs & ~_EXECUTE) for p in write_roots]
    rules += [(p, _WRITE_FILE | _READ_FILE) for p in write_files]
    for path, rights in rules:
      why = _add_rule(libc, ruleset, path, rights)
      if why:
        return why
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
      return f"no_new_privs: {os.strerror(ctypes.get_errno())}"
    if libc.syscall(_RESTRICT_SELF, ruleset, 0) != 0:
      return f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}"
  finally:
    os.close(ruleset)
  return ""


def _add_rule(libc, ruleset: int, path: str, rights: int) -> str:
  """Allow `rights` beneath `path`; "" (also for a missing path) or why not."""
  try:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
  except OSError:
    return ""
  try:
    if not os.path.isdir(path):
      rights &= _FILE_RIGHTS
    beneath = struct.pack("=Qi", rights, fd)  # packed struct: 12 bytes
    buffer = ctypes.create_string_buffer(beneath, len(beneath))
    if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, buffer, 0) != 0:
      return f"landlock_add_rule({path}): {os.strerror(ctypes.get_errno())}"
  finally:
    os.close(fd)
  return ""
