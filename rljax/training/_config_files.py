"""Config files: `load_config` runs a Python config file's `get_config()`;
`check_inputs` names the command that makes a path the config reads."""

import importlib.util
import os
import pathlib
import sys

from rljax._src.errors import UserError
from rljax.training._config import RunConfig


class ConfigNotFoundError(UserError, FileNotFoundError):
  """The config file does not exist."""


def load_config(path: str) -> RunConfig:
  """`get_config()` of a Python config file (its folder joins sys.path, so
  configs can share a base module).

  A config file is Python and runs with the caller's rights: it is trusted
  input, like a training script. Load only configs you wrote or reviewed.
  """
  return _load(path)[0]


def _load(path: str) -> tuple[RunConfig, dict[str, str]]:
  """`load_config`, and the file's ``PREREQUISITES`` (a path the run reads
  -> the command that makes it; none when the file defines none)."""
  file = pathlib.Path(path)
  if not file.is_file():
    raise ConfigNotFoundError(
      f"config file {path!r} not found; see configs/ for examples."
    )
  sys.path.insert(0, str(file.parent.resolve()))
  spec = importlib.util.spec_from_file_location(f"_config_{file.stem}", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise UserError(f"{path} must define get_config() -> RunConfig.")
  config = module.get_config()
  if not isinstance(config, RunConfig):
    raise UserError(
      f"{path}: get_config() returned {type(config).__name__}, not RunConfig."
    )
  return config, dict(vars(module).get("PREREQUISITES", {}))


def inputs(config: RunConfig) -> list[tuple[str, str, str]]:
  """(field, value, local path) of each file or directory `config` reads:
  an "hf:" or "gguf:" model or teacher, "jsonl:" data."""
  out = []
  models = [("model.source", config.model.source)]
  if config.teacher is not None:
    models.append(("teacher.source", config.teacher.source))
  for field, value in models:
    for prefix in ("hf:", "gguf:"):
      if value.startswith(prefix):
        out.append((field, value, value[len(prefix) :]))
  if config.data.source.startswith("jsonl:"):
    source = config.data.source
    out.append(("data.source", source, source[len("jsonl:") :]))
  return out


def check_inputs(config: RunConfig, prerequisites: dict[str, str]) -> None:
  """Raise a `UserError` at the first path `config` reads that does not
  exist, naming the command that makes it where `prerequisites` (a config
  file's ``PREREQUISITES``) has one."""
  for field, value, path in inputs(config):
    if os.path.exists(path):
      continue
    message = f"{field}={value!r}: {path!r} does not exist"
    if not os.path.isabs(path):
      message += f" (from {os.getcwd()})"
    known = {os.path.normpath(k): v for k, v in prerequisites.items()}
    command = known.get(os.path.normpath(path))
    if not command:
      raise UserError(message + ".")
    raise UserError(
      f"{message}; make it first, from the repository root: {command}"
    )
