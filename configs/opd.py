"""On-policy distillation with a task reward: SmolLM2-135M-Instruct (the
teacher, frozen) into its first 10 layers (the student), on one-digit
addition. The student samples; the teacher scores the same tokens; the
advantage is GRPO's on the reward plus the per-token reverse-KL term
log pi_T - log pi_old (`rljax.algorithms.opd_grpo`; `opd` alone is pure
distillation). A teacher of another size works the same way (the same
tokenizer). Slow on CPU; a GPU or TPU runs it in seconds a step:

  python -m rljax.training --config configs/opd.py
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
    sampler=SamplerSpec(num_samples=8, max_new_tokens=12, temperature=1.0),
    algorithm=AlgorithmSpec(name="opd_grpo", kwargs={"coef": 1.0}),
    optim=OptimSpec(learning_rate=2e-5, grad_clip=1.0),
    train=TrainSpec(steps=50, prompts_per_step=8, eval_prompts=64),
    output=OutputSpec(directory="runs/opd", rollouts_every=5),
  )
