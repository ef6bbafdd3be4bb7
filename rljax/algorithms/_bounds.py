"""Presets with adaptive or per-token clip bounds: BAPO and DCPO (see
`rljax.objectives._bounds` and `rljax.transforms._bounds`)."""

from typing import Optional

from rljax import advantages
from rljax import aggregate
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import chain
from rljax.objectives import _bounds as objectives
from rljax.transforms import _bounds as stages


def bapo(
  *,
  rho0: float = 0.5,
  low_start: float = 0.6,
  low_max: float = 0.9,
  low_step: float = 0.05,
  high_start: float = 1.2,
  high_max: float = 3.0,
  high_step: float = 0.1,
  contribution: str = "clamped",
) -> Algorithm:
  """BAPO (arXiv 2510.18927): GRPO advantages, PPO clip with ratio bounds
  searched over each minibatch until P / N >= rho0 (`objectives.bapo`),
  dual clip 3, token mean (the official recipe keeps verl's default
  ``loss_agg_mode``), no KL term (its example script)."""
  return Algorithm(
    chain(
      transforms.group_advantages(advantages.grpo),
      objectives.bapo(
        rho0=rho0,
        low_start=low_start,
        low_max=low_max,
        low_step=low_step,
        high_start=high_start,
        high_max=high_max,
        high_step=high_step,
        contribution=contribution,
      ),
    ),
    aggregate.token_mean,
  )


def dcpo(
  *,
  num_prompts: int = 2**16,
  eps_low: float = 0.16,
  eps_high: float = 0.2,
  max_high: Optional[float] = 10.0,
  dual_clip: Optional[float] = 3.0,
) -> Algorithm:
  """DCPO (arXiv 2509.02333): Smooth Advantage Standardization per prompt
  (`transforms.dcpo_sas_advantages`, a table of ``num_prompts`` rows keyed
  by ``Batch.prompt_ids_P``; set it to ``len(task.train)``), the dynamic-adaptive clip from the old token
  probability (`objectives.dcpo_clip`, eps 0.16 / 0.2) and the OTM loss:
  each response's token sum, averaged over responses
  (`aggregate.seq_mean_token_sum`)."""
  return Algorithm(
    chain(
      stages.dcpo_sas_advantages(num_prompts),
      objectives.dcpo_clip(
        eps_low=eps_low,
        eps_high=eps_high,
        max_high=max_high,
        dual_clip=dual_clip,
      ),
    ),
    aggregate.seq_mean_token_sum,
  )


PRESETS = {"bapo": bapo, "dcpo": dcpo}
