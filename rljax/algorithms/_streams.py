"""Presets over a group's streams (`rljax.rollouts` strategies)."""

from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import chain
from rljax.advantages import grpo as grpo_advantages


def icpo(
  *,
  eps: float = 0.2,
  dual_clip: float | None = 3.0,
  gamma: float = 0.1,
  beta: float = 1.0,
  horizon: int = 400,
) -> Algorithm:
  """ICPO (arXiv 2510.26519): GRPO over a group mixing on-policy samples
  and implicit-expert-forcing samples (`rljax.rollouts.InContextDemos`,
  stream 1): the expert bonus (`transforms.icpo_expert_bonus`), group
  advantages over the whole group, the clipped ratio (dual clip 3) on the
  on-policy samples and the shaped loss -A pi / (pi + gamma)
  (`losses.icpo_shaped`) on the expert ones, token mean. Defaults of the
  official scripts (Celine-hxy/ICPO)."""
  # rljax.rollouts.PLAIN and PRIVILEGED (not imported: the algorithm
  # layer does not depend on the sampler)
  on, expert = (0,), (1,)
  return Algorithm(
    chain(
      transforms.icpo_expert_bonus(
        beta=beta, horizon=horizon, expert_streams=expert
      ),
      transforms.group_advantages(grpo_advantages),
      transforms.stream_weights(icpo_on_PG=on, icpo_expert_PG=expert),
      objectives.mixed_policy(
        losses.ppo_clip,
        mix=[("advantages_PGT", "icpo_on_PG")],
        eps_low=eps,
        eps_high=eps,
        dual_clip=dual_clip,
      ),
      objectives.mixed_policy(
        losses.icpo_shaped,
        mix=[("advantages_PGT", "icpo_expert_PG")],
        gamma=gamma,
      ),
    ),
    aggregate.token_mean,
  )


PRESETS = {"icpo": icpo}
