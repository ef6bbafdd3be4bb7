"""An agent with a calculator: 3-digit multiplication (the README's agent
demo; tasks.get("calculator")), scratch model.

Each sample is an episode (`rljax.envs.EpisodeRollouts`): the policy may
write ``<c>929*342</c>``, decoding stops there, the calculator's result
``<o>317718</o>`` is appended (masked out of the loss), and the policy's
next turn without a call is its answer (reward 1 when exact). The warm
start shows the tool-using transcript for 30% of the problems and the bare
answer for the rest, so the policy starts calling the tool sometimes; GRPO
on the episodes' returns then learns that calling pays. The no-tool
baseline is ``task.kwargs.use_tools=False`` (every call fails).

python -m rljax.training --config configs/agent_calculator.py
"""

import dataclasses

from _arithmetic import base


def get_config():
  config = base(
    "grpo",
    sampler={
      "num_samples": 8,
      "max_new_tokens": 40,
      "engine": "continuous",
      "groups": "episodes",
      "groups_kwargs": {"turn_tokens": 16},
    },
    task={
      "name": "calculator",
      "kwargs": {"digits": 3, "operations": ["*"], "demo_rate": 0.3},
      "max_prompt_tokens": 8,
    },
    train={
      "steps": 60,
      "warm_start_steps": 1000,
      "eval_every": 10,
      "eval_prompts": 200,
    },
  )
  return dataclasses.replace(
    config,
    model=dataclasses.replace(config.model, max_position_embeddings=48),
    output=dataclasses.replace(
      config.output, directory="runs/agent_calculator"
    ),
  )
