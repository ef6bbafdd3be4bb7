"""SmolLM2-135M-Instruct with a sandboxed Python tool on reasoning-gym's
basic arithmetic (tasks.get("python:reasoning_gym:basic_arithmetic")).

SmolLM2's chat template has no tool-call format, so the system message
lists the tool and asks for Hermes-style calls,
``<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>``;
decoding stops at ``</tool_call>``, the code runs in `rljax.sandbox` (a
fresh process per call, 4 at once, CPU, memory, output and time limits, no
network), and its output comes back as a "tool" message (masked out of the
loss). The first turn without a call is the answer, scored by the task's
reward. Slow on CPU (minutes per step on 2 cores):

  python -m rljax.training --config configs/agent_python.py
"""

from rljax.training import AlgorithmSpec
from rljax.training import ModelSpec
from rljax.training import OptimSpec
from rljax.training import OutputSpec
from rljax.training import RunConfig
from rljax.training import SamplerSpec
from rljax.training import TaskSpec
from rljax.training import TrainSpec


def get_config():
  return RunConfig(
    model=ModelSpec(source="smollm2", chat_template=True),
    task=TaskSpec(
      name="python:reasoning_gym:basic_arithmetic",
      kwargs={"size": 2000, "test_size": 50, "max_turns": 3},
      max_prompt_tokens=320,
    ),
    sampler=SamplerSpec(
      num_samples=4,
      max_new_tokens=160,
      temperature=1.0,
      engine="continuous",
      groups="episodes",
      groups_kwargs={"turn_tokens": 64, "step_timeout": 30.0},
    ),
    algorithm=AlgorithmSpec(name="grpo"),
    optim=OptimSpec(learning_rate=2e-5, grad_clip=1.0),
    # One prompt's 4 episodes per micro-batch (exact: micro-batching sums
    # the whole minibatch's gradient): the dry run measures 6.3 GiB of update
    # temporaries and a 9.4 GB peak; 2 micro-batches exceeded 24 GB.
    train=TrainSpec(
      steps=4, prompts_per_step=4, eval_prompts=8, microbatches=4
    ),
    output=OutputSpec(directory="runs/agent_python", rollouts_every=1),
  )
