"""The RL loop end to end on a tiny model: runs, logs, resumes exactly."""

import json
import pathlib

import jax
import numpy as np
import pytest

import rljax
from rljax import posttrain
from rljax import testing
from rljax.training import Trainer
from rljax.training import override

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
# The preset configs on the arithmetic task (smollm2_grpo loads a real model).
# The SmolLM2 configs load a real model (their own tests, slow).
# The post-training configs that start from another run's model, and OPD
# and GKD (SmolLM2 teachers), run in tests/posttrain/configs_test.py.
PRESETS = sorted(
  p.stem
  for p in CONFIGS.glob("[!_]*.py")
  if p.stem
  not in (
    "smollm2_grpo",
    "grpo_lora",
    "agent_python",
    "sft_grpo",
    "dpo",
    "online_dpo",
    "opd",
    "gkd",
  )
)


def _config(name, directory, *extra):
  return testing.tiny_run_config(
    CONFIGS / f"{name}.py", directory, "train.mesh=(1, 1, 1)", *extra
  )


def test_indivisible_batch_fails_before_anything_is_built(tmp_path):
  config = _config("grpo", tmp_path, "train.mesh=(8, 1, 1)")
  config = override(config, ["train.prompts_per_step=12"])
  with pytest.raises(
    ValueError, match=r"train.prompts_per_step has 12 rows.*multiple of 8"
  ):
    Trainer(config)


@pytest.mark.parametrize(
  "item,match",
  [
    ("sampler.num_samples=0", "sampler.num_samples=0: must be >= 1"),
    ("train.minibatches=3", "multiple of train.minibatches=3"),
    ("model.source=llama", "model.source='llama': must be one of"),
    ("output.directory=gs://b/run", "output.checkpoint_directory=gs://"),
  ],
)
def test_bad_settings_name_the_field(tmp_path, item, match):
  with pytest.raises(ValueError, match=match):
    Trainer(_config("grpo", tmp_path, item))


@pytest.mark.parametrize(
  "item,match",
  [
    ("train.reference_resets=(-1,)", "train.reference_resets=.*ints >= 0"),
    ("train.reference_resets=(1.5,)", "train.reference_resets=.*ints >= 0"),
    ("train.reference_resets=3", "expected a tuple for 'reference_resets'"),
  ],
)
def test_bad_reference_resets_name_the_field(tmp_path, item, match):
  with pytest.raises(ValueError, match=match):
    Trainer(_config("grpo", tmp_path, item))


@pytest.mark.slow  # default-run time; run with -m slow
def test_reference_resets_copy_the_policy_at_their_steps(tmp_path):
  config = _config(
    "grpo",
    tmp_path,
    "algorithm.kwargs.kl_coef=0.1",
    "train.reference_resets=(1,)",
  )
  # Rewarded by length, which varies within a group of a barely trained
  # model's samples: step 0 moves the policy whatever is sampled (the task's
  # reward can be 0 for every sample, and at step 0 KL has no gradient).
  length = lambda samples: np.asarray(samples.num_tokens, np.float32)
  trainer = Trainer(config, rewards=[("length", length, 1.0)])
  leaves = jax.tree.leaves
  start = [np.asarray(x) for x in leaves(trainer.state.policy.params)]
  trainer.step(0)
  after_0 = [np.asarray(x) for x in leaves(trainer.state.policy.params)]
  for ref, x in zip(leaves(trainer.state.reference), start):
    np.testing.assert_array_equal(ref, x)  # still the initial policy
  assert any(not np.array_equal(a, b) for a, b in zip(after_0, start))
  trainer.step(1)
  for ref, x in zip(leaves(trainer.state.reference), after_0):
    np.testing.assert_array_equal(ref, x)  # the policy as step 1 began
  # an algorithm without a reference cannot reset one
  with pytest.raises(ValueError, match="keeps no reference policy"):
    Trainer(_config("grpo", tmp_path / "b", "train.reference_resets=(1,)"))


def test_grpo_runs_and_writes_its_outputs(tmp_path):
  config = _config(
    "grpo",
    tmp_path,
    "train.steps=2",
    "output.rollouts_every=1",
    "output.plot=True",
    "output.checkpoint_every=2",
    f"output.checkpoint_directory={tmp_path / 'elsewhere'}",
  )
  trainer = Trainer(config)
  summary = trainer.run()
  assert len(summary["history"]) == 2
  last = summary["history"][-1]
  for key in ("reward", "accuracy", "loss", "kl", "entropy", "clip_frac"):
    assert np.isfinite(last[key]), key
  assert last["tokens"] > 0
  records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["step"] for r in records if "loss" in r] == [1, 2]
  rollouts = [json.loads(line) for line in open(tmp_path / "rollouts.jsonl")]
  assert {r["step"] for r in rollouts} == {1, 2}
  assert len(rollouts) == 2 * 8 * 4
  assert (tmp_path / "learning_curves.png").stat().st_size > 0
  assert trainer.checkpointer.all_steps() == [2]
  assert (tmp_path / "elsewhere" / "2").is_dir()
  report = trainer.dry_run()
  assert report["update_temp_mib"] > 0 and report["parameters"] > 1000
  assert np.isfinite(report["metrics"]["loss"])


def test_an_algorithm_built_in_code_is_the_one_trained(tmp_path):
  # The config names grpo; the trainer must trace the algorithm passed in.
  traced = []
  base = rljax.algorithms.cispo()

  def apply(terms, batch, state):
    traced.append(batch.mask_PGT.shape)
    return base.transform.apply(terms, batch, state)

  custom = base._replace(transform=base.transform._replace(apply=apply))
  config = _config("grpo", tmp_path, "train.steps=1")
  trainer = Trainer(config, algorithm=custom)
  assert trainer.algorithm is custom
  summary = trainer.run()
  assert any(shape[:2] == (8, 4) for shape in traced)  # the real batch
  assert np.isfinite(summary["history"][-1]["loss"])


@pytest.mark.slow  # three trainers: about a minute
def test_resume_equals_a_straight_run(tmp_path):
  straight = Trainer(_config("grpo", tmp_path / "a", "train.steps=4"))
  straight.run()
  common = ("train.steps=4", "output.checkpoint_every=1")
  first = Trainer(_config("grpo", tmp_path / "b", *common))
  first.run(steps=2)
  first.checkpointer.wait()
  resumed = Trainer(_config("grpo", tmp_path / "b", *common))
  assert resumed.start_step == 2
  summary = resumed.run()
  for a, b in zip(
    jax.tree.leaves(straight.state.policy.params),
    jax.tree.leaves(resumed.state.policy.params),
  ):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
  # The resumed run saw the same prompts: its last step's reward matches.
  straight_last = json.loads(
    (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()[-2]
  )
  assert summary["history"][-1]["reward"] == straight_last["reward"]


# Settings the tiny run's 4 samples per prompt need.
TINY_EXTRA = {
  "treepo": (
    "sampler.groups_kwargs={'branching': [2, 2], 'segment': 1, 'leaves': 4,"
    " 'divergence': 'even', 'fallback': 'random'}",
  ),
  "spo_tree": ("sampler.groups_kwargs={'branching': [2, 2], 'segment': 1}",),
  "brpo": ("sampler.num_samples=5",),  # one trace: 1 + 2 budgets x 2
}


@pytest.mark.slow  # every preset compiles its own loop: several minutes
@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_config_runs_two_steps(tmp_path, name):
  extra = TINY_EXTRA.get(name, ())
  config = _config(name, tmp_path, "train.steps=2", *extra)
  summary = posttrain.run_for(config)(config).run()
  assert len(summary["history"]) == 2
  assert all(np.isfinite(h["loss"]) for h in summary["history"])
