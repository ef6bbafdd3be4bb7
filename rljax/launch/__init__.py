"""The command line: ``python -m rljax.training --config configs/<name>.py``
(``python -m rljax.launch`` is the same program).

It trains any run kind (`rljax.posttrain.run_for` picks the class), dry-runs one step or
plans the run for a TPU slice. It sits on top of `rljax.training`,
`rljax.posttrain` and `rljax.plan`; none of them imports it.
"""

from rljax.launch._cli import main

__all__ = ["main"]
