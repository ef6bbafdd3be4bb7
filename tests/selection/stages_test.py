"""Stage schedules: prompts, sampler and generation budget per stage."""

import pathlib

import jax
import numpy as np
import pytest

from rljax import selection
from rljax import testing
from rljax.checkpointing import _json
from rljax.training import Trainer

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "grpo.py"

# Twelve examples of two "domains".
EXAMPLES = [{"op": "+" if i % 3 else "-", "i": i} for i in range(12)]
MINUS = [0, 3, 6, 9]


def test_stage_of_each_step():
  stages = selection.Stages([{"steps": 2}, {"steps": 3}, {}])
  assert [stages.stage(s) for s in range(8)] == [0, 0, 1, 1, 1, 2, 2, 2]
  assert selection.Stages([{}]).stage(10**6) == 0


def test_each_stage_selects_its_domain_with_its_budget():
  stages = selection.Stages(
    [
      selection.Stage(steps=2, where={"op": "-"}, max_new_tokens=3),
      selection.Stage(sampler=selection.Shuffled(num_samples=2)),
    ],
    num_samples=4,
  ).prepare(EXAMPLES)
  assert stages.max_samples == 4
  state = stages.init(len(EXAMPLES), seed=0)
  seen = []
  for step in range(2):
    chosen, state = stages.select(state, step, 4)
    assert set(chosen.prompt_ids) <= set(MINUS)
    seen += list(chosen.prompt_ids)
    np.testing.assert_array_equal(chosen.num_samples, 4)
    assert chosen.settings == {"max_new_tokens": 3}
  # Stage 0's own Shuffled stream over its four prompts: each once per pass.
  assert sorted(seen) == sorted(MINUS * 2)
  chosen, state = stages.select(state, 2, 12)
  assert sorted(chosen.prompt_ids) == list(range(12))  # every prompt
  np.testing.assert_array_equal(chosen.num_samples, 2)
  assert chosen.settings is None
  # Stage 0's position survives stage 1 (a stage keeps its own state).
  assert state["stages"][0]["position"] == 8
  assert state["stages"][1]["position"] == 12


def test_update_reaches_the_current_stage_in_its_own_ids():
  stages = selection.Stages(
    [
      {"steps": 1, "where": {"op": "-"}, "sampler": "uncertainty"},
      {"sampler": "uncertainty"},
    ],
    num_samples=2,
  ).prepare(EXAMPLES)
  state = stages.init(len(EXAMPLES), seed=0)
  chosen, state = stages.select(state, 0, 2)
  feedback = selection.Feedback(
    prompt_ids=chosen.prompt_ids,
    rewards=np.ones((2, 2), np.float32),
    correct=np.array([[True, True], [False, True]]),
    lengths=np.ones((2, 2), np.int32),
    valid=np.ones((2, 2), bool),
    step=0,
  )
  state = stages.update(state, feedback)
  inner = state["stages"][0]
  local = [MINUS.index(i) for i in chosen.prompt_ids]
  # Beta(1, 1) prior + 2 right / 1 right 1 wrong, at the stage's own index.
  np.testing.assert_array_equal(inner["alpha"][local], [3.0, 2.0])
  np.testing.assert_array_equal(inner["beta"][local], [1.0, 2.0])
  assert inner["alpha"].sum() == 4 + 3  # two others untouched at 1
  np.testing.assert_array_equal(state["stages"][1]["alpha"], np.ones(12))
  # The state is JSON (checkpoint metadata) and comes back equal.
  back = _json.decode(_json.encode(state, "prompt_state"))
  for k in ("alpha", "beta", "position"):
    np.testing.assert_array_equal(back["stages"][0][k], inner[k])


def test_bad_stages_are_named():
  with pytest.raises(ValueError, match="only the last stage"):
    selection.Stages([{}, {"steps": 2}])
  with pytest.raises(ValueError, match="is empty"):
    selection.Stages([])
  with pytest.raises(ValueError, match="max_new_tokens=0"):
    selection.Stages([{"max_new_tokens": 0}])
  either = selection.Stages([{"where": {"i": [1, 2, 9]}}]).prepare(EXAMPLES)
  np.testing.assert_array_equal(either.ids[0], [1, 2, 9])  # a list: any
  with pytest.raises(ValueError, match="matches no training prompt"):
    selection.Stages([{"where": {"op": "*"}}]).prepare(EXAMPLES)
  with pytest.raises(ValueError, match="call stages.prepare"):
    selection.Stages([{"where": {"op": "-"}}]).init(12, 0)
  chosen = selection.Selection(
    np.array([0]), np.array([1]), {"max_new_tokens": 9}
  )
  with pytest.raises(ValueError, match="sampler.max_new_tokens=4"):
    selection.check_selection(chosen, 1, 5, 4, "Stages", 4)
  chosen = chosen._replace(settings={"top_k": 2})
  with pytest.raises(ValueError, match="may set"):
    selection.check_selection(chosen, 1, 5, 4, "Stages", 4)
  chosen = chosen._replace(settings={"temperature": 0.0})
  with pytest.raises(ValueError, match="temperature=0.0"):
    selection.check_selection(chosen, 1, 5, 4, "Stages", 4)
  with pytest.raises(ValueError, match="temperature=-1"):
    selection.Stages([{"temperature": -1}])


@pytest.mark.slow  # two trainer steps; configs/cascade_rl.py runs too
def test_trainer_runs_the_stages(tmp_path):
  stages = (
    "task.kwargs.operations=('+', '-')",
    "sampler.prompts='stages'",
    "sampler.prompts_kwargs={'stages': [{'steps': 1, 'where': {'op': '-'},"
    " 'max_new_tokens': 2}, {'where': {'op': '+'}, 'temperature': 0.5}]}",
  )
  config = testing.tiny_run_config(
    CONFIG, tmp_path, "train.steps=2", "train.epochs=2", *stages
  )
  trainer = Trainer(config)
  captured = []
  with_old = trainer._with_old

  def capture(batch, seqs=None):
    out = with_old(batch, seqs)
    if seqs is not None:
      captured.append(jax.device_get(out))
    return out

  trainer._with_old = capture
  width = config.sampler.max_new_tokens
  trainer.step(0)
  first = trainer._last
  assert {e["op"] for e in first.examples} == {"-"}
  # The stage's budget of 2 tokens, in a rollout as wide as the config's.
  assert first.rollout.tokens_PGT.shape[-1] == width
  assert first.rollout.mask_PGT.sum(-1).max() <= 2
  assert trainer._temperature == config.sampler.temperature
  trainer.step(1)
  assert {e["op"] for e in trainer._last.examples} == {"+"}
  assert trainer._last.rollout.mask_PGT.sum(-1).max() > 2
  # Stage 2 samples at 0.5 and scores at 0.5: the trainer's recomputed
  # old log-probs (train.epochs=2 needs them) equal the sampler's
  # full-distribution ones at the same weights.
  assert trainer._temperature == 0.5
  np.testing.assert_allclose(
    captured[-1].old_logp_PGT * np.asarray(trainer._last.rollout.mask_PGT),
    np.asarray(trainer._last.rollout.full_logp_PGT),
    atol=1e-3,
  )
