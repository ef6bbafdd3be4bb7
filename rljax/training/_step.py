"""Train states and the jitted update on one prepared rollout batch.

States are plain pytrees: the model structure (`nnx.GraphDef`) stays outside,
so a state can be sharded, checkpointed and passed through `jax.jit`.
Sequences are prompt + completion, [P, G, L] with L = S + T; the loss reads
the last T positions. With ``UpdateSpec.prefix_grouper`` each group's
prompt (the same for its G samples) is encoded once (Prefix Grouper).

One update makes ``epochs x minibatches`` optimizer steps over the batch.
Each minibatch may be split into ``microbatches`` whose gradients add up to
exactly the minibatch's: the loss is a `Mean(num, den)`, the denominator does
not depend on the parameters, so the gradient of the whole is
sum(grad num) / sum(den).

Before each optimizer step, stages with ``Transform.measure`` get their
statistic over the whole minibatch (a forward pass, summed over micro-batches
and devices) and ``Transform.observe`` updates the algorithm state the loss
then reads (dual variables, bounds searched over the batch).

Every optimizer step is guarded: when the loss, the gradient or the updated
parameters hold a NaN or an infinity, the step leaves the state as it was
(parameters, optimizer state, step count) and says so in its metrics
(``skipped_updates`` and the cause, ``nonfinite_loss`` / ``_grads`` /
``_params`` / ``_value``), so a non-finite value never reaches the weights or
a checkpoint; the trainer then stops or skips (``train.nonfinite``). optax's
`apply_if_finite` is not used: it checks gradients only (a huge learning
rate makes finite gradients into infinite weights) and applies the bad
update after ``max_consecutive_errors``.
"""

from typing import Any, NamedTuple, Optional

from flax import nnx
import jax
import jax.numpy as jnp
import optax

from rljax import objectives
from rljax._src.base import Algorithm
from rljax._src.base import Batch
from rljax._src.base import Mean
from rljax.models import _lora
from rljax.models import grouped_completion_logprobs
from rljax.models import load_balancing_loss
from rljax.models import positions_from_mask
from rljax.models import token_logprobs
from rljax.training import _packing
from rljax.training._packing import Packing


class PolicyState(NamedTuple):
  """The trained policy: weights, optimizer and algorithm states, step."""

  params: Any  # nnx.State of the policy
  opt_state: Any
  algo_state: Any
  step: jax.Array  # int32: optimizer steps taken


class ValueState(NamedTuple):
  """The PPO critic: weights and optimizer state."""

  params: Any
  opt_state: Any


class TrainState(NamedTuple):
  """Policy, frozen reference (None when no KL uses it) and value states."""

  policy: PolicyState
  reference: Any = None
  value: Optional[ValueState] = None


class Sequences(NamedTuple):
  """Prompt + completion tokens of every sample, [P, G, L] int32."""

  tokens_PGL: jax.Array
  mask_PGL: jax.Array
  # Mixture-of-experts policies: int32 [P, G, Y layers, L, K] the sampler's
  # experts (`rljax.sampling.Rollout.routing_PGLWK`), replayed by every
  # forward of an MoE model here (routing replay); None routes freely.
  routing_PGYLK: Optional[jax.Array] = None


class Models(NamedTuple):
  """Static structure: graph definitions and optimizers (hashable)."""

  policy: nnx.GraphDef
  value: Optional[nnx.GraphDef]
  optimizer: optax.GradientTransformation
  value_optimizer: Optional[optax.GradientTransformation]


def completion_logprobs(
  model,
  seqs: Sequences,
  width: int,
  *,
  temperature,
  schedule="auto",
  prefix_grouper=False,
  return_routing=False,
  packing: Optional[Packing] = None,
):
  """(logp_PGT, entropy_PGT) of the last `width` tokens of each sequence.

  With ``packing`` (one unit of a `rljax.training.Packing`: the samples'
  real spans laid end to end in rows with segment ids) the model runs on
  the packed rows and the outputs are read back into [P, G, T]: the same
  values, up to float summation order, computed over real tokens only
  (`_packed_forward`).

  With ``prefix_grouper`` each group's prompt (the first L - width tokens,
  the same for all its samples) is encoded once and shared by its G
  completions (`rljax.models.grouped_completion_logprobs`, Prefix Grouper):
  the same values and gradients, up to float rounding, with the prompt's
  share of the compute divided by G. Samples of a group with different
  prompts raise an error (a ValueError, or at run time under `jax.jit`).

  A mixture-of-experts `model` routes the tokens through the experts in
  ``seqs.routing_PGYLK`` when it is given (routing replay: Ma et al., 2025,
  "Rollout Routing Replay", arXiv:2510.11370); dense models ignore it.
  ``return_routing=True`` (MoE, no prefix_grouper) also returns the
  `rljax.models.Routing` of the P * G rows (leading axis: layers).
  """
  replay = seqs.routing_PGYLK is not None and model.config.num_experts
  if packing is not None:
    if prefix_grouper:
      raise ValueError(_GROUPER_PACKED)
    return _packed_logprobs(
      model, seqs, width, packing, temperature, schedule, return_routing
    )
  if (replay or return_routing) and prefix_grouper:
    raise ValueError(
      "routing replay (Sequences.routing_PGYLK) and the router's auxiliary"
      " loss do not support prefix_grouper; turn prefix_grouper off for"
      " mixture-of-experts policies."
    )
  if prefix_grouper:
    prompt, prompt_mask = shared_prompts(
      seqs, seqs.tokens_PGL.shape[-1] - width
    )
    return grouped_completion_logprobs(
      model,
      prompt,
      prompt_mask,
      seqs.tokens_PGL[..., -width:],
      seqs.mask_PGL[..., -width:],
      temperature=temperature,
      schedule=schedule,
    )
  p, g, length = seqs.tokens_PGL.shape
  flat = lambda x: x.reshape(p * g, length)  # noqa: E731
  routing = None
  if replay:  # [P, G, Y, L, K] -> [Y, P * G, L, K]
    r = seqs.routing_PGYLK
    routing = jnp.moveaxis(r.reshape(p * g, *r.shape[2:]), 1, 0)
  logp, entropy, *routing = token_logprobs(
    model,
    flat(seqs.tokens_PGL),
    flat(seqs.mask_PGL),
    temperature=temperature,
    schedule=schedule,
    routing_LBSK=routing,
    return_routing=return_routing,
  )
  back = lambda x: x[:, length - width :].reshape(p, g, width)  # noqa: E731
  return (back(logp), back(entropy), *routing)


_GROUPER_PACKED = (
  "model.prefix_grouper and train.max_tokens_per_microbatch (packed"
  " updates) cannot be combined: Prefix Grouper shares each group's padded"
  " prompt across its samples, packing removes the padding. Unset one of"
  " them."
)


def _packed_inputs(seqs: Sequences, packing: Packing):
  """The packed rows of one unit: (tokens, mask, positions, segment ids)
  [R, C], positions those of the padded rows (`positions_from_mask`)."""
  p, g, length = seqs.tokens_PGL.shape
  tokens = seqs.tokens_PGL.reshape(p * g, length)
  mask = jnp.asarray(seqs.mask_PGL, jnp.int32).reshape(p * g, length)
  return (
    _packing.gather_rows(tokens, packing),
    _packing.gather_rows(mask, packing),
    _packing.gather_rows(positions_from_mask(mask), packing),
    packing.segment_KRC,
  )


def _packed_logprobs(
  model, seqs, width, packing, temperature, schedule, return_routing
):
  """`completion_logprobs` on the packed rows of ``packing`` (one unit)."""
  p, g, length = seqs.tokens_PGL.shape
  tokens, mask, positions, segments = _packed_inputs(seqs, packing)
  routing = None
  if seqs.routing_PGYLK is not None and model.config.num_experts:
    r = seqs.routing_PGYLK  # [P, G, Y, L, K] -> [P G, L, Y, K] -> [Y, R, C, K]
    r = jnp.moveaxis(r.reshape(p * g, *r.shape[2:]), 1, 2)
    routing = jnp.moveaxis(_packing.gather_rows(r, packing), 2, 0)
  logp, entropy, *routed = token_logprobs(
    model,
    tokens,
    mask,
    segment_ids_BS=segments,
    positions_BS=positions,
    temperature=temperature,
    schedule=schedule,
    routing_LBSK=routing,
    return_routing=return_routing,
  )
  back = lambda x: _packing.scatter_back(x, packing)[:, 1:].reshape(  # noqa: E731
    p, g, width
  )
  return (back(logp), back(entropy), *routed)


def shared_prompts(seqs: Sequences, prompt_width: int):
  """([P, S] tokens, [P, S] mask) of each group's prompt, the first
  `prompt_width` columns, checked to be the same for every sample.

  Raises a ValueError when they differ (under `jax.jit`, at run time,
  through a host callback: the error then arrives wrapped in the runtime's
  error, with this message).
  """
  tokens = seqs.tokens_PGL[..., :prompt_width]
  mask = seqs.mask_PGL[..., :prompt_width]
  real = jnp.where(mask > 0, tokens, 0)
  same = jnp.logical_and(
    jnp.all(real == real[:, :1]), jnp.all(mask == mask[:, :1])
  )
  if isinstance(same, jax.core.Tracer):
    jax.debug.callback(_raise_unless_shared, same)
  else:
    _raise_unless_shared(same)
  return tokens[:, 0], mask[:, 0]


def _raise_unless_shared(same) -> None:
  if not bool(same):
    raise ValueError(
      "prefix_grouper: the samples of a group have different prompt tokens"
      " (the first L - completion_width columns of Sequences differ along"
      " G). Prefix Grouper shares one prompt per group; set"
      " model.prefix_grouper=False for batches whose groups mix prompts."
    )


def prompt_mean_logprobs(
  model, seqs: Sequences, prompt_width: int, *, temperature, schedule="auto"
) -> jax.Array:
  """[P] mean log p(token | earlier prompt tokens) over each prompt.

  The prompt is the same for every sample of a group: the first sample's
  is scored. Its first real token (predicted from padding) is left out.
  """
  tokens = seqs.tokens_PGL[:, 0, :prompt_width]
  mask = jnp.asarray(seqs.mask_PGL[:, 0, :prompt_width], jnp.float32)
  logp, _ = token_logprobs(
    model, tokens, mask, temperature=temperature, schedule=schedule
  )
  follows = mask * jnp.pad(mask[:, :-1], ((0, 0), (1, 0)))
  return jnp.sum(logp * follows, -1) / jnp.maximum(jnp.sum(follows, -1), 1.0)


def trajectory_grad_sq_norms(
  graph, params, seqs: Sequences, width: int, *, temperature, schedule="auto"
) -> jax.Array:
  """[P, G] ||grad_params sum_t log pi(y_t)||^2 of each sample's completion.

  One backward pass per sample, run one after another (`jax.lax.map`), so
  memory holds one gradient at a time.
  """
  p, g, length = seqs.tokens_PGL.shape

  def one(row):
    tokens, mask = row
    single = Sequences(tokens[None, None], mask[None, None])

    def total(prm):
      logp, _ = completion_logprobs(
        nnx.merge(graph, prm),
        single,
        width,
        temperature=temperature,
        schedule=schedule,
      )
      return jnp.sum(logp * mask[None, None, length - width :])

    # With LoRA, the adapters' gradient only (never the frozen base's).
    grads = jax.grad(lambda t: total(_lora.with_trainable(params, t)))(
      _lora.trainable(params)
    )
    return optax.tree.norm(grads, squared=True)

  rows = (
    seqs.tokens_PGL.reshape(p * g, length),
    jnp.asarray(seqs.mask_PGL, jnp.float32).reshape(p * g, length),
  )
  return jax.lax.map(one, rows).reshape(p, g)


def rescore(
  request,
  graph,
  params,
  seqs: Sequences,
  width: int,
  *,
  schedule="auto",
  prefix_grouper=False,
  packing: Optional[Packing] = None,
) -> jax.Array:
  """One `rljax.Rescore` pass of the model (``graph``, ``params``);
  ``prefix_grouper`` and ``packing`` apply to completion log-probs (see
  `completion_logprobs`)."""
  kw = dict(temperature=request.temperature, schedule=schedule)
  if request.span == "gradient":
    return trajectory_grad_sq_norms(graph, params, seqs, width, **kw)
  model = nnx.merge(graph, params)
  if request.span == "prompt":
    prompt_width = seqs.tokens_PGL.shape[-1] - width
    return prompt_mean_logprobs(model, seqs, prompt_width, **kw)
  return completion_logprobs(
    model, seqs, width, prefix_grouper=prefix_grouper, packing=packing, **kw
  )[0]


def completion_values(
  value_model, seqs: Sequences, width: int, packing: Optional[Packing] = None
) -> jax.Array:
  """[P, G, T] V(state before token t): the value at token t's predictor
  (on packed rows with ``packing``: 0 where the predictor is padding)."""
  p, g, length = seqs.tokens_PGL.shape
  if packing is not None:
    tokens, mask, positions, segments = _packed_inputs(seqs, packing)
    values = value_model(
      tokens, mask, segment_ids_BS=segments, positions_BS=positions
    )
    values = _packing.scatter_back(values, packing)[:, :-1]
    return values.reshape(p, g, width)
  values = value_model(
    seqs.tokens_PGL.reshape(p * g, length), seqs.mask_PGL.reshape(p * g, length)
  )
  values = values[:, length - width - 1 : length - 1]
  return values.reshape(p, g, width)


def _rows(tree, start, size):
  """Rows [start, start + size) of the leading P axis of every leaf."""
  return jax.tree.map(
    lambda x: jax.lax.dynamic_slice_in_dim(x, start, size, axis=0), tree
  )


def _add(a, b):
  return jax.tree.map(jnp.add, a, b)


def _zeros_like_out(fn, *args):
  """Zeros shaped like ``fn(*args)``'s output (traced, not run)."""
  return jax.tree.map(
    lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(fn, *args)
  )


def _summed(fn, n: int):
  """``fn(0) + ... + fn(n - 1)`` over pytrees: one traced copy of `fn` in a
  `lax.scan` from zeros (0 + x is x exactly, so the sums are those of
  peeling the first term, in half the program and its compile)."""
  if n == 1:
    return fn(0)
  total, _ = jax.lax.scan(
    lambda carry, i: (_add(carry, fn(i)), None),
    _zeros_like_out(fn, 0),
    jnp.arange(n),
  )
  return total


def _scale(grads, den):
  """grad(num) / den, or grad(num) when den is 0 (a token-sum loss)."""
  inv = jnp.where(den == 0, 1.0, 1.0 / jnp.where(den == 0, 1.0, den))
  return jax.tree.map(lambda g: (g * inv).astype(g.dtype), grads)


class UpdateSpec(NamedTuple):
  """Static settings of `update` (hashable: one compile per value)."""

  completion_width: int
  epochs: int = 1
  minibatches: int = 1
  microbatches: int = 1
  temperature: float = 1.0
  schedule: str = "auto"
  value_eps: Optional[float] = 0.2
  prefix_grouper: bool = False  # encode each group's prompt once
  # Mixture of experts: add coef * `rljax.models.load_balancing_loss` (over
  # prompt and completion tokens) to the policy loss; 0 leaves it out.
  router_aux_coef: float = 0.0


def _accumulated_grads(loss_fn, params, data, microbatches):
  """Summed num-gradients, summed denominators and metrics over micro-batches.

  ``loss_fn(params, rows, i) -> (Mean loss, metrics)`` sees the i-th block of
  rows of `data`; the caller divides the summed gradient by the summed
  denominator, which gives exactly the whole minibatch's gradient.
  """
  rows = jax.tree.leaves(data)[0].shape[0] // microbatches

  def micro(i):
    def num(params):
      loss, metrics = loss_fn(params, _rows(data, i * rows, rows), i)
      return loss.num, (loss.den, metrics)

    grads, (den, metrics) = jax.grad(num, has_aux=True)(params)
    return grads, den, metrics

  return _summed(micro, microbatches)


def _policy_logprobs(models, spec, params, seqs, packing=None):
  return completion_logprobs(
    nnx.merge(models.policy, params),
    seqs,
    spec.completion_width,
    temperature=spec.temperature,
    schedule=spec.schedule,
    prefix_grouper=spec.prefix_grouper,
    packing=packing,
  )


def _unit(packing, i):
  """Unit `i` of a `Packing` (None: padded rows)."""
  return None if packing is None else packing.unit(i)


def _with_router_aux(
  models, algorithm, spec, params, rows, algo_state, key, i, packing=None
):
  """The policy loss plus ``spec.router_aux_coef`` times the router's
  load-balancing loss, and the latter as metric ``router_aux``.

  The auxiliary term is weighted by the micro-batch's denominator (by
  1 / microbatches when the loss has none), so the summed loss gains coef
  times the (weighted) mean auxiliary loss of the micro-batches.
  """
  seqs, batch = rows
  model = nnx.merge(models.policy, params)
  logp, entropy, routing = completion_logprobs(
    model,
    seqs,
    spec.completion_width,
    temperature=spec.temperature,
    schedule=spec.schedule,
    prefix_grouper=spec.prefix_grouper,
    return_routing=True,
    packing=packing,
  )
  p, g, length = seqs.mask_PGL.shape
  mask = seqs.mask_PGL.reshape(p * g, length)
  if packing is not None:
    mask = _packing.gather_rows(mask, packing)
  aux = load_balancing_loss(routing.logits, routing.experts, mask)
  loss, metrics = algorithm.loss(
    logp, batch, algo_state, entropy_PGT=entropy, key=jax.random.fold_in(key, i)
  )
  weight = jnp.where(loss.den == 0, 1.0 / spec.microbatches, loss.den)
  loss = Mean(loss.num + spec.router_aux_coef * aux * weight, loss.den)
  metrics = {**metrics, "router_aux": Mean(aux, jnp.float32(1.0))}
  return loss, metrics


def _policy_grads(
  models, algorithm, spec, params, algo_state, seqs, batch, key, packing=None
):
  """The policy loss's summed num-gradients, denominator and metrics, with
  respect to the trainable part of `params` (`_lora.trainable`)."""

  def loss(trained, rows, i):
    mb_seqs, mb_batch = rows
    full = _lora.with_trainable(params, trained)
    if spec.router_aux_coef:
      return _with_router_aux(
        models,
        algorithm,
        spec,
        full,
        rows,
        algo_state,
        key,
        i,
        _unit(packing, i),
      )
    logp, entropy = _policy_logprobs(
      models, spec, full, mb_seqs, _unit(packing, i)
    )
    return algorithm.loss(
      logp,
      mb_batch,
      algo_state,
      entropy_PGT=entropy,
      key=jax.random.fold_in(key, i),
    )

  return _accumulated_grads(
    loss, _lora.trainable(params), (seqs, batch), spec.microbatches
  )


def _measured(
  models, algorithm, spec, params, algo_state, seqs, batch, key, packing
):
  """`Algorithm.measure` summed over the micro-batches of a minibatch: a
  forward pass at the current parameters, no gradient."""
  rows = batch.mask_PGT.shape[0] // spec.microbatches

  def micro(i):
    mb_seqs, mb_batch = _rows((seqs, batch), i * rows, rows)
    logp, entropy = _policy_logprobs(
      models, spec, params, mb_seqs, _unit(packing, i)
    )
    return algorithm.measure(
      jax.lax.stop_gradient(logp),
      mb_batch,
      algo_state,
      entropy_PGT=jax.lax.stop_gradient(entropy),
      key=jax.random.fold_in(key, i),
    )

  return _summed(micro, spec.microbatches)


def _observed(
  models, algorithm, spec, params, algo_state, seqs, batch, key, packing
):
  """The algorithm state for this optimizer step (`Transform.observe`)."""
  if algorithm.transform.observe is None:
    return algo_state
  stats = {}
  if algorithm.measures:
    stats = _measured(
      models, algorithm, spec, params, algo_state, seqs, batch, key, packing
    )
  return algorithm.observe(algo_state, stats)


def _value_grads(models, spec, params, seqs, batch, packing):
  """The critic's clipped value loss: summed num-gradients, den, metrics."""

  def loss(params, rows, i):
    mb_seqs, mb_batch = rows
    values = completion_values(
      nnx.merge(models.value, params),
      mb_seqs,
      spec.completion_width,
      _unit(packing, i),
    )
    return objectives.value_loss(values, mb_batch, eps=spec.value_eps)

  return _accumulated_grads(loss, params, (seqs, batch), spec.microbatches)


def all_finite(tree) -> jax.Array:
  """True when every floating-point leaf of `tree` is free of NaN and inf."""
  leaves = [
    jnp.all(jnp.isfinite(x))
    for x in jax.tree.leaves(tree)
    if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
  ]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def _keep_if(ok, new, old):
  """`new` where `ok`, else `old` (leaf by leaf; `ok` is a scalar bool)."""
  return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


def _flag(bad) -> Mean:
  return Mean(bad.astype(jnp.float32), jnp.float32(1.0))


def _minibatch_step(
  models, algorithm, spec, state, seqs, batch, key, packing=None
):
  """One optimizer step (policy, and critic if any) on one minibatch
  (``packing``: its micro-batches' units, or None).

  The step is applied only when the loss, the gradient and the new
  parameters are finite (see the module docstring).
  """
  policy = state.policy
  # Whole-minibatch statistics and state that learns from them come first;
  # the loss then reads the observed state (see rljax.Transform).
  policy = policy._replace(
    algo_state=_observed(
      models,
      algorithm,
      spec,
      policy.params,
      policy.algo_state,
      seqs,
      batch,
      key,
      packing,
    )
  )
  grads, den, metrics = _policy_grads(
    models,
    algorithm,
    spec,
    policy.params,
    policy.algo_state,
    seqs,
    batch,
    key,
    packing,
  )
  grads = _scale(grads, den)
  metrics = dict(metrics, grad_norm=Mean(optax.tree.norm(grads), 1.0))
  trained = _lora.trainable(policy.params)
  updates, opt_state = models.optimizer.update(grads, policy.opt_state, trained)
  if algorithm.transform.step_scale is not None:
    scale = algorithm.step_scale(policy.algo_state)
    updates = jax.tree.map(lambda u: u * scale.astype(u.dtype), updates)
    metrics["step_scale"] = Mean(scale, jnp.float32(1.0))
  stepped = policy._replace(
    params=_lora.with_trainable(
      policy.params, optax.apply_updates(trained, updates)
    ),
    opt_state=opt_state,
    step=policy.step + 1,
  )
  loss_ok = all_finite(metrics["loss"].value) if "loss" in metrics else True
  grads_ok = all_finite(grads)
  params_ok = all_finite(_lora.trainable(stepped.params))
  ok = jnp.logical_and(jnp.logical_and(loss_ok, grads_ok), params_ok)
  policy = _keep_if(ok, stepped, state.policy)
  metrics.update(
    nonfinite_loss=_flag(~jnp.asarray(loss_ok)),
    nonfinite_grads=_flag(~grads_ok),
    nonfinite_params=_flag(~params_ok),
  )
  value = state.value
  value_ok = jnp.array(True)
  if value is not None:
    v_grads, v_den, v_metrics = _value_grads(
      models, spec, value.params, seqs, batch, packing
    )
    v_grads = _scale(v_grads, v_den)
    v_updates, v_opt = models.value_optimizer.update(
      v_grads, value.opt_state, value.params
    )
    v_params = optax.apply_updates(value.params, v_updates)
    value_ok = jnp.logical_and(all_finite(v_grads), all_finite(v_params))
    value = _keep_if(value_ok, ValueState(v_params, v_opt), value)
    metrics.update(v_metrics)
  metrics["nonfinite_value"] = _flag(~value_ok)
  metrics["skipped_updates"] = _flag(~jnp.logical_and(ok, value_ok))
  return state._replace(policy=policy, value=value), metrics


def update(
  models: Models,
  algorithm: Algorithm,
  spec: UpdateSpec,
  state: TrainState,
  seqs: Sequences,
  batch: Batch,
  key: jax.Array,
  packing: Optional[Packing] = None,
) -> tuple[TrainState, dict[str, Mean]]:
  """``epochs x minibatches`` optimizer steps on a prepared batch.

  Minibatches are consecutive blocks of prompt groups, in the same order
  every epoch. Metrics are `Mean`s summed over every step, so their value is
  the mean over all the update's tokens (or sequences).

  With ``packing`` (``minibatches x microbatches`` units, see
  `rljax.training.Packing`) every forward and backward runs on packed rows
  of real tokens; the loss, gradients and parameters are those of the
  padded rows up to float summation order.
  """
  rows = batch.mask_PGT.shape[0] // spec.minibatches
  if (
    packing is not None
    and packing.units != spec.minibatches * spec.microbatches
  ):
    raise ValueError(
      f"the packing has {packing.units} units; the update needs one per"
      f" micro-batch ({spec.minibatches} x {spec.microbatches})."
    )

  def body(state, i):
    j = i % spec.minibatches
    mb_seqs, mb_batch = _rows((seqs, batch), j * rows, rows)
    mb_packing = None
    if packing is not None:
      mb_packing = jax.tree.map(
        lambda x: jax.lax.dynamic_slice_in_dim(
          x, j * spec.microbatches, spec.microbatches
        ),
        packing,
      )
    return _minibatch_step(
      models,
      algorithm,
      spec,
      state,
      mb_seqs,
      mb_batch,
      jax.random.fold_in(key, i),
      mb_packing,
    )

  steps = spec.epochs * spec.minibatches
  if steps == 1:
    return body(state, 0)

  def scan_body(carry, i):
    state, total = carry
    state, metrics = body(state, i)
    return (state, _add(total, metrics)), None

  # One traced optimizer step, its metrics summed from zeros (`_summed`).
  zeros = _zeros_like_out(lambda s: body(s, 0)[1], state)
  (state, metrics), _ = jax.lax.scan(
    scan_body, (state, zeros), jnp.arange(steps)
  )
  return state, metrics
