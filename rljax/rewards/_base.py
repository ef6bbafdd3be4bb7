"""The reward interface: `Samples` in, float32 rewards out; `score` mixes K."""

from collections.abc import Callable, Mapping, Sequence
import math
from typing import Any, NamedTuple

import numpy as np

from rljax._src.errors import UserError


class Samples(NamedTuple):
  """Decoded completions with their prompts' task metadata (host-side).

  N = P*G completions in prompt-major order: the G samples of prompt 0, then
  those of prompt 1, ...

  Attributes:
    texts: the N decoded completions (without the prompt).
    num_tokens: completion lengths in tokens, int [N].
    truncated: True where generation hit the length limit, bool [N].
    metadata: each sample's task example dict, e.g. {"question": ...,
      "answer": "68"} (the G samples of a prompt share one dict).
    extra: per-sample side arrays, name -> array with leading axis N: the
      rollout's ``_PG`` side data (an agent episode's ``tool_calls_PG``,
      ``episode_return_PG``, ...; see `rljax.envs`); None when there is
      none.
  """

  texts: Sequence[str]
  num_tokens: np.ndarray
  truncated: np.ndarray
  metadata: Sequence[Mapping[str, Any]]
  extra: Mapping[str, np.ndarray] | None = None


class RewardResult(NamedTuple):
  """What a reward function returns.

  Attributes:
    values: float32 [N] rewards (0.5 stays 0.5; NaN means "does not apply",
      which `score` counts as 0 like TRL's None; +-inf is an error).
    parsed: bool [N], False where no answer could be extracted; None when
      the notion does not apply (format or length rewards).
  """

  values: np.ndarray
  parsed: np.ndarray | None = None


RewardFn = Callable[[Samples], "RewardResult | np.ndarray"]
RewardSpec = (
  Mapping[str, tuple[RewardFn, float]] | Sequence[tuple[str, RewardFn, float]]
)


class Scores(NamedTuple):
  """K rewards on N samples and their weighted sum.

  Attributes:
    values_NK: float32 [N, K], each reward unweighted.
    weights_K: float32 [K].
    names: the K reward names, in column order.
    total_N: float32 [N], sum_k w_k r_k with NaN terms counted as 0 (the
      semantics of `rljax.shaping.weighted_sum`).
    metrics: "reward/<name>": the mean of each reward over the samples where
      it applies; "unparseable/<name>": the fraction of samples without an
      extractable answer, for rewards that report `parsed`.
  """

  values_NK: np.ndarray
  weights_K: np.ndarray
  names: tuple[str, ...]
  total_N: np.ndarray
  metrics: dict[str, float]


def score(samples: Samples, rewards: RewardSpec) -> Scores:
  """Run K reward functions on the samples and combine them with weights.

  R_n = sum_k w_k r_nk (NaN r_nk counts as 0). Host-side numpy, float32.

  Args:
    samples: the N completions and their metadata.
    rewards: {name: (fn, weight)} or [(name, fn, weight), ...]; each fn maps
      `samples` to a `RewardResult` or to a plain array of N values.

  Returns:
    `Scores` with the per-reward values, the weighted total and the metrics.

  Raises:
    UserError: a reward returned +-inf (or a value beyond float32's range).
    ValueError: a spec, a shape or the samples are malformed.

  References:
    TRL `GRPOTrainer` (`reward_funcs`, `reward_weights`, nansum of rewards).
  """
  specs = as_specs(rewards)
  n = _num_samples(samples)
  results = [_run(name, fn, samples, n) for name, fn, _ in specs]
  values_NK = np.stack([values for values, _ in results], axis=-1)
  weights_K = np.asarray([w for _, _, w in specs], np.float32)
  terms_NK = np.where(np.isnan(values_NK), 0.0, values_NK * weights_K[None, :])
  total_N = np.sum(terms_NK, axis=-1, dtype=np.float32)
  metrics = {}
  for (name, _, _), (values, parsed) in zip(specs, results):
    metrics[f"reward/{name}"] = _nanmean(values)
    if parsed is not None:
      metrics[f"unparseable/{name}"] = _nanmean(~parsed)
  names = tuple(name for name, _, _ in specs)
  return Scores(values_NK, weights_K, names, total_N, metrics)


def as_specs(rewards: RewardSpec) -> list[tuple[str, RewardFn, float]]:
  """Either spec form of `score` as [(name, fn, weight)], validated (a
  `ValueError` names the bad entry)."""
  if isinstance(rewards, Mapping):
    items = [
      (name, *pair) if isinstance(pair, (tuple, list)) else (name, pair)
      for name, pair in rewards.items()
    ]
  else:
    items = [tuple(item) for item in rewards]
  if not items:
    raise ValueError("rewards is empty; give at least one (name, fn, weight).")
  for item in items:
    if len(item) != 3 or not isinstance(item[0], str) or not callable(item[1]):
      raise ValueError(
        "rewards must be {name: (fn, weight)} or [(name, fn, weight), ...]"
        f" with str names and callable fns; got the entry {item!r}."
      )
    if not _is_finite_number(item[2]):
      raise ValueError(
        f"the weight of reward {item[0]!r} must be a finite number; got"
        f" {item[2]!r}."
      )
  names = [name for name, _, _ in items]
  if len(set(names)) != len(names):
    raise ValueError(f"reward names must be unique; got {names}.")
  return [(name, fn, float(w)) for name, fn, w in items]


def _is_finite_number(x: Any) -> bool:
  """True for a real, finite scalar."""
  try:
    return math.isfinite(float(x))
  except (TypeError, ValueError):
    return False


def _num_samples(samples: Samples) -> int:
  """N, after checking that every field of `samples` has N entries."""
  n = len(samples.texts)
  for field in ("num_tokens", "truncated", "metadata"):
    value = getattr(samples, field)
    if value is not None and len(value) != n:
      raise ValueError(
        f"samples.{field} has {len(value)} entries but samples.texts has {n};"
        " every field needs one entry per completion."
      )
  for name, value in (samples.extra or {}).items():
    if len(value) != n:
      raise ValueError(
        f"samples.extra[{name!r}] has {len(value)} entries but samples.texts"
        f" has {n}; every side array needs one entry per completion."
      )
  return n


def _run(
  name: str, fn: RewardFn, samples: Samples, n: int
) -> tuple[np.ndarray, np.ndarray | None]:
  """Call one reward function and check the shapes of what it returns."""
  out = fn(samples)
  values, parsed = out if isinstance(out, RewardResult) else (out, None)
  with np.errstate(over="ignore"):  # beyond float32 becomes inf, see below
    values = np.asarray(values, np.float32)
  if values.shape != (n,):
    raise ValueError(
      f"reward {name!r} returned values of shape {values.shape}; it must"
      f" return one value per sample, shape ({n},)."
    )
  infinite = np.flatnonzero(np.isinf(values))
  if infinite.size:
    shown = ", ".join(str(i) for i in infinite[:5])
    more = f" and {infinite.size - 5} more" if infinite.size > 5 else ""
    raise UserError(
      f"reward {name!r} returned infinite values for the samples at indices"
      f" {shown}{more} (beyond float32's range counts as infinite); return"
      " finite rewards (clip them), or NaN where the reward does not apply."
    )
  if parsed is not None:
    parsed = np.asarray(parsed, bool)
    if parsed.shape != (n,):
      raise ValueError(
        f"reward {name!r} returned parsed of shape {parsed.shape}; it must"
        f" be None or bool of shape ({n},)."
      )
  return values, parsed


def _nanmean(x: np.ndarray) -> float:
  """Mean over the non-NaN entries; NaN when there are none."""
  x = np.asarray(x, np.float64)
  kept = x[~np.isnan(x)]
  return float(kept.mean()) if kept.size else math.nan
