"""`merge_lora`: a LoRA / QLoRA model folded into a plain `Transformer`.

Above both `_lora` (the adapters) and `_transformer` (which computes them
inside its projections): the merge builds a fresh `Transformer`, so it
cannot live in `_lora` without an import cycle.
"""

from flax import nnx
import jax
import jax.numpy as jnp

from rljax.models import _lora
from rljax.models._transformer import Transformer


def _delta_weight(layers, name) -> jax.Array:
  """[L, *in, *out] alpha / r * A B (float32)."""
  a = getattr(layers, f"{name}_lora_a")[...].astype(jnp.float32)
  b = getattr(layers, f"{name}_lora_b")[...].astype(jnp.float32)
  n, r = a.shape[0], a.shape[-1]
  # One [in, r] x [r, out] product per layer (batched over L).
  ab = jnp.einsum(
    "lir,lro->lio", a.reshape(n, -1, r), b.reshape(n, r, -1)
  ).reshape(a.shape[:-1] + b.shape[2:])
  scale = layers.lora_scale[...].reshape((-1,) + (1,) * (ab.ndim - 1))
  return ab * scale


def merge_lora(model):
  """A plain `Transformer` with W + alpha / r A B (base dequantized): what
  `rljax.checkpoints.save_hf` exports. `model` is left as it is."""
  layers = model.layers
  plain = nnx.eval_shape(lambda: Transformer(model.config, rngs=nnx.Rngs(0)))
  for path, value in nnx.to_flat_state(nnx.state(plain)):
    source = model
    for key in path[:-1]:
      source = getattr(source, key)
    name = path[-1]
    array = getattr(source, name)[...]
    if source is layers and name in _lora.PROJECTIONS:
      w = {name: array}
      if hasattr(layers, f"{name}_qscale"):
        w[f"{name}_qscale"] = getattr(layers, f"{name}_qscale")[...]
      dtype = model.config.param_dtype
      array = _lora.base_weight(w, name, jnp.float32)
      if hasattr(layers, f"{name}_lora_a"):
        array = array + _delta_weight(layers, name)
      array = array.astype(dtype)
    value.set_value(jnp.asarray(array))
  return plain
