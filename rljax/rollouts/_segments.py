"""Segment rollouts: SPO-chain's Monte Carlo values at cutpoints.

Segment Policy Optimization (SPO, Guo et al., 2025, arXiv 2505.23564;
official code AIFrameResearch/SPO) samples each prompt's responses, cuts
each response at its low-probability tokens and values the state before
each cut by the mean reward of N continuations sampled from it; the
continuations only estimate values and are not trained on.
`rljax.transforms.spo_chain_advantages` turns the values into segment
advantages. SPO-tree, the long chain-of-thought instance, is
`rljax.rollouts.SegmentTree`.
"""

from collections.abc import Sequence
import dataclasses
from typing import Optional

import jax
import numpy as np

from rljax import sampling
from rljax.rollouts._base import Drawn
from rljax.rollouts._base import GroupStrategy
from rljax.rollouts._base import Scorer
from rljax.sampling import Rollout

# score(rollout [R, N, T], rows [R] group index of each row) -> rewards [R, N]


def segment_cutpoints(
  logp_PGT,
  mask_PGT,
  *,
  rho: float = 0.9,
  interval: int = 1,
  cut_at_prompt: bool = False,
) -> np.ndarray:
  """SPO-chain's cutpoint rule (arXiv 2505.23564): where segments start.

  Token t is low-probability when pi(y_t) = exp(logp_t) < rho; counting
  them 0, 1, 2, ... along the response, every `interval`-th one (0,
  interval, 2 interval, ...) starts a segment, i.e. the state (prompt,
  y_<t) before it is a cutpoint whose value is estimated. The official code
  (`_create_value_estimation_requests`) takes ``np.where(p < 0.9)[0] - 1``
  (the state before each such token, -1 for the prompt) and keeps every
  `cutpoint_interval`-th, 5 in its released runs. ``cut_at_prompt`` also
  cuts at token 0 (the prompt state s_0, valued even when the first token
  is above rho; the probability mask leaves its segment out of the loss,
  so this only costs samples).

  Args:
    logp_PGT: [..., T] log-probs of the sampled tokens (at the sampling
      temperature).
    mask_PGT: [..., T] 1 on the response's tokens.
    rho: the probability threshold, in (0, 1].
    interval: low-probability tokens per segment, >= 1.
    cut_at_prompt: also start a segment at token 0.

  Returns:
    bool [..., T]: True where a segment starts.
  """
  _check_rule(rho, interval)
  logp, mask = np.asarray(logp_PGT, np.float64), np.asarray(mask_PGT) > 0
  if logp.shape != mask.shape:
    raise ValueError(
      f"logp_PGT has shape {logp.shape} and mask_PGT {mask.shape}; give one"
      " log-prob per completion token."
    )
  low = (np.exp(logp) < rho) & mask
  rank = np.cumsum(low, axis=-1) - 1  # the index of each low token
  cuts = low & (rank % int(interval) == 0)
  if cut_at_prompt:
    cuts[..., :1] |= mask[..., :1]
  return cuts


def _check_rule(rho: float, interval: int) -> None:
  if not 0 < rho <= 1:
    raise ValueError(f"rho={rho}; the probability threshold is in (0, 1].")
  if isinstance(interval, bool) or int(interval) != interval or interval < 1:
    raise ValueError(f"interval={interval!r}; it must be an int >= 1.")


def sample_continuations(
  engine: sampling.Engine,
  model,
  requests: Sequence[tuple[Sequence[int], Sequence[int]]],
  *,
  key: jax.Array,
  num_samples: int,
  max_new_tokens: int,
  width: int,
  temperature: float,
  shards: Optional[Sequence[int]] = None,
) -> Rollout:
  """`num_samples` continuations of each (prompt, prefix) request.

  Request r is queued as the prompt ``prompt + prefix`` (``engine.add``
  with ``num_samples``, so its samples share the prefix's cache) and draws
  with key ``fold_in(key, r)``: its samples are those of sampling that
  sequence as a prompt. The [R, num_samples, width] rollout holds each
  whole completion, the prefix (log-probs 0) then the continuation, within
  a budget of `max_new_tokens` completion tokens, the prefix counted.
  """
  out = sampling.RolloutBuilder(len(requests), num_samples, width)
  queued = []
  for r, (prompt, prefix) in enumerate(requests):
    prefix = [int(t) for t in prefix]
    budget = max_new_tokens - len(prefix)
    if budget < 1:
      raise ValueError(
        f"request {r} has a prefix of {len(prefix)} tokens, which leaves no"
        f" budget within max_new_tokens={max_new_tokens}."
      )
    seqs = engine.add(
      [int(t) for t in prompt] + prefix,
      key=jax.random.fold_in(key, r),
      max_new_tokens=budget,
      num_samples=num_samples,
      temperature=temperature,
      shard=None if shards is None else int(shards[r]),
    )
    queued.append((r, prefix, seqs))
  engine.run(model)
  for r, prefix, seqs in queued:
    for n, seq in enumerate(seqs):
      out.put_tokens(r, n, prefix)
      out.put_after(r, n, seq, len(prefix))
  tokens, mask = _left_padded([p for p, _ in requests])
  rows = np.repeat(np.arange(len(requests)), num_samples)
  shape = (len(requests), num_samples, -1)
  return out.rollout(tokens[rows].reshape(shape), mask[rows].reshape(shape))


def _left_padded(prompts) -> tuple[np.ndarray, np.ndarray]:
  width = max((len(p) for p in prompts), default=0)
  tokens = np.zeros((len(prompts), width), np.int32)
  mask = np.zeros((len(prompts), width), np.int32)
  for i, prompt in enumerate(prompts):
    if len(prompt):
      tokens[i, width - len(prompt) :] = prompt
      mask[i, width - len(prompt) :] = 1
  return tokens, mask


def _sample_responses(
  engine, model, prompts, counts, shard, *, key, **kwargs
) -> sampling.RolloutBuilder:
  """The groups' responses: ``counts[i]`` samples of prompt i with key
  ``fold_in(key, i)``."""
  g = int(counts.max()) if len(counts) else 0
  out = sampling.RolloutBuilder(len(prompts), g, kwargs.pop("width"))
  queued = []
  for i, prompt in enumerate(prompts):
    if counts[i] < 1:
      continue
    seqs = engine.add(
      list(prompt),
      key=jax.random.fold_in(key, i),
      num_samples=int(counts[i]),
      shard=shard[i],
      **kwargs,
    )
    queued += [(i, j, s) for j, s in enumerate(seqs)]
  engine.run(model)
  for i, j, seq in queued:
    out.put(i, j, seq)
  return out


@dataclasses.dataclass(frozen=True)
class SegmentRollouts(GroupStrategy):
  """SPO-chain's sampler (catalog row 2.44, arXiv 2505.23564).

  `draw` samples each group's responses, cuts each at its low-probability
  tokens (`segment_cutpoints` on the sampler's log-probs under the full
  distribution at the sampling temperature), samples `num_continuations`
  continuations from every distinct cut prefix (`sample_continuations`:
  the prompt plus the prefix re-added as a prompt; a prefix shared by
  several responses of a group, such as the empty one, is valued once, as
  the official code deduplicates its queries) and scores them with the
  task's rewards. V(s) is their mean reward. The responses are the
  group's samples; the continuations are not trained on. ``Batch.extra``
  gets ``spo_cuts_PGT`` (1 where a segment starts), ``spo_values_PGT``
  (V there) and ``spo_low_prob_PGT`` (1 where pi(y_t) < rho) for
  `rljax.transforms.spo_chain_advantages` (preset ``spo_segment``).

  The trainer passes `draw` the task's scorer (``score=``), which values
  the continuations with the task's rewards.

  Args:
    rho: the cutpoint probability threshold (0.9 in the official code).
    interval: low-probability tokens per segment (the code's
      `cutpoint_interval`; 5 in the released SPO-chain runs).
    num_continuations: N, the Monte Carlo samples per cut (9 in the
      released GSM8K runs, 4 in the Qwen configs).
    cut_at_prompt: also value the prompt state of every response
      (`segment_cutpoints`).
  """

  rho: float = 0.9
  interval: int = 5
  num_continuations: int = 9
  cut_at_prompt: bool = False

  def __post_init__(self):
    _check_rule(self.rho, self.interval)
    n = self.num_continuations
    if isinstance(n, bool) or int(n) != n or n < 1:
      raise ValueError(f"num_continuations={n!r}; it must be an int >= 1.")

  def draw(
    self,
    engine,
    model,
    prompts,
    counts,
    *,
    key,
    max_new_tokens,
    width,
    temperature,
    groups=(),
    step=0,
    state=None,
    batch=None,
    score: Optional[Scorer] = None,
  ) -> Drawn:
    del step, state, batch
    counts = np.asarray(counts, np.int64)
    if max_new_tokens > width:
      raise ValueError(
        f"max_new_tokens={max_new_tokens} exceeds the rollout width {width}."
      )
    if score is None:
      raise ValueError(
        "SegmentRollouts.draw values its cuts with the task's rewards: pass"
        " score= (the trainer passes the task's scorer)."
      )
    p = len(prompts)
    shard = [i * engine.shards // max(p, 1) for i in range(p)]
    budget = dict(
      max_new_tokens=max_new_tokens, width=width, temperature=temperature
    )
    main = _sample_responses(
      engine,
      model,
      prompts,
      counts,
      shard,
      key=jax.random.fold_in(key, 0),
      **budget,
    )
    cuts = segment_cutpoints(
      main.full_logp,
      main.mask,
      rho=self.rho,
      interval=self.interval,
      cut_at_prompt=self.cut_at_prompt,
    )
    values = self._values(
      engine, model, prompts, main.tokens, cuts, score, shard, key, budget
    )
    low = np.exp(np.asarray(main.full_logp, np.float64)) < self.rho
    extra = {
      "spo_cuts_PGT": cuts.astype(np.int32),
      "spo_values_PGT": values,
      "spo_low_prob_PGT": (low & (main.mask > 0)).astype(np.int32),
    }
    tokens, mask = _left_padded(prompts)
    shape = main.shape[:2] + tokens.shape[1:]
    return Drawn(
      main.rollout(
        np.broadcast_to(tokens[:, None], shape),
        np.broadcast_to(mask[:, None], shape),
      ),
      extra,
    )

  def _values(
    self,
    engine,
    model,
    prompts,
    tokens_PGT,
    cuts_PGT,
    score,
    shard,
    key,
    budget,
  ) -> np.ndarray:
    """[P, G, T] float32 V(prompt, y_<t) at the cuts, 0 elsewhere."""
    index: dict[tuple, int] = {}  # (group, prefix) -> request row
    where = []
    for i, j, t in zip(*np.nonzero(cuts_PGT)):
      prefix = tuple(int(x) for x in tokens_PGT[i, j, :t])
      where.append((i, j, t, index.setdefault((int(i), prefix), len(index))))
    values = np.zeros(np.shape(tokens_PGT), np.float32)
    if not index:
      return values
    requests = sorted(index, key=index.get)
    rollout = sample_continuations(
      engine,
      model,
      [(prompts[i], prefix) for i, prefix in requests],
      key=jax.random.fold_in(key, 1),
      num_samples=self.num_continuations,
      shards=[shard[i] for i, _ in requests],
      **budget,
    )
    rewards = np.asarray(score(rollout, [i for i, _ in requests]), np.float32)
    want = (len(requests), self.num_continuations)
    if rewards.shape != want:
      raise ValueError(
        f"the continuation scorer returned shape {rewards.shape}; it must"
        f" return one reward per continuation, {want}."
      )
    for i, j, t, r in where:
      values[i, j, t] = rewards[r].mean()
    return values
