"""AEPO (agentic) on the calculator task (configs/agent_calculator.py's
run), scratch model.

AEPO (arXiv 2510.14545) balances entropy in the rollout and in the update.
Rollout (strategy "aepo", `rljax.envs.AEPOEpisodes`): each step first runs
one monitoring episode per question; its entropies split each group's 8
samples into m episodes from the question, m = 8 sigmoid(0.5 (H_root -
mean H_tool)), and branches; `AEPOBranching` then forks an episode k = 2
tokens after a tool result when (alpha + 0.2 ΔH_t)(1 - 0.05 l) > 0.5, l
counting the group's consecutive forking turns. Update (preset
aepo_agentic): GRPO on the episode returns with AEPO's entropy-balanced
clip (stop-gradient in the high-entropy clipping term, `objectives.aepo`)
and entropy-aware advantage A (1 + 0.2 z(H)).

python -m rljax.training --config configs/aepo_agentic.py
"""

import dataclasses

import agent_calculator


def get_config():
  config = agent_calculator.get_config()
  groups = {**config.sampler.groups_kwargs, "k": 2}
  return dataclasses.replace(
    config,
    sampler=dataclasses.replace(
      config.sampler, groups="aepo", groups_kwargs=groups
    ),
    algorithm=dataclasses.replace(config.algorithm, name="aepo_agentic"),
    output=dataclasses.replace(config.output, directory="runs/aepo_agentic"),
  )
