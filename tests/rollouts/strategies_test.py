"""Group strategies: members sampled as asked, the seed papers' plans and
revisions by hand, and the trainer's rounds."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import envs
from rljax import models
from rljax import rollouts
from rljax import sampling
from rljax import testing
from rljax.training import Trainer
from rljax.training import _rollout

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "grpo.py"
ALPHABET = "0123456789+-=ab"


def _engine(model):
  return sampling.Engine(
    model.config, slots=4, page_size=4, segment=4, max_length=24
  )


def _sample(model, tokenizer, members, prompts, key=0):
  def encode(texts):
    return _rollout.encode_prompts(tokenizer, texts, 8)

  return rollouts.sample_members(
    _engine(model),
    model,
    encode,
    members,
    prompts,
    key=jax.random.key(key),
    max_new_tokens=5,
    width=6,
    temperature=1.0,
    encode_completion=lambda t: tokenizer.encode(t, add_bos=False) + [1],
  )


def test_members_are_sampled_as_asked(model, tokenizer):
  M = rollouts.Member
  members = [
    [M(), M(), M(prompt="ab1+2=", train_prompt="1+2=", temperature=3.0)],
    [M(completion="42"), M(), None],
  ]
  out = _sample(model, tokenizer, members, ["1+2=", "3+4="])
  assert out.tokens_PGT.shape == (2, 3, 6)
  np.testing.assert_array_equal(out.sample_mask_PG, [[1, 1, 1], [1, 1, 0]])
  # Every sample's prompt tokens are its train prompt, left-padded.
  train = _rollout.encode_prompts(tokenizer, ["1+2=", "3+4="], 8)[0]
  np.testing.assert_array_equal(out.prompt_tokens_PGS[0, 2], train[0])
  np.testing.assert_array_equal(out.prompt_tokens_PGS[1, 0], train[1])
  # The given completion: its ids and the stop id, behaviour log-prob 0.
  ids = tokenizer.encode("42", add_bos=False) + [1]
  np.testing.assert_array_equal(out.tokens_PGT[1, 0, :3], ids)
  np.testing.assert_array_equal(out.mask_PGT[1, 0], [1, 1, 1, 0, 0, 0])
  assert np.all(out.logp_PGT[1, 0] == 0)
  # A sampled member = the engine's own samples of that prompt: sample
  # (0, 2) is the only sample of its sampling prompt ("ab1+2=", the
  # group's second distinct (prompt, budget) in sorted order after
  # "1+2=", so key fold_in(k_0, 1)), at its temperature.
  engine = _engine(model)
  k0 = jax.random.fold_in(jax.random.key(0), 0)
  [alone] = engine.add(
    tokenizer.encode("ab1+2="),
    key=jax.random.fold_in(k0, 1),
    max_new_tokens=5,
    temperature=3.0,
  )
  engine.run(model)
  n = len(alone.completion)
  np.testing.assert_array_equal(out.tokens_PGT[0, 2, :n], alone.completion)
  # Batched with the group or alone: the float32 forward's reductions (over
  # hidden, MLP and attended positions, n <= 64) may be ordered differently,
  # ~n * eps32 * |logit| apart; a wrong token is off by far more.
  np.testing.assert_allclose(out.logp_PGT[0, 2, :n], alone.logp, atol=2e-5)
  assert out.mask_PGT[0, 2].sum() == n
  # Deterministic for a fixed key.
  again = _sample(model, tokenizer, members, ["1+2=", "3+4="])
  np.testing.assert_array_equal(again.tokens_PGT, out.tokens_PGT)


def test_splice_takes_the_given_samples():
  a = sampling.Rollout(*(np.zeros((2, 2, 3)) for _ in sampling.Rollout._fields))
  b = sampling.Rollout(*(np.ones((2, 2, 3)) for _ in sampling.Rollout._fields))
  out = rollouts.splice(a, b, [(1, 0)])
  np.testing.assert_array_equal(out.tokens_PGT[:, :, 0], [[0, 0], [1, 0]])


def _group(n=4, **example):
  return rollouts.Group({"answer": "7", "index": 3, **example}, "3+4=", 3, n)


def _scores(correct, members=None, rewards=None, surprise=None):
  correct = np.asarray(correct, bool)
  p, g = correct.shape
  members = members or [[rollouts.Member()] * g for _ in range(p)]
  return rollouts.Scores(
    rewards=correct.astype(np.float32) if rewards is None else rewards,
    correct=correct,
    valid=np.ones((p, g), bool),
    members=members,
    completions=[[f"c{i}{j}" for j in range(g)] for i in range(p)],
    surprise=np.zeros((p, g)) if surprise is None else surprise,
  )


def test_privileged_context_plans_off_policy_members():
  s = rollouts.PrivilegedContext(context="doc", num_privileged=2)
  plan = s.plan(_group(doc="rules"), 0, {})
  assert plan[:2] == [rollouts.Member()] * 2
  assert plan[2] == rollouts.Member(
    prompt="rules\n3+4=", train_prompt="3+4=", stream=rollouts.PRIVILEGED
  )
  assert s.plan(_group(), 0, {}) == [rollouts.Member()] * 4  # no doc
  # At least one on-policy sample stays.
  assert sum(m.stream for m in s.plan(_group(2, doc="d"), 0, {})) == 1
  with pytest.raises(ValueError, match="position"):
    rollouts.PrivilegedContext(position="middle")


def test_icpo_demonstrations_are_other_solved_examples():
  examples = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(5)]
  demo = rollouts.icpo_demonstrations(
    examples, lambda e: e["question"] + "=", num_demos=2
  )
  assert demo({"question": "3+1", "index": 3}) == "4+1=5\n0+1=1"
  bound = rollouts.InContextDemos().prepare(
    type(
      "Task",
      (),
      {
        "train": examples,
        "format_prompt": staticmethod(lambda e: e["question"] + "="),
      },
    )
  )
  plan = bound.plan(
    rollouts.Group(examples[0] | {"index": 0}, "0+1=", 0, 8), 0, {}
  )
  assert plan[-1].prompt == "1+1=2\n0+1=" and plan[-1].train_prompt == "0+1="
  assert [m.stream for m in plan] == [0] * 7 + [1]


def test_temperature_stream_follows_the_entropy():
  s = rollouts.TemperatureStream(num_extra=2, target=0.5, high=1.2, low=0.8)
  state = s.init()
  plan = s.plan(_group(), 0, state)
  assert [m.temperature for m in plan] == [None, None, 1.2, 1.2]
  assert [m.stream for m in plan] == [0, 0, 4, 4]
  # Entropy = mean surprise of the plain samples only: (0.2 + 0.4) / 2.
  members = [plan]
  surprise = np.array([[0.2, 0.4, 9.0, 9.0]])
  state = s.update(
    [_group()], _scores([[0, 0, 0, 0]], members, surprise=surprise), 0, state
  )
  assert state["entropy"] == pytest.approx(0.3)
  assert s.plan(_group(), 1, state)[2].temperature == 1.2  # 0.3 < 0.5
  state = {"entropy": 0.7}
  assert s.plan(_group(), 1, state)[2].temperature == 0.8


def test_tiered_hints_only_for_groups_that_all_failed():
  s = rollouts.TieredHints(
    hints=("h1", "h2"),
    exempt_steps=2,
    num_replaced=1,
    template="{prompt}{hint}",
  )
  groups = [_group(h1="a", h2="b"), _group(h1="a")]
  scores = _scores([[0, 0, 0, 0], [0, 1, 0, 0]])
  assert s.revise(groups, scores, 1, 0, {}) == {}  # exempt
  out = s.revise(groups, scores, 2, 0, {})
  assert list(out) == [(0, 3)]  # the last failed sample of group 0 only
  assert out[(0, 3)] == rollouts.Member(
    prompt="3+4=a",
    train_prompt="3+4=a",
    stream=rollouts.HINTED,
    only_if_correct=True,
  )
  assert s.revise(groups, scores, 2, 1, {})[(0, 3)].prompt == "3+4=b"
  plain = rollouts.TieredHints(hints=("h1",), train_on="plain", exempt_steps=0)
  out = plain.revise(groups, scores, 0, 0, {})
  assert out[(0, 3)].train_prompt == "3+4="


def test_solution_hints_reveal_more_each_round():
  s = rollouts.SolutionHints(solution="sol", template="{prompt}|{hint}")
  assert s.hint("abcdefgh", 0) == "ab"  # round(0.25 * 8)
  assert s.hint("abcdefgh", 2) == "abcdef"
  groups = [_group(2, sol="abcdefgh"), _group(2, sol="xy")]
  out = s.revise(groups, _scores([[0, 0], [1, 0]]), 0, 1, {})
  assert sorted(out) == [(0, 0), (0, 1)]  # the whole failed group
  assert out[(0, 0)].prompt == out[(0, 0)].train_prompt == "3+4=|abcd"
  with pytest.raises(ValueError, match="must increase"):
    rollouts.SolutionHints(fractions=(0.5, 0.25))


def test_inject_answer_always_or_when_nothing_succeeded():
  always = rollouts.InjectAnswer()
  plan = always.plan(_group(3), 0, {})
  assert plan[-1] == rollouts.Member(completion="7", stream=rollouts.INJECTED)
  assert plan[:2] == [rollouts.Member()] * 2
  anchor = rollouts.InjectAnswer(when="no_success")
  assert anchor.plan(_group(3), 0, {}) == [rollouts.Member()] * 3
  out = anchor.revise(
    [_group(2), _group(2)], _scores([[0, 0], [0, 1]]), 0, 0, {}
  )
  assert out == {(0, 1): rollouts.Member(completion="7", stream=3)}


def test_replay_stores_successes_and_replays_them():
  s = rollouts.ReplaySuccesses(buffer_size=2)
  state = s.init()
  groups = [_group(2)]
  # Successes (reward > 0.1) are stored, first in first out, per prompt.
  for k, rewards in enumerate([[1.0, 0.0], [0.05, 0.5], [0.9, 0.0]]):
    scores = _scores([[r > 0 for r in rewards]], rewards=np.array([rewards]))
    scores = scores._replace(completions=[[f"s{k}a", f"s{k}b"]])
    state = s.update(groups, scores, k, state)
  assert state["buffers"] == {"3": ["s1b", "s2a"]}
  # A group with std < 0.05 and mean < 0.2 gets one in its first slot.
  failed = _scores([[0, 0]], rewards=np.array([[0.1, 0.1]]))
  out = s.revise(groups, failed, 5, 0, state)
  assert list(out) == [(0, 0)] and out[(0, 0)].completion in ("s1b", "s2a")
  assert out == s.revise(groups, failed, 5, 0, state)  # deterministic
  mixed = _scores([[0, 1]], rewards=np.array([[0.0, 1.0]]))
  assert s.revise(groups, mixed, 5, 0, state) == {}
  # Replayed samples are not stored again.
  replayed = failed._replace(
    members=[[rollouts.Member(completion="x", stream=3), rollouts.Member()]],
    rewards=np.array([[1.0, 0.0]]),
  )
  assert s.update(groups, replayed, 6, state) == state


@pytest.mark.slow  # three trainers; test_bad_strategies_are_named runs one
def test_trainer_runs_rounds_and_marks_streams(tmp_path):
  # Hints that give the answer away: every all-failed group gets a hinted
  # sample, kept only when it is correct.
  hints = rollouts.TieredHints(
    hints=(lambda e: e["answer"],), exempt_steps=0, template="{prompt}{hint}"
  )
  config = testing.tiny_run_config(
    CONFIG,
    tmp_path,
    "train.steps=2",
    "task.max_prompt_tokens=10",
    "output.checkpoint_every=1",
  )
  trainer = Trainer(config, groups=hints)
  trainer.step(0)
  scored = trainer._last
  streams = scored.streams_PG
  correct = np.asarray(scored.scores.values_NK)[:, 0].reshape(streams.shape) > 0
  # A hinted sample is in the batch only where it is correct.
  assert np.all(correct[streams == rollouts.HINTED])
  # Prompt tokens of hinted samples hold the hint (trained on it).
  wide = scored.rollout.prompt_mask_PGS.sum(-1)
  assert np.all(wide[streams == rollouts.HINTED] > wide[streams == 0].min())
  # A strategy's state is checkpointed and restored.
  replay = rollouts.ReplaySuccesses(mean_below=2.0, std_below=9.0)
  trainer = Trainer(
    testing.tiny_run_config(
      CONFIG, tmp_path / "r", "train.steps=1", "task.max_prompt_tokens=10"
    ),
    groups=replay,
  )
  trainer.run()
  assert (
    Trainer(
      testing.tiny_run_config(
        CONFIG, tmp_path / "r", "train.steps=1", "task.max_prompt_tokens=10"
      ),
      groups=replay,
    ).groups_state
    == trainer.groups_state
  )


def test_bad_strategies_are_named(tmp_path):
  class Short(rollouts.GroupStrategy):
    def plan(self, group, step, state):
      return [rollouts.Member()]

  config = testing.tiny_run_config(CONFIG, tmp_path, "train.steps=1")
  with pytest.raises(Exception, match="Short.plan returned 1 members"):
    Trainer(config, groups=Short()).step(0)
  with pytest.raises(ValueError, match="unknown group strategy"):
    rollouts.get("nope")
  static = testing.tiny_run_config(
    CONFIG, tmp_path / "s", "train.steps=1", "sampler.engine='static'"
  )
  with pytest.raises(Exception, match="sampler.engine='continuous'"):
    Trainer(static, groups=rollouts.InjectAnswer())


@pytest.mark.slow  # minutes of CPU: the slow set
def test_tree_leaves_share_their_ancestors_segments(model):
  engine = sampling.Engine(
    model.config,
    slots=4,
    page_size=4,
    segment=4,
    max_length=24,
    stop_ids=(3, 4, 5),  # frequent stops: some branches end early
  )
  prompts = [[7, 8, 9], [10, 11], [12, 13, 14, 15]]
  out, tree = rollouts.sample_trees(
    engine,
    model,
    prompts,
    key=jax.random.key(1),
    branching=(2, 2, 2),
    segment=2,
    max_new_tokens=8,
    width=9,
    temperature=1.5,
  )
  assert out.tokens_PGT.shape == (3, 8, 9) and tree.shape == (3, 8, 3)
  for p in range(3):
    n = int(out.sample_mask_PG[p].sum())
    assert n >= 2 and np.all(out.sample_mask_PG[p, :n] == 1)
    assert np.all(tree[p, n:] == -1)
    for a in range(n):
      length = int(out.mask_PGT[p, a].sum())
      depth = int((tree[p, a] >= 0).sum())
      # A leaf above the last depth ended with a stop id in its segment.
      if depth < 3:
        assert out.tokens_PGT[p, a, length - 1] in (3, 4, 5)
      assert length <= 8
      for b in range(a + 1, n):
        shared = int(np.sum((tree[p, a] == tree[p, b]) & (tree[p, a] >= 0)))
        # Leaves with d common ancestors share d segments (2 tokens each)
        # and then differ in which node they are at depth d + 1.
        k = 2 * shared
        np.testing.assert_array_equal(
          out.tokens_PGT[p, a, :k], out.tokens_PGT[p, b, :k]
        )
        assert shared < 3
    # Each leaf's log-probs are the model's at its sampling temperature.
    for a in range(n):
      length = int(out.mask_PGT[p, a].sum())
      seq = jnp.asarray(prompts[p] + out.tokens_PGT[p, a, :length].tolist())
      logp, _ = models.token_logprobs(
        model, seq[None], jnp.ones((1, len(seq))), temperature=1.5
      )
      np.testing.assert_allclose(
        out.full_logp_PGT[p, a, :length],
        np.asarray(logp[0, len(prompts[p]) :]),
        atol=1e-4,
      )
  assert engine.pages_in_use() == 0  # every node released


@pytest.mark.slow  # a trainer step; sample_trees has its own test
def test_trainer_samples_trees(tmp_path):
  config = testing.tiny_run_config(CONFIG, tmp_path, "train.steps=1")
  trainer = Trainer(
    config, groups=rollouts.TreeRollouts(branching=(2, 2), segment=2)
  )
  trainer.step(0)
  tree = trainer._last.extra["tree_PG"]
  assert tree.shape == (8, 4, 2)
  # Depth-1 ids: the first two leaves share one node, the last two another.
  valid = trainer._last.rollout.sample_mask_PG > 0
  assert np.all((tree[:, 0, 0] == tree[:, 1, 0])[valid[:, 1]])
  with pytest.raises(ValueError, match="makes 8 leaves"):
    Trainer(
      testing.tiny_run_config(CONFIG, tmp_path / "b", "train.steps=1"),
      groups=rollouts.TreeRollouts(branching=(2, 2, 2), segment=2),
    ).step(0)


def test_get_builds_registered_strategies_and_register_keeps_built_ins():
  # `import rljax.envs` registered the agent strategies.
  assert isinstance(rollouts.get("episodes"), envs.EpisodeRollouts)
  assert "episodes" not in rollouts.STRATEGIES
  with pytest.raises(ValueError, match=r"\['tree'\] are built in"):
    rollouts.register({"tree": envs.EpisodeRollouts})
  assert isinstance(rollouts.get("tree"), rollouts.TreeRollouts)
