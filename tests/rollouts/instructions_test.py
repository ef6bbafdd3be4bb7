"""INSPO's instruction population: selection probabilities against numpy,
scores, pruning and proposals by hand, and one trainer step."""

import dataclasses
import pathlib
import re

import numpy as np
import pytest

from rljax import rollouts
from rljax import testing
from rljax.training import Trainer

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "inspo.py"


def _group(prompt_id, n=4):
  return rollouts.Group({}, "1+2=", prompt_id, n)


def _scores(rewards):
  rewards = np.asarray(rewards, np.float32)
  p, g = rewards.shape
  return rollouts.Scores(
    rewards=rewards,
    correct=rewards > 0,
    valid=np.ones((p, g), bool),
    members=[[rollouts.Member()] * g for _ in range(p)],
    completions=[[""] * g for _ in range(p)],
    surprise=np.zeros((p, g)),
  )


def test_probabilities_match_numpy_softmax():
  s = rollouts.InstructionPopulation(
    instructions=["a", "b", "c"], temperature=0.5
  )
  state = {
    "instructions": ["a", "b", "c"],
    "sums": [3.0, 0.0, 0.0],
    "counts": [4, 2, 0],
  }
  # weights: a 3/4, b 0, c unused -> the used mean (0.75 + 0) / 2 = 0.375
  w = np.array([0.75, 0.0, 0.375])
  want = np.exp(w / 0.5) / np.exp(w / 0.5).sum()
  np.testing.assert_allclose(s.weights(state), w)
  np.testing.assert_allclose(s.probabilities(state), want)
  # Hand-worked: e^1.5 = 4.4817, e^0 = 1, e^0.75 = 2.1170; sum 7.5987:
  # p = (0.5898, 0.1316, 0.2786).
  np.testing.assert_allclose(
    s.probabilities(state), [0.5898, 0.1316, 0.2786], atol=1e-4
  )


def test_plan_prefixes_and_trains_on_the_instruction():
  s = rollouts.InstructionPopulation(
    instructions=["0+", "1*"], template="{instruction}{prompt}"
  )
  state = s.init()
  plan = s.plan(_group(5), 3, state)
  # One instruction per question (the paper), drawn by the generator
  # seeded (seed, step, prompt id) from the uniform start.
  rng = np.random.default_rng([0, 3, 5])
  j = rng.choice(2, size=1, p=[0.5, 0.5])[0]
  want = ["0+", "1*"][j] + "1+2="
  assert [m.prompt for m in plan] == [want] * 4
  assert [m.train_prompt for m in plan] == [want] * 4
  assert {m.stream for m in plan} == {rollouts.INSTRUCTED}
  assert plan == s.plan(_group(5), 3, state)
  per_sample = rollouts.InstructionPopulation(
    instructions=["0+", "1*"], template="{instruction}{prompt}", per="sample"
  )
  idx = per_sample.choose(_group(5, 64), 0, state)
  assert len(idx) == 64 and set(idx) == {0, 1}


def test_update_scores_prunes_and_proposes():
  proposed = []

  def proposer(best, k):
    proposed.append((list(best), k))
    return [f"new{i}" for i in range(k)]

  s = rollouts.InstructionPopulation(
    instructions=["a", "b", "c"],
    prune_every=2,
    prune_k=1,
    proposer=proposer,
    per="sample",
  )
  state = s.init()
  groups = [_group(0, 4), _group(1, 4)]
  rewards = [[1.0, 0.0, 1.0, 1.0], [0.0, 0.5, 0.0, 1.0]]
  c0, c1 = s.choose(groups[0], 0, state), s.choose(groups[1], 0, state)
  sums, counts = np.zeros(3), np.zeros(3, int)
  for chosen, row in zip((c0, c1), rewards):
    for j, r in zip(chosen, row):
      sums[j] += r
      counts[j] += 1
  new = s.update(groups, _scores(rewards), 0, state)  # step 0: no pruning
  np.testing.assert_allclose(new["sums"], sums)
  assert new["counts"] == counts.tolist()
  assert new["instructions"] == ["a", "b", "c"] and not proposed
  # Hand-made state at step 1 (prune_every=2: after steps 1, 3, ...):
  # means a 0.5, b 0.9, c 0.1 (+ this step's zero rewards, which keep the
  # order) -> c leaves; the proposer sees the survivors best first.
  state = {
    "instructions": ["a", "b", "c"],
    "sums": [5.0, 9.0, 1.0],
    "counts": [10, 10, 10],
  }
  zero = _scores(np.zeros((2, 4)))
  new = s.update(groups, zero, 1, state)
  assert proposed == [(["b", "a"], 1)]
  assert new["instructions"] == ["a", "b", "new0"]
  assert new["sums"] == [5.0, 9.0, 0.0]
  chosen = np.concatenate([s.choose(g, 1, state) for g in groups])
  assert new["counts"] == [
    10 + int(np.sum(chosen == 0)),
    10 + int(np.sum(chosen == 1)),
    0,
  ]


def test_recombine_by_hand():
  # halves: "abcd" -> "ab" + second half of "wxyz" -> "yz"
  assert rollouts.recombine(["abcd", "wxyz"], 3) == ["abyz", "wxcd", "abyz"]
  assert rollouts.recombine(["0+"], 1) == ["0+"]
  with pytest.raises(ValueError, match="at least one"):
    rollouts.recombine([], 1)


def test_bad_input():
  with pytest.raises(ValueError, match="instructions"):
    rollouts.InstructionPopulation(instructions=[])
  with pytest.raises(ValueError, match="prune_k"):
    rollouts.InstructionPopulation(instructions=["a"], prune_k=1)
  with pytest.raises(ValueError, match="temperature"):
    rollouts.InstructionPopulation(instructions=["a", "b"], temperature=0)
  with pytest.raises(ValueError, match="template"):
    rollouts.InstructionPopulation(instructions=["a", "b"], template="{prompt}")
  s = rollouts.InstructionPopulation(
    instructions=["a", "b"], prune_every=1, proposer=lambda b, k: []
  )
  with pytest.raises(ValueError, match="proposer returned"):
    s.update([_group(0)], _scores(np.zeros((1, 4))), 0, s.init())


@pytest.mark.slow
def test_trainer_samples_with_instructions(tmp_path):
  config = testing.tiny_run_config(CONFIG, tmp_path, "train.steps=1")
  kwargs = dict(config.sampler.groups_kwargs, prune_every=1)
  config = dataclasses.replace(
    config, sampler=dataclasses.replace(config.sampler, groups_kwargs=kwargs)
  )
  trainer = Trainer(config)
  trainer.step(0)
  valid = np.asarray(trainer._last.rollout.sample_mask_PG) > 0
  streams = np.asarray(trainer._last.streams_PG)
  assert np.all(streams[valid] == rollouts.INSTRUCTED)
  # Every row trains on a seed instruction followed by the task's prompt.
  r = trainer._last.rollout
  tokens, mask = np.asarray(r.prompt_tokens_PGS), np.asarray(r.prompt_mask_PGS)
  for p, g in zip(*np.nonzero(valid)):
    text = trainer.tokenizer.decode(tokens[p, g][mask[p, g] > 0].tolist())
    assert re.search(r"(0\+|1\*|0\*|9-)\d+[-+*]\d+=$", text), text
  # Pruned after step 0 (prune_every=1): three of the seeds survive in
  # order, the fourth is a fresh recombination with no rewards yet; the
  # survivors keep their rewards; the pruned one took whole groups of 4
  # samples (one instruction per question) with it.
  state = trainer.groups_state
  seeds = ["0+", "1*", "0*", "9-"]
  survivors = state["instructions"][:3]
  assert survivors == [t for t in seeds if t in survivors]
  assert state["counts"][3] == 0 and state["sums"][3] == 0.0
  gone = int(valid.sum()) - sum(state["counts"])
  assert gone >= 0 and gone % 4 == 0
