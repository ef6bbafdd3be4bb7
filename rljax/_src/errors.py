"""Errors in what the user gave: configs, files, directories, runs.

`UserError` marks a problem the user can fix (a bad setting, a damaged or
missing file, a directory in use, a full disk). The train CLI prints its
message on one line, without a traceback, and exits with status 2; any other
exception is a bug in rljax and keeps its traceback. It subclasses
`ValueError`, so ``except ValueError`` still catches it.

Messages name the field, file or directory and say what to do.
"""


class UserError(ValueError):
  """A problem in the user's input that the message says how to fix."""


class CheckpointError(UserError):
  """A checkpoint cannot be written or read (damaged, unwritable, full)."""


class NonFiniteError(UserError):
  """Training produced a NaN or infinite loss, gradient or parameter."""
