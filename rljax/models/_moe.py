"""Mixture-of-experts feed-forward blocks (Qwen3-MoE, Mixtral).

A linear router scores the E experts of each token; the softmax (in
float32) picks the top K; each token's output is the gate-weighted sum of
its K experts' SwiGLU outputs. Shapes: B batch, S sequence, D width, E
experts, K experts per token, F expert width, L layers, T = B * S tokens.

Dispatch never builds a dense [T, E, D] tensor: the T * K token-slots are
sorted by expert, so each expert's tokens are one contiguous run, and the
experts run as grouped matmuls (`jax.lax.ragged_dot`) over the runs. The
block holds [T * K, D] gathered inputs and outputs and [T * K, F]
activations, K times a dense MLP's, whatever E.
"""

from typing import NamedTuple, Optional

from flax import nnx
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

import pallas_kernels
from rljax.models._config import ModelConfig
from rljax.sharding._rules import BATCH_AXES
from rljax.sharding._rules import _axis_size


class Routing(NamedTuple):
  """What the routers did: per layer when returned by a model (leading L).

  ``logits`` are the router's float32 logits, ``experts`` the int32 ids of
  the experts each token ran through (its top K, or the replayed ones).
  """

  logits: jax.Array  # float32 [(L,) B, S, E]
  experts: jax.Array  # int32 [(L,) B, S, K]


def expert_params(config: ModelConfig, rngs: nnx.Rngs) -> dict:
  """The stacked router and expert weights of every layer.

  Logical axes: "expert" on the expert dimension (sharded by the rules:
  expert parallelism), "expert_embed" on the experts' width (the rules
  leave it whole, so "expert" and "embed" may share a mesh axis).
  """
  c, dt = config, config.param_dtype
  L, D, E, F = (
    c.num_layers,
    c.hidden_size,
    c.num_experts,
    c.expert_intermediate_size,
  )
  init = jax.nn.initializers.normal(0.02)

  def param(shape, axes):
    return nnx.Param(init(rngs.params(), shape, dt), logical_axes=axes)

  expert_in = ("layers", "expert", "expert_embed", "mlp")
  return {
    "router": param((L, D, E), ("layers", "embed", None)),
    "expert_gate": param((L, E, D, F), expert_in),
    "expert_up": param((L, E, D, F), expert_in),
    "expert_down": param(
      (L, E, F, D), ("layers", "expert", "mlp", "expert_embed")
    ),
  }


def route(
  config: ModelConfig,
  logits_TE: jax.Array,
  experts_TK: Optional[jax.Array] = None,
) -> tuple[jax.Array, jax.Array]:
  """Gate weights [T, K] (float32) and expert ids [T, K] (int32).

  The weights are the softmax probabilities (over all E experts) of the
  chosen experts, divided by their sum when ``config.norm_topk_prob`` (so
  equal to a softmax over the chosen experts' logits). The experts are the
  top K unless `experts_TK` replays earlier choices: then the weights are
  this router's probabilities at the replayed experts (routing replay).
  """
  probs = jax.nn.softmax(logits_TE.astype(jnp.float32), axis=-1)
  if experts_TK is None:
    weights, experts_TK = jax.lax.top_k(probs, config.experts_per_token)
  else:
    experts_TK = jnp.asarray(experts_TK, jnp.int32)
    weights = jnp.take_along_axis(probs, experts_TK, axis=-1)
  if config.norm_topk_prob:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights, experts_TK.astype(jnp.int32)


def _grouped(w, name, x_MD, group_sizes_E, kernel: bool) -> jax.Array:
  """``x @ w[name][e]`` for each run of rows of expert e, in x's dtype: the
  target's kernel (`pallas_kernels.grouped_matmul`: megablox on a TPU)
  where it may run (one device, or a shard's rows inside `jax.shard_map`),
  else `jax.lax.ragged_dot`."""
  if kernel:
    return pallas_kernels.grouped_matmul(x_MD, w[name], group_sizes_E)
  return jax.lax.ragged_dot(x_MD, w[name].astype(x_MD.dtype), group_sizes_E)


_EXPERT_WEIGHTS = ("expert_gate", "expert_up", "expert_down")


def _experts(w, x_TD, experts_TK, num_experts: int) -> jax.Array:
  """[T, K, D] each token's output from each of its K experts; on a mesh
  (`jax.set_mesh`), each device's own tokens (`_expert_parallel`)."""
  weights = {n: w[n] for n in _EXPERT_WEIGHTS}
  mesh = jax.sharding.get_abstract_mesh()
  rows, tensor = _mesh_split(mesh, x_TD.shape[0])
  if not (rows or tensor):
    # One device: the kernel. A mesh whose split does not fit, or a program
    # traced outside its mesh on several devices (the static sampler): XLA's
    # op, which it can partition (a Mosaic kernel it cannot).
    single = mesh.size == 1 if not mesh.empty else jax.device_count() == 1
    return _local_experts(weights, x_TD, experts_TK, num_experts, single)
  return _expert_parallel(mesh, rows, tensor, num_experts)(
    weights, x_TD, experts_TK
  )


def _mesh_split(mesh, tokens: int) -> tuple[tuple[str, ...], Optional[str]]:
  """(the batch axes the tokens split over, the tensor axis) of `mesh`'s
  axes of more than one device; ((), None) when there is no mesh, the
  tokens do not divide, or it has axes the rules do not name."""
  if mesh.empty or mesh.size == 1:
    return (), None
  big = {n for n in mesh.axis_names if mesh.shape[n] > 1}
  rows = tuple(a for a in BATCH_AXES if a in big)
  tensor = "tensor" if "tensor" in big else None
  if big - set(rows) - {tensor} or tokens % _axis_size(mesh, rows or None):
    return (), None
  return rows, tensor


def _expert_parallel(mesh, rows, tensor, num_experts: int):
  """`_local_experts` per device under `jax.shard_map`: each device routes
  its own tokens (split over the batch axes `rows`) through every expert,
  whose weights it gathers as FSDP gathers a dense layer's, with the
  experts' width split over `tensor` (Megatron's MLP: the partial outputs
  summed over it). XLA cannot partition `jax.lax.ragged_dot`: left to
  GSPMD, every chip computed every token's experts (Qwen3-30B-A3B's plan
  on v5p-64 counted ~580 times the active parameters' FLOPs a chip)."""
  P = jax.sharding.PartitionSpec
  specs = {
    "expert_gate": P(None, None, tensor),
    "expert_up": P(None, None, tensor),
    "expert_down": P(None, tensor, None),
  }

  def local(weights, x_TD, experts_TK):
    y = _local_experts(weights, x_TD, experts_TK, num_experts, True)
    return jax.lax.psum(y, tensor) if tensor else y

  split = rows or None
  return jax.shard_map(
    local,
    mesh=mesh,
    in_specs=(specs, P(split, None), P(split, None)),
    out_specs=P(split, None, None),
    # The megablox kernel's outputs carry no varying-axes type; gradients
    # are checked equal to one device's (tests/models/moe_test.py).
    check_vma=False,
  )


def _local_experts(
  w, x_TD, experts_TK, num_experts: int, kernel: bool
) -> jax.Array:
  """[T, K, D] each token's output from each of its K experts (`kernel`: see
  `_grouped`).

  Sorting the T * K slots by expert makes each expert's rows contiguous;
  the inverse permutation puts the results back in slot order.
  """
  t, k = experts_TK.shape
  flat = experts_TK.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  x = x_TD[order // k]  # [T * K, D], rows grouped by expert
  gate = _grouped(w, "expert_gate", x, sizes, kernel)
  up = _grouped(w, "expert_up", x, sizes, kernel)
  y = _grouped(w, "expert_down", jax.nn.silu(gate) * up, sizes, kernel)
  inverse = jnp.zeros_like(order).at[order].set(jnp.arange(t * k))
  return y[inverse].reshape(t, k, -1)


def moe_mlp(
  config: ModelConfig,
  w: dict,
  h_BSD: jax.Array,
  experts_BSK: Optional[ArrayLike] = None,
) -> tuple[jax.Array, Routing]:
  """The mixture-of-experts block on normed hidden states [B, S, D].

  Args:
    config: the model's config (``num_experts`` > 0).
    w: one layer's weights (``router`` [D, E], ``expert_gate`` and
      ``expert_up`` [E, D, F], ``expert_down`` [E, F, D]).
    h_BSD: the normed hidden states.
    experts_BSK: int32 expert ids to route through instead of the top K
      (routing replay); gate weights still come from this router.

  Returns:
    The block's output [B, S, D] and its `Routing` (logits [B, S, E],
    experts [B, S, K]).
  """
  b, s, d = h_BSD.shape
  logits = jnp.einsum(
    "bsd,de->bse", h_BSD, w["router"].astype(h_BSD.dtype)
  ).astype(jnp.float32)
  replay = None
  if experts_BSK is not None:
    replay = jnp.asarray(experts_BSK).reshape(b * s, -1)
  weights, experts = route(config, logits.reshape(b * s, -1), replay)
  y = _experts(w, h_BSD.reshape(b * s, d), experts, config.num_experts)
  out = jnp.einsum("tkd,tk->td", y, weights.astype(y.dtype))
  routing = Routing(logits, experts.reshape(b, s, -1))
  return out.reshape(b, s, d), routing


def load_balancing_loss(
  logits_LBSE: ArrayLike,
  experts_LBSK: ArrayLike,
  mask_BS: Optional[ArrayLike] = None,
) -> jax.Array:
  """The Switch-Transformer auxiliary loss E * sum_e f_e * P_e (float32).

  f_e is the number of (layer, real token) top-K assignments to expert e
  and P_e the summed router probability of expert e, both divided by the
  number of (layer, real token) pairs: statistics pooled over layers, as
  transformers' ``load_balancing_loss_func`` (Mixtral, Qwen3-MoE) computes
  them; sum_e f_e = K, and perfectly balanced routing gives K. Gradients
  flow through P only (the assignment is discrete).

  Args:
    logits_LBSE: router logits of every layer (`Routing.logits`).
    experts_LBSK: the experts each token was routed to (`Routing.experts`).
    mask_BS: 1 on real tokens, 0 on padding (default: all real).

  Returns:
    The scalar loss.

  References:
    Fedus et al., 2021, "Switch Transformers", arXiv:2101.03961, eq. 4-6.
  """
  logits = jnp.asarray(logits_LBSE, jnp.float32)
  experts = jnp.asarray(experts_LBSK, jnp.int32)
  num_experts = logits.shape[-1]
  mask = jnp.ones(logits.shape[1:3], jnp.float32)
  if mask_BS is not None:
    mask = jnp.asarray(mask_BS, jnp.float32)
  count = mask.sum() * logits.shape[0]
  probs = jax.nn.softmax(logits, axis=-1)
  p = jnp.einsum("lbse,bs->e", probs, mask) / count
  onehot = jax.nn.one_hot(experts, num_experts, dtype=jnp.float32)
  f = jnp.einsum("lbske,bs->e", onehot, mask) / count
  return num_experts * jnp.sum(f * p)
