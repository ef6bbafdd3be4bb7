"""GRPO with LoRA / QLoRA through the Trainer: only adapters train, the
reference is the frozen base, resume is exact, the state is small."""

import pathlib

from flax import nnx
import jax
import numpy as np
import pytest

from rljax import testing
from rljax.models import Transformer
from rljax.models import token_logprobs
from rljax.training import Trainer
from rljax.training import load_config
from rljax.training import override

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
LORA = ("model.lora_rank=4", "model.lora_alpha=8.0")
# The README demo with rank-8 adapters on the warm-started model (LoRA
# takes a larger learning rate than full fine-tuning's 2e-4).
LORA_DEMO = (
  "model.lora_rank=8",
  "model.lora_alpha=16.0",
  "optim.learning_rate=1e-3",
)


def _config(directory, *extra):
  return testing.tiny_run_config(
    CONFIGS / "grpo.py",
    directory,
    "train.mesh=(1, 1, 1)",
    "algorithm.kwargs.kl_coef=0.1",
    *LORA,
    *extra,
  )


def _split(params):
  return nnx.split_state(params, nnx.LoRAParam, ...)


def _arrays(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _base_logp(trainer, base_state):
  """Token log-probs of the frozen base as a plain model (no adapters)."""
  config = trainer.policy().config
  plain = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  nnx.update(plain, nnx.filter_state(base_state, nnx.Param))
  tokens = np.arange(12, dtype=np.int32).reshape(2, 6) % config.vocab_size
  mask = np.ones_like(tokens)
  return tokens, mask, token_logprobs(plain, tokens, mask)[0]


def _length(samples):
  return np.asarray(samples.num_tokens, np.float32)


@pytest.mark.slow  # 12 s on 2 cores (the default run's budget)
def test_only_adapters_train_and_the_reference_is_the_frozen_base(tmp_path):
  # Rewarded by length, which varies within a group of a barely trained
  # model's samples, so the adapters get a gradient whatever is sampled (the
  # task's reward can be 0 for every sample, and then nothing moves).
  trainer = Trainer(_config(tmp_path), rewards=[("length", _length, 1.0)])
  state = trainer.state
  adapters, base = _split(state.policy.params)
  n_adapter = sum(x.size for x in jax.tree.leaves(adapters))
  # The optimizer state is the adapters' only (Adam: two moments + counts).
  opt_sizes = [x.size for x in jax.tree.leaves(state.policy.opt_state)]
  assert sum(s for s in opt_sizes if s > 1) == 2 * n_adapter
  # The reference is zero adapters, not a second base.
  ref = jax.tree.leaves(state.reference)
  assert sum(x.size for x in ref) == n_adapter
  assert all(not np.any(np.asarray(x)) for x in ref)
  base_before = _arrays(base)
  adapters_before = _arrays(adapters)
  trainer.step(0)
  trainer.step(1)
  adapters, base = _split(trainer.state.policy.params)
  for a, b in zip(_arrays(base), base_before):
    np.testing.assert_array_equal(a, b)  # the base never moves
  assert any(
    not np.array_equal(a, b) for a, b in zip(_arrays(adapters), adapters_before)
  )
  # The policy moved; the reference (base + zero adapters) is the base,
  # bit for bit, after the adapters changed.
  tokens, mask, want = _base_logp(trainer, base)
  ref_model = nnx.merge(trainer.models.policy, trainer.reference_params())
  got = token_logprobs(ref_model, tokens, mask)[0]
  np.testing.assert_array_equal(got, want)
  moved = token_logprobs(trainer.policy(), tokens, mask)[0]
  assert np.max(np.abs(np.asarray(moved) - np.asarray(want))) > 0


@pytest.mark.slow  # three trainers: about two minutes on 2 CPU cores
def test_resume_with_lora_equals_a_straight_run(tmp_path):
  straight = Trainer(_config(tmp_path / "a", "train.steps=4"))
  straight.run()
  common = ("train.steps=4", "output.checkpoint_every=1")
  first = Trainer(_config(tmp_path / "b", *common))
  first.run(steps=2)
  first.checkpointer.wait()
  resumed = Trainer(_config(tmp_path / "b", *common))
  assert resumed.start_step == 2
  resumed.run()
  for name in ("params", "opt_state"):
    for a, b in zip(
      jax.tree.leaves(getattr(straight.state.policy, name)),
      jax.tree.leaves(getattr(resumed.state.policy, name)),
    ):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


@pytest.mark.slow  # default-run time; run with -m slow
def test_qlora_trains_on_an_int8_base(tmp_path):
  trainer = Trainer(_config(tmp_path, "model.lora_quantize_base=True"))
  layers = trainer.state.policy.params["layers"]
  assert layers["q_proj"][...].dtype == np.int8
  # Adapters away from the reference's zeros: the KL term has a gradient
  # even when every reward of the 2-step warm start is 0.
  params = trainer.state.policy.params
  moved = jax.tree.map(lambda x: x + 0.05, _split(params)[0])
  policy = trainer.state.policy._replace(params=nnx.merge_state(params, moved))
  trainer.state = trainer.state._replace(policy=policy)
  before = _arrays(moved)
  metrics = trainer.step(0)
  assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
  after = _arrays(_split(trainer.state.policy.params)[0])
  assert any(not np.array_equal(a, b) for a, b in zip(after, before))


@pytest.mark.parametrize(
  "item, match",
  [
    ("model.lora_rank=-1", "model.lora_rank"),
    ("model.lora_targets=('qkv',)", "model.lora_targets"),
    ("model.lora_alpha=0.0", "model.lora_alpha"),
  ],
)
def test_bad_lora_settings_name_the_field(tmp_path, item, match):
  with pytest.raises(ValueError, match=match):
    Trainer(_config(tmp_path, item))


def test_quantize_without_lora_names_the_fix(tmp_path):
  with pytest.raises(ValueError, match="lora_rank > 0"):
    Trainer(
      _config(tmp_path, "model.lora_rank=0", "model.lora_quantize_base=True")
    )


def state_bytes(state) -> dict[str, int]:
  """Bytes of each part of a `TrainState` (the sum over its leaves)."""
  parts = dict(
    params=state.policy.params,
    optimizer=state.policy.opt_state,
    reference=state.reference,
    value=state.value,
  )
  return {
    k: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(v))
    for k, v in parts.items()
  }


@pytest.mark.slow  # SmolLM2-135M on CPU: minutes
def test_grpo_lora_config_runs_two_iterations(tmp_path):
  config = override(
    load_config(CONFIGS / "grpo_lora.py"),
    [
      f"output.directory={tmp_path}",
      "train.steps=2",
      "train.eval_prompts=4",
      "train.mesh=(1, 1, 1)",
      # The state's bytes do not depend on the batch: a small one.
      "train.prompts_per_step=2",
      "sampler.num_samples=2",
      "train.microbatches=1",
      "output.tensorboard=False",
      "output.plot=False",
    ],
  )
  trainer = Trainer(config)
  summary = trainer.run()
  assert all(np.isfinite(h["loss"]) for h in summary["history"] if "loss" in h)
  got = state_bytes(trainer.state)
  # Measured: params 531.8 MiB (the base + 18.6 MiB of adapters), Adam
  # 37.3 MiB, reference 18.6 MiB; full fine-tuning with the same KL holds
  # 513.1 + 1026.3 + 513.1 MiB (0.29 of it; QLoRA's int8 base: 0.14).
  assert got["optimizer"] < 0.1 * got["params"]
  assert got["reference"] < 0.05 * got["params"]


@pytest.mark.slow  # a README demo run (and the full one, `grpo_demo`)
def test_lora_on_the_demo_model_is_within_5_points_of_full(
  tmp_path, grpo_demo, train_demo
):
  # Measured (seed 0, 2 CPU cores): both warm-start to 80.1%; GRPO takes
  # full fine-tuning to 88.3% and rank-8 LoRA (its state: adapters and
  # their Adam moments) to 85.9%.
  full = grpo_demo[1]["after"]["eval_accuracy"]
  lora = train_demo(tmp_path, *LORA_DEMO)["after"]["eval_accuracy"]
  assert lora >= full - 0.05, (lora, full)
