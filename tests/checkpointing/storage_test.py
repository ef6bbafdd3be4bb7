"""Unwritable or full checkpoint directories: one `CheckpointError` line that
names the directory (and step), the OS error and the fix, raised within
seconds, with the previous checkpoints left intact.

We run as root, so chmod does not stop writes: the unwritable directories are
paths under /proc and /sys, and a read-only or tiny tmpfs mounted by the test
(skipped where `mount` is not permitted). A full disk during a save is a real
full tmpfs (tensorstore's own write error) and, everywhere, an
``OSError(ENOSPC)`` raised by the file write of orbax's JSON item (the lowest
Python layer orbax writes through; tensorstore's C++ writes cannot be patched).
"""

import errno
import os
import shutil
import subprocess
import threading

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rljax._src.errors import CheckpointError
from rljax.checkpointing import Checkpointer
from rljax.checkpointing import _checkpointer

_UNWRITABLE = [errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT]
_NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"


def _one_line(error, *parts):
  message = str(error)
  assert "\n" not in message, message
  for part in parts:
    assert part in message, (part, message)
  return message


def _within(seconds, fn):
  """fn()'s exception (or None); fails if it has not returned in `seconds`."""
  box = {}

  def run():
    try:
      fn()
    except BaseException as e:  # noqa: B036 -- handed to the test
      box["error"] = e

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(seconds)
  assert not thread.is_alive(), f"still blocked after {seconds} s"
  return box.get("error")


@pytest.mark.parametrize(
  "directory", ["/proc/rljax-checkpoints/run", "/sys/rljax-checkpoints"]
)
def test_an_unwritable_directory_fails_at_once_in_one_line(directory):
  error = _within(60, lambda: Checkpointer(directory))
  assert isinstance(error, CheckpointError), repr(error)
  message = _one_line(error, directory, "output.checkpoint_directory")
  assert any(os.strerror(code) in message for code in _UNWRITABLE), message


@pytest.fixture
def tmpfs(tmp_path):
  """mount(size, *options): a fresh tmpfs at tmp_path/mnt, or a skip."""
  mnt = tmp_path / "mnt"
  mnt.mkdir()
  mounted = []

  def mount(size, *options):
    if shutil.which("mount") is None:
      pytest.skip("no mount command")
    opts = ",".join([f"size={size}", *options])
    proc = subprocess.run(
      ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)],
      capture_output=True,
      text=True,
    )
    if proc.returncode:
      pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    mounted.append(mnt)
    return mnt

  yield mount
  for path in mounted:
    subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_read_only_filesystem_fails_at_init(tmpfs):
  mnt = tmpfs("1m", "ro")
  with pytest.raises(CheckpointError) as info:
    Checkpointer(mnt / "run")
  _one_line(
    info.value,
    str(mnt / "run"),
    os.strerror(errno.EROFS),
    "output.checkpoint_directory",
  )


def test_a_full_disk_fails_at_init(tmpfs):
  mnt = tmpfs("256k")
  (mnt / "ckpt").mkdir()
  fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
  with pytest.raises(OSError, match=_NO_SPACE):
    while True:
      os.write(fd, b"\0" * 4096)
  os.close(fd)
  with pytest.raises(CheckpointError) as info:
    Checkpointer(mnt / "ckpt")
  _one_line(info.value, str(mnt / "ckpt"), _NO_SPACE, "free space")


def _assert_step_1_intact(root):
  like = {"x": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=_one())}
  with Checkpointer(root) as ckpt:
    assert ckpt.all_steps() == [1]
    out = ckpt.restore(like)
  assert out.step == 1 and out.skipped == ()
  np.testing.assert_array_equal(out.state["x"], np.arange(8.0))
  # The failed save's tmp directory was no checkpoint, and is gone now.
  assert sorted(p.name for p in epath.Path(root).iterdir()) == ["1"]


def _one():
  return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def test_a_disk_that_fills_during_an_async_save(tmpfs):
  mnt = tmpfs("1m")
  ckpt = Checkpointer(mnt, keep=1)
  assert ckpt.save(1, {"x": jnp.arange(8.0)})
  ckpt.wait()
  # 4 MB of random floats (zstd cannot shrink them) on a 1 MB disk.
  big = {"x": jax.random.normal(jax.random.key(0), (1024, 1024))}
  assert _within(60, lambda: ckpt.save(2, big)) is None  # async: returns
  error = _within(60, ckpt.wait)
  assert isinstance(error, CheckpointError), repr(error)
  _one_line(error, "step 2", str(mnt), _NO_SPACE, "free space")
  # keep=1 did not delete step 1 for the failed step 2.
  assert ckpt.all_steps() == [1]
  assert _within(60, ckpt.close) is None  # reported once, not again
  _assert_step_1_intact(mnt)


@pytest.mark.parametrize("async_save", [True, False])
def test_no_space_from_the_file_layer_is_one_line(
  tmp_path, monkeypatch, async_save
):
  write_text = epath.gpath.PosixGPath.write_text

  def full_disk(self, *args, **kwargs):
    if self.name == "metadata":  # the metadata item's JSON file
      raise OSError(errno.ENOSPC, _NO_SPACE, str(self))
    return write_text(self, *args, **kwargs)

  ckpt = Checkpointer(tmp_path, keep=1, async_save=async_save)
  ckpt.save(1, {"x": jnp.arange(8.0)})
  ckpt.wait()
  monkeypatch.setattr(epath.gpath.PosixGPath, "write_text", full_disk)

  def save_and_wait():
    ckpt.save(2, {"x": jnp.zeros(8)}, metadata={"run": "a"})
    ckpt.wait()

  error = _within(60, save_and_wait)
  assert isinstance(error, CheckpointError), repr(error)
  _one_line(error, "step 2", str(tmp_path), _NO_SPACE, "free space")
  assert ckpt.all_steps() == [1]
  monkeypatch.undo()
  assert _within(60, ckpt.close) is None
  _assert_step_1_intact(tmp_path)


def _orbax_cleanup_finds_a_writer(monkeypatch):
  """orbax's one rmtree of tmp directories meets a writer still at work."""

  def refilled(self):
    raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY))

  monkeypatch.setattr(
    ocp.CheckpointManager, "_maybe_await_cleanup_tmp_directory", refilled
  )


def test_opening_waits_out_the_writers_of_a_failed_save(tmp_path, monkeypatch):
  # A failed save of this process can leave writers finishing in its tmp
  # directory; opening the directory again retries until they are done.
  ckpt = Checkpointer(tmp_path, keep=1)
  ckpt.save(1, {"x": jnp.arange(8.0)})
  ckpt.close()
  tmp = tmp_path / "2.orbax-checkpoint-tmp" / "state.orbax-checkpoint-tmp"
  tmp.mkdir(parents=True)
  stop = threading.Event()

  def writer():
    for i in range(10_000):
      if stop.wait(0.001):
        return
      try:
        (tmp / f"chunk_{i}").write_bytes(b"\0" * 64)
      except FileNotFoundError:  # the directory was deleted under it
        return

  thread = threading.Thread(target=writer)
  thread.start()
  threading.Timer(0.3, stop.set).start()
  _orbax_cleanup_finds_a_writer(monkeypatch)
  try:
    _assert_step_1_intact(tmp_path)
  finally:
    stop.set()
    thread.join()


def test_a_tmp_directory_that_cannot_go_is_one_line(tmp_path, monkeypatch):
  ckpt = Checkpointer(tmp_path, keep=1)
  ckpt.save(1, {"x": jnp.arange(8.0)})
  ckpt.close()
  (tmp_path / "2.orbax-checkpoint-tmp").mkdir()
  _orbax_cleanup_finds_a_writer(monkeypatch)

  def stuck(path):
    raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), str(path))

  monkeypatch.setattr(_checkpointer.shutil, "rmtree", stuck)
  monkeypatch.setattr(_checkpointer, "_TMP_CLEANUP_S", 0.2)
  with pytest.raises(CheckpointError) as info:
    Checkpointer(tmp_path)
  _one_line(
    info.value, str(tmp_path / "2.orbax-checkpoint-tmp"), "open it again"
  )
