"""The shared base of the preset configs: 2-digit addition, scratch model.

A ~100K-parameter Llama-style model with a character vocabulary gets a short
supervised warm start, then RL. Stable settings from DESIGN.md section 8:
learning rate 2e-4, global-norm clipping 1.0, 16 samples per prompt.
"""

import dataclasses
from typing import Optional

from rljax.training import AlgorithmSpec
from rljax.training import ModelSpec
from rljax.training import OptimSpec
from rljax.training import OutputSpec
from rljax.training import RunConfig
from rljax.training import SamplerSpec
from rljax.training import TaskSpec
from rljax.training import TrainSpec


def base(
  algorithm: str,
  *,
  sampler: Optional[dict] = None,
  task: Optional[dict] = None,
  train: Optional[dict] = None,
  **kwargs,
) -> RunConfig:
  """The arithmetic run with preset `algorithm` and its hyperparameters;
  `sampler`, `task` and `train` replace fields of those sections (a
  prompt sampler, a group strategy, a wider prompt)."""
  config = _base(algorithm, **kwargs)
  return dataclasses.replace(
    config,
    sampler=dataclasses.replace(config.sampler, **(sampler or {})),
    task=dataclasses.replace(config.task, **(task or {})),
    train=dataclasses.replace(config.train, **(train or {})),
  )


def _base(algorithm: str, **kwargs) -> RunConfig:
  return RunConfig(
    model=ModelSpec(
      source="scratch",
      hidden_size=64,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      intermediate_size=192,
      max_position_embeddings=32,
      scan_unroll=2,  # both layers: a shallow model runs faster unrolled
    ),
    task=TaskSpec(
      name="arithmetic",
      kwargs={"digits": 2, "prompt_style": "bare"},
      max_prompt_tokens=6,
    ),
    sampler=SamplerSpec(num_samples=16, max_new_tokens=4, temperature=1.0),
    algorithm=AlgorithmSpec(name=algorithm, kwargs=kwargs),
    optim=OptimSpec(learning_rate=2e-4, grad_clip=1.0),
    train=TrainSpec(
      steps=150,
      prompts_per_step=16,
      warm_start_steps=800,
      warm_start_lr=3e-3,
      warm_start_batch=128,
      eval_every=10,
      eval_prompts=256,
    ),
    output=OutputSpec(directory=f"runs/{algorithm}", rollouts_every=10),
  )
