"""Architecture hyperparameters of the decoder family (Llama, Qwen2, Qwen3,
Gemma 1-3, Qwen3-MoE, Mixtral)."""

import dataclasses
from typing import Optional

from rljax._src import checks

# `ModelConfig.remat` values: what a layer keeps for the backward pass
# (None: nothing recomputed; "full": its input only; "dots": matmul outputs).
REMAT_POLICIES = {False: None, "none": None, True: "full", "full": "full"}
REMAT_POLICIES["dots"] = "dots"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
  """Llama-3 style RoPE frequency scaling (HF `rope_type="llama3"`)."""

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int

  def __post_init__(self):
    checks.positive(
      factor=self.factor,
      low_freq_factor=self.low_freq_factor,
      high_freq_factor=self.high_freq_factor,
      original_max_position_embeddings=self.original_max_position_embeddings,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinearRopeScaling:
  """Position interpolation: frequencies divided by `factor` (HF
  ``rope_type="linear"``, e.g. Gemma 3's global layers)."""

  factor: float

  def __post_init__(self):
    checks.positive(factor=self.factor)


SLIDING, FULL = "sliding_attention", "full_attention"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """A decoder-only transformer: GQA, RoPE, RMSNorm, SwiGLU.

  Llama: the defaults. Qwen2: ``qkv_bias=True``, untied embeddings. Qwen3:
  ``qk_norm=True``. ``dtype`` is the compute dtype (bfloat16 on accelerators);
  parameters are stored in ``param_dtype`` and logits are always float32.

  ``scan_unroll`` is how many layers each iteration of the layer scan runs;
  ``num_layers`` (or more) unrolls the stack completely. Unrolling removes the loop's
  per-layer work (slicing the stacked weights, stacking the residuals saved
  for the backward pass), which dominates for shallow, narrow models (a
  2-layer toy model's train step is about 1.3x faster on CPU unrolled);
  compile time grows with it, so deep models keep the default of 1.
  ``update_unroll`` sets it for forwards without a cache alone (the
  update's and the scoring passes'; 0: ``scan_unroll``), so the update can
  unroll while the engine's decode steps keep their compact scan.
  ``remat`` is what the backward pass recomputes (`jax.checkpoint` around
  each layer, MaxText's ``remat_policy``): ``"none"`` (False, the default)
  keeps every activation; ``"full"`` (True) keeps each layer's input only,
  at the cost of a second forward, which long sequences on a pod need;
  ``"dots"`` keeps the matmul outputs and recomputes the elementwise work
  between them (``jax.checkpoint_policies.
  dots_with_no_batch_dims_saveable``), most of full's saving of time for
  part of its saving of memory.

  Gemma: ``embed_scale=True`` (embeddings times sqrt(D)), ``norm_offset=True``
  (RMSNorm ``x * (1 + w)``, w stored as HF stores it), ``activation=
  "gelu_tanh"`` (GeGLU). Gemma 2 adds ``post_norms`` (norms after attention
  and MLP too: four per layer), ``query_pre_attn_scalar`` (scores scaled by
  its inverse square root instead of head_dim's), ``attn_logit_softcap`` and
  ``final_logit_softcap`` (``cap * tanh(s / cap)``), and ``layer_types``: per
  layer, "sliding_attention" (a token attends to the ``sliding_window``
  tokens up to and including itself) or "full_attention". Gemma 3 adds
  ``qk_norm`` and ``local_rope_theta``, the RoPE base of the sliding layers
  (``rope_theta`` and ``rope_scaling`` are the full layers').

  Mixture of experts (Qwen3-MoE, Mixtral): ``num_experts`` > 0 replaces
  every layer's SwiGLU MLP by ``num_experts`` SwiGLU experts of width
  ``expert_intermediate_size``, of which a float32-softmax router picks
  ``experts_per_token`` per token (`rljax.models.moe_mlp`); their gate
  weights are the top-k probabilities, renormalised to sum to 1 when
  ``norm_topk_prob`` (Mixtral: always; Qwen3-MoE: as its config says).
  ``intermediate_size`` is then unused. 0 experts: a dense model.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10_000.0
  rope_scaling: Optional[RopeScaling | LinearRopeScaling] = None
  rms_norm_eps: float = 1e-6
  tie_embeddings: bool = True
  qkv_bias: bool = False
  qk_norm: bool = False
  max_position_embeddings: int = 2048
  dtype: str = "float32"
  param_dtype: str = "float32"
  scan_unroll: int = 1
  update_unroll: int = 0
  remat: bool | str = False
  embed_scale: bool = False
  norm_offset: bool = False
  activation: str = "silu"
  post_norms: bool = False
  query_pre_attn_scalar: Optional[float] = None
  attn_logit_softcap: Optional[float] = None
  final_logit_softcap: Optional[float] = None
  sliding_window: Optional[int] = None
  layer_types: Optional[tuple[str, ...]] = None
  local_rope_theta: Optional[float] = None

  @property
  def sliding_layers(self) -> tuple[bool, ...]:
    """Per layer, whether it attends within ``sliding_window`` only."""
    types = self.layer_types or (FULL,) * self.num_layers
    return tuple(t == SLIDING for t in types)

  num_experts: int = 0
  experts_per_token: int = 0
  expert_intermediate_size: int = 0
  norm_topk_prob: bool = False

  def __post_init__(self):
    checks.positive(
      vocab_size=self.vocab_size,
      hidden_size=self.hidden_size,
      intermediate_size=self.intermediate_size,
      num_layers=self.num_layers,
      num_heads=self.num_heads,
      num_kv_heads=self.num_kv_heads,
      head_dim=self.head_dim,
      rope_theta=self.rope_theta,
      rms_norm_eps=self.rms_norm_eps,
      scan_unroll=self.scan_unroll,
    )
    checks.non_negative(update_unroll=self.update_unroll)
    if self.remat not in REMAT_POLICIES:
      raise ValueError(
        f"remat must be one of {sorted(REMAT_POLICIES, key=str)}; got"
        f" {self.remat!r}."
      )
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads"
        f" ({self.num_kv_heads}) for grouped-query attention."
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for RoPE; got {self.head_dim}.")
    checks.one_of("dtype", self.dtype, ["float32", "bfloat16", "float16"])
    checks.one_of("param_dtype", self.param_dtype, ["float32", "bfloat16"])
    checks.one_of("activation", self.activation, ["silu", "gelu_tanh"])
    for name in (
      "query_pre_attn_scalar",
      "attn_logit_softcap",
      "final_logit_softcap",
      "sliding_window",
      "local_rope_theta",
    ):
      if getattr(self, name) is not None:
        checks.positive(**{name: getattr(self, name)})
    self._check_layer_types()
    checks.non_negative(num_experts=self.num_experts)
    if self.num_experts:
      self._check_experts()

  def _check_layer_types(self):
    if self.layer_types is None:
      return
    if not isinstance(self.layer_types, tuple):
      raise ValueError(
        f"layer_types must be a tuple (hashable); got {self.layer_types!r}."
      )
    if len(self.layer_types) != self.num_layers:
      raise ValueError(
        f"layer_types has {len(self.layer_types)} entries; it needs one per"
        f" layer (num_layers={self.num_layers})."
      )
    for t in self.layer_types:
      checks.one_of("layer_types entry", t, [SLIDING, FULL])
    if SLIDING in self.layer_types and self.sliding_window is None:
      raise ValueError(
        "layer_types has sliding_attention layers but sliding_window is"
        " None; set sliding_window (tokens each such layer attends to)."
      )

  def _check_experts(self):
    """A mixture of experts needs a router top-k and an expert width."""
    checks.positive(
      num_experts=self.num_experts,
      experts_per_token=self.experts_per_token,
      expert_intermediate_size=self.expert_intermediate_size,
    )
    if self.experts_per_token > self.num_experts:
      raise ValueError(
        f"experts_per_token ({self.experts_per_token}) must be at most"
        f" num_experts ({self.num_experts})."
      )
