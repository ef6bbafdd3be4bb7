"""Hugging Face safetensors checkpoints: loading a directory, saving one.

config.json is mapped to `ModelConfig` in `_hf_config`, tensor names and
layouts in `_hf_tensors`; safetensors files are read in `_safetensors`.

Loading checks everything it reads: a damaged, truncated or foreign file, a
malformed config.json, a missing, misshapen or non-float tensor and a NaN or
inf weight each raise one `CheckpointError` that names the file and the
tensor and says what to do.
"""

import json
import os
import pathlib
from typing import Any

from flax import nnx
import numpy as np
import safetensors.numpy

from rljax._src.errors import CheckpointError
from rljax.checkpoints._hf_config import _config_from_hf
from rljax.checkpoints._hf_config import hf_config
from rljax.checkpoints._hf_errors import CheckpointNotFoundError
from rljax.checkpoints._hf_tensors import _fill
from rljax.checkpoints._hf_tensors import _Where
from rljax.checkpoints._hf_tensors import hf_tensors
from rljax.checkpoints._safetensors import _read_safetensors
from rljax.models._config import ModelConfig
from rljax.models._transformer import Transformer


def _read_config(path: pathlib.Path) -> Any:
  """The parsed config.json at `path`."""
  if not path.is_file():
    raise CheckpointNotFoundError(
      f"{path} not found: a Hugging Face checkpoint directory needs"
      " config.json and *.safetensors files."
    )
  try:
    return json.loads(path.read_bytes())
  except OSError as e:
    raise CheckpointError(f"{path} cannot be read: {e}") from e
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    raise CheckpointError(
      f"{path} is not valid JSON ({e}); the file is damaged: re-download it"
      " or export the checkpoint again."
    ) from e


def load_hf(
  directory: str | os.PathLike, *, rngs: nnx.Rngs | None = None, **overrides
) -> Transformer:
  """A `Transformer` from a directory with config.json and *.safetensors.

  Every tensor is checked as it is read: its presence, shape, dtype and that
  every entry is finite.

  Args:
    directory: a transformers checkpoint directory (shards are merged).
    rngs: unused: every weight comes from the files, so the model is built
      abstractly (no random init, no compile); kept for compatibility.
    **overrides: `ModelConfig` fields to set, e.g. ``dtype="bfloat16"``.

  Returns:
    The model, every parameter from the files.

  Raises:
    CheckpointNotFoundError: config.json or every *.safetensors file is
      missing (a `CheckpointError` and a `FileNotFoundError`).
    CheckpointError: a damaged, truncated or foreign file, a malformed or
      unsupported config.json, or a tensor that is missing, of the wrong
      shape or dtype, or not finite. The message names the file and tensor.
  """
  del rngs
  path = pathlib.Path(directory)
  config_path = path / "config.json"
  config = _config_from_hf(
    _read_config(config_path), str(config_path), **overrides
  )
  files = sorted(path.glob("*.safetensors"))
  if not files:
    raise CheckpointNotFoundError(
      f"no *.safetensors files in {path}; re-download the checkpoint or"
      " export it again."
    )
  tensors, owner = {}, {}
  for f in files:
    read = _read_safetensors(f)
    tensors.update(read)
    owner.update(dict.fromkeys(read, str(f)))
  where = _Where(
    checkpoint=str(files[0]) if len(files) == 1 else f"{path}/*.safetensors",
    files=owner,
  )
  return _model(config, tensors, where)


def model_from_tensors(
  config: ModelConfig, tensors: dict[str, np.ndarray]
) -> Transformer:
  """A `Transformer` whose every weight comes from HF-named `tensors`.

  The model is built abstractly (no random init, nothing compiled), then
  filled by `load_hf_tensors`, which checks every name, shape, dtype and
  that every entry is finite.

  Args:
    config: the model's config.
    tensors: HF parameter name -> array.

  Returns:
    The model.

  Raises:
    CheckpointError: as `load_hf_tensors`.
  """
  return _model(config, tensors, _Where())


def _model(config: ModelConfig, tensors, where: _Where) -> Transformer:
  """`model_from_tensors`, naming files and tensors as `where` says."""
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  _fill(model, tensors, where)  # sets every parameter
  return model


def save_hf(model: Transformer, directory: str | os.PathLike) -> None:
  """Write config.json and model.safetensors that transformers can load.

  Files are written under temporary names and renamed into place, so a
  crash never leaves a half-written checkpoint behind.
  """
  path = pathlib.Path(directory)
  path.mkdir(parents=True, exist_ok=True)
  tmp_cfg, tmp_st = path / "config.json.tmp", path / "model.safetensors.tmp"
  tmp_cfg.write_text(json.dumps(hf_config(model.config), indent=2))
  safetensors.numpy.save_file(
    hf_tensors(model), tmp_st, metadata={"format": "pt"}
  )
  os.replace(tmp_st, path / "model.safetensors")
  os.replace(tmp_cfg, path / "config.json")
