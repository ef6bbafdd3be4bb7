"""Rollout and training overlap: a producer works ahead of the update with
bounded staleness (`Pipeline`; ``train.async_mode`` in a run).

A run's trainer takes one produced rollout a step and publishes its new
weights after the update; in ``"one_step_off"`` and ``"async"`` modes the
next rollouts are produced meanwhile, from weights at most
``max_staleness`` updates old.
"""

from rljax.pipeline._pipeline import MODES
from rljax.pipeline._pipeline import ORDERS
from rljax.pipeline._pipeline import Pipeline
from rljax.pipeline._pipeline import Produced
from rljax.pipeline._pipeline import Snapshot
from rljax.pipeline._pipeline import Taken

__all__ = ["MODES", "ORDERS", "Pipeline", "Produced", "Snapshot", "Taken"]
