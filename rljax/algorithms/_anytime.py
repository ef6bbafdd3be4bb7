"""AnytimeReasoner's preset: BRPO over thinking cut at token budgets."""

from collections.abc import Sequence
from typing import Optional

from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import chain


def brpo(
  *,
  budgets: Sequence[int] = (2000, 4000, 6000, 8000),
  prior: str | Sequence[float] = "uniform",
  num_summaries: int = 4,
  baseline: str = "brpo",
  summaries: str = "all",
  summary_baseline: Optional[str] = None,
  eps: float = 0.2,
) -> Algorithm:
  """AnytimeReasoner / BRPO (arXiv 2505.13438) over the rows of the group
  strategy `rljax.rollouts.AnytimeBudgets` (``sampler.groups="anytime"``
  with the same `budgets` and `num_summaries`): thinking tokens take the
  budget-relative chunk advantage and summary tokens the summary one
  (`transforms.brpo_advantages`), PPO clip 0.2, token mean, no KL.

  Defaults of the official scripts (sail-sg/AnytimeReasoner README and
  run_1.5b_8k.sh): 4 budgets of an 8000-token window, 4 summaries per
  cut, ``variance_reduction=brpo``, ``summary_method=brpo``, clip 0.2, no
  KL loss. `prior` is ``"uniform"``, ``"linear"`` or ``"base"`` (the
  paper's three priors, `transforms.budget_prior`) or S weights. The
  summary baseline defaults to the code's rule: the mean over the
  summaries of the same prefix when ``num_summaries > 1``, over the
  group's summaries at the same budget when it is 1. The code divides the
  loss by a micro-batch's rows times its padded width; here it is the
  token mean. The GRPO baseline of the paper is ``num_summaries=1,
  summaries="last", baseline="v2", prior="base"``.
  """
  if summary_baseline is None:
    summary_baseline = "prefix" if num_summaries > 1 else "budget"
  return Algorithm(
    chain(
      transforms.brpo_advantages(
        transforms.budget_prior(budgets, prior),
        baseline=baseline,
        summary_baseline=summary_baseline,
        summaries=summaries,
      ),
      objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps),
    ),
    aggregate.token_mean,
  )


PRESETS = {"brpo": brpo}
