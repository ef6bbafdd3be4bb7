"""ProgressBar: postfix strings by hand, tokens/s from a fake clock, drawn
when the output is not a terminal, silent on processes other than 0."""

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.monitoring import ProgressBar
from rljax.monitoring import format_number
from rljax.monitoring import format_postfix


@pytest.mark.parametrize(
  "x, expected",
  [
    (0.0, "0"),
    (0.53, "0.53"),
    (0.8512, "0.851"),  # 3 significant digits
    (12.34, "12.3"),
    (999.4, "999"),
    (999.7, "1k"),  # would be "1e+03" with a plain :.3g
    (3100.0, "3.1k"),
    (12_345_678.0, "12.3M"),
    (0.02, "0.02"),
    (0.0012, "1.2e-3"),
    (-0.00056, "-5.6e-4"),
    (float("nan"), "nan"),
  ],
)
def test_format_number(x, expected):
  assert format_number(x) == expected


def test_postfix_by_hand_and_missing_keys_skipped():
  values = {
    "reward": 0.53,
    "accuracy": 0.41,
    "kl_ref": 1.2e-3,
    "entropy": 0.85,
    "clip_frac": 0.02,
    "response_length": 12.3,
  }
  assert (
    format_postfix(values, tokens_per_s=3100.0)
    == "rew 0.53 acc 0.41 kl 1.2e-3 ent 0.85 clip 0.02 len 12.3 tok/s 3.1k"
  )
  assert format_postfix({"entropy": 0.85, "reward": 1.0}) == "rew 1 ent 0.85"
  assert format_postfix({"loss": 2.5}, keys={"loss": "L"}) == "L 2.5"
  assert format_postfix({"b": 1, "a": 2}, keys=[("a", "A"), ("b", "B")]) == (
    "A 2 B 1"
  )


class _Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_tokens_per_second_from_wall_time_between_updates():
  clock, out = _Clock(), io.StringIO()
  bar = ProgressBar(10, file=out, clock=clock)
  clock.now += 2.0
  # 6400 tokens in 2 s -> 3200 tok/s; jax and numpy values are accepted.
  bar.update(1, {"reward": jnp.float32(0.5), "tokens": np.int32(6400)})
  assert bar.postfix == "rew 0.5 tok/s 3.2k"
  clock.now += 0.5
  bar.update(2, {"reward": 0.75, "tokens": 500, "note": "unused"})  # 500/0.5
  assert bar.postfix == "rew 0.75 tok/s 1k"
  bar.update(3, {"accuracy": 0.25})  # no tokens -> no rate
  assert bar.postfix == "acc 0.25"
  bar.close()


def test_bar_draws_to_a_non_terminal_with_a_long_mininterval():
  out = io.StringIO()
  bar = ProgressBar(4, initial=1, file=out, desc="grpo")
  assert bar._bar.mininterval == 30.0  # CI logs stay short
  bar.update(2, {"reward": 0.5})
  assert bar._bar.n == 2
  bar.update(4, {"reward": 0.5})  # jumps to the step, not by one
  bar.close()
  text = out.getvalue()
  assert "grpo" in text and "4/4" in text and "rew 0.5" in text


def test_other_processes_draw_nothing(monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  out = io.StringIO()
  bar = ProgressBar(3, file=out)
  bar.update(1, {"reward": jnp.ones(3)})  # not even converted
  bar.close()
  assert out.getvalue() == "" and bar.postfix == ""
