"""Partial rollouts: long samples are paused and continued in later steps.

Kimi k1.5 (catalog row 2.95, arXiv 2501.12599, section 2.6.2) and C3PO++
(row 2.55, Ring-1T, arXiv 2510.18855) keep more groups in flight than a
step trains. Each step decodes every unfinished sample of every group in
flight, `segment` tokens at a time, and stops as soon as enough groups are
complete to fill the batch (C3PO++'s dynamic cutoff under a token budget);
the oldest complete groups are trained, the unfinished ones are paused
and continue in the next step under the updated policy. A long sample is
thereby drawn by several policy versions, and no step waits for the
longest sample of its batch.

The tokens a sample drew in earlier steps keep their sampler log-probs
(``rollout_logp_PGT``: the older policy's), so rollout-correction
transforms (`rljax.transforms.icepop`, as C3PO++ pairs it, or truncated
importance weights) see the policy lag as train/rollout mismatch.
``Batch.extra["lag_PG"]`` ([P, G, T] int32) holds each token's lag: how
many steps before this one its policy sampled it.

Continuing re-prefills the prompt and the tokens so far under the new
policy (the old cache belongs to the old weights), as an inference
server does after a weight update.
"""

import dataclasses
import math
from typing import Optional

import jax
import numpy as np

from rljax import sampling
from rljax._src import checks
from rljax.rollouts._base import Drawn
from rljax.rollouts._base import Group
from rljax.rollouts._base import GroupStrategy
from rljax.rollouts._base import State

_ENDED = ("stop_id", "stop_rule")
_FIELDS = ("tokens", "logp", "full_logp", "drawn_at")


@dataclasses.dataclass(frozen=True)
class PartialRollouts(GroupStrategy):
  """Groups in flight across steps; a step trains the oldest complete ones.

  Each step admits new prompts until ``ceil(in_flight * batch)`` groups
  are in flight (the prompt sampler picks them; `new_prompts`), then
  decodes `segment` tokens per unfinished sample at a time until at least
  `batch` groups have every sample complete (a stop id, a stop string, or
  the step's ``max_new_tokens`` tokens in all). It trains the `batch`
  oldest complete groups; the rest stay in the state (checkpointed) for
  the next steps. ``in_flight=1`` decodes every group to its end: plain
  sampling.

  Args:
    segment: tokens decoded per sample between checks for complete
      groups; C3PO++'s per-iteration token budget is ``segment`` times the
      number of checks a step needs.
    in_flight: groups kept in flight, as a multiple of the batch (>= 1).
    max_lag: restart a group whose oldest token was drawn more than this
      many steps ago (its samples are discarded and drawn again); None:
      never. Our option: neither paper specifies one.
    train_unfinished: T-PPO (catalog row 1.8, arXiv 2506.15050): every
      step decodes one window of `segment` tokens and trains the `batch`
      oldest groups whether or not their samples ended;
      ``Batch.extra["unfinished_PG"]`` marks the samples still running
      (for `rljax.transforms.egae_advantages`, which trains each token in
      the window that drew it, ``lag_PG`` 0). A trained group stays in
      flight until all its samples end.
  """

  segment: int = 64
  in_flight: float = 2.0
  max_lag: Optional[int] = None
  train_unfinished: bool = False
  task: object = dataclasses.field(default=None, repr=False, compare=False)

  def __post_init__(self):
    checks.positive(segment=self.segment)
    if not self.in_flight >= 1:
      raise ValueError(
        f"in_flight={self.in_flight}; it must be >= 1 (a multiple of the"
        " batch kept in flight)."
      )
    if self.max_lag is not None and int(self.max_lag) < 1:
      raise ValueError(f"max_lag={self.max_lag}; give >= 1 or None.")

  def prepare(self, task) -> "PartialRollouts":
    return dataclasses.replace(self, task=task)

  def init(self) -> State:
    return {"next_uid": 0}

  def new_prompts(self, batch: int, state: State) -> int:
    held = len(state.get("ids", ()))
    return max(0, math.ceil(self.in_flight * batch) - held)

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
    score=None,
  ):
    del score
    if self.task is None:
      raise ValueError(
        "PartialRollouts needs its task: call prepare(task) (the trainer does)."
      )
    batch = len(prompts) if batch is None else int(batch)
    flight = _Flight(state or self.init(), width)
    if self.max_lag is not None:
      flight.restart_older_than(step - int(self.max_lag))
    for prompt, n, g in zip(prompts, counts, groups):
      flight.admit(g.prompt_id, prompt, int(n))
    if self.train_unfinished:
      if len(flight.ids) < batch:
        raise ValueError(
          f"PartialRollouts: {len(flight.ids)} groups in flight for a batch"
          f" of {batch}; in_flight={self.in_flight} must be >= 1."
        )
      flight.decode(
        engine,
        model,
        key=key,
        segment=self.segment,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        step=step,
      )
      taken = np.arange(batch)  # the oldest, ended or not
      rollout, lag = flight.rollout(taken, step)
      unfinished = ~flight.done[taken]
      extra = {"lag_PG": lag, "unfinished_PG": unfinished}
      out_groups = self._groups(flight, taken)
      flight.drop(taken[~unfinished.any(axis=1)])
      return Drawn(rollout, extra, out_groups, flight.save())
    rounds = 0
    while flight.complete().size < batch:
      if not flight.decode(
        engine,
        model,
        key=jax.random.fold_in(key, rounds),
        segment=self.segment,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        step=step,
      ):
        raise ValueError(
          f"PartialRollouts: {flight.complete().size} groups can complete"
          f" but the batch needs {batch}; in_flight={self.in_flight} keeps"
          " too few groups (>= 1 batch)."
        )
      rounds += 1
    taken = flight.complete()[:batch]  # the oldest complete groups
    rollout, lag = flight.rollout(taken, step)
    out_groups = self._groups(flight, taken)
    flight.drop(taken)
    return Drawn(rollout, {"lag_PG": lag}, out_groups, flight.save())

  def _groups(self, flight, taken) -> list[Group]:
    out = []
    for a in taken:
      example = self.task.train[int(flight.ids[a])]
      out.append(
        Group(
          example,
          self.task.format_prompt(example),
          int(flight.ids[a]),
          int(flight.counts[a]),
        )
      )
    return out


class _Flight:
  """The groups in flight as arrays: [N] per group, [N, G] per sample,
  [N, G, W] per token; ``drawn_at`` is the step that drew each token."""

  def __init__(self, state: State, width: int):
    self.next_uid = int(state.get("next_uid", 0))
    self.width = width
    self.ids = np.asarray(state.get("ids", np.zeros(0)), np.int64)
    self.uids = np.asarray(state.get("uids", np.zeros(0)), np.int64)
    self.counts = np.asarray(state.get("counts", np.zeros(0)), np.int32)
    self.prompts = [list(map(int, p)) for p in state.get("prompts", [])]
    self.length = np.asarray(state.get("length", np.zeros((0, 0))), np.int32)
    self.done = np.asarray(state.get("done", np.zeros((0, 0))), bool)
    self.truncated = np.asarray(state.get("truncated", self.done), bool)
    g = self.length.shape[1] if self.length.ndim == 2 else 0
    self.arrays = {
      f: np.asarray(
        state.get(f, np.zeros((0, g, width))),
        np.float32 if "logp" in f else np.int32,
      )
      for f in _FIELDS
    }

  def save(self) -> State:
    return {
      "next_uid": self.next_uid,
      "ids": self.ids,
      "uids": self.uids,
      "counts": self.counts,
      "prompts": [list(p) for p in self.prompts],
      "length": self.length,
      "done": self.done,
      "truncated": self.truncated,
      **self.arrays,
    }

  def _grow(self, g: int) -> None:
    """Room for groups of `g` samples."""
    have = self.length.shape[1] if self.length.ndim == 2 else 0
    if g <= have and self.length.ndim == 2:
      return
    pad = g - have
    n = len(self.ids)
    self.length = np.concatenate(
      [self.length.reshape(n, have), np.zeros((n, pad), np.int32)], 1
    )
    self.done = np.concatenate(
      [self.done.reshape(n, have), np.ones((n, pad), bool)], 1
    )
    self.truncated = np.concatenate(
      [self.truncated.reshape(n, have), np.zeros((n, pad), bool)], 1
    )
    for f, a in self.arrays.items():
      a = a.reshape(n, have, self.width)
      self.arrays[f] = np.concatenate(
        [a, np.zeros((n, pad, self.width), a.dtype)], 1
      )

  def admit(self, prompt_id: int, prompt, n: int) -> None:
    self._grow(n)
    g = self.length.shape[1]
    self.ids = np.append(self.ids, prompt_id)
    self.uids = np.append(self.uids, self.next_uid)
    self.next_uid += 1
    self.counts = np.append(self.counts, n).astype(np.int32)
    self.prompts.append([int(t) for t in prompt])
    self.length = np.concatenate([self.length, np.zeros((1, g), np.int32)])
    self.done = np.concatenate([self.done, (np.arange(g) >= n)[None]])
    self.truncated = np.concatenate([self.truncated, np.zeros((1, g), bool)])
    for f, a in self.arrays.items():
      self.arrays[f] = np.concatenate(
        [a, np.zeros((1, g, self.width), a.dtype)]
      )

  def restart_older_than(self, oldest: int) -> None:
    """Clear the samples of groups holding a token drawn before step
    `oldest`."""
    drawn = self.arrays["drawn_at"]
    for a in range(len(self.ids)):
      held = np.arange(self.width)[None] < self.length[a][:, None]
      if np.any(held & (drawn[a] < oldest)):
        self.length[a] = 0
        self.done[a] = np.arange(self.done.shape[1]) >= self.counts[a]
        self.truncated[a] = False
        for arr in self.arrays.values():
          arr[a] = 0

  def complete(self) -> np.ndarray:
    """The complete groups, oldest first."""
    return np.flatnonzero(np.all(self.done, axis=1))

  def decode(
    self, engine, model, *, key, segment, max_new_tokens, temperature, step
  ) -> bool:
    """One segment of every unfinished sample; False if none was left."""
    requests = []
    n = len(self.ids)
    for a in range(n):
      key_a = jax.random.fold_in(key, int(self.uids[a]))
      open_ = np.flatnonzero(~self.done[a])
      fresh = [j for j in open_ if self.length[a, j] == 0]
      started = [j for j in open_ if self.length[a, j] > 0]
      shard = a * engine.shards // max(n, 1)
      if fresh:  # samples not begun share the prompt's cache
        budget = min(segment, max_new_tokens)
        seqs = engine.add(
          self.prompts[a],
          key=jax.random.fold_in(key_a, 0),
          max_new_tokens=budget,
          num_samples=len(fresh),
          temperature=temperature,
          shard=shard,
        )
        requests += [(a, j, s) for j, s in zip(fresh, seqs)]
      for j in started:
        k = int(self.length[a, j])
        budget = min(segment, max_new_tokens - k)
        tokens = self.arrays["tokens"][a, j, :k].tolist()
        (seq,) = engine.add(
          self.prompts[a] + tokens,
          key=jax.random.fold_in(key_a, 1 + int(j)),
          max_new_tokens=budget,
          temperature=temperature,
          shard=shard,
        )
        requests.append((a, j, seq))
    if not requests:
      return False
    engine.run(model)
    engine.close()
    for a, j, seq in requests:
      k = int(self.length[a, j])
      new = seq.completion[: self.width - k]
      sl = slice(k, k + len(new))
      self.arrays["tokens"][a, j, sl] = new
      self.arrays["logp"][a, j, sl] = seq.logp[: len(new)]
      self.arrays["full_logp"][a, j, sl] = seq.full_logp[: len(new)]
      self.arrays["drawn_at"][a, j, sl] = step
      self.length[a, j] = k + len(new)
      ended = sampling.REASONS[seq.stop_reason] in _ENDED
      full = self.length[a, j] >= max_new_tokens
      self.done[a, j] = ended or full
      self.truncated[a, j] = full and not ended
    return True

  def rollout(self, taken: np.ndarray, step: int):
    """The [P, G] rollout of groups `taken` and each token's lag."""
    p, g = len(taken), self.length.shape[1]
    out = sampling.RolloutBuilder(p, g, self.width)
    lag = np.full((p, g, self.width), -1, np.int32)
    for i, a in enumerate(taken):
      for j in range(int(self.counts[a])):
        k = int(self.length[a, j])
        out.put_tokens(
          i,
          j,
          self.arrays["tokens"][a, j, :k],
          self.arrays["logp"][a, j, :k],
          self.arrays["full_logp"][a, j, :k],
          truncated=bool(self.truncated[a, j]),
        )
        lag[i, j, :k] = step - self.arrays["drawn_at"][a, j, :k]
    s = max((len(self.prompts[a]) for a in taken), default=1)
    tokens = np.zeros((p, g, s), np.int32)
    mask = np.zeros((p, g, s), np.int32)
    for i, a in enumerate(taken):  # left-padded
      n = len(self.prompts[a])
      tokens[i, :, s - n :] = self.prompts[a]
      mask[i, :, s - n :] = 1
    return out.rollout(tokens, mask), lag

  def drop(self, taken: np.ndarray) -> None:
    keep = np.setdiff1d(np.arange(len(self.ids)), taken)
    self.ids, self.uids = self.ids[keep], self.uids[keep]
    self.counts = self.counts[keep]
    self.prompts = [self.prompts[a] for a in keep]
    self.length, self.done = self.length[keep], self.done[keep]
    self.truncated = self.truncated[keep]
    self.arrays = {f: a[keep] for f, a in self.arrays.items()}
