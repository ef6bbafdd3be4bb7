"""Post-training records: plain dicts from JSONL, TFDS or a task.

A record is one of four kinds (`record_kind`):

* "chat": ``{"messages": [{"role": ..., "content": ...}, ...]}``, trained
  on its assistant turns;
* "prompt_completion": ``{"prompt": ..., "completion": ...}``;
* "pair": ``{"prompt": ..., "chosen": ..., "rejected": ...}`` (DPO and
  kin);
* "unpaired": ``{"prompt": ..., "completion": ..., "label": bool}`` (KTO:
  a desirable or undesirable completion).

A prompt is a string or a list of messages; a completion (also chosen and
rejected) is a string or one assistant message (a dict, or a list holding
one). Reading is host-side Python; nothing here is jitted.
"""

from collections.abc import Mapping, Sequence
import json
import os
from typing import Any

import numpy as np

KINDS = ("chat", "prompt_completion", "pair", "unpaired")

# The keys each kind needs, in the order errors list them.
_KEYS = {
  "chat": ("messages",),
  "pair": ("prompt", "chosen", "rejected"),
  "unpaired": ("prompt", "completion", "label"),
  "prompt_completion": ("prompt", "completion"),
}


def read_jsonl(path: str | os.PathLike) -> list[dict]:
  """Records from a JSON Lines file, one JSON object a line.

  Blank lines are skipped. A line that is not valid JSON, or not an object,
  raises ValueError naming the file and the (1-based) line.
  """
  path = os.fspath(path)
  records = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(
          f"{path}:{number}: not valid JSON ({e.msg} at column {e.colno})."
        ) from None
      if not isinstance(record, dict):
        raise ValueError(
          f"{path}:{number}: each line must be a JSON object (a record);"
          f" got {type(record).__name__}."
        )
      records.append(record)
  return records


def tfds_records(
  name: str,
  *,
  split: str,
  data_dir: str | os.PathLike,
  fields: Mapping[str, str] | None = None,
) -> list[dict]:
  """Records of a TFDS dataset already prepared in `data_dir`.

  Uses the builder's random-access data source (``as_data_source``: the
  dataset must be prepared in `data_dir` in the array_record format, e.g.
  ``tfds build NAME --data_dir=DIR --file_format=array_record``); nothing
  is downloaded. Bytes become str and numpy scalars Python numbers.

  Args:
    name: the TFDS name, e.g. "my_dataset" or "my_dataset/config:1.0.0".
    split: e.g. "train" or "test[:10%]".
    data_dir: where the prepared dataset lives.
    fields: our key -> the dataset's feature name, e.g. ``{"prompt":
      "question", "completion": "answer"}``; None keeps every feature under
      its own name.

  Returns:
    One dict per example.
  """
  import tensorflow_datasets as tfds  # imported only when TFDS is read

  builder = tfds.builder(name, data_dir=os.fspath(data_dir))
  try:
    source = builder.as_data_source(split=split)
  except Exception as e:
    raise ValueError(
      f"cannot read TFDS {name!r} split {split!r} from {data_dir}: {e}"
      " Prepare it there first, in the array_record format (tfds build"
      f" {name} --data_dir={data_dir} --file_format=array_record)."
    ) from e
  records = []
  for i in range(len(source)):
    example = source[i]
    if fields is not None:
      missing = sorted(set(fields.values()) - set(example))
      if missing:
        raise ValueError(
          f"fields names features {missing} that TFDS {name!r} lacks; its"
          f" features are {sorted(example)}."
        )
      example = {ours: example[theirs] for ours, theirs in fields.items()}
    records.append({k: _python(v) for k, v in example.items()})
  return records


def _python(value: Any) -> Any:
  """A TFDS feature value as plain Python (str for bytes)."""
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, np.ndarray):
    if value.ndim == 0:
      return _python(value.item())
    return [_python(v) for v in value]
  if isinstance(value, np.generic):
    return _python(value.item())
  if isinstance(value, Mapping):
    return {k: _python(v) for k, v in value.items()}
  return value


def task_records(task, split: str) -> list[dict]:
  """Prompt / completion records of a `rljax.tasks.Task` split.

  The prompt is ``task.format_prompt(example)``; the completion is the
  example's "demonstration" when it has one (an agent task's transcript),
  else its "answer".

  Args:
    task: a `rljax.tasks.Task`.
    split: "train" or "test".

  Returns:
    ``{"prompt", "completion"}`` dicts, in the split's order.
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test'; got {split!r}.")
  examples = getattr(task, split)
  return [
    {
      "prompt": task.format_prompt(e),
      "completion": str(e.get("demonstration", e["answer"])),
    }
    for e in (examples[i] for i in range(len(examples)))
  ]


def record_kind(record: Mapping[str, Any]) -> str:
  """Which kind of record this is (one of `KINDS`).

  "messages" makes a chat record; "chosen" or "rejected" a pair; "label"
  an unpaired one; otherwise it must have "prompt" and "completion". A
  record missing keys its kind needs raises ValueError naming them.
  """
  if not isinstance(record, Mapping):
    raise ValueError(f"a record must be a dict; got {type(record).__name__}.")
  if "messages" in record:
    kind = "chat"
  elif "chosen" in record or "rejected" in record:
    kind = "pair"
  elif "label" in record:
    kind = "unpaired"
  elif "prompt" in record or "completion" in record:
    kind = "prompt_completion"
  else:
    raise ValueError(
      f"a record with keys {sorted(record)} is none of: chat (messages),"
      " prompt_completion (prompt, completion), pair (prompt, chosen,"
      " rejected), unpaired (prompt, completion, label)."
    )
  missing = [k for k in _KEYS[kind] if k not in record]
  if missing:
    raise ValueError(
      f"a {kind} record needs {list(_KEYS[kind])}; this one (keys"
      f" {sorted(record)}) is missing {missing}."
    )
  if kind == "chat":
    messages(record["messages"], "messages")
  if kind == "unpaired" and not isinstance(record["label"], (bool, np.bool_)):
    raise ValueError(
      "an unpaired record's label must be a bool (True: a desirable"
      f" completion); got {record['label']!r}."
    )
  return kind


def messages(value: Any, name: str = "prompt") -> list[dict]:
  """`value` as chat messages: a string is one user message; a list must
  hold dicts with "role" and "content"."""
  if isinstance(value, str):
    return [{"role": "user", "content": value}]
  if isinstance(value, Sequence) and value:
    if all(
      isinstance(m, Mapping) and {"role", "content"} <= set(m) for m in value
    ):
      return [dict(m) for m in value]
  raise ValueError(
    f"{name} must be a string or a non-empty list of"
    f' {{"role": ..., "content": ...}} messages; got {value!r:.200}.'
  )


def completion_text(value: Any, name: str = "completion") -> str:
  """The text of a completion: a string, or one assistant message (a dict,
  or a list holding one)."""
  if isinstance(value, str):
    return value
  if isinstance(value, Sequence) and len(value) == 1:
    value = value[0]
  if (
    isinstance(value, Mapping)
    and value.get("role") == "assistant"
    and isinstance(value.get("content"), str)
  ):
    return value["content"]
  raise ValueError(
    f"{name} must be a string or one assistant message"
    f' ({{"role": "assistant", "content": ...}}); got {value!r:.200}.'
  )
