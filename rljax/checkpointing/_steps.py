"""Step directories: only those orbax committed are checkpoints."""

from collections.abc import Iterator
import dataclasses
import re
from typing import Any

from etils import epath
import orbax.checkpoint as ocp

_COMMITTED = ocp.path.atomicity.COMMIT_SUCCESS_FILE  # orbax's commit marker
_TMP_SUFFIX = ocp.path.atomicity.TMP_DIR_SUFFIX
_TREE_METADATA = "_METADATA"  # orbax's pytree metadata file in ``state/``
_STEP_NAME = re.compile(r"0|[1-9][0-9]*")


@dataclasses.dataclass(frozen=True)
class _CommittedSteps(ocp.step.NameFormat):
  """orbax's standard step names, counting only committed step directories.

  orbax lists every directory named like a step, so a stray ``mkdir 7`` would
  be the latest step (blocking saves up to 7 and counting against keep-N).
  """

  base: Any = dataclasses.field(default_factory=ocp.step.standard_name_format)

  def build_name(self, step: int) -> str:
    return self.base.build_name(step)

  def find_all(self, base_path: epath.PathLike) -> Iterator[Any]:
    return (m for m in self.base.find_all(base_path) if _committed(m.path))

  def find_step(self, base_path: epath.PathLike, step: int) -> Any:
    found = self.base.find_step(base_path, step)
    if not _committed(found.path):
      raise ValueError(f"{found.path} is not a committed checkpoint.")
    return found


def _committed(path: epath.Path) -> bool:
  """Whether orbax finished and committed the step directory `path`."""
  return (path / _COMMITTED).exists()
