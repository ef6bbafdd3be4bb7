"""The composition core: `Batch`, `Transform`, `chain` and `Algorithm`.

An algorithm is a chain of transforms, exactly like an optax optimizer. Every
transform is three pure functions:

* ``init() -> state``: its state (an adaptive coefficient, running statistics);
  ``()`` when it keeps none.
* ``prepare(batch, state) -> (batch, state)``: runs once per rollout batch,
  outside the gradient: reward shaping, filters, advantages, importance weights
  against the rollout engine, state updates.
* ``apply(terms, batch, state) -> terms``: runs inside the loss, where
  ``terms.logp_PGT`` carries the gradient: it adds a per-token policy surrogate
  or a penalty (KL, entropy bonus), or multiplies the policy term by a mask.

Two optional functions open the loss to whole-batch statistics and to state
that learns from the loss (dual variables, adaptive clip bounds):

* ``measure(terms, batch, state) -> {name: Mean}``: a statistic of the
  current policy on one micro-batch (``terms`` holds the current log-probs and
  entropies, nothing else yet). Each optimizer step first runs a forward pass
  over its whole minibatch, sums the `Mean`s over micro-batches and devices,
  so the values are exactly the minibatch's, whatever the micro-batching or
  sharding.
* ``observe(state, stats) -> state``: runs once per optimizer step, before
  the loss, with the values of the transform's own ``measure`` (``{}`` when it
  has none); ``apply`` then reads what it stored. Use it for a dual-variable
  step, bounds searched over the batch, or a per-step schedule.

Side data. `Batch` carries the prompt id (``prompt_ids_P``, the dataset index,
so a transform can keep a per-prompt table in its state), the completion
token ids (``tokens_PGT``), a frozen scoring model's token log-probs
(``teacher_logp_PGT``) and ``extra``: named arrays that one stage writes in
``prepare`` (`Batch.with_extra`) and a later one reads (`Batch.get`), sliced
with the batch into minibatches and micro-batches. An ``extra`` name ends
with its layout, ``_P``, ``_PG`` or ``_PGT`` (``correct_PG``,
``eps_low_PGT``). During ``prepare`` the batch also holds a PRNG ``key``
(`Batch.require_key`), a different one for each stage of a chain.

Extra scoring passes. A stage that needs the completion's log-probs under
another temperature or model, a prompt's perplexity or per-sample gradient
norms lists `Rescore` requests in ``Transform.rescores``; the Trainer runs
them with the old-log-prob pass and stores each in ``Batch.extra`` under its
name before ``prepare``. A stage's ``step_scale(state)`` multiplies each
optimizer step's update (a learning rate that follows a statistic).

`Algorithm(transform, aggregate)` adds the one reduction from per-token losses
to a scalar. The loss is returned as a `Mean` (numerator, denominator), so that
micro-batches and data-parallel shards sum to the exact global value.
"""

from collections.abc import Callable
from typing import Any, NamedTuple, Optional, Protocol

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats

State = Any
Array = jax.Array


class Mean(NamedTuple):
  """A mean kept as numerator and denominator.

  Sum `Mean`s of disjoint parts of a batch leaf by leaf (``jax.tree.map(jnp.add,
  a, b)``) and `value` is the mean of the whole. A denominator of 0 means
  "no normaliser": `value` is then the numerator itself (used by token-sum
  aggregations, whose normaliser is a constant folded into the numerator).
  """

  num: Array
  den: Array

  @property
  def value(self) -> Array:
    return jnp.where(
      self.den == 0, self.num, stats.safe_div(self.num, self.den)
    )


def mean_metric(x: ArrayLike, mask: ArrayLike) -> Mean:
  """The masked mean of `x` as a `Mean` (for metrics)."""
  return Mean(stats.masked_sum(x, mask), jnp.sum(stats.f32(mask)))


def finalize(metrics: dict[str, Mean]) -> dict[str, Array]:
  """Turn a dict of `Mean`s into plain scalars."""
  return {k: m.value for k, m in metrics.items()}


class Batch(NamedTuple):
  """One rollout batch in group layout: P prompts x G samples x T tokens.

  Only `mask_PGT` is required; transforms read the fields they need and raise
  a clear error when one is missing. Filters and groups of different sizes are
  expressed through `sample_mask_PG` (never by boolean indexing).
  """

  mask_PGT: Array  # completion tokens that enter the loss (0/1 or weights)
  sample_mask_PG: Optional[Array] = None  # valid samples; None = all valid
  rewards_PG: Optional[Array] = None  # scalar outcome reward per sample
  rewards_PGK: Optional[Array] = None  # K separate rewards (multi-reward)
  token_rewards_PGT: Optional[Array] = None  # per-token rewards (KL-in-reward)
  advantages_PGT: Optional[Array] = None  # filled by an advantage transform
  returns_PGT: Optional[Array] = None  # value targets (GAE)
  old_logp_PGT: Optional[Array] = None  # behaviour policy, recomputed
  ref_logp_PGT: Optional[Array] = None  # reference policy
  rollout_logp_PGT: Optional[Array] = None  # as reported by the sampler
  old_values_PGT: Optional[Array] = None  # value model at rollout time
  old_entropy_PGT: Optional[Array] = None  # behaviour-policy entropies
  policy_weights_PGT: Optional[Array] = None  # multiply the policy term only
  truncated_PG: Optional[Array] = None  # hit the length limit without EOS
  baseline_rewards_P: Optional[Array] = None  # e.g. ReMax greedy reward
  prompt_ids_P: Optional[Array] = None  # int32 dataset index of each prompt
  tokens_PGT: Optional[Array] = None  # int32 completion token ids
  teacher_logp_PGT: Optional[Array] = None  # a frozen scoring model's
  # int32 version of the weights that sampled each token (an asynchronous
  # run's partial rollouts: `rljax.pipeline`); with rollout_logp_PGT, the
  # behaviour policy of each token.
  version_PGT: Optional[Array] = None
  extra: Optional[dict[str, Array]] = None  # side data; see `with_extra`
  key: Optional[Array] = None  # PRNG key, present during `prepare` only

  @property
  def shape(self) -> tuple[int, int, int]:
    return tuple(jnp.shape(self.mask_PGT))

  def samples(self) -> Array:
    """[P, G] float32 validity of each sample (ones when not given)."""
    if self.sample_mask_PG is None:
      return jnp.ones(self.shape[:2], jnp.float32)
    return stats.f32(self.sample_mask_PG)

  def loss_mask(self) -> Array:
    """[P, G, T] token mask with invalid or filtered samples zeroed."""
    return stats.f32(self.mask_PGT) * self.samples()[..., None]

  def require(self, *fields: str, by: str) -> None:
    """Raise a clear error if any of `fields` is missing."""
    missing = [f for f in fields if getattr(self, f) is None]
    if missing:
      raise ValueError(
        f"{by} needs Batch field(s) {missing}; set them when building the"
        " Batch (or put the transform that computes them earlier in the"
        " chain)."
      )

  def with_extra(self, **arrays: ArrayLike) -> "Batch":
    """A batch whose ``extra`` also holds `arrays` (replacing equal names).

    Each name ends with its layout: ``_P`` [prompts], ``_PG`` [prompts,
    samples] or ``_PGT`` [prompts, samples, tokens]; trailing dimensions
    after the layout are allowed (``_PGK`` style is not: use ``_PG`` with a
    trailing axis).
    """
    for name, value in arrays.items():
      _check_extra(name, value, self.shape)
    return self._replace(
      extra={
        **(self.extra or {}),
        **{k: jnp.asarray(v) for k, v in arrays.items()},
      }
    )

  def get(self, name: str, *, by: str) -> Array:
    """``extra[name]``, or a clear error naming the stage that writes it."""
    if not self.extra or name not in self.extra:
      have = sorted(self.extra or {})
      raise ValueError(
        f"{by} needs Batch.extra[{name!r}] (present: {have}); put the"
        " transform that writes it earlier in the chain, or add it with"
        " Batch.with_extra."
      )
    return self.extra[name]

  def require_key(self, *, by: str) -> Array:
    """The PRNG key of a randomised batch stage."""
    if self.key is None:
      raise ValueError(
        f"{by} is randomised and needs a PRNG key: call"
        " Algorithm.prepare(batch, state, key=...) (the Trainer does)."
      )
    return self.key


_LAYOUTS = {"P": 1, "PG": 2, "PGT": 3}


def _check_extra(name: str, value: ArrayLike, shape) -> None:
  layout = name.rsplit("_", 1)[-1] if "_" in name else ""
  if layout not in _LAYOUTS:
    raise ValueError(
      f"Batch.extra name {name!r} must end with its layout _P, _PG or _PGT"
      " (e.g. 'correct_PG', 'eps_low_PGT'), so that it is sliced with the"
      " batch."
    )
  lead = shape[: _LAYOUTS[layout]]
  checks.leading_shape(
    f"Batch.extra[{name!r}]", value, lead, f"Batch.mask_PGT[:{len(lead)}]"
  )


def check_batch(batch: Batch) -> None:
  """Validate the layout of every field present in `batch`."""
  checks.rank("Batch.mask_PGT", batch.mask_PGT, 3, "[prompts, samples, tokens]")
  expected = {"PGT": batch.shape, "PG": batch.shape[:2], "P": batch.shape[:1]}
  for name, value in batch._asdict().items():
    if value is None or name == "key":
      continue
    if name == "extra":
      for extra_name, extra_value in value.items():
        _check_extra(extra_name, extra_value, batch.shape)
      continue
    suffix = name.rsplit("_", 1)[-1]
    if suffix == "PGK":
      checks.rank(f"Batch.{name}", value, 3, "[prompts, samples, rewards]")
      checks.leading_shape(
        f"Batch.{name}", value, batch.shape[:2], "Batch.mask_PGT[:2]"
      )
    elif tuple(jnp.shape(value)) != expected[suffix]:
      raise ValueError(
        f"Batch.{name} has shape {tuple(jnp.shape(value))}; expected"
        f" {expected[suffix]} to match Batch.mask_PGT {batch.shape}."
      )


class LossTerms(NamedTuple):
  """What the loss stage of a chain threads from transform to transform.

  The per-token loss is ``policy_loss_PGT * policy_weight_PGT + penalty_PGT``:
  masks and weights (top-entropy, off-policy, importance sampling) touch the
  policy surrogate only, never the KL or entropy penalties.
  """

  logp_PGT: Array  # current policy log-probs; the gradient flows from here
  entropy_PGT: Optional[Array]  # current policy entropies, if computed
  key: Optional[Array]  # PRNG key for randomised objectives (clip-cov)
  policy_loss_PGT: Array
  policy_weight_PGT: Array
  penalty_PGT: Array
  metrics: dict[str, Mean]


_RESCORE_MODELS = ("policy", "reference", "teacher")
_RESCORE_SPANS = {"completion": "_PGT", "prompt": "_P", "gradient": "_PG"}


class Rescore(NamedTuple):
  """A scoring pass a stage asks the Trainer for (`Transform.rescores`).

  Before ``prepare``, ``Batch.extra[name]`` holds the completion tokens' log
  probabilities under ``model`` (``"policy"``: the weights that sampled
  them, like `Batch.old_logp_PGT`; ``"reference"``; ``"teacher"``) with
  the logits divided by ``temperature``: e.g. DCPO-dist's old policy at a
  target temperature T*. With ``span="prompt"`` it holds instead each
  prompt's mean token log-prob (its log inverse perplexity; the first
  prompt token, which has no context, left out), named ``..._P``: e.g.
  ProGRPO's prompt confidence. With ``span="gradient"`` it holds each
  sample's squared gradient norm ||grad_theta sum_t log pi(y_t)||^2 over
  the policy's parameters (one backward pass per sample, run one after
  another), named ``..._PG``: VCPO's per-trajectory gradient norms. Outside
  the Trainer, fill the entry yourself.
  """

  name: str
  temperature: float = 1.0
  model: str = "policy"
  span: str = "completion"

  def check(self) -> "Rescore":
    checks.one_of("Rescore.span", self.span, _RESCORE_SPANS)
    layout = _RESCORE_SPANS[self.span]
    if not self.name.endswith(layout):
      raise ValueError(
        f"Rescore name {self.name!r} must end with {layout} (span"
        f" {self.span!r}: one log-prob per completion token, one mean per"
        " prompt, or one gradient norm per sample)."
      )
    if self.span == "gradient" and self.model != "policy":
      raise ValueError(
        "Rescore(span='gradient') differentiates the policy being trained;"
        f" model must be 'policy', not {self.model!r}."
      )
    checks.positive(temperature=self.temperature)
    checks.one_of("Rescore.model", self.model, _RESCORE_MODELS)
    return self


class Transform(NamedTuple):
  """Three pure functions and optional ones; see the module docstring.

  ``step_scale(state) -> scalar`` multiplies each optimizer step's update
  (after the optimizer, so with AdamW it scales the learning rate and the
  weight decay): a learning rate that follows a statistic, e.g. VCPO's
  effective sample size. It reads the state after ``observe``; a chain
  multiplies its stages' factors.
  """

  init: Callable[[], State]
  prepare: Callable[[Batch, State], tuple[Batch, State]]
  apply: Callable[[LossTerms, Batch, State], LossTerms]
  measure: Optional[Callable[[LossTerms, Batch, State], dict[str, Mean]]] = None
  observe: Optional[Callable[[State, dict[str, Array]], State]] = None
  rescores: tuple[Rescore, ...] = ()
  step_scale: Optional[Callable[[State], Array]] = None


def _keep_batch(batch: Batch, state: State) -> tuple[Batch, State]:
  return batch, state


def _keep_terms(terms: LossTerms, batch: Batch, state: State) -> LossTerms:
  del batch, state
  return terms


def stateless_prepare(fn: Callable[[Batch], Batch]) -> Transform:
  """A transform that only rewrites the batch (advantages, shaping, filters)."""
  return Transform(
    init=lambda: (),
    prepare=lambda batch, state: (fn(batch), state),
    apply=_keep_terms,
  )


def stateless_apply(fn: Callable[[LossTerms, Batch], LossTerms]) -> Transform:
  """A transform that only acts inside the loss (objectives, penalties)."""
  return Transform(
    init=lambda: (),
    prepare=_keep_batch,
    apply=lambda terms, batch, state: fn(terms, batch),
  )


def chain(*transforms: Transform) -> Transform:
  """Compose transforms left to right, like `optax.chain`."""
  for i, t in enumerate(transforms):
    if not isinstance(t, Transform):
      raise TypeError(
        f"chain argument {i} is a {type(t).__name__}, not a Transform. Pass"
        " transforms (rljax.transforms.*, rljax.objectives.*); to extend a"
        " preset, chain its `.transform`."
      )

  def init():
    return tuple(t.init() for t in transforms)

  def _states(state):
    if not isinstance(state, tuple) or len(state) != len(transforms):
      raise ValueError(
        f"state does not belong to this chain of {len(transforms)}"
        " transforms; create it with the chain's own init()."
      )
    return state

  def prepare(batch, state):
    key, new_state = batch.key, []
    for i, (t, s) in enumerate(zip(transforms, _states(state))):
      if key is not None:
        batch = batch._replace(key=jax.random.fold_in(key, i))
      batch, s = t.prepare(batch, s)
      new_state.append(s)
    return batch._replace(key=key), tuple(new_state)

  def apply(terms, batch, state):
    for t, s in zip(transforms, _states(state)):
      terms = t.apply(terms, batch, s)
    return terms

  def measure(terms, batch, state):
    return tuple(
      t.measure(terms, batch, s) if t.measure else {}
      for t, s in zip(transforms, _states(state))
    )

  def observe(state, stats):
    stats = stats or ({},) * len(transforms)
    return tuple(
      t.observe(s, st) if t.observe else s
      for t, s, st in zip(transforms, _states(state), stats)
    )

  def step_scale(state):
    scale = jnp.ones((), jnp.float32)
    for t, s in zip(transforms, _states(state)):
      if t.step_scale is not None:
        scale = scale * jnp.asarray(t.step_scale(s), jnp.float32)
    return scale

  measures = any(t.measure for t in transforms)
  observes = any(t.observe for t in transforms)
  scales = any(t.step_scale for t in transforms)
  return Transform(
    init,
    prepare,
    apply,
    measure=measure if measures else None,
    observe=observe if observes else None,
    rescores=_merge_rescores(t.rescores for t in transforms),
    step_scale=step_scale if scales else None,
  )


def _merge_rescores(groups) -> tuple[Rescore, ...]:
  """The stages' scoring passes; one name may not mean two passes."""
  merged: dict[str, Rescore] = {}
  for request in (r.check() for group in groups for r in group):
    if merged.setdefault(request.name, request) != request:
      raise ValueError(
        f"two stages ask for Batch.extra[{request.name!r}] with different"
        f" passes: {merged[request.name]} and {request}; rename one."
      )
  return tuple(merged.values())


class Aggregation(Protocol):
  """Reduce a per-token loss [..., T] under a mask to a `Mean`."""

  def __call__(self, loss_BT: ArrayLike, mask_BT: ArrayLike) -> Mean: ...


class Algorithm(NamedTuple):
  """A transform plus the aggregation of its per-token loss.

  Example:
    >>> import rljax
    >>> algo = rljax.Algorithm(
    ...     rljax.chain(
    ...         rljax.transforms.group_advantages(rljax.advantages.rloo),
    ...         rljax.objectives.sapo(tau_pos=1.0, tau_neg=1.05),
    ...         rljax.objectives.kl_penalty(rljax.losses.kl_k3, coef=1e-3)),
    ...     aggregate=rljax.aggregate.seq_mean_token_mean)
  """

  transform: Transform
  aggregate: Aggregation

  def init(self) -> State:
    return self.transform.init()

  def prepare(
    self, batch: Batch, state: State, *, key: Optional[Array] = None
  ) -> tuple[Batch, State]:
    """Once per rollout batch: shaping, filters, advantages, weights.

    `key` feeds randomised stages (`Batch.require_key`); the returned batch
    no longer holds it.
    """
    check_batch(batch)
    batch, state = self.transform.prepare(batch._replace(key=key), state)
    return batch._replace(key=None), state

  def step_scale(self, state: State) -> Array:
    """The factor on this optimizer step's update (see `Transform`'s
    ``step_scale``); 1 when no stage scales it."""
    if self.transform.step_scale is None:
      return jnp.ones((), jnp.float32)
    return jnp.asarray(self.transform.step_scale(state), jnp.float32)

  @property
  def rescores(self) -> tuple[Rescore, ...]:
    """The extra scoring passes the stages ask for (see `Rescore`)."""
    return _merge_rescores([self.transform.rescores])

  @property
  def measures(self) -> bool:
    """Whether a stage measures whole-minibatch statistics (`measure`)."""
    return self.transform.measure is not None

  def measure(
    self,
    logp_PGT: ArrayLike,
    batch: Batch,
    state: State,
    *,
    entropy_PGT: Optional[ArrayLike] = None,
    key: Optional[Array] = None,
  ) -> Any:
    """The stages' statistics of one (micro)batch, as a pytree of `Mean`s.

    Sum the trees of disjoint parts leaf by leaf; pass the result to
    `observe`. Returns ``{}`` when no stage measures anything.
    """
    if not self.measures:
      return {}
    check_batch(batch)
    terms = _initial_terms(jnp.asarray(logp_PGT), batch, entropy_PGT, key)
    stats = self.transform.measure(terms, batch, state)
    return jax.lax.stop_gradient(stats)

  def observe(self, state: State, stats: Any) -> State:
    """The state after one optimizer step's statistics (see the module
    docstring); `stats` is `measure`'s tree summed over the minibatch."""
    if self.transform.observe is None:
      return state
    values = jax.tree.map(
      lambda m: m.value, stats, is_leaf=lambda x: isinstance(x, Mean)
    )
    return self.transform.observe(state, values)

  def loss(
    self,
    logp_PGT: ArrayLike,
    batch: Batch,
    state: State,
    *,
    entropy_PGT: Optional[ArrayLike] = None,
    key: Optional[Array] = None,
  ) -> tuple[Mean, dict[str, Mean]]:
    """The loss of a (prepared) batch as a `Mean`, and metrics.

    Differentiate ``loss.value`` for one batch. For micro-batches, sum the
    numerators' gradients and divide by the summed denominators (the
    denominator never depends on the parameters).
    """
    check_batch(batch)
    checks.same_shape(
      ["logp_PGT", "Batch.mask_PGT", "entropy_PGT"],
      logp_PGT,
      batch.mask_PGT,
      entropy_PGT,
    )
    logp_PGT = jnp.asarray(logp_PGT)
    terms = _initial_terms(logp_PGT, batch, entropy_PGT, key)
    terms = self.transform.apply(terms, batch, state)
    weight = terms.policy_weight_PGT
    if batch.policy_weights_PGT is not None:
      weight = weight * stats.f32(batch.policy_weights_PGT)
    mask = batch.loss_mask()
    per_token = terms.policy_loss_PGT * weight + terms.penalty_PGT
    loss = self.aggregate(per_token, mask)
    metrics = {**_standard_metrics(logp_PGT, batch, mask, weight, entropy_PGT)}
    metrics.update(terms.metrics)
    metrics["loss"] = loss
    return loss, metrics


def _initial_terms(logp_PGT, batch, entropy_PGT, key) -> LossTerms:
  zeros = jnp.zeros(batch.shape, jnp.float32)
  return LossTerms(
    logp_PGT=logp_PGT,
    entropy_PGT=entropy_PGT,
    key=key,
    policy_loss_PGT=zeros,
    policy_weight_PGT=jnp.ones_like(zeros),
    penalty_PGT=zeros,
    metrics={},
  )


def old_logp(logp_PGT: Array, batch: Batch) -> Array:
  """Behaviour log-probs; on-policy (no `old_logp_PGT`) they are sg[logp]."""
  if batch.old_logp_PGT is None:
    return jax.lax.stop_gradient(stats.f32(logp_PGT))
  return stats.f32(batch.old_logp_PGT)


def _standard_metrics(logp, batch, mask, weight, entropy) -> dict[str, Mean]:
  logp = jax.lax.stop_gradient(stats.f32(logp))
  log_ratio = logp - old_logp(logp, batch)
  metrics = {
    "ratio_mean": mean_metric(jnp.exp(log_ratio), mask),
    # verl's `ppo_kl`: the k1 estimate of KL(old || current).
    "kl_old": mean_metric(-log_ratio, mask),
    "masked_frac": mean_metric(weight == 0, mask),
  }
  if batch.advantages_PGT is not None:
    metrics["adv_mean"] = mean_metric(batch.advantages_PGT, mask)
  if entropy is not None:
    metrics["entropy"] = mean_metric(jax.lax.stop_gradient(entropy), mask)
  return metrics
