"""XRPO's in-context seeding (`rollouts.ICLSeeding`): retrieval and the ICL
prompt by hand, only groups without a success seeded, the corpus, seeded
rows sampled by the tiny model with the demonstrations in their prompt,
and a trainer step of configs/xrpo.py."""

import pathlib

import jax
import numpy as np
import pytest

from rljax import rollouts
from rljax import sampling
from rljax import testing
from rljax.training import Trainer
from rljax.training import _rollout

XRPO = pathlib.Path(__file__).resolve().parents[2] / "configs" / "xrpo.py"


def _reference_similarity(a, b, n=3):
  """Character n-gram Jaccard, written apart from the implementation."""
  ga = set(a[i : i + n] for i in range(len(a) - n + 1)) or {a}
  gb = set(b[i : i + n] for i in range(len(b) - n + 1)) or {b}
  return len(ga.intersection(gb)) / len(ga.union(gb))


def test_ngram_similarity_by_hand_and_reference():
  # "12+34=" has the 3-grams {12+, 2+3, +34, 34=} and "12+35=" has
  # {12+, 2+3, +35, 35=}: 2 shared of 6 in all, 1/3.
  assert rollouts.ngram_similarity("12+34=", "12+35=") == pytest.approx(1 / 3)
  assert rollouts.ngram_similarity("5+5=", "5+5=") == 1.0
  assert rollouts.ngram_similarity("ab", "ab") == 1.0  # shorter than n
  rng = np.random.default_rng(0)
  for _ in range(50):
    a, b = ("".join(rng.choice(list("12+="), rng.integers(1, 8))) for _ in "ab")
    assert rollouts.ngram_similarity(a, b) == pytest.approx(
      _reference_similarity(a, b)
    )
  with pytest.raises(ValueError, match="n=0"):
    rollouts.ngram_similarity("a", "b", n=0)


def _group(prompt, prompt_id, n=4):
  return rollouts.Group({"answer": "0"}, prompt, prompt_id, n)


def _scores(correct, completions=None, valid=None):
  correct = np.asarray(correct, bool)
  p, g = correct.shape
  return rollouts.Scores(
    rewards=correct.astype(np.float32),
    correct=correct,
    valid=np.ones((p, g), bool) if valid is None else np.asarray(valid),
    members=[[rollouts.Member()] * g for _ in range(p)],
    completions=completions
    or [[f"c{i}{j}" for j in range(g)] for i in range(p)],
    surprise=np.zeros((p, g)),
  )


# A corpus, oldest first: (prompt id, prompt, a verified completion).
CORPUS = [
  [7, "12+35=", "47"],
  [8, "90+11=", "101"],
  [9, "12+30=", "42"],
  [3, "12+34=", "46"],  # the seeded prompt's own success
]


def test_icl_prompt_by_hand():
  s = rollouts.ICLSeeding(num_demos=2, separator="*")
  state = {"corpus": CORPUS}
  # Similarity to "12+34=": "12+35=" and "12+30=" 1/3 each (shared 12+,
  # 2+3), "90+11=" 0; the tie goes to the newest stored (id 9 first), and
  # the prompt's own success (id 3) is skipped.
  assert s.icl_prompt("12+34=", 3, state) == "12+30=42*12+35=47*12+34="
  # With include_self, its own success is the closest (similarity 1).
  mine = rollouts.ICLSeeding(num_demos=2, separator="*", include_self=True)
  assert mine.icl_prompt("12+34=", 3, state) == "12+34=46*12+30=42*12+34="
  # Long solutions are cut; nothing stored: no ICL prompt.
  cut = rollouts.ICLSeeding(num_demos=1, separator="*", max_solution_chars=1)
  assert cut.icl_prompt("90+12=", 3, state) == "90+11=1*90+12="
  assert s.icl_prompt("12+34=", 3, {"corpus": [CORPUS[-1]]}) is None
  assert s.icl_prompt("12+34=", 3, s.init()) is None


def test_only_groups_without_a_success_are_seeded():
  s = rollouts.ICLSeeding(num_demos=1, separator="*", fraction=0.5)
  state = {"corpus": CORPUS}
  groups = [_group("12+34=", 3), _group("90+12=", 4), _group("1+1=", 5, 3)]
  valid = [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]]
  scores = _scores([[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]], valid=valid)
  out = s.revise(groups, scores, 0, 0, state)
  # Group 0 (all failed): its last round(0.5 * 4) = 2 samples; group 1 has
  # a success; group 2 has 3 valid samples: round(1.5) = 2, the last 2
  # valid ones.
  assert sorted(out) == [(0, 2), (0, 3), (2, 1), (2, 2)]
  seeded = rollouts.Member(
    prompt="12+30=42*12+34=",
    train_prompt="12+30=42*12+34=",
    stream=rollouts.HINTED,
  )
  assert out[(0, 2)] == out[(0, 3)] == seeded
  assert out[(2, 1)].prompt.endswith("*1+1=")
  assert out == s.revise(groups, scores, 0, 0, state)  # deterministic
  # Off-policy: sampled with the demonstrations, trained without them.
  plain = rollouts.ICLSeeding(num_demos=1, separator="*", train_on="plain")
  member = plain.revise(groups, scores, 0, 0, state)[(0, 2)]
  assert member.prompt == seeded.prompt and member.train_prompt == "12+34="
  # At least one sample; fraction 1 seeds the whole group.
  tiny = rollouts.ICLSeeding(fraction=0.1).revise(groups, scores, 0, 0, state)
  assert sorted(tiny) == [(0, 3), (2, 2)]
  whole = rollouts.ICLSeeding(fraction=1.0).revise(groups, scores, 0, 0, state)
  assert len(whole) == 4 + 3
  # Nothing stored: no seeding (the zero-shot samples stay).
  assert s.revise(groups, scores, 0, 0, s.init()) == {}


def test_corpus_keeps_the_latest_success_per_prompt():
  s = rollouts.ICLSeeding(corpus_size=2)
  groups = [_group("1+1=", 10, 2), _group("2+2=", 11, 2)]
  state = s.init()
  state = s.update(
    groups,
    _scores([[0, 1], [0, 0]], [["x", "2"], ["y", "z"]]),
    0,
    state,
  )
  assert state == {"corpus": [[10, "1+1=", "2"]]}
  # A correct but invalid sample is not stored; a new success of a stored
  # prompt replaces its entry and becomes the newest.
  state = s.update(
    groups,
    _scores([[1, 0], [1, 1]], [["02", "w"], ["4", "04"]], [[1, 0], [1, 0]]),
    1,
    state,
  )
  assert state == {"corpus": [[10, "1+1=", "02"], [11, "2+2=", "4"]]}
  # A prompt stored again moves behind the others; at most corpus_size
  # entries, the oldest dropped first.
  state = s.update(groups[:1], _scores([[1, 0]], [["2", "x"]]), 2, state)
  assert [e[0] for e in state["corpus"]] == [11, 10]
  state = s.update([_group("3+3=", 12, 1)], _scores([[1]], [["6"]]), 3, state)
  assert state == {"corpus": [[10, "1+1=", "2"], [12, "3+3=", "6"]]}


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"num_demos": 0}, "num_demos=0"),
    ({"corpus_size": 0}, "corpus_size=0"),
    ({"fraction": 0.0}, "fraction=0.0"),
    ({"fraction": 1.5}, "fraction=1.5"),
    ({"train_on": "both"}, "train_on must be one of"),
    ({"max_solution_chars": 0}, "max_solution_chars=0"),
  ],
)
def test_bad_settings_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    rollouts.ICLSeeding(**kwargs)
  assert isinstance(rollouts.get("icl_seeding"), rollouts.ICLSeeding)


def _sample(model, tokenizer, members, prompts):
  def encode(texts):
    return _rollout.encode_prompts(tokenizer, texts, 16)

  engine = sampling.Engine(
    model.config, slots=4, page_size=4, segment=4, max_length=24
  )
  return rollouts.sample_members(
    engine,
    model,
    encode,
    members,
    prompts,
    key=jax.random.key(0),
    max_new_tokens=4,
    width=5,
    temperature=1.0,
    encode_completion=lambda t: tokenizer.encode(t, add_bos=False) + [1],
  )


def _prompt_text(tokenizer, rollout, i, j):
  ids = rollout.prompt_tokens_PGS[i, j][rollout.prompt_mask_PGS[i, j] > 0]
  return tokenizer.decode([int(t) for t in ids])


def test_seeded_rows_are_sampled_with_the_demonstrations(model, tokenizer):
  # The tiny model's own groups: revise's members sampled with the engine.
  state = {"corpus": [[7, "12+35=", "47"], [8, "9+1=", "10"]]}
  groups = [_group("12+34=", 3, 3), _group("5+5=", 4, 3)]
  scores = _scores([[0, 0, 0], [1, 0, 0]])
  prompts = [g.prompt for g in groups]
  out = {}
  for train_on in ("seeded", "plain"):
    s = rollouts.ICLSeeding(
      num_demos=1, separator="a", fraction=0.5, train_on=train_on
    )
    wanted = s.revise(groups, scores, 0, 0, state)
    assert sorted(wanted) == [(0, 1), (0, 2)]  # group 1 has a success
    members = [[wanted.get((i, j)) for j in range(3)] for i in range(2)]
    out[train_on] = _sample(model, tokenizer, members, prompts)
  seeded, plain = out["seeded"], out["plain"]
  np.testing.assert_array_equal(seeded.sample_mask_PG, [[0, 1, 1], [0, 0, 0]])
  for j in (1, 2):
    # The demonstration is in the trained prompt exactly, then the prompt.
    text = _prompt_text(tokenizer, seeded, 0, j)
    assert text.endswith("12+35=47a12+34=") and "12+35=47" in text
    assert _prompt_text(tokenizer, plain, 0, j).endswith("12+34=")
    assert "47" not in _prompt_text(tokenizer, plain, 0, j)
  # Both draw from the ICL prompt with the same keys: equal samples and
  # sampler log-probs (off-policy for "plain": taken under the demos).
  np.testing.assert_array_equal(seeded.tokens_PGT, plain.tokens_PGT)
  np.testing.assert_allclose(seeded.logp_PGT, plain.logp_PGT, atol=1e-6)
  assert seeded.mask_PGT[0, 1:].sum() > 0


@pytest.mark.slow  # a trainer step of the config
def test_trainer_seeds_failed_groups(tmp_path):
  config = testing.tiny_run_config(XRPO, tmp_path, "train.steps=1")
  trainer = Trainer(config)
  assert isinstance(trainer.groups, rollouts.ICLSeeding)
  # A stored success to retrieve (the tiny model solves almost nothing).
  trainer.groups_state = {"corpus": [[10**6, "11+11=", "22"]]}
  trainer.step(0)
  scored = trainer._last
  streams = scored.streams_PG
  valid = scored.rollout.sample_mask_PG > 0
  correct = np.asarray(scored.scores.values_NK)[:, 0].reshape(streams.shape)
  seeded = (streams == rollouts.HINTED) & valid
  assert seeded.any()
  # Only groups without a correct zero-shot sample are seeded.
  plain_correct = ((correct > 0) & (streams == 0) & valid).any(-1)
  assert not np.any(seeded.any(-1) & plain_correct)
  # A seeded row trains on the ICL prompt: the demonstration, then its own.
  tokenizer = trainer.tokenizer
  for i, j in zip(*np.nonzero(seeded)):
    text = _prompt_text(tokenizer, scored.rollout, i, j)
    assert text.startswith("11+11=22*") and text.endswith("=")
  for i, j in zip(*np.nonzero((streams == 0) & valid)):
    assert "*" not in _prompt_text(tokenizer, scored.rollout, i, j)
