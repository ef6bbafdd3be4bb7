"""HBPO's budget subgroups: the plan by hand, capped sampling, the
trainer's streams, and bad input."""

import pathlib

import jax
import numpy as np
import pytest

from rljax import models
from rljax import rollouts
from rljax import sampling
from rljax import testing
from rljax.tokenizers import Tokenizer
from rljax.training import Trainer
from rljax.training import _rollout
from rljax.transforms import _budgets as T_budgets

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
GROUP = rollouts.Group(
  example={"question": "1+2=", "answer": "3"},
  prompt="1+2=",
  prompt_id=0,
  num_samples=7,
)


def test_subgroup_sizes_by_hand():
  assert rollouts.subgroup_sizes(16, 4) == [4, 4, 4, 4]
  assert rollouts.subgroup_sizes(7, 3) == [3, 2, 2]
  assert rollouts.subgroup_sizes(2, 4) == [1, 1, 0, 0]


def test_plan_by_hand():
  s = rollouts.BudgetSubgroups(budgets=(2, 3, 5), template="{budget}*{prompt}")
  members = s.plan(GROUP, 0, s.init())
  # 7 samples over 3 budgets: 3, 2, 2; prompts "2*1+2=", "3*1+2=",
  # "5*1+2=", trained on the same text; streams 10, 11, 12; no cap.
  want = [("2*1+2=", 10)] * 3 + [("3*1+2=", 11)] * 2 + [("5*1+2=", 12)] * 2
  assert [(m.prompt, m.stream) for m in members] == want
  assert all(m.train_prompt == m.prompt for m in members)
  assert all(m.max_new_tokens is None for m in members)
  capped = rollouts.BudgetSubgroups(budgets=(2, 3, 5), cap=True)
  members = capped.plan(GROUP, 0, capped.init())
  assert [m.max_new_tokens for m in members] == [2, 2, 2, 3, 3, 5, 5]
  # The paper's prompt after the reasoning tag by default.
  assert members[0].prompt == (
    "1+2=<think> I will answer the question within 2 tokens"
  )
  # The transforms read the same streams (they do not import rollouts).
  assert rollouts.BUDGET_STREAM == T_budgets.BUDGET_STREAM == 10


def test_registered_by_name():
  s = rollouts.get("budget_subgroups", budgets=[1, 4])
  assert isinstance(s, rollouts.BudgetSubgroups) and s.budgets == (1, 4)


@pytest.mark.parametrize(
  "kwargs,match",
  [
    ({"budgets": ()}, "budgets"),
    ({"budgets": (0, 4)}, "budgets"),
    ({"budgets": (2.5,)}, "budgets"),
    ({"budgets": (4, 4)}, "strictly increasing"),
    ({"budgets": (8, 4)}, "strictly increasing"),
    ({"template": "{prompt} only"}, "template"),
  ],
)
def test_bad_input_is_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    rollouts.BudgetSubgroups(**kwargs)


def test_capped_subgroups_generate_within_their_budget():
  tokenizer = Tokenizer.from_characters("0123456789+-*=")
  config = models.ModelConfig(
    vocab_size=tokenizer.vocab_size,
    hidden_size=16,
    intermediate_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    max_position_embeddings=32,
  )
  model = testing.random_model(config, scale=0.1)  # rarely stops early
  s = rollouts.BudgetSubgroups(
    budgets=(1, 2, 4), template="{budget}*{prompt}", cap=True
  )
  group = GROUP._replace(num_samples=6)
  members = [s.plan(group, 0, s.init())]
  out = rollouts.sample_members(
    sampling.Engine(config, slots=6, page_size=4, segment=4, max_length=20),
    model,
    lambda texts: _rollout.encode_prompts(tokenizer, texts, 8),
    members,
    ["1+2="],
    key=jax.random.key(0),
    max_new_tokens=6,
    width=6,
    temperature=1.0,
    encode_completion=lambda t: tokenizer.encode(t, add_bos=False) + [1],
  )
  lengths = np.asarray(out.mask_PGT).sum(-1)[0]
  assert np.all(lengths <= [1, 1, 2, 2, 4, 4])
  assert lengths[4:].max() > 2  # the widest subgroup used its room


@pytest.mark.slow
def test_trainer_marks_the_subgroups_streams(tmp_path):
  config = testing.tiny_run_config(
    CONFIGS / "hbpo.py", tmp_path, "train.steps=1"
  )
  trainer = Trainer(config)
  trainer.step(0)
  streams = np.asarray(trainer._last.streams_PG)
  # 4 samples per prompt over 4 budgets: one sample each, streams 10..13.
  np.testing.assert_array_equal(streams, np.tile([10, 11, 12, 13], (8, 1)))
