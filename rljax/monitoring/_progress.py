"""A console progress bar whose postfix shows the RL training metrics."""

from collections.abc import Callable, Mapping, Sequence
import math
import sys
import time
from typing import Any, Optional, TextIO

import jax
import tqdm

from rljax.monitoring._values import to_floats

Keys = Mapping[str, str] | Sequence[tuple[str, str]]

# metric name -> short label, in display order.
DEFAULT_POSTFIX = {
  "reward": "rew",
  "accuracy": "acc",
  "kl_ref": "kl",
  "entropy": "ent",
  "clip_frac": "clip",
  "response_length": "len",
}


def format_number(x: float) -> str:
  """Three significant digits, SI suffixes from 1000, ``1.2e-3`` below 0.01.

  >>> [format_number(v) for v in (0.5312, 12.34, 3141.0, 0.00123, 0.0)]
  ['0.531', '12.3', '3.14k', '1.2e-3', '0']
  """
  if x == 0 or not math.isfinite(x):
    return f"{x:g}"
  if abs(x) < 0.01:
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"
  for suffix in ("", "k", "M", "G"):
    # 999.5 would print as "1e+03" with 3 significant digits.
    if abs(x) < 999.5:
      return f"{x:.3g}{suffix}"
    x /= 1000
  return f"{x:.3g}T"


def format_postfix(
  values: Mapping[str, float],
  keys: Keys = DEFAULT_POSTFIX,
  tokens_per_s: Optional[float] = None,
) -> str:
  """``"rew 0.53 acc 0.41 ... tok/s 3.1k"``: the `keys` present in `values`.

  Args:
    values: metric name -> float.
    keys: metric name -> label (or (name, label) pairs), in display order;
      names missing from `values` are skipped.
    tokens_per_s: appended as ``tok/s`` when given.

  Returns:
    The postfix string.
  """
  parts = [
    f"{label} {format_number(values[name])}"
    for name, label in dict(keys).items()
    if name in values
  ]
  if tokens_per_s is not None:
    parts.append(f"tok/s {format_number(tokens_per_s)}")
  return " ".join(parts)


class ProgressBar:
  """A tqdm bar over training steps with the metrics in its postfix.

  ``update(step, metrics)`` moves the bar to `step` and shows ``rew 0.53
  acc 0.41 kl 1.2e-3 ent 0.85 clip 0.02 len 12.3 tok/s 3.1k`` from the
  metrics. Tokens per second are ``metrics[tokens_key]`` (the tokens processed
  since the previous update) over the wall time since the previous update (or
  since the bar was created). Only process 0 draws. The bar also draws when the
  output is not a terminal (CI logs), then at most every `mininterval` seconds
  so logs stay short.

  Args:
    total: the number of steps.
    initial: the step to start from (a resumed run).
    keys: metric name -> label (or (name, label) pairs) shown in the
      postfix, in order.
    tokens_key: the metric holding the tokens processed in the step.
    desc: a prefix for the bar.
    mininterval: seconds between redraws; default 0.1 on a terminal, 30
      otherwise.
    file: where to draw (default stderr).
    clock: the wall clock (seconds).
  """

  def __init__(
    self,
    total: int,
    *,
    initial: int = 0,
    keys: Keys = DEFAULT_POSTFIX,
    tokens_key: str = "tokens",
    desc: Optional[str] = None,
    mininterval: Optional[float] = None,
    file: Optional[TextIO] = None,
    clock: Callable[[], float] = time.perf_counter,
  ):
    file = file or sys.stderr
    if mininterval is None:
      mininterval = 0.1 if _isatty(file) else 30.0
    self.active = jax.process_index() == 0
    self.keys = dict(keys)
    self.tokens_key = tokens_key
    self.postfix = ""
    self._clock = clock
    self._last = clock()
    self._bar = tqdm.tqdm(
      total=total,
      initial=initial,
      desc=desc,
      file=file,
      mininterval=mininterval,
      dynamic_ncols=True,
      disable=not self.active,
    )

  def update(self, step: int, metrics: Optional[Mapping[str, Any]] = None):
    """Move the bar to `step` (steps done) and show `metrics`.

    Args:
      step: the number of steps done; the bar jumps there.
      metrics: this update's metrics (scalars, jax or numpy); the tokens
        count is the tokens processed since the previous update.
    """
    if not self.active:
      return
    now = self._clock()
    elapsed, self._last = now - self._last, now
    wanted = set(self.keys) | {self.tokens_key}
    values = to_floats(
      {k: v for k, v in (metrics or {}).items() if k in wanted}
    )
    rate = None
    if self.tokens_key in values and elapsed > 0:
      rate = values[self.tokens_key] / elapsed
    self.postfix = format_postfix(values, self.keys, rate)
    self._bar.set_postfix_str(self.postfix, refresh=False)
    self._bar.update(step - self._bar.n)

  def close(self) -> None:
    """Draw the final state and release the terminal line."""
    self._bar.close()

  def __enter__(self) -> "ProgressBar":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def _isatty(file: Any) -> bool:
  """Whether `file` is an interactive terminal."""
  return bool(getattr(file, "isatty", None) and file.isatty())
