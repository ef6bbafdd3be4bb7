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
from typing import Any, Optional

import numpy as np

from rljax._src.errors import UserError

KINDS = ("chat", "prompt_completion", "pair", "unpaired")

# The keys each kind needs, in the order errors list them.
_KEYS = {
  "chat": ("messages",),
  "pair": ("prompt", "chosen", "rejected"),
  "unpaired": ("prompt", "completion", "label"),
  "prompt_completion": ("prompt", "completion"),
}

# What each field must hold, as errors name the fix.
_ASSISTANT = (
  'a string or one assistant message {"role": "assistant", "content": ...}'
)
_FORMS = {
  "prompt": "a string (or, with model.chat_template=True, a non-empty list of"
  ' {"role": ..., "content": ...} messages)',
  "completion": _ASSISTANT,
  "chosen": _ASSISTANT,
  "rejected": _ASSISTANT,
  "label": "true or false (whether the completion is desirable)",
  "messages": 'a non-empty list of {"role": ..., "content": ...} messages'
  " with string contents",
}

# One record of each kind, for the error of a file that holds none.
EXAMPLES = {
  "chat": '{"messages": [{"role": "user", "content": "2+2="},'
  ' {"role": "assistant", "content": "4"}]}',
  "prompt_completion": '{"prompt": "2+2=", "completion": "4"}',
  "pair": '{"prompt": "2+2=", "chosen": "4", "rejected": "5"}',
  "unpaired": '{"prompt": "2+2=", "completion": "4", "label": true}',
}


def read_jsonl(
  path: str | os.PathLike,
  kinds: Sequence[str] = (),
  *,
  chat: bool = True,
  where: str = "",
) -> list[dict]:
  """Records from a JSON Lines file, one JSON object a line, all checked.

  Blank lines are skipped. Every line is read before anything is raised: a
  line that is not UTF-8, not valid JSON or not an object, and with `kinds`
  a record that is none of them (`record_problem`), is counted, and one
  `UserError` names how many lines are bad and the first one's line number,
  field and fix.

  Args:
    path: the file.
    kinds: the record kinds the caller takes (see `KINDS`), in order of
      preference; empty checks only that each line is a JSON object.
    chat: the records are rendered with a chat template (prompts may be
      message lists; chat records need it).
    where: what the error names first (default: the path).

  Returns:
    The records, in the file's order.
  """
  path = os.fspath(path)
  records, bad = [], _Bad(where or path, "line")
  with open(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      record, problem = _parse(raw)
      if record is None and problem is None:
        continue  # a blank line
      if problem is None and kinds:
        problem = record_problem(record, kinds, chat=chat)
      bad.add(number, problem)
      records.append(record)
  bad.raise_if_any(len(records))
  return records


def check_records(
  records: Sequence[Any],
  kinds: Sequence[str],
  *,
  chat: bool = True,
  where: str = "records",
) -> None:
  """Raise one `UserError` if any of `records` is none of `kinds`: how many
  are bad and the first one's (1-based) number, field and fix."""
  bad = _Bad(where, "record")
  for number, record in enumerate(records, start=1):
    bad.add(number, record_problem(record, kinds, chat=chat))
  bad.raise_if_any(len(records))


class _Bad:
  """A count of bad lines (or records) and the first one's problem."""

  def __init__(self, where: str, unit: str):
    self.where, self.unit = where, unit
    self.count, self.first = 0, None

  def add(self, number: int, problem: Optional[str]) -> None:
    if problem is not None:
      self.count += 1
      self.first = self.first or (number, problem)

  def raise_if_any(self, total: int) -> None:
    if not self.count:
      return
    number, problem = self.first
    if self.count == 1:
      counted = f"1 of {total} {self.unit}s is bad; fix or remove it"
    else:
      counted = (
        f"{self.count} of {total} {self.unit}s are bad, {self.unit} {number}"
        " the first; fix or remove them"
      )
    raise UserError(
      f"{self.where}: {self.unit} {number}: {problem}. {counted}."
    )


def _parse(raw: bytes) -> tuple[Optional[dict], Optional[str]]:
  """(the record, None) of one line, (None, what is wrong), or (None,
  None) for a blank line."""
  try:
    line = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    return None, f"not UTF-8 text (byte {e.start + 1}); save the file as UTF-8"
  if not line.strip():
    return None, None
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    return None, (
      f"not valid JSON ({e.msg} at column {e.colno}); each line must be one"
      " JSON object"
    )
  if not isinstance(record, dict):
    return None, (
      f"a JSON {_json_type(record)}, not an object; each line must be one"
      ' record, e.g. {"prompt": ..., "completion": ...}'
    )
  return record, None


def _json_type(value: Any) -> str:
  """The JSON name of a Python value's type."""
  if isinstance(value, (bool, np.bool_)):
    return "boolean"
  if isinstance(value, (int, float, np.number)):
    return "number"
  for types, name in (
    (str, "string"),
    (Mapping, "object"),
    ((list, tuple), "array"),
    (type(None), "null"),
  ):
    if isinstance(value, types):
      return name
  return type(value).__name__


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
  kind = _looks_like(record)
  if kind is None:
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


def record_problem(
  record: Any, kinds: Sequence[str], *, chat: bool = True
) -> Optional[str]:
  """What is wrong with `record` as a record of one of `kinds` (the kinds a
  run takes, the first preferred), naming the field and the fix; None when
  nothing is. `chat`: the run renders records with a chat template."""
  if not isinstance(record, Mapping):
    return f"a JSON {_json_type(record)}, not an object (a record)"
  looks = _looks_like(record)
  kind = looks if looks in kinds else kinds[0]
  keys = _KEYS[kind]
  missing = [k for k in keys if k not in record]
  if missing:
    have = f"its keys are {sorted(record)}" if record else "it is empty"
    problem = (
      f"field {missing[0]!r} is missing: a {kind} record has"
      f" {_listed(keys)} ({have})"
    )
    if looks not in (None, kind):
      problem += (
        f"; it looks like a {looks} record, and this run trains on"
        f" {' or '.join(kinds)} records"
      )
    return problem
  for key in keys:
    problem = _field_problem(key, record[key], chat)
    if problem:
      return problem
  return None


def _looks_like(record: Mapping[str, Any]) -> Optional[str]:
  """The kind a record's keys suggest (`record_kind`'s rule), or None."""
  if "messages" in record:
    return "chat"
  if "chosen" in record or "rejected" in record:
    return "pair"
  if "label" in record:
    return "unpaired"
  if "prompt" in record or "completion" in record:
    return "prompt_completion"
  return None


def _field_problem(key: str, value: Any, chat: bool) -> Optional[str]:
  """What is wrong with one field's value, or None."""
  if key == "messages" and _is_messages(value) and not chat:
    return (
      "field 'messages' is a conversation, which needs"
      " model.chat_template=True (or write the record as"
      ' {"prompt": ..., "completion": ...})'
    )
  if key == "prompt" and _is_messages(value) and not chat:
    return (
      "field 'prompt' is a list of messages, which needs"
      " model.chat_template=True; make it a string"
    )
  if key in ("messages", "prompt"):
    ok = _is_messages(value) or (key == "prompt" and isinstance(value, str))
  elif key == "label":
    ok = isinstance(value, (bool, np.bool_))
  else:
    try:
      completion_text(value, key)
      ok = True
    except ValueError:
      ok = False
  if ok:
    return None
  shown = json.dumps(value, default=str)
  shown = shown if len(shown) <= 60 else shown[:57] + "..."
  return (
    f"field {key!r} is {shown} (a JSON {_json_type(value)}); it must be"
    f" {_FORMS[key]}"
  )


def _is_messages(value: Any) -> bool:
  """A non-empty list of {"role", "content"} dicts with string values."""
  return (
    isinstance(value, (list, tuple))
    and bool(value)
    and all(
      isinstance(m, Mapping)
      and isinstance(m.get("role"), str)
      and isinstance(m.get("content"), str)
      for m in value
    )
  )


def _listed(keys: Sequence[str]) -> str:
  """'a', 'b' and 'c'."""
  quoted = [repr(k) for k in keys]
  if len(quoted) == 1:
    return quoted[0]
  return ", ".join(quoted[:-1]) + " and " + quoted[-1]


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
