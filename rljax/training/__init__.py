"""RL training: configs, train states, the jitted update and the loop.

``python -m rljax.training --config configs/grpo.py train.steps=20`` runs
a config; `Trainer` is the same loop from Python. The same command runs
the post-training kinds (``kind="sft"``, ``"preference"``, ``"distill"``:
`rljax.posttrain`). Every kind is a `Runner` (what runs share: mesh,
checkpoints, logs, evaluation, the loop) with its own step.
"""

from rljax.training._config import AlgorithmSpec
from rljax.training._config import DataSpec
from rljax.training._config import ModelSpec
from rljax.training._config import OptimSpec
from rljax.training._config import OutputSpec
from rljax.training._config import RunConfig
from rljax.training._config import SamplerSpec
from rljax.training._config import SandboxSpec
from rljax.training._config import TaskSpec
from rljax.training._config import TrainSpec
from rljax.training._config import override
from rljax.training._config_files import load_config
from rljax.training._packing import Packing
from rljax.training._packing import pack_plan
from rljax.training._precision import MasterWeightsState
from rljax.training._precision import master_weights
from rljax.training._rollout import Scored
from rljax.training._runner import Runner
from rljax.training._step import Models
from rljax.training._step import PolicyState
from rljax.training._step import Sequences
from rljax.training._step import TrainState
from rljax.training._step import UpdateSpec
from rljax.training._step import ValueState
from rljax.training._step import completion_logprobs
from rljax.training._step import completion_values
from rljax.training._step import update
from rljax.training._trainer import Trainer
from rljax.training._validate import validate

__all__ = [
  "AlgorithmSpec",
  "DataSpec",
  "MasterWeightsState",
  "ModelSpec",
  "Models",
  "OptimSpec",
  "OutputSpec",
  "Packing",
  "PolicyState",
  "RunConfig",
  "Runner",
  "SamplerSpec",
  "SandboxSpec",
  "Scored",
  "Sequences",
  "TaskSpec",
  "TrainSpec",
  "TrainState",
  "Trainer",
  "UpdateSpec",
  "ValueState",
  "completion_logprobs",
  "completion_values",
  "load_config",
  "master_weights",
  "override",
  "pack_plan",
  "update",
  "validate",
]
