"""Training checkpoints: atomic, keep-N, asynchronous and verified, over orbax.

`Checkpointer` saves the train state (any pytree of arrays, sharded or not,
typed PRNG keys included), the data-iterator state and a metadata dict per
step with the checksums of its files, and restores them onto any mesh,
falling back past damaged steps (listed in `Restored.skipped`).
`keys_to_data` and `data_to_keys` are the typed-key conversion it applies
(typed keys are stored as key data).
"""

from rljax.checkpointing._checkpointer import Checkpointer
from rljax.checkpointing._checkpointer import Restored
from rljax.checkpointing._keys import data_to_keys
from rljax.checkpointing._keys import keys_to_data

__all__ = [
  "Checkpointer",
  "Restored",
  "data_to_keys",
  "keys_to_data",
]
