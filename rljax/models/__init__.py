"""Decoder-only transformers in Flax NNX: Llama, Qwen2, Qwen3, Gemma 1-3,
the Qwen3-MoE and Mixtral mixtures of experts, and LoRA / QLoRA adapters."""

from rljax.models._config import REMAT_POLICIES
from rljax.models._config import LinearRopeScaling
from rljax.models._config import ModelConfig
from rljax.models._config import RopeScaling
from rljax.models._logprobs import grouped_completion_logprobs
from rljax.models._logprobs import token_logprobs
from rljax.models._lora import LORA_TARGETS
from rljax.models._lora import add_lora
from rljax.models._lora import quantize_base
from rljax.models._lora import save_peft
from rljax.models._merge import merge_lora
from rljax.models._moe import Routing
from rljax.models._moe import load_balancing_loss
from rljax.models._moe import moe_mlp
from rljax.models._transformer import KVCache
from rljax.models._transformer import PagedCache
from rljax.models._transformer import Transformer
from rljax.models._transformer import ValueModel
from rljax.models._transformer import cache_bytes
from rljax.models._transformer import init_cache
from rljax.models._transformer import init_pages
from rljax.models._transformer import positions_from_mask

__all__ = [
  "KVCache",
  "LORA_TARGETS",
  "LinearRopeScaling",
  "ModelConfig",
  "REMAT_POLICIES",
  "PagedCache",
  "RopeScaling",
  "Routing",
  "Transformer",
  "ValueModel",
  "add_lora",
  "cache_bytes",
  "grouped_completion_logprobs",
  "init_cache",
  "init_pages",
  "load_balancing_loss",
  "merge_lora",
  "moe_mlp",
  "positions_from_mask",
  "quantize_base",
  "save_peft",
  "token_logprobs",
]
