"""The single-stream SPO preset (arXiv 2509.13232); see
`rljax.transforms.single_stream_advantages` and
`rljax.selection.SingleStream`."""

from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax._src.base import Algorithm
from rljax._src.base import chain
from rljax.transforms import _single_stream


def spo(
  *,
  num_prompts: int = 2**16,
  forgetting: str = "constant",
  rho: float = 0.875,
  eps_low: float = 0.2,
  eps_high: float = 0.28,
) -> Algorithm:
  """Single-stream SPO (arXiv 2509.13232): one sample per prompt, the
  baseline a persistent per-prompt Beta tracker, advantages z-scored over
  the batch (`transforms.single_stream_advantages`), PPO clip with the
  official run script's bounds (0.2, 0.28), token mean (verl's default).

  Run it with ``sampler.num_samples=1`` and the prioritized sampler
  ``sampler.prompts="single_stream"`` (`rljax.selection.SingleStream`).
  Set ``num_prompts`` to ``len(task.train)`` (the `Trainer` refuses a
  smaller table). ``forgetting="kl"`` needs the policy drift per prompt in
  ``Batch.extra["policy_drift_P"]``, which the Trainer does not compute
  yet; the default is the official code's constant ``rho``.
  """
  return Algorithm(
    chain(
      _single_stream.single_stream_advantages(
        num_prompts, forgetting=forgetting, rho=rho
      ),
      objectives.policy(losses.ppo_clip, eps_low=eps_low, eps_high=eps_high),
    ),
    aggregate.token_mean,
  )


PRESETS = {"spo": spo}
