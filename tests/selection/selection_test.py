"""Prompt samplers: the default stream, allocation, and the trainer's use
of them (variable samples per prompt, checkpointed state)."""

import json
import pathlib

import grain
import jax
import numpy as np
import pytest

from rljax import selection
from rljax import testing
from rljax._src.errors import UserError
from rljax.training import Trainer

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "grpo.py"


def test_shuffled_is_grains_shuffled_repeated_stream():
  sampler = selection.Shuffled(num_samples=4)
  state = sampler.init(10, seed=3)
  want = grain.MapDataset.range(10).shuffle(seed=3).repeat()
  got = []
  for step in range(4):
    chosen, state = sampler.select(state, step, 6)
    np.testing.assert_array_equal(chosen.num_samples, 4)
    got += list(chosen.prompt_ids)
  assert got == [want[i] for i in range(24)]
  assert sorted(got[:10]) == list(range(10))  # one pass covers the set
  assert state["position"] == 24


def test_allocate_by_hand():
  # Budget 12 over weights 0, 1, 1, 2 with 1..6 each: shares 0, 3, 3, 6.
  np.testing.assert_array_equal(
    selection.allocate([0, 1, 1, 2], 12, 1, 6), [1, 3, 3, 5]
  )
  # Equal weights: equal counts; the budget's remainder by largest share.
  np.testing.assert_array_equal(selection.allocate([1] * 4, 8, 1, 8), [2] * 4)
  counts = selection.allocate([0.5, 0.3, 0.2], 10, 2, 10)
  assert counts.sum() == 10 and list(counts) == [5, 3, 2]
  # The cap binds: the rest goes to the others, never above `high`.
  counts = selection.allocate([10, 1, 1], 12, 1, 6)
  assert list(counts) == [6, 3, 3]
  with pytest.raises(ValueError, match="cannot give"):
    selection.allocate([1, 1], 3, 2, 4)


def test_uncertainty_gives_uncertain_prompts_more_samples():
  sampler = selection.Uncertainty(
    num_samples=4, min_samples=2, max_samples_per_prompt=8
  )
  state = sampler.init(4, seed=0)
  chosen, _ = sampler.select(state, 0, 4)
  np.testing.assert_array_equal(chosen.num_samples, 4)  # unseen: uniform
  # Prompt 0 always right, 1 always wrong, 2 and 3 half right.
  correct = np.array([[1] * 4, [0] * 4, [1, 0] * 2, [0, 1] * 2], bool)
  feedback = selection.Feedback(
    prompt_ids=np.arange(4),
    rewards=correct.astype(np.float32),
    correct=correct,
    lengths=np.ones((4, 4), np.int32),
    valid=np.ones((4, 4), bool),
    step=0,
  )
  state = sampler.update(state, feedback)
  np.testing.assert_allclose(state["alpha"], [5, 1, 3, 3])
  np.testing.assert_allclose(state["beta"], [1, 5, 3, 3])
  state["position"] = 0  # the same four prompts again
  chosen, _ = sampler.select(state, 1, 4)
  counts = dict(zip(chosen.prompt_ids, chosen.num_samples))
  # sqrt(p(1-p)): 0.373 for p = 5/6 or 1/6, 0.5 for p = 1/2; budget 16.
  assert counts[0] == counts[1] == 3 and counts[2] == counts[3] == 5
  assert chosen.num_samples.sum() == 16
  # Invalid samples do not count.
  half = feedback._replace(valid=np.arange(4)[None].repeat(4, 0) < 2)
  s2 = sampler.update(sampler.init(4, 0), half)
  np.testing.assert_allclose(s2["alpha"] + s2["beta"], 2 + 2)


def test_check_selection_names_the_sampler():
  bad = selection.Selection(np.array([0, 5]), np.array([2, 2]))
  with pytest.raises(ValueError, match="Mine chose prompt ids outside"):
    selection.check_selection(bad, 2, 5, 4, "Mine")
  bad = selection.Selection(np.array([0, 1]), np.array([2, 9]))
  with pytest.raises(ValueError, match=r"in \[1, max_samples=4\]"):
    selection.check_selection(bad, 2, 5, 4, "Mine")
  with pytest.raises(ValueError, match="unknown prompt sampler"):
    selection.get("nope")


class _Cycle(selection.PromptSampler):
  """Prompts 0, 1, 2, ... with 1..4 samples in turn; counts its updates."""

  max_samples = 4

  def init(self, num_prompts, seed):
    return {"next": 0, "updates": 0, "seen": np.zeros(num_prompts, np.int64)}

  def select(self, state, step, size):
    ids = (state["next"] + np.arange(size)) % len(state["seen"])
    counts = 1 + np.arange(size) % 4
    return selection.Selection(ids, counts), {**state, "next": ids[-1] + 1}

  def update(self, state, feedback):
    seen = np.array(state["seen"])
    np.add.at(seen, feedback.prompt_ids, feedback.valid.sum(-1))
    return {**state, "seen": seen, "updates": state["updates"] + 1}


@pytest.mark.slow  # minutes of CPU: the slow set
def test_trainer_samples_a_different_number_per_prompt(tmp_path):
  config = testing.tiny_run_config(
    CONFIG, tmp_path, "train.steps=2", "output.checkpoint_every=2"
  )
  trainer = Trainer(config, prompts=_Cycle())
  out = trainer.run()
  # 8 prompts x (1 + 2 + 3 + 4) / 4 samples per step.
  assert [h["samples"] for h in out["history"]] == [20.0, 20.0]
  assert trainer._last.rollout.tokens_PGT.shape[1] == 4
  np.testing.assert_array_equal(
    trainer._last.rollout.sample_mask_PG.sum(-1), [1, 2, 3, 4] * 2
  )
  state = trainer.prompt_state
  assert state["updates"] == 2 and state["seen"].sum() == 40
  # The state is checkpointed and restored with the train state.
  resumed = Trainer(config, prompts=_Cycle())
  assert resumed.start_step == 2
  np.testing.assert_array_equal(resumed.prompt_state["seen"], state["seen"])
  assert resumed.prompt_state["next"] == state["next"]


def test_static_engine_refuses_different_counts(tmp_path):
  config = testing.tiny_run_config(
    CONFIG, tmp_path, "train.steps=1", "sampler.engine='static'"
  )
  with pytest.raises(UserError, match="sampler.engine='continuous'"):
    Trainer(config, prompts=_Cycle()).run()


@pytest.mark.slow  # three short runs; the multi-host test covers it too
def test_uncertainty_sampler_resumes_exactly(tmp_path):
  run = (
    "sampler.prompts='uncertainty'",
    "sampler.prompts_kwargs={'max_samples_per_prompt': 8}",
    "output.checkpoint_every=2",
  )
  whole = Trainer(
    testing.tiny_run_config(CONFIG, tmp_path / "a", "train.steps=4", *run)
  )
  whole.run()
  part = Trainer(
    testing.tiny_run_config(CONFIG, tmp_path / "b", "train.steps=2", *run)
  )
  part.run()
  resumed = Trainer(
    testing.tiny_run_config(CONFIG, tmp_path / "b", "train.steps=4", *run)
  )
  assert resumed.start_step == 2
  resumed.run()
  for key in ("alpha", "beta"):
    np.testing.assert_array_equal(
      resumed.prompt_state[key], whole.prompt_state[key]
    )
  assert resumed.prompt_state["position"] == whole.prompt_state["position"]
  lines = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
  counts = [
    json.loads(x)["samples"] for x in lines if "samples" in json.loads(x)
  ]
  assert all(c <= 8 * 4 for c in counts)  # P x num_samples budget
  for a, b in zip(
    jax.tree.leaves(whole.state.policy.params),
    jax.tree.leaves(resumed.state.policy.params),
  ):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
