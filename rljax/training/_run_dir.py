"""A run's output directory: one run at a time, fresh starts, resumed logs.

* `lock` holds an exclusive `fcntl.flock` on ``<directory>/.rljax.lock``
  while a trainer writes there (its setup and `run`), so a second run into
  the same directory stops with a message naming the first (pid, host, start
  time) instead of interleaving logs and dropping checkpoints. The kernel
  releases the lock when the process ends, however it ends (kill -9
  included), so a crashed run never leaves a stale lock.
* `move_aside` clears the directory for a fresh start (``--fresh``): the
  previous run's files move to a sibling ``<directory>.previous-<time>``, so
  nothing is deleted and the two runs never mix.
* `truncate_jsonl` drops the records after a resumed step, so the steps a
  resumed run repeats appear once.

Only process 0 of a multi-host run writes the directory (logs, rollouts,
plots); the others neither lock nor move it.
"""

from collections.abc import Iterator
import contextlib
import datetime
import fcntl
import json
import logging
import os
import pathlib
import shutil
import socket
from typing import Optional

from rljax._src.errors import UserError

LOCK = ".rljax.lock"
_log = logging.getLogger("rljax")


@contextlib.contextmanager
def lock(directory: pathlib.Path, *, active: bool = True) -> Iterator[None]:
  """Hold the directory's run lock for the body; refuse if another holds it.

  Args:
    directory: the run's output directory (created if missing).
    active: False on processes that do not write the directory.

  Raises:
    UserError: another run holds the lock; the message names it.
  """
  if not active:
    yield
    return
  directory.mkdir(parents=True, exist_ok=True)
  path = directory / LOCK
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
      raise UserError(
        f"output.directory={str(directory)!r} is in use by another run"
        f" ({holder or 'holder unknown'}). Wait for it to finish, stop it,"
        " or give this run another output.directory."
      ) from None
    started = datetime.datetime.now().isoformat(timespec="seconds")
    os.ftruncate(fd, 0)
    os.pwrite(
      fd,
      f"pid {os.getpid()} on {socket.gethostname()}, since {started}".encode(),
      0,
    )
    yield
  finally:
    os.close(fd)  # closing the descriptor releases the flock


def previous_run(directory: pathlib.Path) -> list[pathlib.Path]:
  """The entries of `directory` that a run wrote (all but the lock file)."""
  if not directory.is_dir():
    return []
  return sorted(p for p in directory.iterdir() if p.name != LOCK)


def move_aside(
  directory: pathlib.Path, checkpoints: Optional[pathlib.Path] = None
) -> Optional[pathlib.Path]:
  """Move a previous run out of `directory` (and `checkpoints`, when that is
  a separate local folder) into ``<directory>.previous-<time>``.

  Args:
    directory: the run's output directory.
    checkpoints: a checkpoint directory outside `directory`, or None.

  Returns:
    Where the previous run went, or None when there was nothing to move.
  """
  entries = previous_run(directory)
  outside = checkpoints is not None and checkpoints.exists()
  if outside and directory.resolve() in checkpoints.resolve().parents:
    outside = False  # moved with the rest of the directory
  if not entries and not (outside and any(checkpoints.iterdir())):
    return None
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  target = directory.with_name(f"{directory.name}.previous-{stamp}")
  suffix = 0
  while target.exists():
    suffix += 1
    target = directory.with_name(f"{directory.name}.previous-{stamp}-{suffix}")
  target.mkdir(parents=True)
  for entry in entries:
    shutil.move(str(entry), str(target / entry.name))
  if outside:
    shutil.move(str(checkpoints), str(target / "checkpoint_directory"))
  _log.warning(
    "--fresh: moved the previous run in %s to %s.", directory, target
  )
  return target


def truncate_jsonl(path: pathlib.Path, last_step: int) -> int:
  """Drop the records of `path` with ``step > last_step``; returns how many.

  The file is rewritten through a temporary file and a rename, so a crash
  leaves either the old or the new file. Lines that are not JSON records
  (a line cut short by a crash) are dropped too.
  """
  if not path.is_file():
    return 0
  kept, dropped = [], 0
  with open(path) as f:
    for line in f:
      try:
        record = json.loads(line)
        step = int(record["step"])
      except (ValueError, KeyError, TypeError):
        dropped += 1
        continue
      if step > last_step:
        dropped += 1
      else:
        kept.append(line if line.endswith("\n") else line + "\n")
  if dropped:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
      f.writelines(kept)
    os.replace(tmp, path)
  return dropped
