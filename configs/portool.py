"""PORTool on the calculator task (configs/agent_calculator.py's run),
scratch model.

PORTool (arXiv 2510.26020): each group of 8 starts 4 episodes from the
question and every tool-call step forks into f = 2 branches while the
group has room (strategy "portool", `rljax.envs.PORToolBranching`), so
branches share their first tool calls. Each step is rewarded by whether a
trajectory through it answers correctly plus 0.1 when its tool calls
succeeded; the update (preset portool) adds the fork-relative advantage
(a step's reward against its siblings', `transforms.portool_advantages`
on the runner's ``node_ids_PG``) to the episode's group advantage.

python -m rljax.training --config configs/portool.py
"""

import dataclasses

import agent_calculator


def get_config():
  config = agent_calculator.get_config()
  groups = {**config.sampler.groups_kwargs, "branching": 2}
  return dataclasses.replace(
    config,
    sampler=dataclasses.replace(
      config.sampler, groups="portool", groups_kwargs=groups
    ),
    algorithm=dataclasses.replace(config.algorithm, name="portool"),
    output=dataclasses.replace(config.output, directory="runs/portool"),
  )
