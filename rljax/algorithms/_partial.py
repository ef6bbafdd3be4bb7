"""Presets over partial rollouts (`rljax.rollouts.PartialRollouts`):
samples paused in one step and continued under the next policy."""

from rljax import advantages
from rljax import aggregate
from rljax import losses
from rljax import objectives
from rljax import transforms
from rljax._src.base import Algorithm
from rljax._src.base import chain


def c3po_pp(
  *, eps: float = 0.2, low: float = 0.5, high: float = 5.0
) -> Algorithm:
  """C3PO++ with IcePop (Ring-1T, arXiv 2510.18855): GRPO over groups
  whose long samples were drawn by several policy versions (partial
  rollouts, ``sampler.groups='partial'``), with IcePop's masked importance
  weights (`transforms.icepop`: tokens whose training/sampler probability
  ratio leaves [low, high] = [0.5, 5] are dropped), which absorb both the
  engine mismatch and the policy lag of earlier steps' tokens. PPO clip,
  each sequence's token mean averaged over sequences."""
  return Algorithm(
    chain(
      transforms.icepop(low=low, high=high),
      transforms.group_advantages(advantages.grpo),
      objectives.policy(losses.ppo_clip, eps_low=eps, eps_high=eps),
    ),
    aggregate.seq_mean_token_mean,
  )


def tppo(
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.28,
  gamma: float = 1.0,
  lam: float = 0.95,
) -> Algorithm:
  """T-PPO (arXiv 2506.15050): PPO over windows of partial rollouts
  (``sampler.groups='partial'`` with ``train_unfinished``): extended GAE
  on responses still running, each token trained in the window that drew
  it, the critic on finished responses (`transforms.egae_advantages`);
  PPO clip [1 - 0.2, 1 + 0.28] (the paper builds on DAPO's / VC-PPO's
  recipe; ours: their usual clip-higher), token mean."""
  return Algorithm(
    chain(
      transforms.egae_advantages(gamma=gamma, lam=lam),
      objectives.policy(losses.ppo_clip, eps_low=eps_low, eps_high=eps_high),
    ),
    aggregate.token_mean,
  )


PRESETS = {"c3po_pp": c3po_pp, "tppo": tppo}
