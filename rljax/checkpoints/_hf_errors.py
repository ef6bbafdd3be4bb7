"""The errors of loading a Hugging Face checkpoint, and the advice they give."""

from rljax._src.errors import CheckpointError

_REDOWNLOAD = "Re-download the checkpoint or export it again."


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
  """A checkpoint file or directory does not exist."""


class MissingTensorError(CheckpointError, KeyError):
  """A checkpoint lacks a tensor the model needs."""

  __str__ = BaseException.__str__  # KeyError's would quote the message.
