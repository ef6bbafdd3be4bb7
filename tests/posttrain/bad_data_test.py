"""Bad post-training data through the CLI (issue 26): every data error of
every run kind is one ``error:`` line with exit status 2, found before any
model is built, wherever the bad record is; pairs whose chosen and rejected
are the same are dropped with one warning and counted."""

import json
import logging

import pytest

from rljax._src.errors import UserError
from rljax.launch import _cli
from rljax.posttrain import _run
from rljax.training import DataSpec
from rljax.training import _build

TINY = [
  "model.hidden_size=32",
  "model.num_layers=1",
  "model.num_heads=2",
  "model.num_kv_heads=1",
  "model.intermediate_size=64",
  "task.kwargs={'digits': 1, 'prompt_style': 'bare'}",
  "task.max_prompt_tokens=6",
  "sampler.num_samples=2",
  "sampler.max_new_tokens=4",
  "train.prompts_per_step=8",
  "train.eval_prompts=8",
  "train.steps=1",
  "train.mesh=(1, 1, 1)",
  "data.rows=8",
  "output.tensorboard=False",
  "output.plot=False",
]
KINDS = {
  "dpo": ["kind=preference", "algorithm.name=dpo"],
  "kto": ["kind=preference", "algorithm.name=kto"],
  "sft": ["kind=sft"],
  "distill": [
    "kind=distill",
    "algorithm.name=gkd",
    "algorithm.kwargs={'lmbda': 0.0}",
    "teacher.source=scratch",
    "teacher.hidden_size=32",
    "teacher.num_heads=2",
    "teacher.num_kv_heads=1",
  ],
}


def _record(kind, i):
  """A good record of `kind` (a 1-digit sum)."""
  a, b = i % 10, (3 * i) % 10
  prompt, right, wrong = f"{a}+{b}=", str(a + b), str(a + b + 1)
  if kind == "dpo":
    return {"prompt": prompt, "chosen": right, "rejected": wrong}
  if kind == "kto":
    return {"prompt": prompt, "completion": right, "label": i % 3 > 0}
  return {"prompt": prompt, "completion": right}


def _lines(kind, n=100, **bad):
  """n JSON lines of good `kind` records; ``bad`` maps "line_<k>" (1-based)
  to the text of line k."""
  lines = [json.dumps(_record(kind, i)) for i in range(n)]
  for name, text in bad.items():
    lines[int(name.removeprefix("line_")) - 1] = text
  return "".join(line + "\n" for line in lines)


@pytest.fixture
def built(monkeypatch):
  """The models built: any call fails the test (data errors come first)."""
  calls = []

  def build_policy(*args, **kwargs):
    calls.append(args)
    raise AssertionError("a model was built before the data was checked")

  monkeypatch.setattr(_build, "build_policy", build_policy)
  return calls


def _run_cli(tmp_path, kind, text, *extra):
  """``python -m rljax.training`` (in process) on `text` as the data."""
  data = tmp_path / "data.jsonl"
  data.write_text(text)
  config = tmp_path / "cfg.py"
  config.write_text(
    "from rljax.training import RunConfig\n"
    "def get_config():\n  return RunConfig()\n"
  )
  return _cli.main(
    [
      "--config",
      str(config),
      *KINDS[kind],
      *TINY,
      f"output.directory={tmp_path / 'run'}",
      f"data.source=jsonl:{data}",
      *extra,
    ]
  )


def _one_error_line(code, capsys, *fragments) -> str:
  """Exit status 2 and a single ``error:`` line holding `fragments`."""
  err = capsys.readouterr().err
  assert code == 2, err
  lines = [line for line in err.splitlines() if line.strip()]
  errors = [line for line in lines if line.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in err, err
  for fragment in fragments:
    assert fragment in errors[0], errors[0]
  return errors[0]


def test_first_pair_without_rejected(tmp_path, capsys, built):
  bad = json.dumps({"prompt": "1+1=", "chosen": "2"})
  code = _run_cli(tmp_path, "dpo", _lines("dpo", line_1=bad))
  _one_error_line(
    code, capsys, "line 1:", "field 'rejected' is missing", "fix or remove"
  )
  assert not built


def test_pair_without_rejected_on_line_70(tmp_path, capsys, built):
  bad = json.dumps({"prompt": "1+1=", "chosen": "2"})
  code = _run_cli(tmp_path, "dpo", _lines("dpo", line_70=bad))
  _one_error_line(
    code,
    capsys,
    "line 70: field 'rejected' is missing",
    "'prompt', 'chosen' and 'rejected'",
    "1 of 100 lines is bad",
  )
  assert not built  # only the first 64 records used to be checked


@pytest.mark.parametrize(
  "kind, bad, fragments",
  [
    ("dpo", '{"prompt": "1+1=", "chosen": "2",', ["not valid JSON"]),
    ("dpo", '["1+1=", "2", "3"]', ["a JSON array, not an object"]),
    (
      "dpo",
      '{"prompt": "1+1=", "chosen": 5, "rejected": "3"}',
      ["field 'chosen' is 5 (a JSON number)", "must be a string"],
    ),
    (
      "dpo",
      '{"prompt": "1+1=", "completion": "2"}',
      ["field 'chosen' is missing", "trains on pair records"],
    ),
    (
      "kto",
      '{"prompt": "1+1=", "completion": "2", "label": "yes"}',
      ["field 'label' is \"yes\"", "true or false"],
    ),
    ("kto", '{"prompt": "1+1=", "completion": "2"}', ["'label' is missing"]),
    ("sft", '{"completion": "2"}', ["field 'prompt' is missing"]),
    (
      "sft",
      '{"prompt": [{"role": "user", "content": "1+1="}], "completion": "2"}',
      ["field 'prompt' is a list of messages", "model.chat_template=True"],
    ),
    ("distill", '{"prompt": "1+1=", "completion": null}', ["'completion'"]),
    ("distill", "7", ["a JSON number, not an object"]),
  ],
)
def test_each_bad_line_of_each_kind(
  tmp_path, capsys, built, kind, bad, fragments
):
  """The same bad line on lines 70 and 90: both counted, the first named."""
  text = _lines(kind, line_70=bad, line_90=bad)
  _one_error_line(
    _run_cli(tmp_path, kind, text),
    capsys,
    "data.source='jsonl:",
    "line 70: ",
    *fragments,
    "2 of 100 lines are bad, line 70 the first",
  )
  assert not built


@pytest.mark.parametrize("kind", KINDS)
def test_an_empty_file(tmp_path, capsys, built, kind):
  _one_error_line(
    _run_cli(tmp_path, kind, "\n"),
    capsys,
    "holds no records (the file is empty)",
  )
  assert not built


def test_a_missing_file(tmp_path, capsys, built):
  code = _run_cli(tmp_path, "dpo", "", "data.source=jsonl:nowhere/pairs.jsonl")
  _one_error_line(code, capsys, "'nowhere/pairs.jsonl' does not exist")
  assert not built


def test_a_missing_file_in_code(tmp_path, monkeypatch):
  """The same without the CLI (a run built in Python)."""
  monkeypatch.chdir(tmp_path)
  data = DataSpec(source="jsonl:nowhere/pairs.jsonl")
  with pytest.raises(
    UserError, match=r"there is no file 'nowhere/pairs.jsonl'"
  ):
    _run.records(data, task=None, kinds=("pair",))


def test_on_policy_gkd_steps_on_prompt_records(tmp_path, capsys, built):
  code = _run_cli(tmp_path, "distill", _lines("distill"), "algorithm.kwargs={}")
  _one_error_line(code, capsys, "on-policy GKD steps", "lmbda=0")
  assert not built


def test_only_identical_pairs(tmp_path, capsys, built):
  same = json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "2"})
  code = _run_cli(tmp_path, "dpo", f"{same}\n" * 5)
  _one_error_line(code, capsys, "all 5 pairs have the same chosen and rejected")
  assert not built


def _identical_on_lines_3_and_70() -> str:
  same = {
    "prompt": "1+1=",
    "chosen": "2",
    "rejected": [{"role": "assistant", "content": "2"}],  # the same text
  }
  return _lines("dpo", line_3=json.dumps(same), line_70=json.dumps(same))


def _dropped_warnings(caplog) -> list[str]:
  messages = [r.getMessage() for r in caplog.records]
  return [m for m in messages if "dropped" in m]


def test_identical_pairs_are_dropped_with_one_warning(
  tmp_path, capsys, caplog, built
):
  """Dropped while the data is read, before the model (which here stops
  the run: the fixture fails any build)."""
  with caplog.at_level(logging.WARNING, logger="rljax"):
    with pytest.raises(AssertionError, match="a model was built"):
      _run_cli(tmp_path, "dpo", _identical_on_lines_3_and_70())
  warned = _dropped_warnings(caplog)
  assert len(warned) == 1, warned
  assert "dropped 2 of 100 pairs" in warned[0]
  assert "the other 98" in warned[0]
  assert len(built) == 1


@pytest.mark.slow  # compiles the DPO update (about 10 s)
def test_identical_pairs_are_counted_in_the_metrics(tmp_path, capsys, caplog):
  text = _identical_on_lines_3_and_70()
  with caplog.at_level(logging.WARNING, logger="rljax"):
    assert _run_cli(tmp_path, "dpo", text, "--dry_run") == 0
  assert len(_dropped_warnings(caplog)) == 1
  report = json.loads(capsys.readouterr().out)
  assert report["metrics"]["pairs_dropped_identical"] == 2.0
  assert report["metrics"]["pairs"] == 8.0
