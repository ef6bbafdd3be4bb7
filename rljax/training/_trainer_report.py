"""What a `Trainer` reports: step and evaluation metrics, the non-finite
policy's verdicts, and a dry run's figures.

Means are over every process's samples: each process sums its own rows,
the sums are summed over processes, and one count divides them all.
"""

import logging
import math
import time
from typing import Any

import jax
import numpy as np

from rljax import monitoring
from rljax import sharding
from rljax._src.errors import NonFiniteError
from rljax.training import _hosts
from rljax.training import _precision

# Progress-bar labels for the metrics people watch.
PROGRESS_KEYS = {
  "reward": "rew",
  "accuracy": "acc",
  "kl": "kl",
  "entropy": "ent",
  "clip_frac": "clip",
  "response_length": "len",
}

# Metrics the learning-curve plot shows.
PLOT_KEYS = (
  "reward",
  "accuracy",
  "eval_accuracy",
  "kl",
  "entropy",
  "response_length",
)

# Update metrics that flag a non-finite step, and what they name.
NONFINITE_CAUSES = {
  "nonfinite_loss": "the policy loss",
  "nonfinite_grads": "the policy gradient",
  "nonfinite_params": "the updated policy parameters",
  "nonfinite_value": "the critic's gradient or parameters",
}


def add_summary_names(out: dict[str, float]) -> None:
  """Summary names the progress bar and plots show."""
  out["kl"] = out.get("kl_ref", out.get("kl_old", 0.0))
  out["clip_frac"] = out.get("clip_frac_low", 0.0) + out.get(
    "clip_frac_high", 0.0
  )


def episode_metrics(scored) -> dict[str, np.ndarray]:
  """Per-prompt tool calls and turns of agent episodes (first sample)."""
  extra = scored.extra or {}
  if "turns_PG" not in extra:
    return {}
  return {
    "tool_calls": np.asarray(extra["tool_calls_PG"])[:, 0].sum(-1),
    "tool_call_rate": np.asarray(extra["tool_calls_PG"])[:, 0].sum(-1) > 0,
    "turns": np.asarray(extra["turns_PG"])[:, 0],
  }


def rollout_metrics(
  scored, refills, num_kept, *, rows: int, prompts_per_step: int, mesh=None
) -> dict[str, float]:
  """Means over every process's samples (sums over processes / counts, a
  collective on `mesh`'s devices); `rows`: this process's prompts."""
  values = np.asarray(scored.scores.values_NK)
  mask = np.asarray(scored.rollout.mask_PGT)
  valid = np.asarray(scored.rollout.sample_mask_PG).reshape(-1) > 0
  n = int(valid.sum())  # samples (a prompt may have fewer than G)
  sums = {
    "reward": np.sum(np.asarray(scored.rewards_PG).reshape(-1)[valid]),
    # A task's first reward is its correctness check.
    "accuracy": np.sum(values[valid, 0] > 0),
    "response_length": mask.sum(),
    "truncated": np.sum(scored.rollout.truncated_PG),
    # Fractions and means weighted by n like the sums above, so that one
    # count divides everything; kept_groups becomes a count below.
    "kept_groups": num_kept * n / rows,
    **{k: v * n for k, v in scored.scores.metrics.items()},
  }
  sums = {k: np.float64(v) for k, v in sums.items()}
  total = _hosts.process_sum({"count": np.float64(n), **sums}, mesh)
  out = {k: float(total[k] / total["count"]) for k in sums}
  out["kept_groups"] *= prompts_per_step
  out["tokens"] = float(total["response_length"])
  out["samples"] = float(total["count"])
  out["refills"] = float(refills)
  return out


def stop_or_warn(config, step: int, metrics, in_a_row: int, skipped: int):
  """After an update skipped for a NaN or an infinity: stop the run
  (``train.nonfinite=stop``, or too many in a row), or log a warning."""
  t = config.train
  cause = " and ".join(
    what for key, what in NONFINITE_CAUSES.items() if metrics.get(key)
  )
  advice = (
    f"Likely causes: a learning rate too high (optim.learning_rate="
    f"{config.optim.learning_rate}), extreme rewards or advantages, or"
    " a custom objective's NaN. The update was not applied and no"
    " checkpoint holds it; resume from the last checkpoint with a lower"
    " optim.learning_rate"
  )
  if t.nonfinite == "stop":
    raise NonFiniteError(
      f"step {step + 1}: {cause} held a NaN or an infinity. {advice}, or"
      " set train.nonfinite=skip to skip such updates."
    )
  logging.getLogger("rljax").warning(
    "step %d: %s held a NaN or an infinity; the update was skipped"
    " (%d in a row, %d in all).",
    step + 1,
    cause,
    in_a_row,
    skipped,
  )
  if in_a_row >= t.max_skipped_updates:
    raise NonFiniteError(
      f"step {step + 1}: {in_a_row} updates in a row were"
      f" skipped because {cause} held a NaN or an infinity"
      f" (train.max_skipped_updates={t.max_skipped_updates}). {advice}."
    )


def eval_rows(mesh, n: int) -> tuple[np.ndarray, int]:
  """This process's rows of `n` evaluation prompts padded to a multiple of
  the mesh's batch axes, and the padded count."""
  shards = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
  padded = -(-n // shards) * shards
  return _hosts.own_rows(mesh, padded), padded


def eval_metrics(sample, real, eval_samples: int, temperature: float):
  """Greedy accuracy (and pass@k when `eval_samples` > 1) of
  ``sample(greedy=..., ...)``'s scored rollouts, over the rows where
  `real` is true (the padding is not counted), every process's summed."""
  real = real.astype(np.float64)
  greedy = sample(greedy=True)
  correct = greedy.scores.values_NK[:, 0] > 0
  sums = {"count": real.sum(), "eval_accuracy": (correct * real).sum()}
  for name, values in episode_metrics(greedy).items():
    sums[f"eval_{name}"] = (values * real).sum()
  if eval_samples > 1:
    sampled = sample(num_samples=eval_samples, temperature=temperature)
    right = (sampled.scores.values_NK[:, 0] > 0).reshape(len(real), -1)
    for k in sorted({1, eval_samples}):
      passed = monitoring.pass_at_k(eval_samples, right.sum(-1), k)
      sums[f"eval_pass@{k}"] = (np.asarray(passed) * real).sum()
  total = _hosts.process_sum(sums)
  return {
    k: float(v / total["count"]) for k, v in total.items() if k != "count"
  }


def dry_run_report(start, compiled, metrics, state) -> dict[str, Any]:
  """The dry run's figures: time since `start`, the compiled update's
  memory (XLA's analysis), the parameter count and the step's metrics."""
  memory = compiled.memory_analysis()
  mib = lambda n: round(n / 2**20, 2)  # noqa: E731
  return {
    "step_seconds_with_compile": round(time.perf_counter() - start, 2),
    "update_temp_mib": mib(memory.temp_size_in_bytes),
    "update_argument_mib": mib(memory.argument_size_in_bytes),
    "update_output_mib": mib(memory.output_size_in_bytes),
    "parameters": int(
      sum(x.size for x in jax.tree.leaves(state.policy.params))
    ),
    "train_state_mib": _state_mib(state),
    "metrics": metrics,
  }


def _state_mib(state) -> dict[str, float]:
  """MiB of each part of the train state (global, not per device)."""
  s = state
  parts = {
    "params": s.policy.params,
    "optimizer": s.policy.opt_state,
    "reference": s.reference,
    "value": s.value,
  }
  mib = {k: _precision.tree_bytes(v) / 2**20 for k, v in parts.items()}
  mib["total"] = sum(mib.values())
  return {k: round(v, 3) for k, v in mib.items()}


def write_rollouts(writer, step: int, scored) -> None:
  """A scored rollout's prompts, completions and total scores to a
  `monitoring.RolloutWriter` (which keeps every n-th step)."""
  g = scored.rewards_PG.shape[1]
  writer.maybe_write(
    step,
    [p for p in scored.prompts for _ in range(g)],
    scored.completions,
    np.asarray(scored.scores.total_N),
  )
