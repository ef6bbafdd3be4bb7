"""GRPO on 2-digit addition, asynchronous: rollouts are produced while the
update trains, at most one update stale, and the policy term is corrected
by truncated importance sampling against the sampler's log-probs.

python -m rljax.training --config configs/grpo_async.py [train.max_staleness=2 ...]

``train.async_mode``: "one_step_off" (deterministic, one update stale) or
"async" (the newest weights, at most ``train.max_staleness`` updates old);
``train.queue_order``: "oldest" or "freshest". See the README's section on
asynchronous RL.
"""

import dataclasses

from _arithmetic import base


def get_config():
  config = base(
    "grpo",
    tis_cap=2.0,
    train={"async_mode": "async", "max_staleness": 1},
  )
  output = dataclasses.replace(config.output, directory="runs/grpo_async")
  return dataclasses.replace(config, output=output)
