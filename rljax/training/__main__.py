"""``python -m rljax.training``: the command line, `rljax.launch`.

The command line sits above this package (it dispatches to the
post-training runs and the planner, which import `rljax.training`), so this
script runs it as a program rather than importing it.
"""

import runpy

runpy.run_module("rljax.launch", run_name="__main__", alter_sys=True)
