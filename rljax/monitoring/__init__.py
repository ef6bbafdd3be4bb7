"""Observability for training runs: metrics, progress, rollouts, plots, pass@k.

Everything that writes does so from ``jax.process_index() == 0`` only (the
other processes of a multi-host run get no-ops), so a loop calls it on every
process unconditionally.

* `MetricsLogger`: metrics.jsonl + TensorBoard (+ W&B when asked).
* `ProgressBar`: tqdm with reward, accuracy, KL, entropy, clip fraction,
  response length and tokens/s in its postfix.
* `RolloutWriter`: sampled (prompt, completion, reward) JSON lines every K
  steps.
* `plot_learning_curves`, `plot_runs`, `read_metrics`: PNGs without a display.
* `pass_at_k`: the unbiased estimator for evaluation.
"""

from rljax.monitoring._logger import MetricsLogger
from rljax.monitoring._pass_at_k import pass_at_k
from rljax.monitoring._plots import DEFAULT_PLOT_KEYS
from rljax.monitoring._plots import plot_learning_curves
from rljax.monitoring._plots import plot_runs
from rljax.monitoring._plots import read_metrics
from rljax.monitoring._progress import DEFAULT_POSTFIX
from rljax.monitoring._progress import ProgressBar
from rljax.monitoring._progress import format_number
from rljax.monitoring._progress import format_postfix
from rljax.monitoring._rollouts import RolloutWriter

__all__ = [
  "DEFAULT_PLOT_KEYS",
  "DEFAULT_POSTFIX",
  "MetricsLogger",
  "ProgressBar",
  "RolloutWriter",
  "format_number",
  "format_postfix",
  "pass_at_k",
  "plot_learning_curves",
  "plot_runs",
  "read_metrics",
]
