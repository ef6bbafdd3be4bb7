"""Post-training runs beside RL: supervised fine-tuning, preference
optimisation (offline and online) and distillation (GKD), with their data
(on-policy distillation with a reward is the RL preset
`rljax.algorithms.opd`).

``python -m rljax.training --config configs/sft.py`` runs any kind (the
config's ``kind``); `run_for` picks the class from Python. Each run is a
`rljax.training.Runner` with its own step, so the mesh, checkpoints
(exact resume), logging, evaluation, dry run and CLI are shared.

Records are dicts: chat ``{"messages": [...]}``, ``{"prompt",
"completion"}``, pairs ``{"prompt", "chosen", "rejected"}`` or KTO's
``{"prompt", "completion", "label"}``.
"""

from rljax.posttrain._data import read_jsonl
from rljax.posttrain._data import record_kind
from rljax.posttrain._data import task_records
from rljax.posttrain._data import tfds_records
from rljax.posttrain._distill import DistillRun
from rljax.posttrain._distill import gkd_objective
from rljax.posttrain._encode import Encoded
from rljax.posttrain._encode import encode_prompt_completion
from rljax.posttrain._encode import encode_supervised
from rljax.posttrain._mechanisms import C3POLoss
from rljax.posttrain._mechanisms import CodeTestScores
from rljax.posttrain._mechanisms import PairChoice
from rljax.posttrain._mechanisms import apo_extrapolate
from rljax.posttrain._mechanisms import apo_extrapolate_logits
from rljax.posttrain._mechanisms import best_worst_pairs
from rljax.posttrain._mechanisms import c3po_loss
from rljax.posttrain._mechanisms import codedpo_scores
from rljax.posttrain._mechanisms import direct_advantage_loss
from rljax.posttrain._mechanisms import dno_win_rates
from rljax.posttrain._mechanisms import step_advantages
from rljax.posttrain._packing import Packed
from rljax.posttrain._packing import pack
from rljax.posttrain._packing import packing_efficiency
from rljax.posttrain._packing import pad
from rljax.posttrain._pairs import LOSSES as PREFERENCE_LOSSES
from rljax.posttrain._pairs import PreferenceRun
from rljax.posttrain._pairs import pair_objective
from rljax.posttrain._pairs import sample_pairs
from rljax.posttrain._run import PostTrainer
from rljax.posttrain._sft import SFTRun
from rljax.posttrain._sft import sft_loss

RUNS = {"sft": SFTRun, "preference": PreferenceRun, "distill": DistillRun}


def run_for(config):
  """The run class of ``config.kind`` (``"rl"``: `rljax.training.Trainer`)."""
  from rljax.training import Trainer

  return {"rl": Trainer, **RUNS}[config.kind]


__all__ = [
  "C3POLoss",
  "CodeTestScores",
  "DistillRun",
  "Encoded",
  "PREFERENCE_LOSSES",
  "Packed",
  "PairChoice",
  "PostTrainer",
  "PreferenceRun",
  "RUNS",
  "SFTRun",
  "apo_extrapolate",
  "apo_extrapolate_logits",
  "best_worst_pairs",
  "c3po_loss",
  "codedpo_scores",
  "direct_advantage_loss",
  "dno_win_rates",
  "encode_prompt_completion",
  "encode_supervised",
  "gkd_objective",
  "pack",
  "packing_efficiency",
  "pad",
  "pair_objective",
  "read_jsonl",
  "record_kind",
  "run_for",
  "sample_pairs",
  "sft_loss",
  "step_advantages",
  "task_records",
  "tfds_records",
]
