"""Delethink: trace-level GRPO over chunked (Markovian) traces."""

from typing import Optional

from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import chain


def delethink(
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.26,
  tis_cap: Optional[float] = 2.0,
  scale: str = "std",
) -> Algorithm:
  """Delethink (arXiv 2510.06557, "The Markovian Thinker"): every chunk of
  a trace (`rljax.rollouts.MarkovianChunks`, ``sampler.groups=
  "markovian"``) is a training row; the trace's GRPO advantage is shared
  by its chunks (`transforms.delethink_advantages`), each token weighs
  1 / (its trace's length) and the loss averages over traces
  (`transforms.trace_length_norm` + `aggregate.token_mean`, verl's
  ``seq-mean-token-norm-trace-length``), PPO clip [1 - 0.2, 1 + 0.26] and
  truncated importance sampling against the sampler's log-probs capped at
  2 (`transforms.token_tis`; None: off). No KL term. Defaults of the
  official run (McGill-NLP/the-markovian-thinker
  verl/trainer/config/r1d-1.5b_deepscaler_delethink_24k.yaml:
  ``adv_estimator: grpo``, ``clip_ratio_high: 0.26``,
  ``tis_imp_ratio_cap: 2``; verl's default low clip 0.2). The run's
  ``fixed_num_optim_steps: 2`` (mini-batch size adjusted so each step makes
  two updates) is a trainer setting: ``train.minibatches=2``."""
  stages = [transforms.delethink_advantages(scale=scale)]
  if tis_cap is not None:  # before the normaliser: it reads the 0/1 mask
    stages.append(transforms.token_tis(threshold=tis_cap))
  stages += [
    transforms.trace_length_norm(),
    objectives.policy(losses.ppo_clip, eps_low=eps_low, eps_high=eps_high),
  ]
  return Algorithm(chain(*stages), aggregate.token_mean)


PRESETS = {"delethink": delethink}
