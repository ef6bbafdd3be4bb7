"""Storage and read errors of checkpoints: which are the user's, which damage.

A storage error (no space, no permission, a read-only file system) is one the
user can fix, reported as a one-line `CheckpointError`; a read error on a
missing or corrupt file means the step is damaged (`_Damaged`), so `restore`
falls back past it. orbax and tensorstore wrap both, so the causes are
searched through the exception chain and tensorstore's messages.
"""

from collections.abc import Iterator
import errno
import json
import os
import re
import tempfile
from typing import Optional

from rljax._src.errors import CheckpointError

# Errors of the storage, not of rljax: the user can fix them.
_STORAGE_ERRNOS = frozenset(
  {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.EIO,
  }
)
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
# OS errors on reading a checkpoint that mean damage (not, say, EACCES).
_LOST = frozenset({errno.ENOENT, errno.EIO, errno.ENOTDIR, errno.EISDIR})
# How tensorstore reports an OS error and a damaged or missing file.
_TS_OS_ERROR = re.compile(r"os_error_code='?([0-9]+)")
_TS_DAMAGE = re.compile(
  r"(DATA_LOSS|NOT_FOUND|OUT_OF_RANGE|FAILED_PRECONDITION): "
)
_TS_DETAILS = re.compile(r"\s*\[(tensorstore_spec|source locations)=.*", re.S)


class _Damaged(Exception):
  """A step directory that cannot be restored; `reason` is one line."""

  def __init__(self, reason: str):
    super().__init__(reason)
    self.reason = reason


def _probe(directory: str) -> None:
  """Create `directory` and a file in it, or raise a one-line CheckpointError.

  The file gets a few KiB (flushed to disk), so a full disk fails here too.
  """
  try:
    os.makedirs(directory, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".rljax-write-probe-", dir=directory)
    try:
      os.write(fd, b"\0" * 4096)
      os.fsync(fd)
    finally:
      os.close(fd)
      os.unlink(name)
  except OSError as e:
    fix = (
      "free space on that disk or set output.checkpoint_directory to one "
      "with room"
      if e.errno in _NO_SPACE
      else "set output.checkpoint_directory to a writable directory"
    )
    where = f" ({e.filename})" if e.filename and e.filename != directory else ""
    raise CheckpointError(
      f"Cannot write checkpoints to {directory}: {e.strerror or e}{where}; "
      f"{fix}."
    ) from e


def _chain(error: BaseException) -> Iterator[BaseException]:
  """`error` and its causes."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def _unless_damaged(read):
  """read(), with a storage read error (damage) raised as `_Damaged`."""
  try:
    return read()
  except Exception as e:
    reason = _damage_reason(e)
    if reason is None:
      raise
    raise _Damaged(reason) from e


def _damage_reason(error: BaseException) -> Optional[str]:
  """One line on a damaged or missing file that `error` reports, or None."""
  for e in _chain(error):
    if isinstance(e, json.JSONDecodeError | UnicodeDecodeError):
      return _one_line(f"a JSON file of it is not valid JSON ({e})")
    if isinstance(e, OSError) and e.errno in _LOST:
      return _one_line(str(e))
    if isinstance(e, ValueError) and _TS_DAMAGE.match(str(e)):
      return _one_line(_TS_DETAILS.sub("", str(e)))
  return None


def _storage_cause(error: BaseException) -> Optional[tuple[int, str]]:
  """(errno, its text) of a storage error (no space, ...) in `error`."""
  for e in _chain(error):
    code = e.errno if isinstance(e, OSError) else None
    if code is None and (found := _TS_OS_ERROR.search(str(e))):
      code = int(found.group(1))
    if code in _STORAGE_ERRNOS:
      return code, os.strerror(code)
  return None


def _one_line(text: str, limit: int = 300) -> str:
  text = " ".join(text.split())
  return text if len(text) <= limit else text[: limit - 3] + "..."
