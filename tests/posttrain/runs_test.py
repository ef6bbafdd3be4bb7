"""The post-training runs end to end on a tiny scratch model: SFT (packing,
exact resume, export), offline and online preference runs (the reference
cache, KTO), the CLI and dry run of each kind."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from rljax import posttrain
from rljax import tasks
from rljax._src.errors import UserError
from rljax.launch import _cli
from rljax.training import AlgorithmSpec
from rljax.training import DataSpec
from rljax.training import ModelSpec
from rljax.training import OptimSpec
from rljax.training import OutputSpec
from rljax.training import RunConfig
from rljax.training import SamplerSpec
from rljax.training import TaskSpec
from rljax.training import TrainSpec
from rljax.training import _build


def _config(tmp_path, kind="sft", **sections) -> RunConfig:
  config = RunConfig(
    kind=kind,
    model=ModelSpec(
      hidden_size=32,
      num_layers=1,
      num_heads=2,
      num_kv_heads=1,
      intermediate_size=64,
      max_position_embeddings=32,
    ),
    task=TaskSpec(
      name="arithmetic",
      kwargs={"digits": 1, "prompt_style": "bare"},
      max_prompt_tokens=6,
    ),
    sampler=SamplerSpec(num_samples=4, max_new_tokens=4),
    optim=OptimSpec(learning_rate=1e-2),
    train=TrainSpec(steps=2, prompts_per_step=16, eval_prompts=8),
    data=DataSpec(source="task", max_length=24, rows=8),
    output=OutputSpec(
      directory=str(tmp_path / "run"),
      rollouts_every=0,
      tensorboard=False,
      plot=False,
    ),
  )
  return dataclasses.replace(config, **sections)


def _params(run):
  return [np.asarray(x) for x in jax.tree.leaves(run.state.policy.params)]


@pytest.mark.slow  # default-run time; run with -m slow
def test_packing_and_sharding_change_the_cost_not_the_update(tmp_path):
  packed = posttrain.SFTRun(_config(tmp_path))
  padded_config = _config(tmp_path / "b")
  padded_config = dataclasses.replace(
    padded_config,
    data=dataclasses.replace(padded_config.data, packing=False),
  )
  padded = posttrain.SFTRun(padded_config)
  a, b = packed.step(0), padded.step(0)
  assert a["blocks"] < b["blocks"]  # 16 examples in 1 block, not 2
  assert a["packing_efficiency"] > b["packing_efficiency"]
  np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
  assert a["tokens"] == b["tokens"] > 0
  for x, y in zip(_params(packed), _params(padded)):
    np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-6)
  # Sharded over 8 devices or on one: the same update.
  one = _config(tmp_path / "c")
  one = dataclasses.replace(
    one, train=dataclasses.replace(one.train, mesh=(1, 1, 1))
  )
  single = posttrain.SFTRun(one)
  assert single.step(0)["loss"] == pytest.approx(a["loss"], rel=1e-5)
  for x, y in zip(_params(packed), _params(single)):
    np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-6)


@pytest.mark.slow  # default-run time; run with -m slow
def test_sft_learns_and_resumes_exactly(tmp_path):
  config = _config(tmp_path)
  config = dataclasses.replace(
    config,
    train=dataclasses.replace(config.train, steps=4),
    output=dataclasses.replace(config.output, checkpoint_every=1),
  )
  whole = posttrain.SFTRun(config, resume=False)
  summary = whole.run()
  losses = [h["loss"] for h in summary["history"]]
  assert losses[-1] < losses[0]
  # The exported model loads as a checkpoint source.
  assert (tmp_path / "run" / "model" / "config.json").exists()
  half = dataclasses.replace(
    config,
    output=dataclasses.replace(config.output, directory=str(tmp_path / "half")),
  )
  first = posttrain.SFTRun(half, resume=False)
  first.run(steps=2)
  first.checkpointer.close()
  second = posttrain.SFTRun(half)
  assert second.start_step == 2
  second.run()
  for x, y in zip(_params(whole), _params(second)):
    np.testing.assert_array_equal(x, y)


def _pairs(n=32):
  """Right answers against wrong ones, for 1-digit sums."""
  out = []
  for i in range(n):
    a, b = i % 10, (3 * i) % 10
    out.append(
      {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)}
    )
  return out


def test_dpo_offline_caches_the_reference(tmp_path):
  config = _config(
    tmp_path,
    kind="preference",
    algorithm=AlgorithmSpec(name="dpo", kwargs={"beta": 0.5}),
  )
  # A pair whose chosen and rejected are the same is dropped and counted.
  same = {"prompt": "1+1=", "chosen": "2", "rejected": "2"}
  run = posttrain.PreferenceRun(config, records=[*_pairs(), same])
  assert run.records == _pairs()
  before = run.evaluate_pairs(_pairs(8))
  out = [run.step(s) for s in range(4)]
  assert all(np.isfinite(m["loss"]) for m in out)
  assert all(m["pairs_dropped_identical"] == 1.0 for m in out)
  assert out[0]["loss"] == pytest.approx(np.log(2.0), abs=1e-4)
  assert len(run.ref_cache) == 32  # 4 steps x 16 pairs: every record
  ids = np.array(sorted(run.ref_cache))
  block, _ = run._offline_block(ids[:8], [run.records[i] for i in ids[:8]])
  # The cache holds what the frozen reference gives now.
  fresh = run.reference_logps(block.tokens_PGL, block.mask_PGL)
  # Cached from 16-row batches, fresh from 8 rows: float32 reductions in
  # another order, ~n * eps32 * |logit| a token, summed over 4 tokens.
  np.testing.assert_allclose(block.ref_logp_PG, fresh, rtol=1e-5, atol=1e-4)
  after = run.evaluate_pairs(_pairs(8))
  assert before["eval_reward_accuracy"] == 0.0  # no margin yet
  assert after["eval_reward_margin"] > before["eval_reward_margin"]


@pytest.mark.slow  # each builds its own run; dpo, kto, tgdpo run by default
@pytest.mark.parametrize("loss", ["ipo", "simpo", "orpo", "cpo", "robust_dpo"])
def test_each_paired_loss_trains(tmp_path, loss):
  kwargs = {"label_smoothing": 0.1} if loss == "robust_dpo" else {}
  config = _config(
    tmp_path, kind="preference", algorithm=AlgorithmSpec(loss, kwargs)
  )
  run = posttrain.PreferenceRun(config, records=_pairs(16))
  assert run.state.reference is not None or loss in ("simpo", "orpo", "cpo")
  metrics = run.step(0)
  assert np.isfinite(metrics["loss"]) and metrics["pairs"] == 16


@pytest.mark.slow  # default-run time; run with -m slow
def test_kto_on_unbalanced_unpaired_records(tmp_path):
  records = [
    {"prompt": r["prompt"], "completion": r[key], "label": key == "chosen"}
    for r in _pairs(16)
    for key in ("chosen", "chosen", "chosen", "rejected")
  ]
  config = _config(
    tmp_path,
    kind="preference",
    algorithm=AlgorithmSpec("kto", {"undesirable_weight": 2.5}),
  )
  run = posttrain.PreferenceRun(config, records=records)
  metrics = run.step(0)
  assert np.isfinite(metrics["loss"]) and metrics["kl_reference_point"] >= 0


@pytest.mark.slow  # default-run time; run with -m slow
def test_online_dpo_samples_and_pairs(tmp_path):
  config = _config(
    tmp_path,
    kind="preference",
    algorithm=AlgorithmSpec("dpo", {"min_margin": 0.5}),
    data=DataSpec(source="online"),
  )
  run = posttrain.PreferenceRun(config)
  metrics = run.step(0)
  assert 0.0 <= metrics["pairs_kept"] <= 1.0
  assert metrics["pairs"] == metrics["pairs_kept"] * 16


def test_bad_preference_data_is_one_line(tmp_path):
  config = _config(tmp_path, kind="preference", algorithm=AlgorithmSpec("dpo"))
  with pytest.raises(UserError, match="trains on pair records"):
    posttrain.PreferenceRun(
      config, records=[{"prompt": "1+1=", "completion": "2"}]
    )
  bad = _config(tmp_path, kind="preference", algorithm=AlgorithmSpec("nope"))
  with pytest.raises(UserError, match="algorithm.name='nope'"):
    posttrain.PreferenceRun(bad, records=_pairs())


KINDS = {
  "sft": [],
  "preference": ["algorithm.name=dpo"],
  "distill": [
    "algorithm.name=gkd",
    "teacher.source=scratch",
    "teacher.hidden_size=32",
    "teacher.num_heads=2",
    "teacher.num_kv_heads=1",
  ],
}


def _cli_args(tmp_path, kind):
  """CLI arguments for a tiny run of `kind` (pairs on disk for DPO)."""
  pairs = tmp_path / "pairs.jsonl"
  pairs.write_text("".join(json.dumps(r) + "\n" for r in _pairs()))
  file = tmp_path / "cfg.py"
  file.write_text(
    "from rljax.training import RunConfig\n"
    "def get_config():\n  return RunConfig()\n"
  )
  extra = [f"data.source=jsonl:{pairs}"] if kind == "preference" else []
  return [
    "--config",
    str(file),
    f"kind={kind}",
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "task.kwargs={'digits': 1, 'prompt_style': 'bare'}",
    "task.max_prompt_tokens=6",
    "sampler.num_samples=2",
    "sampler.max_new_tokens=4",
    "train.prompts_per_step=8",
    "train.eval_prompts=8",
    "train.steps=1",
    "data.rows=8",
    "output.tensorboard=False",
    "output.plot=False",
    f"output.directory={tmp_path / kind}",
    *KINDS[kind],
    *extra,
  ]


@pytest.mark.parametrize("kind", KINDS)
def test_cli_dry_runs_each_kind(tmp_path, capsys, kind):
  assert _cli.main([*_cli_args(tmp_path, kind), "--dry_run"]) == 0
  printed = capsys.readouterr().out
  assert '"step_seconds_with_compile"' in printed
  assert '"update_temp_mib"' in printed


@pytest.mark.slow  # a whole run (with evaluations) of each kind
@pytest.mark.parametrize("kind", KINDS)
def test_cli_runs_each_kind(tmp_path, capsys, kind):
  assert _cli.main(_cli_args(tmp_path, kind)) == 0
  assert "eval accuracy" in capsys.readouterr().out


def test_cli_refuses_an_unknown_kind(tmp_path, capsys):
  file = tmp_path / "cfg.py"
  file.write_text(
    "from rljax.training import RunConfig\n"
    "def get_config():\n  return RunConfig()\n"
  )
  assert _cli.main(["--config", str(file), "kind=nope"]) == 2
  assert "kind='nope'" in capsys.readouterr().err


def _twin(config, seed=0):
  """A model built like the run's policy (the same weights at seed 0)."""
  task = tasks.get(config.task.name, **config.task.kwargs)
  return _build.build_policy(config.model, task.alphabet, seed)[0]


@pytest.mark.slow  # default-run time; run with -m slow
def test_gkd_is_zero_at_teacher_equal_student_and_samples(tmp_path):
  config = _config(
    tmp_path,
    kind="distill",
    algorithm=AlgorithmSpec("gkd", {"beta": 0.5, "lmbda": 0.0}),
  )
  run = posttrain.DistillRun(config, teacher=_twin(config))
  out = run.step(0)
  assert out["on_policy"] == 0.0 and out["tokens"] > 0
  assert abs(out["loss"]) < 1e-6 and out["gkd_top1_agreement"] == 1.0
  on = dataclasses.replace(
    config,
    algorithm=AlgorithmSpec("gkd", {"beta": 1.0, "lmbda": 1.0}),
    output=dataclasses.replace(config.output, directory=str(tmp_path / "on")),
  )
  run = posttrain.DistillRun(on, teacher=_twin(config, seed=1))
  out = run.step(0)
  assert out["on_policy"] == 1.0 and out["loss"] > 0.0


@pytest.mark.slow  # default-run time; run with -m slow
def test_tgdpo_reads_the_teacher_as_its_token_reward_model(tmp_path):
  config = _config(
    tmp_path, kind="preference", algorithm=AlgorithmSpec("tgdpo")
  )
  with pytest.raises(UserError, match="teacher"):
    posttrain.PreferenceRun(config, records=_pairs(16))
  run = posttrain.PreferenceRun(
    config, records=_pairs(16), teacher=_twin(config, seed=1)
  )
  out = run.step(0)
  assert out["loss"] == pytest.approx(np.log(2.0), abs=1e-4)


@pytest.mark.slow  # default-run time; run with -m slow
def test_apo_extrapolates_at_a_reference_reset(tmp_path):
  config = _config(
    tmp_path,
    kind="preference",
    algorithm=AlgorithmSpec("dpo", {"apo_alpha": 0.5}),
    train=TrainSpec(
      steps=2, prompts_per_step=16, eval_prompts=8, reference_resets=(1,)
    ),
  )
  run = posttrain.PreferenceRun(config, records=_pairs())
  start = _params(run)
  run.step(0)
  after = _params(run)
  run._reset_reference()
  for x0, x1, new, ref in zip(
    start, after, _params(run), jax.tree.leaves(run.state.reference)
  ):
    np.testing.assert_allclose(new, x1 + 0.5 * (x1 - x0), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(ref), new)
  assert not run.ref_cache  # the old reference's log-probs are gone
