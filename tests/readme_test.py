"""The README's composition example runs as written, under jax.jit."""

import pathlib
import re

import jax
import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_composition_example_runs_jitted():
  text = README.read_text()
  blocks = re.findall(r"```python\n(.*?)```", text, re.S)
  example = next(b for b in blocks if "rljax.chain(" in b)
  lines = example.splitlines()
  start = next(i for i, l in enumerate(lines) if l.startswith("algo = "))
  end = next(i for i, l in enumerate(lines) if i > start and l == ")")
  # The promise: the composition itself takes under ten lines.
  assert end - start + 1 < 10, lines[start : end + 1]
  scope = {}
  exec(example, scope)  # noqa: S102 - the README is ours
  loss, metrics = scope["loss"], scope["metrics"]
  assert np.isfinite(loss.value)
  assert {"loss", "kl_ref", "clip_frac_low", "ratio_mean"} <= set(metrics)
  assert isinstance(jax.tree.leaves(loss)[0], jax.Array)
