"""C3PO++ partial rollouts with IcePop on 2-digit addition (see _arithmetic.py).

C3PO++ (Ring-1T, arXiv 2510.18855): twice the batch's groups are in flight;
each step decodes a token per sample at a time and stops as soon as 16
groups are complete, trains the oldest complete ones and continues the rest
in the next step under the updated policy (`rljax.rollouts.PartialRollouts`).
Tokens drawn by an earlier policy keep their sampler log-probs, and IcePop's
masked importance weights (preset `c3po_pp`) drop those that drifted too far.
The paper's budgets are thousands of tokens; the answers here are at most 4.

python -m rljax.training --config configs/c3po_pp.py [train.steps=100 ...]
"""

from _arithmetic import base


def get_config():
  return base(
    "c3po_pp",
    sampler={
      "groups": "partial",
      "groups_kwargs": {"segment": 1, "in_flight": 2.0},
    },
  )
