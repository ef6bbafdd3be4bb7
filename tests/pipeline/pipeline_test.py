"""The rollout pipeline: which weights each rollout gets, the staleness
bound, the queue's order and drops, errors and shutdown (no JAX: the
"weights" are version numbers, the producer a function the test steers)."""

import random
import threading
import time

import pytest

from rljax.pipeline import Pipeline
from rljax.pipeline import Snapshot


def _run(mode, steps, *, k=1, order="oldest", start=0, delay=None):
  """Train `steps` steps against a producer that records the version each
  rollout was produced from; `delay(step)` sleeps in the trainer's update
  (a slow trainer) or, negated, in the producer."""
  produced = []

  def produce(index, snapshot):
    if delay is not None:
      time.sleep(max(-delay(index), 0.0))
    produced.append((index, snapshot.version))
    return index

  p = Pipeline(
    produce,
    mode=mode,
    max_staleness=k,
    order=order,
    start=start,
    snapshot=Snapshot(start, start),
  )
  taken = []
  try:
    for step in range(start, start + steps):
      t = p.take(step)
      taken.append(t)
      if delay is not None:
        time.sleep(max(delay(step), 0.0))
      p.publish(Snapshot(step + 1, step + 1))
  finally:
    p.close()
  return produced, taken


def test_sync_produces_each_rollout_with_the_current_weights():
  produced, taken = _run("sync", 5, start=3)
  assert produced == [(s, s) for s in range(3, 8)]
  assert [t.staleness for t in taken] == [0] * 5


@pytest.mark.parametrize("seed", [0, 1])
def test_async_with_no_staleness_is_the_sync_schedule(seed):
  rng = random.Random(seed)
  delays = {s: rng.uniform(-0.01, 0.01) for s in range(8)}
  produced, taken = _run("async", 8, k=0, delay=lambda s: delays.get(s, 0))
  # (after the last step it may have started the next rollout)
  assert produced[:8] == [(s, s) for s in range(8)]
  assert [t.produced.value for t in taken] == list(range(8))


@pytest.mark.parametrize("slow", ["trainer", "producer"])
def test_one_step_off_samples_with_the_weights_one_update_back(slow):
  sign = 1 if slow == "trainer" else -1
  produced, taken = _run(
    "one_step_off", 6, start=2, delay=lambda s: sign * 0.01
  )
  # Step n's rollout: the weights of n - 1 updates (the first two: the
  # run's first weights), whichever side is slower.
  assert produced[:6] == [(2, 2), (3, 2), (4, 3), (5, 4), (6, 5), (7, 6)]
  assert [t.staleness for t in taken] == [0, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_async_never_trains_a_rollout_older_than_the_bound(k, seed):
  rng = random.Random(seed)
  delays = {s: rng.choice([-0.004, 0.0, 0.004, 0.012]) for s in range(30)}
  produced, taken = _run("async", 30, k=k, delay=lambda s: delays.get(s, 0))
  assert max(t.staleness for t in taken) <= k
  assert [t.produced.index for t in taken] == list(range(30))
  assert not any(t.dropped for t in taken)  # oldest first drops nothing
  # The producer never ran more than k + 1 rollouts ahead of the update.
  for index, version in produced:
    assert index - version <= k


def test_a_slow_trainer_lets_the_producer_run_ahead_to_the_bound():
  gate = threading.Event()
  started = []

  def produce(index, snapshot):
    started.append(index)
    return snapshot.version

  p = Pipeline(produce, mode="async", max_staleness=2, snapshot=Snapshot(0, 0))
  try:
    deadline = time.time() + 10
    while len(started) < 3 and time.time() < deadline:
      time.sleep(0.001)
    gate.wait(0.05)  # give it the chance to overrun the bound
    assert started == [0, 1, 2]  # 3 = k + 1 outstanding, then it waits
    assert p.take(0).queued == 2
    assert len(started) == 3  # taken is not retired until the publish
    p.publish(Snapshot(1, 1))
    t = p.take(1)
    assert (t.produced.version, t.staleness) == (0, 1)
  finally:
    p.close()


def test_freshest_first_drops_the_rollouts_it_left_too_old():
  release = {i: threading.Event() for i in range(10)}

  def produce(index, snapshot):
    release[index].wait(10)
    return index

  p = Pipeline(
    produce,
    mode="async",
    max_staleness=1,
    order="freshest",
    snapshot=Snapshot(0, 0),
  )
  try:
    release[0].set()
    release[1].set()
    deadline = time.time() + 10
    while p._ready.__len__() < 2 and time.time() < deadline:
      time.sleep(0.001)
    t = p.take(0)
    assert t.produced.index == 1 and t.queued == 1  # the fresher of two
    p.publish(Snapshot(1, 1))
    release[2].set()
    deadline = time.time() + 10
    while p._ready.__len__() < 2 and time.time() < deadline:
      time.sleep(0.001)
    p.publish(Snapshot(2, 2))  # pretend another update ran: 0 is 2 old
    t = p.take(2)
    assert t.produced.index == 2
    release[3].set()
    t = p.take(2)
    # Rollout 0 (weights 0) is 2 updates behind weights 2: dropped.
    assert [d.index for d in t.dropped] == [0]
    assert t.produced.index == 3
  finally:
    for e in release.values():
      e.set()
    p.close()


def test_the_producers_error_reaches_the_trainer():
  def produce(index, snapshot):
    if index == 2:
      raise ValueError("sampler broke")
    return index

  # (no staleness: rollout 2 starts once step 1 has published)
  p = Pipeline(produce, mode="async", max_staleness=0, snapshot=Snapshot(0, 0))
  try:
    assert p.take(0).produced.value == 0
    p.publish(Snapshot(1, 1))
    assert p.take(1).produced.value == 1
    p.publish(Snapshot(2, 2))
    with pytest.raises(ValueError, match="sampler broke"):
      p.take(2)
  finally:
    p.close()


def test_close_stops_a_waiting_producer():
  p = Pipeline(
    lambda i, s: i, mode="async", max_staleness=0, snapshot=Snapshot(0, 0)
  )
  thread = p._thread
  p.close()
  assert not thread.is_alive()


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(mode="eager"), "mode='eager'"),
    (dict(order="newest"), "order='newest'"),
    (dict(max_staleness=-1), "max_staleness=-1"),
  ],
)
def test_bad_settings_are_refused(kwargs, match):
  args = dict(mode="async", max_staleness=1, snapshot=Snapshot(0, 0))
  with pytest.raises(ValueError, match=match):
    Pipeline(lambda i, s: i, **{**args, **kwargs})


class _Processes:
  """Stand-ins for a run's processes in threads: `exchange(rank, n)` is
  their collective (every rank passes a value, each gets all of them)."""

  def __init__(self, n):
    self.barrier = threading.Barrier(n)
    self.values = [None] * n

  def exchange(self, rank, value):
    self.values[rank] = value
    self.barrier.wait()
    out = list(self.values)
    self.barrier.wait()
    return out


def _two_processes(agreeing, *, steps=8, k=2, pause_at=None):
  """Two "processes", each a trainer thread and a pipeline, whose trainers
  step together (the update is a collective) but publish at different
  times. Returns each process's {index: version}, and what the
  producers had produced when a pause at step `pause_at` returned."""
  producers = _Processes(2)  # the producers' collective
  trainers = _Processes(2)  # the updates'
  produced = [{}, {}]
  at_pause = [None, None]
  # Process 1 publishes each update 30 ms after process 0; a rollout takes
  # 10 ms, so the producers start most rollouts between the two.
  delays = [0.0, 0.03]

  def process(rank):
    def produce(index, snapshot):
      time.sleep(0.01)
      produced[rank][index] = snapshot.version
      return index

    p = Pipeline(
      produce,
      mode="async",
      max_staleness=k,
      snapshot=Snapshot(0, 0),
      agree=(lambda n: max(producers.exchange(rank, n))) if agreeing else None,
    )
    try:
      for step in range(steps):
        p.take(step)
        trainers.exchange(rank, step)  # the update
        time.sleep(delays[rank])
        p.publish(Snapshot(step + 1, step + 1))
        if step == pause_at:
          p.pause(max(trainers.exchange(rank, p.hold())))
          at_pause[rank] = dict(produced[rank])
          p.resume()
      p.pause(max(trainers.exchange(rank, p.hold())))
    finally:
      p.close()

  threads = [threading.Thread(target=process, args=(r,)) for r in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=60)
  assert not any(t.is_alive() for t in threads)
  return produced, at_pause


def test_processes_agree_on_the_weights_of_each_rollout():
  produced, at_pause = _two_processes(True, pause_at=3)
  assert produced[0] == produced[1]  # every index, the same version
  assert sorted(produced[0]) == list(range(len(produced[0])))
  assert all(i - 2 <= v <= i for i, v in produced[0].items())
  # Paused at a rollout both agreed on, with everything before it done.
  assert at_pause[0] == at_pause[1]
  # Without the agreement each takes its own newest weights: they differ.
  apart, _ = _two_processes(False)
  assert apart[0] != apart[1]
