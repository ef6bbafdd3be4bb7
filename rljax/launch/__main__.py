"""``python -m rljax.launch``: see `rljax.launch._cli`."""

import sys

from rljax.launch._cli import main

sys.exit(main())
