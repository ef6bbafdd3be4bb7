"""AEPO (arbitrary entropy) on 2-digit addition (see _arithmetic.py).

Arbitrary Entropy Policy Optimization (arXiv 2510.08141): 4 of each
group's 16 samples come from a second stream at temperature 1.2 when the
policy's entropy is below the target, 0.8 above it
(`rljax.rollouts.TemperatureStream`), and add a REINFORCE term to GRPO on
the other 12 (preset `aepo_arbitrary`).

python -m rljax.training --config configs/aepo_arbitrary.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "aepo_arbitrary",
    sampler={"groups": "temperature_stream", "groups_kwargs": {"num_extra": 4}},
  )
