"""Multi-turn episodes on the rollout engine: `run_episodes`, `Episodes`."""

from collections.abc import Callable, Mapping, Sequence
import concurrent.futures as futures
import dataclasses
import logging
import time
import traceback
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from rljax import sampling
from rljax.envs._base import Action
from rljax.envs._base import Environment
from rljax.envs._base import Start
from rljax.envs._base import Step
from rljax.envs._render import Renderer

_logger = logging.getLogger("rljax.envs")
_warned: set[str] = set()


@dataclasses.dataclass(eq=False)
class _Episode:
  p: int
  g: int
  env: Environment
  start: Start
  seq: Any = None  # the engine sequence
  actions: list = dataclasses.field(default_factory=list)  # (start, end)
  rewards: list = dataclasses.field(default_factory=list)
  states: list = dataclasses.field(default_factory=list)
  tool_calls: list = dataclasses.field(default_factory=list)
  tool_errors: list = dataclasses.field(default_factory=list)
  future: Any = None
  deadline: float = 0.0
  result: Optional[tuple] = None  # a finished step not yet applied
  begin: int = 0  # completion index of the current action's first token
  nodes: list = dataclasses.field(default_factory=list)  # tree node ids
  probing: int = 0  # tokens of the current action left after its probe
  last_step: Optional[Step] = None  # the observation before a probe
  first_entropy: Optional[float] = None
  done: bool = False
  truncated: bool = False
  error: str = ""  # why the environment ended the episode abnormally

  def record(self, reward: float, tool_calls: int, tool_errors: int) -> None:
    """A step's reward and tool counts."""
    self.rewards.append(reward)
    self.tool_calls.append(tool_calls)
    self.tool_errors.append(tool_errors)

  def copy(self, g: int) -> "_Episode":
    """A branch: sample `g` with a fork of the environment and copies of
    the lists so far."""
    return dataclasses.replace(
      self,
      g=g,
      env=self.env.fork(),
      actions=list(self.actions),
      rewards=list(self.rewards),
      states=list(self.states),
      tool_calls=list(self.tool_calls),
      tool_errors=list(self.tool_errors),
      nodes=list(self.nodes),
    )


class Episodes(NamedTuple):
  """The episodes of a [P, G] batch.

  Attributes:
    rollout: the [P, G, T] `rljax.sampling.Rollout`: each completion is the
      whole episode after the prompt (actions and observations);
      ``truncated_PG`` marks episodes cut by the context budget.
    extra: the side arrays of the agent data layout (`rljax.envs`):
      ``loss_mask_PGT``, ``turn_ids_PGT``, ``turns_PG``,
      ``turn_rewards_PG`` [P, G, N], ``state_ids_PG`` [P, G, N],
      ``tool_calls_PG`` [P, G, N], ``tool_errors_PG`` [P, G, N],
      ``episode_return_PG``, ``node_ids_PG`` [P, G, N].
    stats: counts over the batch: episodes, turns, tool calls and errors,
      environment errors and time-outs, truncated episodes, and the seconds
      spent decoding vs waiting for environment steps.
  """

  rollout: sampling.Rollout
  extra: dict
  stats: dict


class BranchPoint(NamedTuple):
  """Where a branching rule (``run_episodes(branch=...)``) may fork an
  episode.

  With ``branch.probe_tokens == 0`` the point is an observation: the
  environment has answered action `turn` and the branches would each
  continue after the observation. With ``probe_tokens = k > 0`` the point
  is k tokens into the next action (`turn` + 1), and `entropy` is theirs;
  the branches share those k tokens.

  Attributes:
    group: the example's index p.
    turn: the index of the action just answered (observation points) or
      of the action being probed.
    action: that action.
    step: the environment's answer to the action just answered (the
      observation's `Step`; at probe points, the one before the probed
      action).
    entropy: the mean surprise (-log p under the full distribution) of the
      probed tokens, or of the answered action at observation points: an
      unbiased estimate of the policy's mean token entropy there.
    first_entropy: the same over the first tokens (at most k) of the
      episode's first action (ARPO's initial entropy).
    tool_calls: tool calls of the answered action (at probe points, of
      the action before the probed one).
    leaves: the episodes the group has now.
    budget: the most episodes the group may have (G).
  """

  group: int
  turn: int
  action: Action
  step: Optional[Step]
  entropy: float
  first_entropy: float
  tool_calls: int
  leaves: int
  budget: int


def run_episodes(
  engine: sampling.Engine,
  model,
  renderer: Renderer,
  make_env: Callable[[], Environment],
  examples: Sequence[Mapping[str, Any]],
  counts: Sequence[int],
  *,
  key: jax.Array,
  width: int,
  turn_tokens: int,
  max_turns: int,
  budget: Optional[int] = None,
  temperature: float = 1.0,
  group_size: Optional[int] = None,
  overlap: bool = True,
  workers: int = 8,
  step_timeout: Optional[float] = None,
  branch: Optional[Callable[[BranchPoint], int]] = None,
) -> Episodes:
  """Run ``counts[p]`` episodes of each task example with the engine.

  Every episode gets a fresh environment (`make_env`), starts from
  `Environment.reset`, and alternates a policy turn (at most `turn_tokens`
  tokens, ended by a stop token, a stop string of the environment, or the
  budget) with `Environment.step`, until the environment says done, the
  episode has `max_turns` actions, or its completion would exceed
  `budget` tokens (default `width`, the rollout's width; then it ends
  truncated, before the observation that does not fit). An episode's
  sequence stays in the engine between turns (its cache is reused; the
  observation's tokens are prefilled), and its
  token s is drawn with ``fold_in(sequence key, s)``, so an episode samples
  exactly what decoding its turns one by one would. Episode g of example p
  draws with ``fold_in(fold_in(key, p), k)``'s j-th child, k counting the
  example's distinct first prompts (equal prompts share their cache).

  With ``overlap=True`` environment steps run in a pool of `workers`
  threads while the engine decodes other episodes (a step's result is
  applied at the next segment boundary); otherwise each segment's steps run
  one after another before decoding goes on. In a multi-process run every
  process runs every episode's steps, and all steps started in a segment
  finish before the next, so the processes schedule alike (keep
  environments deterministic; a `step_timeout` is wall-clock time measured
  on each process, so on several hosts prefer the tools' own limits). A
  step that raises, or takes longer than `step_timeout` seconds (a late
  result is dropped; a step still running at its deadline is left to
  finish in its thread), ends its episode with no further reward; both are
  counted in ``stats``.

  Trees of episodes (ARPO, AEPO, PORTool): a `branch` rule is called at
  each `BranchPoint` and returns how many extra branches to fork there
  (clipped to what the group's `group_size` leaves). The branches share
  the episode's cache (`Engine.fork`) and continue with copies of its
  environment (`Environment.fork`); each becomes a sample of the group,
  and ``node_ids_PG`` [P, G, N] records the tree: equal ids mark the same
  action shared by several samples. ``branch.probe_tokens`` (default 0)
  says where the points are (see `BranchPoint`).
  """
  counts = [int(c) for c in counts]
  budget = width if budget is None else min(int(budget), width)
  p = len(examples)
  g = int(group_size or max(counts, default=1))
  if width < 1 or turn_tokens < 1 or max_turns < 1:
    raise ValueError(
      f"width ({width}), turn_tokens ({turn_tokens}) and max_turns"
      f" ({max_turns}) must be >= 1."
    )
  run = _Run(
    engine,
    renderer,
    g=g,
    budget=budget,
    turn_tokens=turn_tokens,
    max_turns=max_turns,
    step_timeout=step_timeout,
    branch=branch,
  )
  run.start(make_env, examples, counts, key, temperature)
  run.decode(model, overlap, workers)
  return _collect(run.episodes, p, g, width, max_turns, run.stats)


@dataclasses.dataclass(eq=False)
class _Run:
  """One `run_episodes` call: its episodes, counts and environment-step
  pool, and the steps that the engine's hooks (``on_stop``, ``poll``)
  take between decoding segments."""

  engine: sampling.Engine
  renderer: Renderer
  g: int
  budget: int
  turn_tokens: int
  max_turns: int
  step_timeout: Optional[float]
  branch: Optional[Callable[[BranchPoint], int]]

  def __post_init__(self):
    self.tokenizer = self.renderer.tokenizer
    self.probe = int(getattr(self.branch, "probe_tokens", 0) or 0)
    self.stop_ids = set(self.engine.stop_ids)
    self.stop_strings = ()
    self.episodes: list[_Episode] = []
    self.by_uid: dict[int, _Episode] = {}
    self.size: list[int] = []  # episodes per group so far
    self.node_count = 0
    self.env_seconds = 0.0
    self.pool = None
    # Several processes, or trees (a group's budget goes to the forks that
    # ask first): every step started in a segment is applied before the
    # next one, so the schedule does not depend on timing.
    self.together = jax.process_count() > 1 or self.branch is not None
    self.stats = dict.fromkeys(
      (
        "episodes",
        "turns",
        "tool_calls",
        "tool_errors",
        "env_errors",
        "env_timeouts",
        "truncated",
      ),
      0,
    )

  # --- starting ---------------------------------------------------------------

  def start(self, make_env, examples, counts, key, temperature) -> None:
    """Reset ``counts[p]`` environments per example and queue their
    prompts; episodes with equal prompts share one engine prompt."""
    p = len(examples)
    for i, example in enumerate(examples):
      key_i = jax.random.fold_in(key, i)
      starts = self._reset(make_env, i, example, counts[i])
      for k, (tokens, group) in enumerate(sorted(starts.items())):
        seqs = self.engine.add(
          list(tokens),
          key=jax.random.fold_in(key_i, k),
          max_new_tokens=min(self.turn_tokens, self.budget),
          num_samples=len(group),
          temperature=temperature,
          keep=True,
          shard=i * self.engine.shards // max(p, 1),
        )
        for ep, seq in zip(group, seqs):
          ep.seq = seq
          self.by_uid[seq.uid] = ep
    self.size = [counts[i] for i in range(p)]

  def _reset(self, make_env, i: int, example, count: int) -> dict:
    """`count` fresh episodes of example `i`, by their prompt's tokens."""
    starts: dict[tuple, list[_Episode]] = {}
    for j in range(count):
      env = make_env()
      start = env.reset(example)
      if not isinstance(start, Start):
        raise TypeError(
          f"{type(env).__name__}.reset returned {type(start).__name__};"
          " it must return envs.Start."
        )
      self.stop_strings = tuple(env.stop_strings) or self.stop_strings
      ep = _Episode(i, j, env, start, states=[start.state])
      self.episodes.append(ep)
      tokens = tuple(self.renderer.prompt(start.prompt, start.tools))
      starts.setdefault(tokens, []).append(ep)
    return starts

  def decode(self, model, overlap: bool, workers: int) -> None:
    """Run the engine until every episode has ended; fill in the stats."""
    engine = self.engine
    if overlap:
      self.pool = futures.ThreadPoolExecutor(max(1, workers))
    rule = engine.stop_rule
    if self.stop_strings:
      engine.stop_rule = sampling.stop_at_strings(
        self._decode, self.stop_strings
      )
    t0 = time.perf_counter()
    try:
      engine.run(model, on_stop=self.on_stop, poll=self.poll)
    finally:
      engine.stop_rule = rule
      if self.pool is not None:
        self.pool.shutdown(wait=False, cancel_futures=True)
    self.stats["episodes"] = len(self.episodes)
    self.stats["seconds"] = time.perf_counter() - t0
    self.stats["env_seconds"] = self.env_seconds
    for ep in self.episodes:
      if not ep.done:  # the engine ended it (capacity) between steps
        self.finish(ep, truncated=True)
    self.stats["truncated"] = sum(ep.truncated for ep in self.episodes)

  # --- actions (after a segment) ----------------------------------------------

  def on_stop(self, seqs) -> None:
    """End the actions of the sequences that stopped: start their
    environment steps, or decide at a probe's end whether to branch."""
    for seq in seqs:
      ep = self.by_uid.get(seq.uid)
      if ep is None or ep.done:
        continue
      if ep.first_entropy is None:
        ep.first_entropy = _surprise(seq, ep.begin, self.probe or None)
      if ep.probing and seq.stop_reason == _LENGTH:
        self._after_probe(ep, seq)
        continue
      ep.probing = 0
      self._end_action(ep, seq)

  def _after_probe(self, ep: _Episode, seq) -> None:
    """A probe point: fork the episode as the branch rule says, or let it
    sample the rest of its action."""
    left, ep.probing = ep.probing, 0
    n = self._ask_branch(
      BranchPoint(
        group=ep.p,
        turn=len(ep.actions),
        action=self._action_of(ep, seq),
        step=ep.last_step,
        entropy=_surprise(seq, ep.begin),
        first_entropy=ep.first_entropy,
        tool_calls=int(ep.last_step.tool_calls) if ep.last_step else 0,
        leaves=self.size[ep.p],
        budget=self.g,
      )
    )
    if n:
      self._fork(ep, n, (), left)
    else:
      self.engine.extend(seq, [], max_new_tokens=left)

  def _end_action(self, ep: _Episode, seq) -> None:
    """Record the action and start its environment step (in the pool, or
    now in serial mode), unless the context budget is spent."""
    end = len(seq.completion)
    action = self._action_of(ep, seq)
    ep.actions.append((ep.begin, end))
    self.node_count += 1
    ep.nodes.append(self.node_count)
    self.stats["turns"] += 1
    if end >= self.budget:  # the context budget is spent
      ep.record(0.0, 0, 0)
      self.finish(ep, truncated=True)
      return
    if self.pool is None:
      ep.result = _safe_step(ep.env, action)
      self.env_seconds += ep.result[1]
    else:
      ep.future = self.pool.submit(_safe_step, ep.env, action)
      ep.deadline = time.monotonic() + (self.step_timeout or float("inf"))

  def _action_of(self, ep: _Episode, seq) -> Action:
    turn = seq.completion[ep.begin :]
    stopped = self._stopped(turn)
    return Action(
      text=self._decode(turn[:-1] if stopped else turn),
      tokens=tuple(turn),
      turn=len(ep.actions),
      truncated=seq.stop_reason not in (_STOP_ID, _STOP_RULE),
    )

  # --- environment steps (before a segment) -----------------------------------

  def poll(self, block: bool) -> bool:
    """Apply the environment steps that have finished (waiting for them
    when `block` or `together`); returns whether any is still running."""
    for ep in self.episodes:  # serial mode: results of the last segment
      if ep.result is not None:
        result, ep.result = ep.result, None
        self._apply(ep, result)
    if self.pool is None:
      return False
    pending = [ep for ep in self.episodes if ep.future is not None]
    if not pending:
      return False
    t0 = time.perf_counter()
    if block or self.together:
      self._wait(pending)
    self.env_seconds += time.perf_counter() - t0
    now = time.monotonic()
    for ep in pending:
      if ep.future.done():
        result, ep.future = ep.future.result(), None
        self._apply(ep, result)
      elif now >= ep.deadline:
        ep.future = None
        self._apply(ep, ("timeout", now - ep.deadline + self.step_timeout))
    return any(ep.future is not None for ep in self.episodes)

  def _wait(self, pending: list[_Episode]) -> None:
    """Wait for the first (or, `together`, every) pending step, at most
    until the earliest deadline."""
    deadline = min(ep.deadline for ep in pending)
    wait = None if deadline == float("inf") else deadline - time.monotonic()
    futures.wait(
      [ep.future for ep in pending],
      timeout=None if wait is None else max(wait, 0.0),
      return_when=futures.ALL_COMPLETED
      if self.together
      else futures.FIRST_COMPLETED,
    )

  def _apply(self, ep: _Episode, timed) -> None:
    """Apply a finished step: end the episode, or queue its next action
    after the observation."""
    result, seconds = timed
    if self.step_timeout is not None and seconds > self.step_timeout:
      result = "timeout"
    if isinstance(result, str):  # the step raised or timed out
      ep.error = result
      self.stats["env_timeouts" if result == "timeout" else "env_errors"] += 1
      ep.record(0.0, 0, 0)
      self.finish(ep)
      return
    ep.record(
      float(result.reward), int(result.tool_calls), int(result.tool_errors)
    )
    self.stats["tool_calls"] += int(result.tool_calls)
    self.stats["tool_errors"] += int(result.tool_errors)
    if result.done or len(ep.actions) >= self.max_turns:
      self.finish(ep)
      return
    last = ep.seq.completion[ep.begin :]
    try:
      obs = self.renderer.observation(
        result.observation, stopped=self._stopped(last)
      )
    except ValueError as e:  # e.g. characters a tokenizer cannot encode
      _warn_once(type(ep.env).__name__ + " observation", e)
      ep.error = f"ValueError: {e}"
      self.stats["env_errors"] += 1
      self.finish(ep)
      return
    self._next_action(ep, result, last, obs)

  def _next_action(self, ep: _Episode, result: Step, last, obs) -> None:
    """Queue the action after observation `obs` (if it fits the budget):
    probe its first tokens, or fork it where the branch rule says."""
    seq = ep.seq
    room = self.budget - len(seq.completion) - len(obs)
    if room < 1 or len(seq.tokens) + len(obs) + 1 >= self.engine.max_length:
      self.finish(ep, truncated=True)
      return
    ep.states.append(result.state)
    ep.begin = len(seq.completion) + len(obs)
    turn = min(self.turn_tokens, room)
    probe = self.probe
    if self.branch is not None and probe and turn > probe:
      ep.probing = turn - probe  # decide k tokens into the next action
      ep.last_step = result
      self.engine.extend(seq, obs, max_new_tokens=probe)
      return
    n = 0
    if self.branch is not None and not probe:
      n = self._ask_branch(
        BranchPoint(
          group=ep.p,
          turn=len(ep.actions) - 1,
          action=Action(
            text=self._decode(last),
            tokens=tuple(last),
            turn=len(ep.actions) - 1,
          ),
          step=result,
          entropy=_surprise(seq, ep.actions[-1][0]),
          first_entropy=ep.first_entropy or 0.0,
          tool_calls=int(result.tool_calls),
          leaves=self.size[ep.p],
          budget=self.g,
        )
      )
    if n:
      self._fork(ep, n, obs, turn)
    else:
      self.engine.extend(seq, obs, max_new_tokens=turn)

  # --- episodes ---------------------------------------------------------------

  def _ask_branch(self, point: BranchPoint) -> int:
    """The branch rule's extra branches at `point`, clipped to what the
    group's size leaves."""
    n = self.branch(point)
    return max(0, min(int(n), self.g - self.size[point.group]))

  def _fork(self, ep: _Episode, n: int, tokens, max_new_tokens: int) -> None:
    """Continue `ep` as n + 1 branches sharing its cache."""
    parent = ep.seq
    kids = self.engine.fork(
      parent,
      n + 1,
      max_new_tokens=max_new_tokens,
      tokens=tokens,
      keep=True,
    )
    self.engine.release(parent)
    for j, kid in enumerate(kids):
      if not tokens:  # a probe's branches: the action began before it
        kid.turn_start = parent.turn_start
      if j == 0:
        twin = ep
      else:
        twin = ep.copy(g=self.size[ep.p])
        self.size[ep.p] += 1
        self.episodes.append(twin)
      twin.seq = kid
      self.by_uid[kid.uid] = twin

  def finish(self, ep: _Episode, *, truncated: bool = False) -> None:
    ep.done = True
    ep.truncated = ep.truncated or truncated
    self.engine.release(ep.seq)
    try:
      ep.env.close()
    except Exception as e:  # noqa: BLE001 - a close failure ends nothing
      _warn_once(type(ep.env).__name__ + ".close", e)

  def _stopped(self, tokens) -> bool:
    """Whether an action's `tokens` end with a stop token."""
    return bool(tokens) and tokens[-1] in self.stop_ids

  def _decode(self, ids) -> str:
    return self.tokenizer.decode(ids, skip_special=False)


def _surprise(seq, begin: int, n: Optional[int] = None) -> float:
  """The mean -log p (full distribution) of the sequence's completion
  tokens from `begin` (the first `n` of them)."""
  logp = seq.full_logp[begin:]
  logp = logp if n is None else logp[:n]
  return float(-np.mean(logp)) if logp else 0.0


_STOP_ID = sampling.REASONS.index("stop_id")
_LENGTH = sampling.REASONS.index("length")
_STOP_RULE = sampling.REASONS.index("stop_rule")


def _safe_step(env: Environment, action: Action) -> tuple:
  """(`env.step(action)` or a one-line error text when it raises, the
  seconds it took)."""
  start = time.perf_counter()
  try:
    out = env.step(action)
  except Exception as e:  # noqa: BLE001 - the episode ends, the run goes on
    _warn_once(type(env).__name__ + ".step", e)
    out = f"{type(e).__name__}: {e}"
  if not isinstance(out, (Step, str)):
    out = (
      f"{type(env).__name__}.step returned {type(out).__name__}; it must"
      " return envs.Step."
    )
  return out, time.perf_counter() - start


def _warn_once(where: str, error: Exception) -> None:
  if where not in _warned:
    _warned.add(where)
    _logger.warning(
      "%s raised; its episode ends (reported once per place):\n%s",
      where,
      "".join(traceback.format_exception(error)),
    )


def _collect(episodes, p, g, width, n, stats) -> Episodes:
  out = sampling.RolloutBuilder(p, g, width)
  loss = np.zeros((p, g, width), np.float32)
  turn_ids = np.full((p, g, width), -1, np.int32)
  turns = np.zeros((p, g), np.int32)
  rewards = np.zeros((p, g, n), np.float32)
  states = np.full((p, g, n), -1, np.int32)
  calls = np.zeros((p, g, n), np.int32)
  errors = np.zeros((p, g, n), np.int32)
  nodes = np.full((p, g, n), -1, np.int32)
  ids: dict[str, int] = {}
  prompts = np.zeros((p, g), object)
  for ep in episodes:
    i, j, seq = ep.p, ep.g, ep.seq
    out.put(i, j, seq)
    out.truncated[i, j] = ep.truncated
    prompts[i, j] = seq.tokens[: seq.prompt_length]
    length = len(seq.completion)
    loss[i, j, :length] = seq.sampled[:length]
    k = len(ep.actions)
    turns[i, j] = k
    for t, (begin, _) in enumerate(ep.actions):
      nxt = ep.actions[t + 1][0] if t + 1 < k else length
      turn_ids[i, j, begin:nxt] = t
    rewards[i, j, :k] = ep.rewards[:k]
    calls[i, j, :k] = ep.tool_calls[:k]
    errors[i, j, :k] = ep.tool_errors[:k]
    nodes[i, j, :k] = ep.nodes[:k]
  # Ids in a canonical order (sample, then turn), whatever the timing.
  for ep in sorted(episodes, key=lambda e: (e.p, e.g)):
    for t, state in enumerate(ep.states[: len(ep.actions)]):
      if state is not None:
        states[ep.p, ep.g, t] = ids.setdefault(str(state), len(ids))
  seen: dict[int, int] = {}
  for idx in zip(*np.nonzero(nodes >= 0)):
    nodes[idx] = seen.setdefault(int(nodes[idx]), len(seen))
  s = max((len(x) for x in prompts.reshape(-1) if x), default=1)
  tokens = np.zeros((p, g, s), np.int32)
  mask = np.zeros((p, g, s), np.int32)
  for i in range(p):
    for j in range(g):
      row = prompts[i, j] or []
      if row:
        tokens[i, j, s - len(row) :] = row
        mask[i, j, s - len(row) :] = 1
  extra = {
    "loss_mask_PGT": loss,
    "turn_ids_PGT": turn_ids,
    "turns_PG": turns,
    "turn_rewards_PG": rewards,
    "state_ids_PG": states,
    "tool_calls_PG": calls,
    "tool_errors_PG": errors,
    "episode_return_PG": rewards.sum(-1),
    "node_ids_PG": nodes,
  }
  return Episodes(out.rollout(tokens, mask), extra, stats)
