"""GiGPO on the 4x4 grid world (tasks.get("grid_world")), scratch model.

GiGPO (arXiv 2505.10978, preset `gigpo`): each episode's actions get the
episode's group-relative advantage plus a step advantage relative to the
other actions taken in the same board (anchor states: the runner's
``state_ids_PG``, equal drawings), with discounted returns (gamma 0.95),
so shorter paths earn more.

The episodes (`rljax.envs.EpisodeRollouts`, ``sampler.groups='episodes'``)
give a policy turn at most 2 tokens, and a turn ends at its move letter
(the task's ``stop_at_move``). The step's budget of 160 tokens holds all 8
turns: 8 x 2 action tokens and 7 observations of 20 (the redrawn grid and
":"); the 20-token prompt and the budget fit the model's 192 positions.
As turns need no stop token, an episode is plain text, and the supervised
warm start learns whole episodes that play a shortest path (each
example's "demonstration": the moves and the boards between them); RL
then trains on the model's own episodes.

python -m rljax.training --config configs/gigpo_grid.py [train.steps=...]
"""

import dataclasses

from _arithmetic import base


def get_config():
  config = base(
    "gigpo",
    sampler={
      "num_samples": 8,
      "max_new_tokens": 160,
      "engine": "continuous",
      "groups": "episodes",
      "groups_kwargs": {"turn_tokens": 2},
    },
    task={
      "name": "grid_world",
      "kwargs": {"size": 4, "max_turns": 8, "max_moves": 6},
      "max_prompt_tokens": 20,
    },
    train={"warm_start_steps": 400, "eval_prompts": 200},
  )
  return dataclasses.replace(
    config,
    model=dataclasses.replace(config.model, max_position_embeddings=192),
    output=dataclasses.replace(config.output, directory="runs/gigpo_grid"),
  )
