"""TPU chips and slice names: what a run plan compiles for and measures
against.

Figures per chip, from Google Cloud's TPU pages (the ``source`` of each
`Chip`): HBM capacity, HBM bandwidth and peak bfloat16 compute. A slice is
named as JAX's `jax.experimental.topologies.get_topology_desc` spells it,
``<version>:<shape>`` (``v5e:4x4``, ``v5p:4x4x4``, ``v6e:8x8``), or as
Cloud TPU's accelerator types spell it, ``<version>-<n>`` (``v5e-64``,
``v5p-128``): n counts chips for v5e and v6e, TensorCores (two a chip) for
v4 and v5p.
"""

import dataclasses
import math
import re

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation's chip.

  Attributes:
    name: "v4", "v5e", "v5p" or "v6e".
    hbm_bytes: HBM capacity per chip.
    hbm_bandwidth: HBM bytes per second per chip.
    peak_flops: peak bfloat16 FLOP/s per chip.
    cores: TensorCores per chip (accelerator types count them on v4, v5p).
    dims: the number of axes of its slice shapes (2D torus or 3D).
    source: the page the figures come from.
  """

  name: str
  hbm_bytes: int
  hbm_bandwidth: float
  peak_flops: float
  cores: int
  dims: int
  source: str


CHIPS = {
  "v4": Chip(
    "v4", 32 * GIB, 1200e9, 275e12, 2, 3, "https://cloud.google.com/tpu/docs/v4"
  ),
  "v5e": Chip(
    "v5e",
    16 * GIB,
    819e9,
    197e12,
    1,
    2,
    "https://cloud.google.com/tpu/docs/v5e",
  ),
  "v5p": Chip(
    "v5p",
    95 * GIB,
    2765e9,
    459e12,
    2,
    3,
    "https://cloud.google.com/tpu/docs/v5p",
  ),
  "v6e": Chip(
    "v6e",
    32 * GIB,
    1640e9,
    918e12,
    1,
    2,
    "https://cloud.google.com/tpu/docs/v6e",
  ),
}


@dataclasses.dataclass(frozen=True)
class Slice:
  """A TPU slice: its chip and its shape (chips along each axis).

  Attributes:
    chip: the `Chip`.
    shape: chips along each torus axis, e.g. (4, 4) or (4, 4, 4).
  """

  chip: Chip
  shape: tuple[int, ...]

  @property
  def chips(self) -> int:
    """The number of chips."""
    return math.prod(self.shape)

  @property
  def name(self) -> str:
    """The topology name `get_topology_desc` takes (``v5e:4x4``)."""
    return f"{self.chip.name}:{'x'.join(map(str, self.shape))}"


def _shape_of(chip: Chip, chips: int) -> tuple[int, ...]:
  """The usual slice shape of `chips` chips: axes as equal as powers of
  two allow, the larger ones last (v5e-32: 4x8; v5p-128: 4x4x4)."""
  if chips < 1 or chips & (chips - 1):
    raise ValueError(
      f"a {chip.name} slice of {chips} chips: the chip count must be a"
      " power of two (name other shapes as <version>:<AxB[xC]>)."
    )
  shape = [1] * chip.dims
  for i in range(int(math.log2(chips))):
    shape[chip.dims - 1 - i % chip.dims] *= 2
  if chip.dims == 3 and chips < 8:  # 2x2x1, not 1x2x2
    shape = sorted(shape, reverse=True)
  return tuple(sorted(shape)) if chip.dims == 2 else tuple(shape)


def parse_slice(name: str) -> Slice:
  """The `Slice` a name means: ``v5e:4x4``, ``v5p:2x2x1``, ``v5e-64``,
  ``v5p-128`` (128 TensorCores: 64 chips, 4x4x4).

  Raises:
    ValueError: an unknown chip, a malformed name or a shape of the wrong
      number of axes; the message shows the accepted forms.
  """
  forms = (
    "<version>:<shape> (v5e:4x4, v5p:4x4x4, v6e:8x8) or <version>-<n>"
    " (v5e-64, v6e-16: n chips; v4-32, v5p-128: n TensorCores, 2 a chip)"
    f" with version one of {', '.join(CHIPS)}"
  )
  match = re.fullmatch(r"(v\w+?)(?::([\dx]+)|-(\d+))", name.strip().lower())
  if match is None or match.group(1) not in CHIPS:
    raise ValueError(f"TPU slice {name!r}: expected {forms}.")
  chip = CHIPS[match.group(1)]
  if match.group(3) is not None:
    count = int(match.group(3))
    if count % chip.cores:
      raise ValueError(
        f"TPU slice {name!r}: {chip.name}-<n> counts TensorCores, {chip.cores}"
        " a chip; n must be a multiple of it."
      )
    return Slice(chip, _shape_of(chip, count // chip.cores))
  shape = tuple(int(x) for x in match.group(2).split("x") if x)
  if len(shape) != chip.dims or not all(shape):
    raise ValueError(
      f"TPU slice {name!r}: a {chip.name} shape has {chip.dims} positive"
      f" axes; expected {forms}."
    )
  return Slice(chip, shape)
