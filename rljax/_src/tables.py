"""Per-prompt state: a fixed-size table indexed by `Batch.prompt_ids_P`.

A transform that learns something about each prompt across steps (a running
success rate, the shortest correct length, a Beta posterior) keeps a
`PromptTable` in its state. The table is an ordinary pytree of fixed shape, so
it is jitted, replicated over the mesh (identical on every host, since
`prepare` runs on the global batch) and checkpointed with the algorithm state.

Example:
  >>> import jax.numpy as jnp
  >>> from rljax import PromptTable
  >>> table = PromptTable.create(10, fill=0.5)
  >>> table = table.store(jnp.array([3, 7]), jnp.array([1.0, 0.0]))
  >>> values, seen = table.lookup(jnp.array([3, 4]))
  >>> values.tolist(), seen.tolist()
  ([1.0, 0.5], [1, 0])
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


class PromptTable(NamedTuple):
  """Values per prompt id, and how many times each was stored.

  Ids outside ``[0, num_prompts)`` read the fill value with ``seen == 0``
  and are never written: size the table with the training set
  (``len(task.train)``; the `Trainer` checks it). When one batch holds the
  same id twice, one of its rows is stored (which one is unspecified) and
  ``seen`` counts both rows; reduce duplicates first where that matters.
  """

  values: jax.Array  # [num_prompts, *shape]
  seen: jax.Array  # [num_prompts] int32
  fill: jax.Array  # [*shape]: what an unseen prompt reads

  @classmethod
  def create(
    cls,
    num_prompts: int,
    *,
    shape: tuple[int, ...] = (),
    fill: ArrayLike = 0.0,
    dtype=jnp.float32,
  ) -> "PromptTable":
    if int(num_prompts) < 1:
      raise ValueError(
        f"PromptTable num_prompts={num_prompts}; it must be at least 1 (the"
        " number of training prompts, len(task.train))."
      )
    fill = jnp.broadcast_to(jnp.asarray(fill, dtype), shape)
    return cls(
      values=jnp.broadcast_to(fill, (int(num_prompts), *shape)),
      seen=jnp.zeros((int(num_prompts),), jnp.int32),
      fill=fill,
    )

  @property
  def num_prompts(self) -> int:
    return self.seen.shape[0]

  def lookup(self, prompt_ids_P: ArrayLike) -> tuple[jax.Array, jax.Array]:
    """(values [P, *shape], seen [P]) of each prompt id."""
    ids = jnp.asarray(prompt_ids_P, jnp.int32)
    inside = (ids >= 0) & (ids < self.num_prompts)
    safe = jnp.where(inside, ids, 0)
    # Rows come out sharded like the ids (explicit meshes ask to be told).
    rows = jax.typeof(ids).sharding
    values = self.values.at[safe].get(out_sharding=rows)
    expand = inside.reshape(inside.shape + (1,) * (values.ndim - 1))
    return (
      jnp.where(expand, values, self.fill),
      jnp.where(inside, self.seen.at[safe].get(out_sharding=rows), 0),
    )

  def store(
    self,
    prompt_ids_P: ArrayLike,
    values_P: ArrayLike,
    where_P: Optional[ArrayLike] = None,
  ) -> "PromptTable":
    """The table with `values_P` stored at each id (only where `where_P`)."""
    ids = jnp.asarray(prompt_ids_P, jnp.int32)
    ok = (ids >= 0) & (ids < self.num_prompts)
    if where_P is not None:
      ok = ok & jnp.asarray(where_P, bool)
    # Rows not to write go to an index past the end, which "drop" ignores.
    target = jnp.where(ok, ids, self.num_prompts)
    values = jnp.asarray(values_P, self.values.dtype)
    return self._replace(
      values=self.values.at[target].set(
        values, mode="drop", out_sharding=jax.typeof(self.values).sharding
      ),
      seen=self.seen.at[target].add(
        1, mode="drop", out_sharding=jax.typeof(self.seen).sharding
      ),
    )
