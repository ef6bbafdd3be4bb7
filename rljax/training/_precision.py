"""Low-precision parameters with float32 master weights.

With ``model.param_dtype="bfloat16"`` the policy's weights (what the forward,
the backward and the sampler read) are stored in bfloat16: half the bytes of
float32. Updating them in bfloat16 loses every step smaller than a
bfloat16 ulp (1/256 of the weight), so with ``optim.master_weights=True`` the
optimizer keeps a float32 copy of every parameter in its state, applies
AdamW to that copy with float32 moments, and hands the model the copy
rounded to bfloat16 (the mixed-precision recipe of Micikevicius et al.,
arXiv:1710.03740, Sec. 3.1, as in Megatron and MaxText).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class MasterWeightsState(NamedTuple):
  """The float32 master parameters and the inner optimizer's state."""

  master: Any
  inner: Any


def master_weights(
  inner: optax.GradientTransformation, dtype=jnp.float32
) -> optax.GradientTransformation:
  """`inner` applied to `dtype` master copies of the parameters.

  ``init(params)`` copies the parameters to `dtype` and initialises `inner`
  on the copies (so Adam's moments are `dtype` too). ``update(grads, state,
  params)`` casts the gradients to `dtype`, steps the master copies with
  `inner`, and returns the updates that take each parameter to its master
  copy rounded to the parameter's dtype: after `optax.apply_updates` the
  parameters equal ``master.astype(param.dtype)`` (the difference of two
  bfloat16 numbers is exact in float32 unless their exponents differ by
  more than 16, i.e. a step that changes a weight more than 65,536-fold).

  Args:
    inner: the optimizer, e.g. the AdamW chain of `rljax.training`.
    dtype: the master copies' dtype.

  Returns:
    An optax gradient transformation; its ``update`` needs ``params``.
  """

  def init(params):
    master = jax.tree.map(lambda p: jnp.asarray(p, dtype), params)
    return MasterWeightsState(master, inner.init(master))

  def update(grads, state, params=None):
    if params is None:
      raise ValueError(
        "master_weights needs the parameters: call"
        " update(grads, state, params)."
      )
    grads = jax.tree.map(lambda g: g.astype(dtype), grads)
    updates, inner_state = inner.update(grads, state.inner, state.master)
    master = optax.apply_updates(state.master, updates)
    steps = jax.tree.map(
      lambda m, p: m.astype(p.dtype).astype(dtype) - p.astype(dtype),
      master,
      params,
    )
    return steps, MasterWeightsState(master, inner_state)

  return optax.GradientTransformation(init, update)


def tree_bytes(tree) -> int:
  """Bytes of every array leaf of `tree` (global sizes, not per device)."""
  return int(
    sum(
      x.size * jnp.dtype(x.dtype).itemsize
      for x in jax.tree.leaves(tree)
      if hasattr(x, "dtype")
    )
  )
