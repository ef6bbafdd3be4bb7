"""Public entry points: argument checks, the custom_vjp, and the dispatch."""

import math

import jax
from jax import lax
import jax.numpy as jnp
from jax.typing import ArrayLike
import numpy as np

from pallas_kernels import _dispatch
from pallas_kernels import _objectives
from pallas_kernels import _reference

F32 = jnp.float32
LOSSES = ("sapo", "ppo_clip")


def _check_temperature(temperature) -> jax.Array:
  """1 / temperature as a constant float32 scalar; concrete values > 0."""
  if np.ndim(temperature) != 0:
    raise ValueError(
      f"temperature must be a scalar; got shape {np.shape(temperature)}."
    )
  try:
    concrete = float(temperature)
  except jax.errors.ConcretizationTypeError:
    concrete = None  # traced: the caller vouches for it
  if concrete is not None and not concrete > 0:
    raise ValueError(f"temperature must be > 0; got {temperature!r}.")
  return lax.stop_gradient(1.0 / jnp.asarray(temperature, F32))


def _check_arrays(hidden, unembed, targets) -> None:
  """Raise a ValueError naming the first malformed input."""
  if hidden.ndim < 1 or not jnp.issubdtype(hidden.dtype, jnp.floating):
    raise ValueError(
      "hidden_ND must be a float array of shape [..., D]; got"
      f" {hidden.dtype}{list(hidden.shape)}."
    )
  if unembed.ndim != 2 or unembed.shape[0] != hidden.shape[-1]:
    raise ValueError(
      f"unembed_DV must have shape [D, V] with D = {hidden.shape[-1]} (the"
      f" last axis of hidden_ND); got {list(unembed.shape)}."
    )
  if unembed.shape[1] == 0 or not jnp.issubdtype(unembed.dtype, jnp.floating):
    raise ValueError(
      "unembed_DV must be a float array with V > 0; got"
      f" {unembed.dtype}{list(unembed.shape)}."
    )
  if targets.shape != hidden.shape[:-1]:
    raise ValueError(
      f"targets_N must have shape {list(hidden.shape[:-1])} (hidden_ND's"
      f" without D); got {list(targets.shape)}."
    )
  if not jnp.issubdtype(targets.dtype, jnp.integer):
    raise ValueError(f"targets_N must hold integer ids; got {targets.dtype}.")


def _flatten(hidden_ND, unembed_DV, targets_N):
  """Checked (hidden [N, D], unembed, targets [N]) and the batch shape."""
  hidden, unembed = jnp.asarray(hidden_ND), jnp.asarray(unembed_DV)
  targets = jnp.asarray(targets_N)
  _check_arrays(hidden, unembed, targets)
  batch = hidden.shape[:-1]
  n = math.prod(batch)
  return hidden.reshape(n, hidden.shape[-1]), unembed, targets.reshape(n), batch


def _schedule(schedule, hidden, unembed, block_n, block_v):
  """Resolve the schedule; an empty batch runs dense (nothing to tile), and
  so does "auto" when the float32 logits fit `_dispatch.dense_limit`."""
  sched = _dispatch.resolve(
    schedule, (hidden.dtype, unembed.dtype), block_n, block_v
  )
  small = hidden.shape[0] * unembed.shape[1] * 4 <= _dispatch.dense_limit()
  if hidden.shape[0] == 0 or (schedule == "auto" and small):
    return _dispatch.resolve("dense", ())
  return sched


def _fused_logprob(sched: _dispatch.Schedule):
  """(hidden, unembed, targets, inv_temp) -> (logp, entropy), custom_vjp."""

  def fwd(hidden, unembed, targets, inv_temp):
    st = sched.forward(hidden, unembed, targets, inv_temp)
    out = (st.target_logit - st.lse, st.lse - st.ez)
    return out, (hidden, unembed, targets, inv_temp, st.lse, st.ez)

  def bwd(res, cotangents):
    g_logp, g_entropy = cotangents
    dh, dw = sched.backward(*res, g_logp, g_entropy)
    return dh, dw, None, None

  fn = jax.custom_vjp(lambda *args: fwd(*args)[0])
  fn.defvjp(fwd, bwd)
  return fn


def _fused_policy(sched: _dispatch.Schedule, objective):
  """(hidden, unembed, targets, inv_temp, old, adv, mask) -> (loss, logp)."""

  def fwd(hidden, unembed, targets, inv_temp, old, adv, mask):
    st = sched.forward(hidden, unembed, targets, inv_temp)
    logp = st.target_logit - st.lse
    loss = objective.value(logp, old, adv, mask)
    res = (hidden, unembed, targets, inv_temp, st.lse, st.ez)
    return (loss, logp), (res, (logp, old, adv, mask))

  def bwd(saved, cotangents):
    res, token_args = saved
    g_loss, g_logp = cotangents
    # dloss/dlogp is elementwise, so the kernel only sees a per-token scalar.
    a = g_loss * objective.coef(*token_args) + g_logp
    dh, dw = sched.backward(*res, a, jnp.zeros_like(a))
    return (dh, dw) + (None,) * 5

  fn = jax.custom_vjp(lambda *args: fwd(*args)[0])
  fn.defvjp(fwd, bwd)
  return fn


def token_logprob(
  hidden_ND: ArrayLike,
  unembed_DV: ArrayLike,
  targets_N: ArrayLike,
  *,
  temperature: float | ArrayLike = 1.0,
  schedule: str = "auto",
  block_n: int | None = None,
  block_v: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Per-token log-probs and entropies without materialising the logits.

    z = (hidden @ unembed) / temperature,  p = softmax(z)
    logp = z[target] - logsumexp(z),  entropy = logsumexp(z) - sum_j p_j z_j

  Differentiable w.r.t. `hidden_ND` and `unembed_DV` through a custom_vjp
  whose backward recomputes the logits blockwise from the saved logsumexp
  (except ``schedule="dense"``, plain autodiff of materialised logits); the
  temperature is a constant (not differentiated). Float32 accumulation for
  float32 or bfloat16 inputs. Works under `jax.jit` and `jax.vmap`.

  Args:
    hidden_ND: final hidden states, [..., D] (leading axes are flattened).
    unembed_DV: the unembedding (LM head), [D, V].
    targets_N: token ids in [0, V), [...] (hidden_ND's leading shape); any id
      is valid, masking ignored tokens is the caller's job.
    temperature: sampling temperature (> 0), python float or scalar array
      (verl / TRL divide the logits by it).
    schedule: "auto" (dense when the float32 logits fit
      `DENSE_AUTO_BYTES`, see `dense_up_to`; otherwise Pallas TPU on TPU, Pallas GPU on GPU,
      else chunked),
      "dense", "chunked", "pallas_tpu", "pallas_gpu" or "pallas_interpret"
      (the TPU kernel under the Pallas interpreter, for CPU tests).
    block_n: tokens per tile; None takes the schedule's default.
    block_v: vocabulary entries per tile; None takes the schedule's default.

  Returns:
    (logp_N, entropy_N), float32 of shape [...].

  References:
    Wijmans et al. 2024, Cut Your Losses in Large-Vocabulary Language Models
    (arXiv 2411.09009); Milakov & Gimelshein 2018, online softmax
    (arXiv 1805.02867).
  """
  hidden, unembed, targets, batch = _flatten(hidden_ND, unembed_DV, targets_N)
  inv_temp = _check_temperature(temperature)
  sched = _schedule(schedule, hidden, unembed, block_n, block_v)
  if sched.name == "dense":
    out = _reference.logprob_entropy(hidden, unembed, targets, inv_temp)
  else:
    out = _fused_logprob(sched)(hidden, unembed, targets, inv_temp)
  return tuple(x.reshape(batch) for x in out)


def _objective(loss, hyper):
  """The `_objectives.Objective` named `loss`, hyperparameters checked."""
  if loss not in LOSSES:
    raise ValueError(f"loss must be one of {list(LOSSES)}; got {loss!r}.")
  clamp, dual = hyper["log_ratio_clamp"], hyper["dual_clip"]
  positive = {
    k: hyper[k] for k in ("tau_pos", "tau_neg", "eps_low", "eps_high")
  }
  positive.update({} if clamp is None else {"log_ratio_clamp": clamp})
  for name, value in positive.items():
    if not value > 0:
      raise ValueError(f"{name} must be > 0; got {value!r}.")
  if dual is not None and not dual > 1:
    raise ValueError(f"dual_clip must be > 1 (or None); got {dual!r}.")
  if loss == "sapo":
    keys = ("tau_pos", "tau_neg", "log_ratio_clamp")
    return _objectives.sapo(**{k: hyper[k] for k in keys})
  keys = ("eps_low", "eps_high", "dual_clip", "log_ratio_clamp")
  return _objectives.ppo_clip(**{k: hyper[k] for k in keys})


def _token_args(batch, **arrays):
  """Flattened float32 [N] token arrays, shapes checked against `batch`."""
  out = []
  for name, x in arrays.items():
    x = jnp.asarray(x)
    if x.shape != batch:
      raise ValueError(
        f"{name} must have shape {list(batch)} (hidden_ND's without D);"
        f" got {list(x.shape)}."
      )
    out.append(lax.stop_gradient(x.astype(F32).reshape(-1)))
  return out


def policy_loss(
  hidden_ND: ArrayLike,
  unembed_DV: ArrayLike,
  targets_N: ArrayLike,
  old_logp_N: ArrayLike,
  advantages_N: ArrayLike,
  mask_N: ArrayLike,
  *,
  loss: str = "sapo",
  temperature: float | ArrayLike = 1.0,
  tau_pos: float = 1.0,
  tau_neg: float = 1.05,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  dual_clip: float | None = None,
  log_ratio_clamp: float | None = 20.0,
  schedule: str = "auto",
  block_n: int | None = None,
  block_v: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Fused per-token policy loss from hidden states, logits never stored.

    logp = token_logprob(hidden, unembed, targets),  r = exp(clamp(logp - old))
    sapo:     L = -(4 / tau) sigmoid(tau (r - 1)) A,  tau = tau_pos if A > 0
              else tau_neg
    ppo_clip: L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)),
              then min(L, -c A) where A < 0 if dual_clip = c

  Per-token values equal `rljax.losses.sapo` / `rljax.losses.ppo_clip`
  applied to the log-probs (same hyperparameter names and defaults; GPPO,
  CISPO and sequence-level losses are not fused). The backward computes the
  per-token coefficient dL/dlogp in closed form from the saved logp and
  feeds it to the same kernel as `token_logprob`, so no logits are kept
  between the passes. Where mask <= 0 the loss and its gradient are 0.
  Like rljax, the loss is not multiplied by the mask (aggregation does it).
  old_logp, advantages, mask and the temperature are constants.

  Args:
    hidden_ND, unembed_DV, targets_N, temperature, schedule, block_n,
      block_v: as in `token_logprob`.
    old_logp_N: log-probs of the sampling policy, [...].
    advantages_N: per-token advantages A, [...].
    mask_N: > 0 on tokens that count, [...].
    loss: "sapo" or "ppo_clip".
    tau_pos, tau_neg: SAPO gate temperatures (paper / verl / TRL: 1.0, 1.05).
    eps_low, eps_high: PPO clip range (verl / TRL / OpenRLHF: 0.2, 0.2).
    dual_clip: PPO dual clip c > 1; None disables it (TRL, OpenRLHF).
    log_ratio_clamp: clamp of logp - old before exp (verl: 20); None
      disables it (TRL).

  Returns:
    (loss_N, logp_N), float32 of shape [...]; logp is not masked.

  References:
    SAPO, Gao et al. 2025 (arXiv 2511.20347); PPO, Schulman et al. 2017
    (arXiv 1707.06347); verl `compute_policy_loss_sapo` / `_vanilla`.
  """
  hyper = dict(
    tau_pos=tau_pos,
    tau_neg=tau_neg,
    eps_low=eps_low,
    eps_high=eps_high,
    dual_clip=dual_clip,
    log_ratio_clamp=log_ratio_clamp,
  )
  objective = _objective(loss, hyper)
  hidden, unembed, targets, batch = _flatten(hidden_ND, unembed_DV, targets_N)
  inv_temp = _check_temperature(temperature)
  tokens = _token_args(
    batch, old_logp_N=old_logp_N, advantages_N=advantages_N, mask_N=mask_N
  )
  sched = _schedule(schedule, hidden, unembed, block_n, block_v)
  if sched.name == "dense":
    logp, _ = _reference.logprob_entropy(hidden, unembed, targets, inv_temp)
    out = (objective.value(logp, *tokens), logp)
  else:
    out = _fused_policy(sched, objective)(
      hidden, unembed, targets, inv_temp, *tokens
    )
  return tuple(x.reshape(batch) for x in out)
