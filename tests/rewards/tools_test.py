"""Tool-use rewards: OTC as a task reward, ToolRL's reward design (against
brute-force and regex references and hand-worked cases) and BATS's budget
note."""

import itertools
import json
import math
import re

import numpy as np
import pytest

from rljax import rewards
from rljax.rewards import RewardResult
from rljax.rewards import Samples
from rljax.rewards import _tools


def samples_of(texts, metadata, **extra):
  n = len(texts)
  return Samples(
    texts=list(texts),
    num_tokens=np.full(n, 5),
    truncated=np.zeros(n, bool),
    metadata=list(metadata),
    extra={k: np.asarray(v) for k, v in extra.items()} or None,
  )


def call_text(*calls, one_block=False):
  """Hermes blocks of {"name", "arguments"} dicts."""
  lines = [json.dumps({"name": n, "arguments": a}) for n, a in calls]
  if one_block:
    return "<tool_call>\n" + "\n".join(lines) + "\n</tool_call>"
  return "\n".join(f"<tool_call>\n{x}\n</tool_call>" for x in lines)


# ---------------------------------------------------------------------------
# OTC.
# ---------------------------------------------------------------------------


def test_otc_reward_groups_by_prompt_hand_worked():
  # Prompt A (3 samples): correct with 2 and 4 calls, wrong with 0 -> n = 2:
  # m = 2 -> 1; m = 4: f = 16/6, sin(pi * (8/3) / 4) = sin(2 pi / 3)
  # = .8660254; wrong stays 0. Prompt B (2 samples): correct with 0 calls
  # -> n = 0: m = 0 -> 1; m = 1 correct: cos(pi / 3) = .5.
  a, b = {"answer": "1"}, {"answer": "2"}
  correct = lambda s: RewardResult(  # noqa: E731
    np.array([1, 1, 0, 1, 1], np.float32), np.ones(5, bool)
  )
  calls = np.array([[2, 0], [1, 3], [0, 0], [0, 0], [1, 0]])
  s = samples_of(["x"] * 5, [a, a, a, b, b], tool_calls_PG=calls)
  out = rewards.otc(correct)(s)
  np.testing.assert_allclose(out.values, [1, 0.8660254, 0, 1, 0.5], 1e-6)
  assert out.parsed.all()
  # OTC-PPO: no n, every correct sample on the cosine branch.
  out = rewards.otc(correct, variant="ppo", c=2.0)(s)
  want = [math.cos(2 * math.pi / 6), math.cos(4 * math.pi / 10), 0, 1, 0.5]
  want[4] = math.cos(math.pi / 4)
  np.testing.assert_allclose(out.values, want, atol=1e-6)


def test_otc_reward_matches_a_loop_reference():
  rng = np.random.default_rng(0)
  metas = [{"q": i} for i in range(6)]
  sizes = rng.integers(1, 5, 6)
  meta = [m for m, k in zip(metas, sizes) for _ in range(k)]
  n = len(meta)
  r = rng.integers(0, 2, n).astype(np.float32) * rng.uniform(0.5, 1, n)
  calls = rng.integers(0, 4, (n, 3))
  s = samples_of(["x"] * n, meta, tool_calls_PG=calls)
  got = rewards.otc(lambda _: r, alpha=0.5, c=2.0)(s).values
  want, start = [], 0
  for k in sizes:
    m, rr = calls[start : start + k].sum(-1), r[start : start + k]
    best = [mm for mm, x in zip(m, rr) if x > 0]
    n_opt = min(best) if best else 0
    for mm, x in zip(m, rr):
      if x <= 0:
        want.append(x)
        continue
      if mm == 0 and n_opt == 0:
        tool = 1.0
      elif n_opt == 0:
        tool = math.cos(mm * math.pi / (2 * mm + 2.0))
      else:
        tool = math.sin(2 * n_opt * mm / (mm + n_opt) * math.pi / (2 * n_opt))
      want.append(0.5 * tool * x)
    start += k
  np.testing.assert_allclose(got, want, atol=1e-6)


def test_otc_reward_errors():
  s = samples_of(["x"], [{}])
  with pytest.raises(ValueError, match="tool_calls_PG"):
    rewards.otc(lambda _: np.ones(1))(s)
  with pytest.raises(ValueError, match="variant"):
    rewards.otc(lambda _: np.ones(1), variant="sft")
  with pytest.raises(ValueError, match="correctness reward function"):
    rewards.otc(None)


# ---------------------------------------------------------------------------
# Parsing.
# ---------------------------------------------------------------------------


def test_parse_calls():
  parse = _tools._parse_calls
  add = {"name": "add", "arguments": {"a": 1}}
  assert parse("no calls") == []
  assert parse(call_text(("add", {"a": 1}))) == [add]
  two = [("add", {"a": 1}), ("mul", {"x": [1, 2]})]
  want = [add, {"name": "mul", "arguments": {"x": [1, 2]}}]
  assert parse(call_text(*two)) == want
  assert parse(call_text(*two, one_block=True)) == want
  # ToolRL's "parameters", a JSON list, OpenAI's arguments-as-string.
  assert parse('<tool_call>{"name": "add", "parameters": {"a": 1}}</tool_call>')
  assert parse(
    '<tool_call>[{"name": "add", "arguments": {"a": 1}}]</tool_call>'
  )
  assert parse(
    '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>'
  ) == [add]
  for bad in [
    "<tool_call>{not json}</tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>{"name": "add", "arguments": [1]}</tool_call>',
    '<tool_call>{"name": "add"}',  # unclosed
    "<tool_call></tool_call>",
  ]:
    assert parse(bad) is None, bad


# ---------------------------------------------------------------------------
# ToolRL.
# ---------------------------------------------------------------------------


def jaccard_ref(a, b):
  """|a & b| / |a | b| over multisets, counted with a dict."""
  if list(a) == list(b):
    return 1.0
  if not a or not b:
    return 0.0
  ca, cb = {}, {}
  for x in a:
    ca[x] = ca.get(x, 0) + 1
  for x in b:
    cb[x] = cb.get(x, 0) + 1
  inter = sum(min(ca[k], cb.get(k, 0)) for k in ca)
  return inter / (len(a) + len(b) - inter)


def pair_ref(g, p):
  if g["name"] != p["name"]:
    return 0.0
  ga, pa = g["arguments"], p["arguments"]
  return jaccard_ref(list(ga), list(pa)) + sum(
    k in pa and pa[k] == v for k, v in ga.items()
  )


def match_ref(gt, pred):
  """Brute force over every assignment of predictions to ground truth."""
  name = jaccard_ref([x["name"] for x in gt], [x["name"] for x in pred])
  best = 0.0
  slots = list(range(len(pred))) + [None] * len(gt)
  for perm in itertools.permutations(slots, len(gt)):
    used = [i for i in perm if i is not None]
    if len(used) != len(set(used)):
      continue
    best = max(
      best,
      sum(pair_ref(g, pred[i]) for g, i in zip(gt, perm) if i is not None),
    )
  s_max = 1 + sum(1 + len(x["arguments"]) for x in gt)
  return name + best, s_max


def greedy_ref(gt, pred):
  """The official code's loop: each ground-truth call in order takes the
  best unused prediction of its name (strictly better than 0)."""
  score = jaccard_ref([x["name"] for x in gt], [x["name"] for x in pred])
  used = set()
  for g in gt:
    best, idx = 0.0, None
    for i, p in enumerate(pred):
      if i in used or p["name"] != g["name"]:
        continue
      v = pair_ref(g, p)
      if v > best:
        best, idx = v, i
    if idx is not None:
      used.add(idx)
      score += best
  return score


def test_toolrl_correctness_hand_worked():
  # GT: add(a=1, b=2), mul(x=3); predicted: add(a=1, b=5), sub(x=3).
  # Names {add, mul} vs {add, sub}: 1/3. add-add: keys 1 + values (a) 1 = 2;
  # mul unmatched. S = 7/3, S_max = 1 + 3 + 2 = 6.
  # R = 6 * (7/3) / 6 - 3 = -2/3.
  gt = [
    {"name": "add", "arguments": {"a": 1, "b": 2}},
    {"name": "mul", "arguments": {"x": 3}},
  ]
  pred = [
    {"name": "add", "arguments": {"a": 1, "b": 5}},
    {"name": "sub", "arguments": {"x": 3}},
  ]
  assert rewards.toolrl_match_score(gt, pred) == pytest.approx((7 / 3, 6.0))
  assert rewards.toolrl_correctness(gt, pred) == pytest.approx(-2 / 3)
  assert rewards.toolrl_correctness(gt, gt) == pytest.approx(3.0)
  assert rewards.toolrl_correctness(gt, None) == -3.0  # unparseable
  assert rewards.toolrl_correctness(gt, []) == -3.0  # no call
  assert rewards.toolrl_correctness([], pred) == 0.0  # the code's 0
  assert rewards.toolrl_correctness(gt, pred, max_reward=1.0) == pytest.approx(
    -2 / 9
  )


def test_toolrl_optimal_matching_beats_greedy():
  # GT f(a=1), f(a=1, b=2); one prediction f(a=1, b=2). Names [f, f] vs
  # [f]: 1/2. Greedy: GT 0 takes it (keys 1/2 + value 1 = 1.5): S = 2.
  # Optimal: GT 1 takes it (1 + 2 = 3): S = 3.5. S_max = 1 + 2 + 3 = 6.
  gt = [
    {"name": "f", "arguments": {"a": 1}},
    {"name": "f", "arguments": {"a": 1, "b": 2}},
  ]
  pred = [{"name": "f", "arguments": {"a": 1, "b": 2}}]
  assert rewards.toolrl_match_score(gt, pred) == pytest.approx((3.5, 6))
  greedy = rewards.toolrl_match_score(gt, pred, matching="greedy")
  assert greedy == pytest.approx((2.0, 6))
  assert rewards.toolrl_correctness(gt, pred) == pytest.approx(0.5)
  assert rewards.toolrl_correctness(gt, pred, matching="greedy") == -1.0


def random_calls(rng, k):
  names, keys = ["f", "g", "h"], ["a", "b", "c"]
  return [
    {
      "name": str(rng.choice(names)),
      "arguments": {
        str(key): int(rng.integers(0, 2))
        for key in rng.choice(keys, rng.integers(0, 3), replace=False)
      },
    }
    for _ in range(k)
  ]


def test_toolrl_match_score_against_brute_force_and_greedy():
  rng = np.random.default_rng(1)
  for _ in range(200):
    gt = random_calls(rng, rng.integers(1, 4))
    pred = random_calls(rng, rng.integers(1, 4))
    got, s_max = rewards.toolrl_match_score(gt, pred)
    want, want_max = match_ref(gt, pred)
    assert got == pytest.approx(want) and s_max == want_max
    greedy, _ = rewards.toolrl_match_score(gt, pred, matching="greedy")
    assert greedy == pytest.approx(greedy_ref(gt, pred))
    assert greedy <= got + 1e-9


# The official code's format patterns (with its tag counts), as the reference.
CODE_PATTERNS = {
  (False, True): r"^<think>.*?</think>\n<response>.*?</response>$",
  (True, False): r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>$",
  (True, True): (
    r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>\n<response>.*?"
    r"</response>$"
  ),
  (False, False): r"^<think>.*?</think>$",
}


def code_format(text, has_calls, has_response):
  text = text.strip()
  ok = re.search(CODE_PATTERNS[has_calls, has_response], text, re.DOTALL)
  if has_calls:
    ok = ok and text.count("<tool_call>") == 1 == text.count("</tool_call>")
  if has_response:
    ok = ok and text.count("<response>") == 1 == text.count("</response>")
  return bool(ok)


PIECES = [
  "<think>",
  "</think>",
  "\n",
  "<tool_call>",
  "</tool_call>",
  "<response>",
  "</response>",
  "x",
  '{"name": "f"}',
  " ",
]


# Mostly plain text, now and then a tag.
WEIGHTS = np.array([1, 1, 2, 1, 1, 1, 1, 12, 4, 4], np.float64)
WEIGHTS /= WEIGHTS.sum()
LAYOUTS = [
  "<think>{}</think>\n<tool_call>\n{}\n</tool_call>",
  "<think>{}</think>\n<response>{}</response>",
  "<think>{}</think>\n<tool_call>\n{}\n</tool_call>\n<response>{}</response>",
  "<think>{}</think>",
]


def test_toolrl_format_matches_the_code_patterns():
  rng = np.random.default_rng(2)
  texts = [
    "<think>plan</think>\n<tool_call>\n{}\n</tool_call>",
    "<think>plan</think>\n<response>hi</response>",
    "<think>plan</think>\n<tool_call>\n{}\n</tool_call>\n"
    "<response>ok</response>",
    "<think></think>",
    "<think>a</think>\nb</think>\n<response>x</response>",  # a later </think>
    "<think>a</think>\n<tool_call>\n</tool_call>",  # needs two newlines
    "<think>a</think><tool_call>\n{}\n</tool_call>",  # no newline
    "  <think>a</think>\n<response>x</response>\n",  # stripped
  ]

  def hole():
    return "".join(rng.choice(PIECES, rng.integers(0, 4), p=WEIGHTS))

  for _ in range(1500):
    texts.append("".join(rng.choice(PIECES, rng.integers(3, 12))))
    # The layouts with random holes (tags in them now and then), sometimes
    # with a piece dropped.
    for layout in LAYOUTS:
      parts = layout.split("{}")
      text = parts[0] + "".join(hole() + part for part in parts[1:])
      if rng.random() < 0.3:
        cut = rng.integers(0, len(text))
        text = text[:cut] + text[cut + rng.integers(1, 3) :]
      texts.append(text)
  positives = {k: sum(code_format(x, *k) for x in texts) for k in CODE_PATTERNS}
  assert min(positives.values()) > 100, positives  # both outcomes are tested
  for text in texts:
    for has_calls, has_response in CODE_PATTERNS:
      got = rewards.toolrl_format(
        text, has_calls=has_calls, has_response=has_response
      )
      assert got == code_format(text, has_calls, has_response), (
        text,
        has_calls,
        has_response,
      )


def test_toolrl_format_several_blocks():
  two = "<think>t</think>\n" + call_text(("f", {}), ("g", {}))
  assert not rewards.toolrl_format(two, has_calls=True, has_response=False)
  assert rewards.toolrl_format(
    two, has_calls=True, has_response=False, one_block=False
  )
  assert rewards.toolrl_format(
    two + "\n<response>r</response>",
    has_calls=True,
    has_response=True,
    one_block=False,
  )
  assert not rewards.toolrl_format(
    two.replace("</tool_call>\n<tool_call>", "</tool_call>\n\n<tool_call>"),
    has_calls=True,
    has_response=False,
    one_block=False,
  )


def test_toolrl_reward_end_to_end():
  gt = [{"name": "add", "arguments": {"a": 1, "b": 2}}]
  good = "<think>sum</think>\n" + call_text(("add", {"a": 1, "b": 2}))
  half = "<think>sum</think>\n" + call_text(("add", {"a": 1, "b": 3}))
  texts = [good, half, "<think>x</think>\n<tool_call>\n{oops\n</tool_call>"]
  meta = [{"tool_calls": gt}] * 2 + [{"tool_calls": call_text(("add", {}))}]
  out = rewards.toolrl()(samples_of(texts, meta))
  # good: 1 + 3. half: S = 1 + (1 + 1) = 3 of S_max 4: 6 * 3/4 - 3 = 1.5,
  # + format 1. Malformed JSON: format 1 (the layout is right), R = -3.
  np.testing.assert_allclose(out.values, [4.0, 2.5, -2.0])
  np.testing.assert_array_equal(out.parsed, [True, True, False])
  out = rewards.toolrl(check_format=False)(samples_of(texts, meta))
  np.testing.assert_allclose(out.values, [3.0, 1.5, -3.0])
  # A response-only ground truth: correctness 0, format asks for <response>.
  resp = rewards.toolrl()(
    samples_of(
      ["<think>a</think>\n<response>b</response>"],
      [{"tool_calls": [], "response": "b"}],
    )
  )
  np.testing.assert_allclose(resp.values, [1.0])


def test_toolrl_errors():
  with pytest.raises(ValueError, match="metadata\\['tool_calls'\\]"):
    rewards.toolrl()(samples_of(["x"], [{"answer": 1}]))
  with pytest.raises(ValueError, match="ground-truth calls of sample 0"):
    rewards.toolrl()(samples_of(["x"], [{"tool_calls": [{"args": 1}]}]))
  with pytest.raises(ValueError, match="matching"):
    rewards.toolrl(matching="hungarian")


# ---------------------------------------------------------------------------
# BATS.
# ---------------------------------------------------------------------------


def test_budget_note():
  assert rewards.budget_note(3, 10) == (
    "<budget>\nTool Call Budget Used: 3, Tool Call Budget Remaining: 7"
    "\n</budget>"
  )
  note = rewards.budget_note({"search": 12}, {"search": 10, "browse": 5})
  assert note.splitlines()[1:3] == [
    "Search Budget Used: 12, Search Budget Remaining: 0",
    "Browse Budget Used: 0, Browse Budget Remaining: 5",
  ]
  with pytest.raises(ValueError, match="both be ints or both be mappings"):
    rewards.budget_note(1, {"search": 2})
  with pytest.raises(ValueError, match="have calls but no budget"):
    rewards.budget_note({"python": 1}, {"search": 2})
  with pytest.raises(ValueError, match="must be an int >= 0"):
    rewards.budget_note(-1, 5)
  with pytest.raises(ValueError, match="must be an int >= 0"):
    rewards.budget_note(1.5, 5)
