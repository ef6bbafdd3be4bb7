"""The checksum manifest of a step: the size and SHA-256 of every file.

orbax and tensorstore verify nothing in the array data (a flipped bit loads
silently), so the manifest is written with the step and checked on restore.
"""

from collections.abc import Mapping
import concurrent.futures
import hashlib
import json
import os

from etils import epath

from rljax.checkpointing._errors import _LOST
from rljax.checkpointing._errors import _Damaged
from rljax.checkpointing._errors import _one_line
from rljax.checkpointing._steps import _COMMITTED

_CHECKSUMS = "rljax_checksums.json"
# Step-level files orbax writes after the checksums (commit time and marker).
_UNHASHED = frozenset({_CHECKSUMS, _COMMITTED, "_CHECKPOINT_METADATA"})
_CHUNK = 1 << 20


def _files(root: epath.Path) -> dict[str, epath.Path]:
  """The files under `root` that the checksums cover, by relative path."""
  files = {}
  for folder, _, names in root.walk():
    for name in names:
      path = folder / name
      rel = path.relative_to(root).as_posix()
      if rel not in _UNHASHED:
        files[rel] = path
  return files


def _sha256(path: epath.Path) -> str:
  digest = hashlib.sha256()
  with path.open("rb") as f:
    while chunk := f.read(_CHUNK):
      digest.update(chunk)
  return digest.hexdigest()


def _digests(files: Mapping[str, epath.Path]) -> dict[str, str]:
  """SHA-256 of each file, several at a time (hashlib releases the GIL)."""
  workers = max(1, min(8, os.cpu_count() or 1, len(files)))
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return dict(zip(files, pool.map(_sha256, files.values())))


def _write_manifest(root: epath.Path) -> None:
  """Write the checksum manifest of the step directory `root`."""
  files = _files(root)
  digests = _digests(files)
  manifest = {
    "algorithm": "sha256",
    "files": {
      rel: [path.stat().length, digests[rel]]
      for rel, path in sorted(files.items())
    },
  }
  (root / _CHECKSUMS).write_text(json.dumps(manifest, indent=1))


def _verify(path: epath.Path, unread: tuple[str, ...] = ()) -> bool:
  """Check the step's files against its checksums; False if it has none.

  Files of the items named in `unread` are not checked.

  Raises:
    _Damaged: a file is missing, has another size or another checksum, or
      the manifest is unreadable.
  """
  manifest = path / _CHECKSUMS
  if not manifest.exists():
    return False
  try:
    saved = json.loads(manifest.read_text())["files"]
    expected = {
      rel: (int(size), str(sha))
      for rel, (size, sha) in saved.items()
      if rel.split("/")[0] not in unread
    }
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise _Damaged(f"its {_CHECKSUMS} is unreadable ({e})") from e
  try:
    for rel, (size, _) in sorted(expected.items()):
      if not (path / rel).exists():
        item = path / rel.split("/")[0]
        if "/" in rel and not item.exists():
          raise _Damaged(f"its {item.name!r} item is missing ({item})")
        raise _Damaged(f"{rel} is missing")
      found = (path / rel).stat().length
      if found != size:
        raise _Damaged(f"{rel} has {found} bytes, {size} were saved")
    digests = _digests({rel: path / rel for rel in expected})
  except OSError as e:
    if e.errno not in _LOST:
      raise
    raise _Damaged(_one_line(f"a file cannot be read: {e}")) from e
  for rel in sorted(expected):
    if digests[rel] != expected[rel][1]:
      raise _Damaged(
        f"checksum mismatch in {rel} (its bytes changed after the save)"
      )
  return True
