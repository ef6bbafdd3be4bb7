"""Post-training runs with LoRA: SFT trains the adapters only and exports
the merged model and PEFT adapters; DPO's reference is the frozen base."""

import dataclasses
import json
import sys

from flax import nnx
import jax
import numpy as np
import pytest

from rljax import checkpoints
from rljax import posttrain
from rljax.models import token_logprobs
from rljax.training import AlgorithmSpec

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from runs_test import _config  # noqa: E402
from runs_test import _pairs  # noqa: E402


def _lora(config, rank=2):
  model = dataclasses.replace(config.model, lora_rank=rank, lora_alpha=4.0)
  return dataclasses.replace(config, model=model)


@pytest.mark.slow  # default-run time; run with -m slow
def test_sft_with_lora_trains_adapters_and_exports_merged_and_peft(tmp_path):
  run = posttrain.SFTRun(_lora(_config(tmp_path)), resume=False)
  base = nnx.filter_state(run.state.policy.params, nnx.Not(nnx.LoRAParam))
  base = [np.asarray(x) for x in jax.tree.leaves(base)]
  summary = run.run()
  losses = [h["loss"] for h in summary["history"]]
  assert losses[-1] < losses[0]
  after = nnx.filter_state(run.state.policy.params, nnx.Not(nnx.LoRAParam))
  for x, y in zip(jax.tree.leaves(after), base):
    np.testing.assert_array_equal(x, y)
  out = tmp_path / "run" / "model"
  config = json.loads((out / "adapter" / "adapter_config.json").read_text())
  assert config["r"] == 2 and config["lora_alpha"] == 4.0
  assert (out / "adapter" / "adapter_model.safetensors").exists()
  # The merged export computes what the policy with adapters computes.
  merged = checkpoints.load_hf(out)
  tokens = np.arange(10, dtype=np.int32).reshape(2, 5) % 8
  mask = np.ones_like(tokens)
  np.testing.assert_allclose(
    token_logprobs(merged, tokens, mask)[0],
    token_logprobs(run.policy(), tokens, mask)[0],
    atol=1e-4,
  )


@pytest.mark.slow  # a second post-training run: about a minute
def test_dpo_with_lora_starts_at_log_2_and_trains(tmp_path):
  config = _lora(
    _config(
      tmp_path,
      kind="preference",
      algorithm=AlgorithmSpec(name="dpo", kwargs={"beta": 0.5}),
    )
  )
  run = posttrain.PreferenceRun(config, records=_pairs())
  out = [run.step(s) for s in range(3)]
  assert all(np.isfinite(m["loss"]) for m in out)
  # Policy (base + zero-effect adapters) equals the reference at first.
  assert out[0]["loss"] == pytest.approx(np.log(2.0), abs=1e-4)
  assert out[-1]["loss"] < out[0]["loss"]
