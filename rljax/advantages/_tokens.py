"""Token-level mechanisms that read the completion token ids.

Three seed mechanisms whose input is *which token ids were sampled where*:

* GTPO's conflict tokens (`gtpo_token_weights`) and entropy filter
  (`gtpo_entropy_filter`);
* HICRA's planning tokens (`strategic_gram_mask`) and advantage
  amplification (`hicra_amplify`);
* AdaCoT's Selective Loss Masking of the think / no-think decision token
  (`tokens_after_trigger`).

Layout: token arrays are [..., G, T] (the group of samples of one prompt is
axis -2) or [..., T]; ``tokens`` are integer ids, ``mask`` is the token
validity (pass ``Batch.loss_mask()``, so invalid samples and padding are 0).
No token outside the mask ever matches, conflicts or is selected, and every
output is 0 / False there. All functions are pure jnp, jit-compatible with
static hyperparameters (gram and trigger lists are Python tuples), and
detached: they describe token selections, not differentiable quantities.
"""

from collections.abc import Sequence
from typing import Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax._src import checks
from rljax._src import stats

# ---------------------------------------------------------------------------
# Shared helpers.
# ---------------------------------------------------------------------------


def _valid(mask: ArrayLike) -> jax.Array:
  return stats.f32(mask) > 0


def _int_tokens(name: str, tokens: ArrayLike) -> jax.Array:
  tokens = jnp.asarray(tokens)
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(
      f"{name} must hold integer token ids; got dtype {tokens.dtype}. Use"
      " Batch.tokens_PGT (int32 completion token ids, set by the Trainer)."
    )
  return tokens


def _shift_left(x: jax.Array, k: int, fill) -> jax.Array:
  """y[..., t] = x[..., t + k], `fill` past the end (static k >= 0)."""
  if k == 0:
    return x
  t = x.shape[-1]
  pad = jnp.full((*x.shape[:-1], min(k, t)), fill, x.dtype)
  return jnp.concatenate([x[..., k:], pad], axis=-1)[..., :t]


def _shift_right(x: jax.Array, k: int, fill) -> jax.Array:
  """y[..., t] = x[..., t - k], `fill` before the start (static k >= 0)."""
  if k == 0:
    return x
  t = x.shape[-1]
  pad = jnp.full((*x.shape[:-1], min(k, t)), fill, x.dtype)
  return jnp.concatenate([pad, x[..., : max(t - k, 0)]], axis=-1)


def _id_tuple(name: str, ids: Sequence[int]) -> tuple[int, ...]:
  try:
    out = tuple(int(i) for i in ids)
  except TypeError as e:
    raise ValueError(
      f"{name} must be a sequence of integer token ids; got {ids!r}."
    ) from e
  if not out:
    raise ValueError(f"{name} must hold at least one token id; got {ids!r}.")
  return out


# ---------------------------------------------------------------------------
# GTPO (arXiv 2508.03772).
# ---------------------------------------------------------------------------


def _group_conflicts(tokens, valid, pos, neg) -> jax.Array:
  """[..., G, T]: valid token (t, y) of an active sample such that some
  positive and some negative sample of the group have y at t (valid)."""
  tokens_j = jnp.moveaxis(tokens, -2, 0)  # [G, ..., T]
  valid_j = jnp.moveaxis(valid, -2, 0)
  pos_j = jnp.moveaxis(pos, -1, 0)  # [G, ...]
  neg_j = jnp.moveaxis(neg, -1, 0)

  def step(carry, xs):
    has_pos, has_neg = carry
    tok, ok, p, n = xs
    same = (tokens == tok[..., None, :]) & ok[..., None, :]
    has_pos = has_pos | (same & p[..., None, None])
    has_neg = has_neg | (same & n[..., None, None])
    return (has_pos, has_neg), None

  init = (jnp.zeros(tokens.shape, bool), jnp.zeros(tokens.shape, bool))
  (has_pos, has_neg), _ = jax.lax.scan(
    step, init, (tokens_j, valid_j, pos_j, neg_j)
  )
  active = (pos | neg)[..., None]
  return has_pos & has_neg & valid & active


def _prefix_run(x: jax.Array) -> jax.Array:
  """x[..., t] and every earlier entry is True (cumprod from the start)."""
  return jnp.cumprod(x.astype(jnp.int32), axis=-1) > 0


def _suffix_conflicts(tokens, valid, pos, neg) -> jax.Array:
  """Conflicts keyed by the distance from each completion's end, kept only
  in the contiguous run that ends at its last valid token."""
  t = tokens.shape[-1]
  steps = jax.lax.broadcasted_iota(jnp.int32, tokens.shape, tokens.ndim - 1)
  end = jnp.max(jnp.where(valid, steps + 1, 0), axis=-1, keepdims=True)
  # Right-align: aligned[u] = x[u + end - T] for u >= T - end.
  gather = (steps + end) % t
  tok_r = jnp.take_along_axis(tokens, gather, axis=-1)
  valid_r = jnp.take_along_axis(valid, gather, axis=-1) & (steps >= t - end)
  conflict_r = _group_conflicts(tok_r, valid_r, pos, neg)
  run_r = jnp.flip(_prefix_run(jnp.flip(conflict_r, -1)), -1)
  back = (steps - end) % t
  return jnp.take_along_axis(run_r, back, axis=-1) & valid


def gtpo_token_weights(
  tokens_PGT: ArrayLike,
  mask_PGT: ArrayLike,
  adv_PG: ArrayLike,
  *,
  positions: str = "all",
  weight: float = 2.0,
) -> tuple[jax.Array, jax.Array]:
  """GTPO's conflict tokens and the token weights delta_{i,t} they get.

  Positive samples have sequence advantage A_i > 0, negative ones A_i < 0
  (A_i = 0 samples are inactive: never conflict, weight 1). A token (t, y)
  of an active sample i is a *conflict token* when some positive and some
  negative sample of the same group both emit id y at position t (valid
  tokens only). Then

    delta_{i,t} = W  if (t, y) conflicts and A_i > 0,
                  0  if (t, y) conflicts and A_i < 0,
                  1  otherwise,

  so a conflict token is never pushed down and a positive one is pushed up
  W times as hard ("skipping negative updates while amplifying positive
  ones").

  Args:
    tokens_PGT: [..., G, T] integer completion token ids.
    mask_PGT: [..., G, T] validity (``Batch.loss_mask()``).
    adv_PG: [..., G] sequence advantages (only their signs are read).
    positions: which conflicts count.
      ``"all"`` (default): every position, the paper's definition ("tokens
      appearing in the same position across completions with opposite
      rewards", abstract of 2508.03772).
      ``"runs"``: the official code (``build_conflict_mask`` in
      winstonsmith1897/GTPO ``gtpo/gtpo_training.py``): only the contiguous
      run of conflicts from position 0 (forward) and the run ending at each
      completion's last valid token, with positions counted from the end
      (backward, right-aligned by length); the forward and backward weights
      are multiplied, as in the code, so a positive token inside both runs
      gets W^2. A masked token inside a completion breaks a run.
    weight: W >= 0 (the code's ``W_RAW = 2.0``).

  Returns:
    (delta, conflict): float32 [..., G, T] weights (0 outside the mask) and
    bool [..., G, T] conflict tokens (for "runs", the union of both runs).

  Cost: O(G^2 T) comparisons per group, O(G T) memory (a scan over G).
  """
  checks.one_of("positions", positions, ("all", "runs"))
  checks.non_negative(weight=weight)
  tokens = _int_tokens("tokens_PGT", tokens_PGT)
  checks.same_shape(["tokens_PGT", "mask_PGT"], tokens, mask_PGT)
  valid = _valid(mask_PGT)
  adv = stats.f32(adv_PG)
  if adv.shape != tokens.shape[:-1]:
    raise ValueError(
      f"adv_PG has shape {adv.shape}; expected {tokens.shape[:-1]} (the"
      " leading axes of tokens_PGT)."
    )
  pos, neg = adv > 0, adv < 0
  sign = jnp.where(pos, weight, 0.0)[..., None]

  def delta_of(conflict):
    return jnp.where(conflict, sign, 1.0)

  if positions == "all":
    conflict = _group_conflicts(tokens, valid, pos, neg)
    delta = delta_of(conflict)
  else:
    fwd = _prefix_run(_group_conflicts(tokens, valid, pos, neg))
    bwd = _suffix_conflicts(tokens, valid, pos, neg)
    conflict = fwd | bwd
    delta = delta_of(fwd) * delta_of(bwd)
  delta = jnp.where(valid, delta, 0.0)
  return jax.lax.stop_gradient(delta), conflict


def gtpo_entropy_filter(
  adv: ArrayLike,
  entropy: ArrayLike,
  *,
  threshold: Optional[float] = 0.7,
  scale: float = 0.1,
) -> jax.Array:
  """GTPO's entropy filter and shaping of the advantages.

    A'_i = A_i - scale * H_i   if H_i <= threshold,
           0                   otherwise (the completion is filtered out),

  with H_i the completion's mean token entropy. Note that a kept completion
  with A_i = 0 gets -scale * H_i (the official code does this too).

  Args:
    adv: advantages (any shape).
    entropy: the completion's mean entropy, broadcastable to `adv`
      (e.g. [..., G, 1] against [..., G, T]).
    threshold: the cut-off (the code's ``ENT_THRESHOLD = 0.7``, in nats);
      None keeps every completion.
    scale: the shaping coefficient (the code's ``ENT_SCALE = 0.1``).

  Returns:
    float32 shaped advantages with the shape of `adv`.
  """
  checks.non_negative(scale=scale)
  adv, h = stats.f32(adv), jax.lax.stop_gradient(stats.f32(entropy))
  shaped = adv - scale * h
  if threshold is None:
    return shaped
  return jnp.where(h <= threshold, shaped, 0.0)


# ---------------------------------------------------------------------------
# HICRA (arXiv 2509.03646).
# ---------------------------------------------------------------------------


def _gram_tuples(grams) -> tuple[tuple[int, ...], ...]:
  if isinstance(grams, (str, bytes)) or not isinstance(grams, Sequence):
    raise ValueError(
      "grams must be a sequence of token-id tuples, e.g. ((12, 7), (40,));"
      f" got {grams!r}. Tokenize each strategic phrase first."
    )
  return tuple(_id_tuple(f"grams[{i}]", g) for i, g in enumerate(grams))


def strategic_gram_mask(
  tokens_BT: ArrayLike,
  mask_BT: ArrayLike,
  grams: Sequence[Sequence[int]],
) -> jax.Array:
  """Tokens covered by an occurrence of any strategic gram.

  planning_t = 1 iff some gram g = (g_0, ..., g_{n-1}) occurs at a start s
  with s <= t < s + n, i.e. tokens_{s+k} = g_k and mask_{s+k} > 0 for every
  k. An occurrence that runs into padding or a masked token does not count.
  Occurrences may overlap; grams may have different lengths.

  Args:
    tokens_BT: [..., T] integer token ids.
    mask_BT: [..., T] validity.
    grams: static token-id tuples (the tokenized Strategic Grams). Grams of
      one length are scanned together, so long lists compile once per
      length.

  Returns:
    bool [..., T] planning-token mask (False outside the mask).
  """
  tokens = _int_tokens("tokens", tokens_BT)
  checks.same_shape(["tokens", "mask"], tokens, mask_BT)
  valid = _valid(mask_BT)
  covered = jnp.zeros(tokens.shape, bool)
  by_length: dict[int, list[tuple[int, ...]]] = {}
  for g in _gram_tuples(grams):
    by_length.setdefault(len(g), []).append(g)
  for n, same_length in sorted(by_length.items()):
    if n > tokens.shape[-1]:
      continue
    windows = jnp.stack([_shift_left(tokens, k, -1) for k in range(n)])
    window_valid = valid
    for k in range(1, n):
      window_valid = window_valid & _shift_left(valid, k, False)
    table = jnp.asarray(same_length, tokens.dtype)  # [M, n]

    def step(cover, gram, windows=windows, window_valid=window_valid, n=n):
      match = window_valid
      for k in range(n):
        match = match & (windows[k] == gram[k])
      for k in range(n):
        cover = cover | _shift_right(match, k, False)
      return cover, None

    covered, _ = jax.lax.scan(step, covered, table)
  return covered & valid


def hicra_amplify(
  adv_BT: ArrayLike, planning_BT: ArrayLike, *, alpha: float = 0.2
) -> jax.Array:
  """HICRA's advantage: A'_t = A_t + alpha |A_t| 1[t is a planning token].

  On planning tokens a positive advantage becomes (1 + alpha) A and a
  negative one (1 - alpha) A (less blame for a failed plan); other tokens
  are unchanged. `planning_BT` may also be a soft weight in [0, 1]; it is
  detached.

  Args:
    adv_BT: [..., T] advantages.
    planning_BT: [..., T] planning-token mask (bool or 0/1).
    alpha: amplification (>= 0; 0.2 per secondary summaries of the paper).
      alpha > 1 turns negative planning advantages positive.

  Returns:
    float32 [..., T] amplified advantages.
  """
  checks.non_negative(alpha=alpha)
  checks.same_shape(["adv_BT", "planning_BT"], adv_BT, planning_BT)
  adv = stats.f32(adv_BT)
  planning = jax.lax.stop_gradient(stats.f32(planning_BT))
  return adv + alpha * jnp.abs(adv) * planning


# ---------------------------------------------------------------------------
# AdaCoT Selective Loss Masking (arXiv 2505.11896).
# ---------------------------------------------------------------------------


def tokens_after_trigger(
  tokens_BT: ArrayLike,
  mask_BT: ArrayLike,
  trigger_ids: Sequence[int],
  *,
  count: int = 1,
  first_only: bool = True,
  at_start: bool = False,
) -> jax.Array:
  """The `count` positions right after a trigger token.

  A trigger is a valid token whose id is in `trigger_ids` (e.g. the id of
  ``<think>``). Selected are positions s + 1, ..., s + count of the first
  trigger s of each sequence (``first_only``) or of every trigger. With
  ``at_start``, a sequence without any trigger selects positions
  0, ..., count - 1 instead (the prompt template ended in the trigger, so
  the decision is the first completion token). Only valid positions are
  selected; positions are raw indices (a masked token still takes a slot).

  Args:
    tokens_BT: [..., T] integer token ids.
    mask_BT: [..., T] validity.
    trigger_ids: static token ids that open the decision.
    count: number of tokens after each trigger (>= 1).
    first_only: only the first trigger of each sequence.
    at_start: fall back to the first `count` positions when no trigger.

  Returns:
    bool [..., T] selected positions.
  """
  ids = _id_tuple("trigger_ids", trigger_ids)
  if not isinstance(count, int) or isinstance(count, bool) or count < 1:
    raise ValueError(f"count must be an int >= 1; got {count!r}.")
  tokens = _int_tokens("tokens", tokens_BT)
  checks.same_shape(["tokens", "mask"], tokens, mask_BT)
  valid = _valid(mask_BT)
  trig = jnp.zeros(tokens.shape, bool)
  for i in ids:
    trig = trig | (tokens == i)
  trig = trig & valid
  if first_only:
    trig = trig & (jnp.cumsum(trig, axis=-1) == 1)
  selected = jnp.zeros(tokens.shape, bool)
  for k in range(1, count + 1):
    selected = selected | _shift_right(trig, k, False)
  if at_start:
    none = ~jnp.any(trig, axis=-1, keepdims=True)
    steps = jax.lax.broadcasted_iota(jnp.int32, tokens.shape, tokens.ndim - 1)
    selected = selected | (none & (steps < count))
  return selected & valid
