"""GKD (arXiv 2306.13649): SmolLM2-135M-Instruct (the teacher, frozen) into
its first 10 layers, on one-digit addition. Half the steps (lmbda 0.5) the
student samples its own completions, the others train on the task's
answers; both models score the same tokens and the loss is the generalized
JSD (beta 0.5) of their next-token distributions over the whole
vocabulary. Slow on CPU:

  python -m rljax.training --config configs/gkd.py
"""

from rljax.training import AlgorithmSpec
from rljax.training import DataSpec
from rljax.training import ModelSpec
from rljax.training import OptimSpec
from rljax.training import OutputSpec
from rljax.training import RunConfig
from rljax.training import SamplerSpec
from rljax.training import TaskSpec
from rljax.training import TrainSpec


def get_config():
  return RunConfig(
    kind="distill",
    model=ModelSpec(source="smollm2", chat_template=True, keep_layers=10),
    teacher=ModelSpec(source="smollm2", chat_template=True),
    task=TaskSpec(
      name="arithmetic",
      kwargs={
        "digits": 1,
        "prompt_style": "question",
        "extract": "last_number",
      },
      max_prompt_tokens=64,
    ),
    sampler=SamplerSpec(num_samples=1, max_new_tokens=12, temperature=1.0),
    algorithm=AlgorithmSpec(
      name="gkd", kwargs={"beta": 0.5, "lmbda": 0.5, "temperature": 1.0}
    ),
    data=DataSpec(source="task"),
    optim=OptimSpec(learning_rate=2e-5, grad_clip=1.0),
    train=TrainSpec(steps=50, prompts_per_step=8, eval_prompts=64),
    output=OutputSpec(directory="runs/gkd", rollouts_every=5),
  )
