"""``python -m rljax.training``: see `rljax.training._cli`."""

import sys

from rljax.training._cli import main

sys.exit(main())
