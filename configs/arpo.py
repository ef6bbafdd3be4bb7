"""ARPO on the calculator task (3-digit multiplication with a calculator
tool; configs/agent_calculator.py's run), scratch model.

ARPO (arXiv 2507.19849, strategy "arpo", `rljax.envs.ARPOBranching`): each
group of 8 episodes starts 4 from the question (N = M / 2, the paper's 8
of 16) and grows as a tree: k tokens after each tool result, an episode
forks Z = 1 branch when alpha + beta ΔH_t > tau (alpha drawn per point,
beta 0.2, tau 0.5: the official run scripts'), ΔH_t the normalised change
of entropy from the episode's first k tokens, until the group has 8. The
update is GRPO on the episodes' returns (preset episode_grpo), ARPO's
default "soft" advantage: tokens shared by branches get the mean of their
advantages through the per-token loss. k = 2: the paper's 20 tokens are
longer than this task's answers.

python -m rljax.training --config configs/arpo.py
"""

import dataclasses

import agent_calculator


def get_config():
  config = agent_calculator.get_config()
  groups = {**config.sampler.groups_kwargs, "k": 2}
  return dataclasses.replace(
    config,
    sampler=dataclasses.replace(
      config.sampler, groups="arpo", groups_kwargs=groups
    ),
    algorithm=dataclasses.replace(config.algorithm, name="episode_grpo"),
    output=dataclasses.replace(config.output, directory="runs/arpo"),
  )
