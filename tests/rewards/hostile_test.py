"""Hostile completions through every built-in reward and every task's reward.

Code injection in every extraction format, huge numbers, unicode tricks,
nesting bombs and very long texts. Nothing may execute (canary files in the
working directory and in a temporary directory stay absent; no process is
created in this process, as an audit hook records), every score is finite,
and every call returns (a faulthandler guard kills a hung test run with a
traceback instead of hanging it).
"""

import faulthandler
import sys
import threading

import numpy as np
import pytest

from rljax import rewards
from rljax import tasks
from rljax.sandbox import _jail
from rljax.sandbox import _sandbox
from rljax.tasks import _reasoning_gym

CANARY = "pwned"
_HANG_GUARD_SECONDS = 900
_PROCESS_EVENTS = {
  "os.system",
  "os.exec",
  "os.fork",
  "os.forkpty",
  "os.posix_spawn",
  "os.spawn",
  "subprocess.Popen",
}
_recorded: list[str] = []
_armed: list[bool] = []


def _injections(canary):
  c = str(canary)
  return [
    f"__import__('os').system('touch {c}')",
    f"__import__('os').system('touch {CANARY}')",
    f"exec(\"open('{c}', 'w').write('x')\")",
    f"open('{c}', 'w').write('x')",
    f"(lambda: __import__('subprocess').run(['touch', '{c}']))()",
    "[x for x in ().__class__.__base__.__subclasses__()"
    f" if x.__name__ == 'Popen'][0](['touch', '{c}'])",
    f"1 + __import__('os').system('touch {c}')",
    f"eval(\"__import__('os').system('touch {c}')\")",
    f"getattr(__import__('os'), 'sys' + 'tem')('touch {c}')",
    f"__import__('pathlib').Path('{c}').touch()",
  ]


HUGE = [
  "1e999999999",
  "-1e-999999999",
  "9**9**9**9",
  "10^10^10",
  "2^{2^{40}}",
  "9" * 1_000_000,
  "1" + "0" * 5000,
  "1/" + "0" * 1000,
]
UNICODE = [
  "６８",  # fullwidth digits
  "\u202e86\u202c",  # right-to-left override
  "6\u03038",  # combining tilde
  "6\x008",  # NUL
  "\ud800",  # a lone surrogate
  "٦٨",  # Arabic-Indic digits
  "6\u200d8",  # zero-width joiner
  "\ufeff68",  # byte-order mark
  "𝟔𝟖",  # mathematical bold digits
]
BOMBS = [
  "(" * 100_000,
  "\\boxed{" * 10_000,
  "<answer>" * 10_000,
  "{" * 100_000,
  "<think>" + "</think><answer></answer>x" * 20_000,
  "1," * 200_000,
  "#### " * 10_000,
  "a" * 1_000_000,
  "The answer is 68. " * 50_000,
]


def _formats(core):
  return [
    core,
    f"<answer>{core}</answer>",
    f"\\boxed{{{core}}}",
    f"#### {core}",
    f"<think>x</think><answer>{core}</answer>",
  ]


def _texts(canary, cores):
  return [text for core in cores for text in _formats(core)] + BOMBS


def _hook(event, args):
  if not _armed or not (
    event in _PROCESS_EVENTS or event.startswith("socket.")
  ):
    return
  if event == "subprocess.Popen" and _is_sandbox_worker(args[1]):
    return  # a sandbox (re)starting its worker
  _recorded.append(event)


def _is_sandbox_worker(argv):
  """A sandbox's worker, its jail (bwrap) or the jail's one-off probe."""
  if not isinstance(argv, (list, tuple)) or len(argv) < 2:
    return False
  if argv[0] == _jail.bwrap_path():
    return True
  return (
    len(argv) > 2
    and argv[0] == sys.executable
    and argv[2] == _sandbox._WORKER_SCRIPT
  )


@pytest.fixture(scope="module", autouse=True)
def _audit():
  if not getattr(sys, "_rljax_hostile_hook", False):
    sys.addaudithook(_hook)  # permanent; a no-op unless armed
    sys._rljax_hostile_hook = True
  yield


@pytest.fixture
def guarded(tmp_path, monkeypatch):
  """cwd in tmp_path, a hang guard, and process creation recorded."""
  monkeypatch.chdir(tmp_path)
  faulthandler.dump_traceback_later(_HANG_GUARD_SECONDS, exit=True)
  _recorded.clear()
  _armed.append(True)
  try:
    yield tmp_path / "canary"
  finally:
    _armed.clear()
    faulthandler.cancel_dump_traceback_later()
  assert not _recorded, f"process creation in the trainer: {_recorded}"
  assert not (tmp_path / "canary").exists()
  assert not (tmp_path / CANARY).exists()


def _score(fn, texts, metadata):
  n = len(texts)
  samples = rewards.Samples(
    list(texts), np.full((n,), 7), np.zeros((n,), bool), [metadata] * n
  )
  values = rewards.score(samples, [("r", fn, 1.0)]).values_NK[:, 0]
  assert values.shape == (n,)
  assert np.isfinite(values).all(), [t[:40] for t, v in zip(texts, values)]
  return values


def _builtin_rewards():
  fns = {
    f"exact_answer:{mode}": rewards.exact_answer(extract=mode)
    for mode in rewards.EXTRACT_MODES
  }
  fns["answer_format"] = rewards.answer_format()
  fns["length_penalty"] = rewards.length_penalty(max_length=8, buffer=4)
  return fns


@pytest.mark.parametrize("name", sorted(_builtin_rewards()))
def test_builtin_rewards(guarded, name):
  fn = _builtin_rewards()[name]
  cores = _injections(guarded) + HUGE + UNICODE
  _score(fn, _texts(guarded, cores), {"answer": "68"})


def test_math_answer_on_injections(guarded):
  fn = rewards.math_answer(timeout_seconds=1)
  texts = _texts(guarded, _injections(guarded) + UNICODE)
  _score(fn, texts[: len(texts) - len(BOMBS)], {"answer": "68"})


@pytest.mark.slow
def test_math_answer_on_everything(guarded):
  fn = rewards.math_answer(timeout_seconds=1)
  _score(
    fn, _texts(guarded, _injections(guarded) + HUGE + UNICODE), {"answer": "68"}
  )


@pytest.mark.slow
def test_math_answer_off_the_main_thread(guarded):
  # Off the main thread math-verify runs in the sandbox (no SIGALRM there).
  fn = rewards.math_answer(timeout_seconds=1)
  fn(_samples_of(["\\boxed{68}"]))  # starts its worker before arming
  texts = _texts(guarded, _injections(guarded) + HUGE[:5])
  result = []
  thread = threading.Thread(
    target=lambda: result.append(_score(fn, texts, {"answer": "68"}))
  )
  thread.start()
  thread.join()
  assert result


def _samples_of(texts, metadata=None):
  n = len(texts)
  return rewards.Samples(
    list(texts),
    np.ones(n),
    np.zeros(n, bool),
    [metadata or {"answer": "68"}] * n,
  )


_TASKS = {
  "arithmetic:bare": lambda: tasks.arithmetic(),
  "arithmetic:question": lambda: tasks.arithmetic(prompt_style="question"),
  "reasoning_gym:countdown": lambda: tasks.get(
    "reasoning_gym:countdown", size=2, test_size=1
  ),
  "reasoning_gym:countdown:hash": lambda: tasks.reasoning_gym(
    "countdown", size=2, test_size=1, extract="hash"
  ),
  "reasoning_gym:basic_arithmetic": lambda: tasks.get(
    "reasoning_gym:basic_arithmetic", size=2, test_size=1
  ),
  "reasoning_gym:gsm_symbolic": lambda: tasks.get(
    "reasoning_gym:gsm_symbolic", size=2, test_size=1
  ),
  # Its scorer evals the answer with sympy (and hangs on 9**9**9**9).
  "reasoning_gym:puzzle24": lambda: tasks.get(
    "reasoning_gym:puzzle24", size=2, test_size=1
  ),
}


@pytest.fixture(scope="module")
def started_tasks():
  """name -> the task, its reward's sandbox started (before arming)."""
  built = {}

  def get(name):
    if name not in built:
      if name.startswith("reasoning_gym"):
        pytest.importorskip("reasoning_gym")
      with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_reasoning_gym, "SCORE_TIMEOUT", 3.0)
        task = _TASKS[name]()
      example = task.train[0]
      answer = example["answer"]
      warm = f"<answer>{answer}</answer>\n#### {answer}"
      _score(task.rewards[0][1], [warm], example)
      built[name] = task
    return built[name]

  yield get
  for task in built.values():
    box = getattr(task.rewards[0][1], "sandbox", None)
    if box is not None:
      box.close()


@pytest.mark.parametrize(
  "name",
  [
    pytest.param(name, marks=pytest.mark.slow) if "puzzle24" in name else name
    for name in sorted(_TASKS)
  ],
)
def test_task_rewards(started_tasks, name, guarded):
  task = started_tasks(name)
  example = task.train[0]
  cores = _injections(guarded) + HUGE + UNICODE
  texts = _texts(guarded, cores) + [f"<answer>{example['answer']}</answer>"]
  for _, fn, _ in task.rewards:
    _score(fn, texts, example)
