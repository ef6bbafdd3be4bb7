"""An RL run's rollout pipeline (``train.async_mode``): `rljax.pipeline`
with the run's settings, the weight snapshots it hands the producer, and
the metrics it logs.

In ``"sync"`` mode the producer samples with the live weights before the
update. Otherwise the update donates its input state while the producer
may still read the weights it was given, so each published snapshot is a
copy: one more copy of the policy's weights (and the algorithm state) in
device memory.
"""

import contextlib
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rljax import pipeline
from rljax.training._config import RunConfig


class Overlap:
  """The run's `pipeline.Pipeline` and its bookkeeping."""

  def __init__(self, config: RunConfig, to_rollout_mesh=None, agree=None):
    t = config.train
    # Several processes: ``(on_update_mesh, on_rollout_mesh)``, each
    # ``fn(n)`` the largest n over processes, a collective on that mesh.
    self.agree = agree
    # Disaggregated: moves (params, algo_state) to the rollout mesh.
    self.to_rollout_mesh = to_rollout_mesh
    self.transfer_bytes = 0
    self.mode = t.async_mode
    self.max_staleness = t.max_staleness
    self.order = t.queue_order
    self.partial = t.partial_rollouts
    self.next_step: Optional[int] = None  # the step the pipeline serves next
    self.dropped_samples = 0
    self._pipeline: Optional[pipeline.Pipeline] = None

  def start(self, produce, step: int, weights) -> None:
    """A new pipeline whose first rollout is `step`'s, produced from
    `weights` (the state after `step` updates)."""
    self.close()
    made = []  # the producer may ask before the constructor returns
    if self.partial:
      produce.newest = lambda: made[0].newest() if made else None
    self._pipeline = pipeline.Pipeline(
      produce,
      mode=self.mode,
      max_staleness=self.max_staleness,
      order=self.order,
      start=step,
      snapshot=pipeline.Snapshot(step, self._snapshot(weights)),
      agree=None if self.agree is None else self.agree[1],
    )
    made.append(self._pipeline)
    self.next_step = step

  def take(self, step: int) -> pipeline.Taken:
    """`step`'s rollout; raises if it is older than the bound allows (the
    pipeline never hands one over: this checks it)."""
    taken = self._pipeline.take(step)
    if not 0 <= taken.staleness <= self._pipeline.bound:
      raise RuntimeError(
        f"step {step} was handed a rollout of weights {taken.staleness}"
        f" updates old; the bound is {self._pipeline.bound}"
        f" (train.async_mode={self.mode!r}, max_staleness"
        f" {self.max_staleness}). This is a bug in rljax.pipeline."
      )
    self.dropped_samples += sum(
      int(np.asarray(d.value.scored.rollout.sample_mask_PG).sum())
      for d in taken.dropped
    )
    self.next_step = step + 1
    return taken

  def publish(self, version: int, weights) -> None:
    """The weights after `version` updates, to the producer."""
    if self._pipeline is not None:
      snapshot = pipeline.Snapshot(version, self._snapshot(weights))
      self._pipeline.publish(snapshot)

  def _snapshot(self, weights) -> Any:
    """The weights as the producer reads them: the live arrays in sync mode
    (sampled before the update donates them), else a copy; moved to the
    rollout mesh when the run has one (the transfer is dispatched here and
    runs beside what follows)."""
    if self.to_rollout_mesh is not None:
      params, algo_state = self.to_rollout_mesh(weights)
      self.transfer_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
      return params, algo_state
    if self.mode != "sync":
      return jax.tree.map(jnp.copy, weights)
    return weights

  def metrics(self, taken: pipeline.Taken, seconds: float) -> dict:
    """What the step logs about the overlap: the rollout's staleness (of
    the weights it started with; with partial rollouts, also the mean and
    largest over its tokens), the samples dropped for age (so far), the
    rollouts left queued, and the fraction of the step the update waited
    for its rollout (in sync mode: while it was produced)."""
    out = {}
    rollout = taken.produced.value.scored.rollout
    if rollout.version_PGT is not None:
      mask = np.asarray(rollout.mask_PGT) > 0
      age = self.next_step - 1 - np.asarray(rollout.version_PGT)[mask]
      out["token_staleness_mean"] = float(age.mean()) if age.size else 0.0
      out["token_staleness_max"] = float(age.max()) if age.size else 0.0
    if self.to_rollout_mesh is not None:
      out["weight_transfer_bytes"] = float(self.transfer_bytes)
      out["weight_wait_seconds"] = taken.produced.value.weights_wait
    return out | {
      "staleness": float(taken.staleness),
      "dropped_samples": float(self.dropped_samples),
      "queue_depth": float(taken.queued),
      "rollout_wait_fraction": taken.waited / max(seconds, 1e-9),
      "producer_wait_seconds": self._pipeline.producer_waited,
    }

  @contextlib.contextmanager
  def paused(self):
    """With several processes, the producer held at a rollout they agree
    on while the trainer launches programs on the rollout mesh (or on
    every device: orbax's barriers); one process needs no pause."""
    if self.agree is None or self._pipeline is None:
      yield
      return
    self._pipeline.pause(self.agree[0](self._pipeline.hold()))
    try:
      yield
    finally:
      self._pipeline.resume()

  def close(self) -> None:
    """Stop the producer (after the rollout it is producing; with several
    processes, after the rollouts any of them started)."""
    if self._pipeline is not None:
      if self.agree is not None:
        self._pipeline.pause(self.agree[0](self._pipeline.hold()))
      self._pipeline.close()
      self._pipeline = None
    self.next_step = None
