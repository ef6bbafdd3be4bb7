"""An RL run's rollout pipeline (``train.async_mode``): `rljax.pipeline`
with the run's settings, the weight snapshots it hands the producer, and
the metrics it logs.

In ``"sync"`` mode the producer samples with the live weights before the
update. Otherwise the update donates its input state while the producer
may still read the weights it was given, so each published snapshot is a
copy: one more copy of the policy's weights (and the algorithm state) in
device memory.
"""

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rljax import pipeline
from rljax.training._config import RunConfig


class Overlap:
  """The run's `pipeline.Pipeline` and its bookkeeping."""

  def __init__(self, config: RunConfig, to_rollout_mesh=None):
    t = config.train
    # Disaggregated: moves the policy's weights to the rollout mesh.
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
    (sampled before the update donates them), else a copy; the policy's
    moved to the rollout mesh when the run has one (the transfer is
    dispatched here and runs beside what follows)."""
    params, algo_state = weights
    if self.mode != "sync":
      algo_state = jax.tree.map(jnp.copy, algo_state)
    if self.to_rollout_mesh is not None:
      params = self.to_rollout_mesh(params)
      self.transfer_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    elif self.mode != "sync":
      params = jax.tree.map(jnp.copy, params)
    return params, algo_state

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

  def close(self) -> None:
    """Stop the producer (after the rollout it is producing)."""
    if self._pipeline is not None:
      self._pipeline.close()
      self._pipeline = None
    self.next_step = None
