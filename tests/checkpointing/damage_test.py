"""Damaged checkpoints: restore falls back past damaged steps (truncated,
zeroed, deleted or bit-flipped files, garbage JSON, missing items, stray step
directories) with a one-line warning, never loads a flipped bit, and raises
one `CheckpointError` when nothing intact is left or an explicit step is
damaged. A changed model is not damage: it raises at once."""

import logging
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax._src.errors import CheckpointError
from rljax.checkpointing import Checkpointer

_CHECKSUMS = "rljax_checksums.json"  # the per-step manifest of file checksums


def _state(step):
  """Random (incompressible) arrays, so a flipped byte lands in raw data."""
  key = jax.random.key(step)
  return {
    "w": jax.random.normal(key, (64, 256)),
    "b": jnp.full((3, 4), float(step)),
    "step": jnp.int32(step),
  }


def _like():
  return jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
    _state(0),
  )


@pytest.fixture
def saved(tmp_path):
  """Steps 1 and 2, each with a data-iterator state and metadata."""
  root = tmp_path / "ckpt"
  with Checkpointer(root, keep=None) as ckpt:
    for step in (1, 2):
      ckpt.save(
        step, _state(step), data_state={"next": step}, metadata={"at": step}
      )
  return root


def _array_file(step_dir):
  """The largest OCDBT data file of the step's state item (the arrays)."""
  files = [p for p in (step_dir / "state").rglob("*") if p.parent.name == "d"]
  return max(files, key=lambda p: p.stat().st_size)


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(10)


def _zero(path):
  path.write_bytes(b"\0" * path.stat().st_size)


def _flip(path):
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0x10
  path.write_bytes(bytes(data))


# What orbax itself notices (with or without checksums).
_DAMAGE = {
  "truncated array data": lambda d: _truncate(_array_file(d)),
  "zeroed array data": lambda d: _zero(_array_file(d)),
  "zeroed OCDBT manifest": lambda d: _zero(d / "state" / "manifest.ocdbt"),
  "deleted array data": lambda d: _array_file(d).unlink(),
  "deleted tree metadata": lambda d: (d / "state" / "_METADATA").unlink(),
  "garbage metadata JSON": lambda d: (d / "metadata" / "metadata").write_text(
    "{garbage"
  ),
  "garbage data JSON": lambda d: (
    d / "data" / "process_0-of-1.json"
  ).write_text("{garbage"),
  "missing state item": lambda d: shutil.rmtree(d / "state"),
  "missing metadata item": lambda d: shutil.rmtree(d / "metadata"),
}
# What only the checksums notice: orbax would load these silently.
_SILENT = {
  "flipped bit in array data": lambda d: _flip(_array_file(d)),
  "zeroed per-process OCDBT manifest": lambda d: _zero(
    d / "state" / "ocdbt.process_0" / "manifest.ocdbt"
  ),
}


def _rljax_warnings(caplog, text):
  return [
    r.getMessage()
    for r in caplog.records
    if r.name == "rljax"
    and r.levelno == logging.WARNING
    and text in r.getMessage()
  ]


def _assert_fell_back_to_step_1(saved, caplog, damage):
  caplog.set_level(logging.WARNING, logger="rljax")
  with Checkpointer(saved) as ckpt:
    out = ckpt.restore(_like())
    assert out.step == 1
    np.testing.assert_array_equal(out.state["w"], _state(1)["w"])
    assert out.data_state == {"next": 1} and out.metadata == {"at": 1}
    assert [step for step, _ in out.skipped] == [2]
    (reason,) = [reason for _, reason in out.skipped]
    lines = _rljax_warnings(caplog, "step 2")
    assert all("\n" not in line for line in lines)
    assert [line for line in lines if reason in line and str(saved) in line]
    # An explicit step is never silently replaced by another one.
    with pytest.raises(CheckpointError, match="step 2") as info:
      ckpt.restore(_like(), step=2)
    assert "\n" not in str(info.value)
  return reason


@pytest.mark.parametrize("damage", sorted(_DAMAGE))
def test_damaged_latest_step_falls_back_to_the_previous(saved, caplog, damage):
  _DAMAGE[damage](saved / "2")
  _assert_fell_back_to_step_1(saved, caplog, damage)


@pytest.mark.parametrize("damage", sorted(_DAMAGE))
def test_damage_is_found_without_checksums_too(saved, caplog, damage):
  # Checkpoints written before checksums (or whose manifest was lost).
  for step in (1, 2):
    (saved / str(step) / _CHECKSUMS).unlink(missing_ok=True)
  _DAMAGE[damage](saved / "2")
  _assert_fell_back_to_step_1(saved, caplog, damage)


@pytest.mark.parametrize("damage", sorted(_SILENT))
def test_silent_corruption_is_caught_by_the_checksums(saved, caplog, damage):
  _SILENT[damage](saved / "2")
  reason = _assert_fell_back_to_step_1(saved, caplog, damage)
  assert "checksum mismatch" in reason and "state/" in reason


def test_a_checkpoint_without_checksums_restores_with_a_warning(saved, caplog):
  caplog.set_level(logging.WARNING, logger="rljax")
  (saved / "2" / _CHECKSUMS).unlink(missing_ok=True)
  with Checkpointer(saved) as ckpt:
    out = ckpt.restore(_like())
  assert out.step == 2 and out.skipped == ()
  (line,) = _rljax_warnings(caplog, "step 2")
  assert "checksum" in line and "\n" not in line


def test_checksums_are_written_for_sync_and_async_saves(tmp_path):
  for async_save in (True, False):
    root = tmp_path / str(async_save)
    with Checkpointer(root, async_save=async_save) as ckpt:
      ckpt.save(1, _state(1), data_state={"next": 1}, metadata={"at": 1})
    text = (root / "1" / _CHECKSUMS).read_text()
    for item in ("state/", "data/process_0-of-1.json", "metadata/metadata"):
      assert item in text


def test_stray_step_directories_are_not_checkpoints(saved, caplog):
  caplog.set_level(logging.WARNING, logger="rljax")
  (saved / "7").mkdir()  # left by a user or a crashed copy
  with Checkpointer(saved, keep=2) as ckpt:
    assert ckpt.all_steps() == [1, 2] and ckpt.latest_step() == 2
    out = ckpt.restore(_like())
    assert out.step == 2
    assert [step for step, _ in out.skipped] == [7]
    assert _rljax_warnings(caplog, "step 7")
    # It neither blocks later saves nor counts against keep=2.
    assert ckpt.save(3, _state(3))
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]
    assert ckpt.save(7, _state(7))  # takes the empty directory's place
    ckpt.wait()
    assert ckpt.all_steps() == [3, 7]
    assert ckpt.restore(_like()).step == 7


def test_a_stray_directory_with_files_is_never_overwritten(saved):
  (saved / "3").mkdir()
  (saved / "3" / "notes.txt").write_text("not a checkpoint")
  with Checkpointer(saved) as ckpt:
    assert ckpt.latest_step() == 2
    with pytest.raises(CheckpointError, match="3.*not a finished checkpoint"):
      ckpt.save(3, _state(3))
  assert (saved / "3" / "notes.txt").read_text() == "not a checkpoint"


def test_saves_after_a_fallback_replace_the_damaged_steps(saved, caplog):
  _truncate(_array_file(saved / "2"))
  with Checkpointer(saved, keep=None) as ckpt:
    assert ckpt.restore(_like()).step == 1
    # The run goes on from step 1: its new step 2 replaces the damaged one.
    assert ckpt.save(2, _state(20))
    ckpt.wait()
    out = ckpt.restore(_like())
  assert out.step == 2 and out.skipped == ()
  np.testing.assert_array_equal(out.state["w"], _state(20)["w"])


def test_no_intact_checkpoint_lists_each_step_and_what_to_do(saved):
  _truncate(_array_file(saved / "1"))
  _flip(_array_file(saved / "2"))
  with Checkpointer(saved) as ckpt:
    with pytest.raises(CheckpointError) as info:
      ckpt.restore(_like())
  message = str(info.value)
  assert "\n" not in message and str(saved) in message
  assert "step 2: checksum mismatch" in message and "step 1:" in message
  assert "delete" in message.lower() and "--fresh" in message


def test_a_changed_model_is_not_damage_and_raises_at_once(saved, caplog):
  caplog.set_level(logging.WARNING, logger="rljax")
  changed = {**_like(), "value_head": jax.ShapeDtypeStruct((2,), jnp.float32)}
  with Checkpointer(saved) as ckpt:
    with pytest.raises(
      CheckpointError,
      match=r"\['value_head'\] is in abstract_state but not in the checkpoint"
      r".*model or algorithm changed.*--fresh",
    ):
      ckpt.restore(changed)
  assert not _rljax_warnings(caplog, "step 2")  # no fallback was tried
