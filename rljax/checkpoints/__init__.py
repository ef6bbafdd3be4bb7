"""Checkpoint import/export: Hugging Face safetensors and llama.cpp GGUF."""

from rljax.checkpoints._gguf import load_gguf
from rljax.checkpoints._gguf import read_gguf
from rljax.checkpoints._hf import load_hf
from rljax.checkpoints._hf import model_from_tensors
from rljax.checkpoints._hf import save_hf
from rljax.checkpoints._hf_config import config_from_hf
from rljax.checkpoints._hf_config import hf_config
from rljax.checkpoints._hf_tensors import hf_tensors
from rljax.checkpoints._hf_tensors import load_hf_tensors
from rljax.checkpoints._shapes import SHAPES
from rljax.checkpoints._shapes import shape_config

__all__ = [
  "SHAPES",
  "shape_config",
  "config_from_hf",
  "hf_config",
  "hf_tensors",
  "load_hf",
  "load_gguf",
  "load_hf_tensors",
  "model_from_tensors",
  "read_gguf",
  "save_hf",
]
