"""The shared base of the pod plans: GRPO on math questions at the lengths
of reasoning RL (512 prompt tokens, 2,048 sampled), a published model's
shapes without weights (``model.source="shape:<name>"``), bfloat16 weights
with float32 master copies, each layer recomputed in the backward (remat).

These configs plan runs (``python -m rljax.training --config
configs/pods/qwen3_8b_grpo.py --plan v5e-64``); to train, point
``model.source`` at the model's checkpoint (``hf:<directory>``).
"""

from rljax.training import AlgorithmSpec
from rljax.training import ModelSpec
from rljax.training import OptimSpec
from rljax.training import OutputSpec
from rljax.training import RunConfig
from rljax.training import SamplerSpec
from rljax.training import TaskSpec
from rljax.training import TrainSpec


def pod_grpo(
  shape: str,
  *,
  mesh: tuple = (1, -1, 1),
  prompts: int,
  samples: int = 8,
  microbatches: int = 1,
  slots: int | None = None,
  lora_rank: int = 0,
) -> RunConfig:
  """GRPO on `shape` over a (data, fsdp, tensor) `mesh` (default: fsdp
  over every chip of the slice), `prompts` x `samples` sequences a step in
  `microbatches` gradient micro-batches; `lora_rank` > 0 trains adapters."""
  return RunConfig(
    model=ModelSpec(
      source=f"shape:{shape}",
      dtype="bfloat16",
      param_dtype="bfloat16",
      chat_template=True,
      remat=True,
      lora_rank=lora_rank,
    ),
    task=TaskSpec(
      name="arithmetic",
      kwargs={
        "digits": 3,
        "prompt_style": "question",
        "extract": "last_number",
      },
      max_prompt_tokens=512,
    ),
    sampler=SamplerSpec(
      num_samples=samples, max_new_tokens=2048, temperature=1.0, slots=slots
    ),
    algorithm=AlgorithmSpec(name="grpo"),
    optim=OptimSpec(
      learning_rate=1e-6, grad_clip=1.0, master_weights=not lora_rank
    ),
    train=TrainSpec(
      steps=200,
      prompts_per_step=prompts,
      microbatches=microbatches,
      mesh=mesh,
    ),
    output=OutputSpec(directory=f"runs/{shape}_grpo"),
  )
