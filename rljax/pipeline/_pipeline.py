"""Rollouts produced beside the update, with bounded staleness.

The trainer consumes one produced rollout a step. In ``"sync"`` mode the
rollout of step n is produced when step n asks for it, with the weights of
n updates. Otherwise a producer thread works ahead while the update runs:

* ``"one_step_off"``: the rollout of step n + 1 is produced while step n
  trains, always with the weights of n updates (those of step n - 1): one
  update stale, deterministically (a run repeats bit for bit).
* ``"async"``: the producer starts the next rollout as soon as the bound
  allows, with the newest weights published; a rollout is at most
  ``max_staleness`` updates old when it trains. Which version a rollout
  gets depends on timing. ``max_staleness=0`` waits for each update, and is
  the synchronous run, bit for bit.

The bound: at most ``max_staleness + 1`` rollouts are outstanding (being
produced, queued, or training); one retires when the update that trained
it publishes its weights, or when it is dropped. Taking the oldest ready
rollout first, no rollout is ever older than the bound; taking the
freshest first (``order="freshest"``), a rollout left behind may age past
it, and is then dropped and counted.

The producer owns whatever state production advances (the prompt
sampler's position, ...): `produce` returns it with the rollout, and the
trainer keeps, for checkpoints, the state of the rollouts it trained.

Several processes (each with a pipeline whose producers sample together)
must start the same rollouts with the same weights: given ``agree``, an
async producer takes the version they agree on, and `hold` then `pause`
stop every producer at the same rollout.
"""

from collections.abc import Callable
import dataclasses
import threading
import time
from typing import Any, NamedTuple, Optional

MODES = ("sync", "one_step_off", "async")
ORDERS = ("oldest", "freshest")


class Snapshot(NamedTuple):
  """Weights to produce with: ``version`` updates applied to the policy;
  ``weights`` any pytree the producer reads (a copy the update cannot
  donate away when a thread reads it)."""

  version: int
  weights: Any


class Produced(NamedTuple):
  """A produced rollout: the ``index``-th produced (counting from the run's
  first step), the ``version`` of the weights that produced it, what
  `produce` returned, and the seconds it took."""

  index: int
  version: int
  value: Any
  seconds: float


@dataclasses.dataclass
class Taken:
  """What `Pipeline.take` hands the update: the rollout, its staleness
  (updates between the weights that produced it and those it trains),
  the rollouts dropped for age before it, the seconds the trainer waited,
  and the rollouts ready in the queue after it was taken."""

  produced: Produced
  staleness: int
  dropped: list
  waited: float
  queued: int


class Pipeline:
  """Hands the update one produced rollout a step (see the module doc).

  Args:
    produce: ``produce(index, snapshot) -> value``, the rollout of the
      ``index``-th step with the weights of ``snapshot``; called in order
      of `index`, from one thread.
    mode: one of `MODES`.
    max_staleness: the bound (``"one_step_off"``: 1; ``"sync"``: 0).
    order: which ready rollout the update takes first (`ORDERS`).
    start: the index of the first rollout (the step a run resumes at).
    snapshot: the weights at `start`.
    agree: with several processes (each with a pipeline, whose producers
      sample together), ``agree(n)``: the largest ``n`` the processes pass,
      a collective the producer thread calls. An ``"async"`` producer then
      samples each rollout (and continues a partial one, `newest`) with
      the version every process agrees on, the newest any of them has;
      the others wait for it. None: one process.
  """

  def __init__(
    self,
    produce: Callable[[int, Snapshot], Any],
    *,
    mode: str,
    max_staleness: int,
    order: str = "oldest",
    start: int = 0,
    snapshot: Snapshot,
    agree: Optional[Callable[[int], int]] = None,
  ):
    if mode not in MODES:
      raise ValueError(f"mode={mode!r}: choose one of {MODES}.")
    if order not in ORDERS:
      raise ValueError(f"order={order!r}: choose one of {ORDERS}.")
    if max_staleness < 0:
      raise ValueError(f"max_staleness={max_staleness} must be >= 0.")
    self.mode = mode
    self.bound = {"sync": 0, "one_step_off": 1}.get(mode, max_staleness)
    self.order = order
    self._produce = produce
    self._agree = agree
    self._start = start
    self._snapshots = {snapshot.version: snapshot}
    self._latest = snapshot.version
    self._ready: list[Produced] = []
    self._started = self._retired = 0
    self._taken = 0  # taken, not yet retired by a publish
    # Versions from this one on are kept while the processes agree on one.
    self._floor: Optional[int] = None
    self._stop_at: Optional[int] = None  # `pause`: start no index from here
    self._producing = False
    self._error: Optional[BaseException] = None
    self._closed = False
    self.producer_waited = 0.0  # seconds the producer waited on the bound
    self._cv = threading.Condition()
    self._thread = None
    if mode != "sync":
      self._thread = threading.Thread(
        target=self._loop, name="rljax-producer", daemon=True
      )
      self._thread.start()

  # --- the trainer's side -----------------------------------------------------

  def take(self, version: int) -> Taken:
    """The next rollout for the update that starts from `version`'s
    weights; waits until one is ready (re-raising the producer's error)."""
    start = time.perf_counter()
    if self._thread is None:  # sync: produce it now
      index = self._start + self._started
      self._started += 1
      snapshot = self._snapshots[self._latest]
      value = self._produce(index, snapshot)
      seconds = time.perf_counter() - start
      produced = Produced(index, snapshot.version, value, seconds)
      self._taken += 1
      # The update waited for the whole rollout.
      return Taken(produced, version - produced.version, [], seconds, 0)
    dropped = []
    with self._cv:
      while True:
        while not self._ready and self._error is None:
          self._cv.wait()
        if self._error is not None:
          raise self._error
        pick = min if self.order == "oldest" else max
        produced = pick(self._ready, key=lambda p: p.index)
        self._ready.remove(produced)
        if version - produced.version <= self.bound:
          break
        dropped.append(produced)  # too old to train: retire it
        self._retired += 1
        self._cv.notify_all()
      self._taken += 1
      queued = len(self._ready)
    waited = time.perf_counter() - start
    return Taken(produced, version - produced.version, dropped, waited, queued)

  def publish(self, snapshot: Snapshot) -> None:
    """New weights (after an update): retires the rollouts taken since the
    last publish, and lets the producer go on."""
    with self._cv:
      self._snapshots[snapshot.version] = snapshot
      self._latest = max(self._latest, snapshot.version)
      self._prune()
      self._retired += self._taken
      self._taken = 0
      self._cv.notify_all()

  def _prune(self) -> None:
    """Drop the weights the producer can no longer read (under the lock):
    one_step_off reads the version before the newest; versions from the
    `_floor` up stay while the processes agree on one."""
    keep = 2 if self.mode == "one_step_off" else 1
    for v in sorted(self._snapshots)[:-keep]:
      if self._floor is None or v < self._floor:
        del self._snapshots[v]

  def newest(self) -> Snapshot:
    """The newest published weights (a producer continuing a rollout under
    them: a partial rollout across updates); with several processes, the
    version they agree on (see ``agree``)."""
    with self._cv:
      snapshot = self._snapshots[self._latest]
      if self._agree is not None:
        self._floor = snapshot.version
    return self._agreed(snapshot)

  def _agreed(self, snapshot: Snapshot) -> Snapshot:
    """The version the processes agree on, from this one's `snapshot`
    (kept from the `_floor` up while they agree): itself, or newer weights
    the trainer is about to publish here, waited for."""
    if self._agree is None:
      return snapshot
    version = self._agree(snapshot.version)
    with self._cv:
      while version not in self._snapshots and not self._closed:
        self._cv.wait()
      if self._closed:
        raise _Closed()
      self._floor = None
      snapshot = self._snapshots[version]
      self._prune()
    return snapshot

  def hold(self) -> int:
    """Start no new rollout; returns the index of the next one (a run's
    processes agree on where to `pause`: the largest of these)."""
    with self._cv:
      self._stop_at = self._start + self._started
      return self._stop_at

  def pause(self, at: int) -> None:
    """Start no rollout from index `at` on, and return once the producer
    has produced those before it: a multi-process run's trainer then
    launches programs on the rollout devices (evaluation) in the same
    order everywhere. Each process first `hold`s its producer and all
    pause at the largest index held, so a producer behind the others
    catches up and none starts a rollout the others do not. `resume`
    lets the producer go on."""
    with self._cv:
      self._stop_at = at
      self._cv.notify_all()
      while (
        self._error is None
        and not self._closed
        and self._thread
        and (self._start + self._started < at or self._producing)
      ):
        self._cv.wait()

  def resume(self) -> None:
    """Undo `pause`."""
    with self._cv:
      self._stop_at = None
      self._cv.notify_all()

  def close(self) -> None:
    """Stop the producer (after the rollout it is producing) and drop what
    is queued."""
    with self._cv:
      self._closed = True
      self._cv.notify_all()
    if self._thread is not None:
      self._thread.join()
      self._thread = None

  # --- the producer's side ----------------------------------------------------

  def _loop(self) -> None:
    try:
      while True:
        with self._cv:
          start = time.perf_counter()
          while not self._closed and (
            self._started - self._retired > self.bound or self._paused()
          ):
            self._cv.wait()
          self.producer_waited += time.perf_counter() - start
          if self._closed:
            return
          index = self._start + self._started
          self._started += 1
          self._producing = True
          snapshot = self._snapshot_for(index)
          if self.mode == "async" and self._agree is not None:
            self._floor = snapshot.version
        start = time.perf_counter()
        if self.mode == "async":
          snapshot = self._agreed(snapshot)
        value = self._produce(index, snapshot)
        seconds = time.perf_counter() - start
        with self._cv:
          self._ready.append(Produced(index, snapshot.version, value, seconds))
          self._producing = False
          self._cv.notify_all()
    except _Closed:
      return
    except BaseException as e:  # handed to the trainer by `take`
      with self._cv:
        self._error = e
        self._cv.notify_all()

  def _paused(self) -> bool:
    """Whether `pause` holds the next index back (under the lock)."""
    return self._stop_at is not None and (
      self._start + self._started >= self._stop_at
    )

  def _snapshot_for(self, index: int) -> Snapshot:
    """one_step_off: the weights of ``index - 1`` updates (the run's first
    step's at the start); async: the newest."""
    if self.mode == "one_step_off":
      return self._snapshots[max(self._start, index - 1)]
    return self._snapshots[self._latest]


class _Closed(Exception):
  """The pipeline closed while its producer waited for weights."""
