"""Tool-use rewards on agent episodes: OTC, ToolRL, and BATS's budget note.

Host-side numpy. Episode side data arrives in ``samples.extra`` (name ->
array with leading axis N, e.g. ``tool_calls_PG`` [N, max_turns]); tool
calls are parsed from the completion text in the Hermes format

    <tool_call>
    {"name": "add", "arguments": {"a": 1, "b": 2}}
    </tool_call>

(``"parameters"`` is accepted for ``"arguments"``, as in ToolRL's data; a
block may hold several calls, one JSON object per line).
"""

from collections.abc import Mapping, Sequence
import json
import re
from typing import Any, Optional

import numpy as np
from scipy import optimize

from rljax._src import checks
from rljax.rewards._base import RewardFn
from rljax.rewards._base import RewardResult
from rljax.rewards._base import Samples

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_MATCHINGS = ("optimal", "greedy")

# ---------------------------------------------------------------------------
# OTC (arXiv 2504.14870).
# ---------------------------------------------------------------------------


def otc(
  correct: RewardFn,
  *,
  variant: str = "grpo",
  c: float = 1.0,
  alpha: float = 1.0,
  among: str = "correct",
  calls: str = "tool_calls_PG",
) -> RewardFn:
  """OTC's tool-integrated reward, r = alpha r_tool(m, n) r_phi.

  r_phi is the reward function `correct` (e.g. `exact_answer`), m an
  episode's tool calls (``samples.extra[calls]`` summed over its turns).
  OTC-GRPO (``variant="grpo"``): n is the fewest calls of a correct sample
  of the same prompt (``among="all"``: of any of its samples); OTC-PPO
  (``"ppo"``): no n, r_tool = cos(m pi / (2m + c)). The formula and what
  was checked: `rljax.transforms.otc_tool_reward` and
  `rljax.transforms.otc_rewards_of` (the same computation, which this
  calls; `rljax.transforms.otc_rewards` is the batch-stage form).

  A prompt's samples are the consecutive samples that share one metadata
  dict (`Samples` gives the G samples of a prompt the same dict).

  Args:
    correct: the correctness reward r_phi (> 0 counts as correct).
    variant: "grpo" or "ppo".
    c: the cosine branch's smoothing constant (> 0).
    alpha: the reward's scale.
    among: which samples estimate n: "correct" or "all".
    calls: the side array of tool calls per turn.

  Returns:
    A reward function `fn(samples) -> RewardResult` (``parsed`` is
    `correct`'s).

  References:
    Wang et al., arXiv 2504.14870 (OTC-PO).
  """
  # Imported here: rljax.rewards stays importable without rljax.transforms.
  from rljax.transforms._tooluse import otc_rewards_of

  checks.one_of("variant", variant, ("grpo", "ppo"))
  checks.one_of("among", among, ("correct", "all"))
  checks.positive(c=c)
  checks.non_negative(alpha=alpha)
  if not callable(correct):
    raise ValueError(
      f"otc(correct) needs the correctness reward function; got {correct!r}."
    )

  def reward(samples: Samples) -> RewardResult:
    out = correct(samples)
    values, parsed = out if isinstance(out, RewardResult) else (out, None)
    r = np.asarray(values, np.float32)
    if r.shape != (len(samples.texts),):
      raise ValueError(
        f"otc: the correctness reward returned shape {r.shape}; it must"
        f" return one value per sample, ({len(samples.texts)},)."
      )
    m = _episode_array(samples, calls, "otc").reshape(len(r), -1).sum(-1)
    starts = _group_starts(samples.metadata)
    size = int(np.max(np.diff(starts))) if len(r) else 1
    r_grid = np.zeros((len(starts) - 1, size), np.float32)
    m_grid, valid = np.zeros_like(r_grid), np.zeros(r_grid.shape, bool)
    rows = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    cols = np.arange(len(r)) - starts[rows]
    r_grid[rows, cols], m_grid[rows, cols], valid[rows, cols] = r, m, True
    grid = otc_rewards_of(
      r_grid, m_grid, valid, variant=variant, c=c, alpha=alpha, among=among
    )
    return RewardResult(np.asarray(grid)[rows, cols], parsed)

  return reward


def _group_starts(metadata: Sequence[Mapping[str, Any]]) -> np.ndarray:
  """Start index of each run of consecutive samples sharing one dict, and
  len(metadata) at the end."""
  starts = [
    i
    for i in range(len(metadata))
    if i == 0 or metadata[i] is not metadata[i - 1]
  ]
  return np.asarray(starts + [len(metadata)], np.int64)


def _episode_array(samples: Samples, name: str, by: str) -> np.ndarray:
  extra = samples.extra or {}
  if name not in extra:
    raise ValueError(
      f"{by} reads samples.extra[{name!r}], the episode runner's side array"
      f" (present: {sorted(extra)}); use it with a task that has an"
      " environment (rljax.envs)."
    )
  return np.asarray(extra[name], np.float32)


# ---------------------------------------------------------------------------
# Parsing tool calls.
# ---------------------------------------------------------------------------


def _parse_calls(text: str) -> Optional[list[dict[str, Any]]]:
  """The tool calls of `text` as [{"name", "arguments"}], [] when it has
  none, None when a block is unclosed or not valid call JSON. Linear time
  (str.find, no regex backtracking)."""
  calls, pos = [], 0
  while (start := text.find(_OPEN, pos)) >= 0:
    end = text.find(_CLOSE, start + len(_OPEN))
    if end < 0:
      return None
    found = _block_calls(text[start + len(_OPEN) : end])
    if found is None:
      return None
    calls.extend(found)
    pos = end + len(_CLOSE)
  return calls


def _block_calls(body: str) -> Optional[list[dict[str, Any]]]:
  """One block: a JSON call, a JSON list of calls, or one call per line."""
  body = body.strip()
  try:
    items = [json.loads(body)]
  except ValueError:
    try:
      items = [json.loads(line) for line in body.splitlines() if line.strip()]
    except ValueError:
      return None
  if len(items) == 1 and isinstance(items[0], list):
    items = items[0]
  calls = [_as_call(item) for item in items]
  return None if not calls or any(x is None for x in calls) else calls


def _as_call(item: Any) -> Optional[dict[str, Any]]:
  if not isinstance(item, dict) or not isinstance(item.get("name"), str):
    return None
  args = item.get("arguments", item.get("parameters", {}))
  if isinstance(args, str):  # OpenAI style: arguments as a JSON string
    try:
      args = json.loads(args)
    except ValueError:
      return None
  if not isinstance(args, dict):
    return None
  return {"name": item["name"], "arguments": args}


def _ground_truth(value: Any, index: int) -> list[dict[str, Any]]:
  """metadata's ground-truth calls (a list of call dicts, or text with
  <tool_call> blocks) normalised; a ValueError says what is wrong."""
  if isinstance(value, str):
    calls = _parse_calls(value)
  elif isinstance(value, (list, tuple)):
    calls = [_as_call(x) for x in value]
    calls = None if any(x is None for x in calls) else calls
  else:
    calls = None
  if calls is None:
    raise ValueError(
      f"toolrl: the ground-truth calls of sample {index} are malformed"
      f" ({value!r:.200}); give a list of {{'name': str, 'arguments':"
      " dict}} or text with <tool_call> blocks."
    )
  return calls


# ---------------------------------------------------------------------------
# ToolRL (arXiv 2504.13958).
# ---------------------------------------------------------------------------


def _jaccard(a: Sequence[Any], b: Sequence[Any]) -> float:
  """Multiset Jaccard |a & b| / |a | b|: 1 when equal (both empty too)."""
  a, b = list(a), list(b)
  if a == b:
    return 1.0
  if not a or not b:
    return 0.0
  rest, inter = list(b), 0
  for x in a:
    if x in rest:
      rest.remove(x)
      inter += 1
  return inter / (len(a) + len(b) - inter)


def _pair_score(gt: dict[str, Any], pred: dict[str, Any]) -> float:
  """Parameter-name Jaccard + matching parameter values, 0 across names."""
  if gt["name"] != pred["name"]:
    return 0.0
  g, p = gt["arguments"], pred["arguments"]
  same = sum(1.0 for k, v in g.items() if k in p and p[k] == v)
  return _jaccard(list(g), list(p)) + same


def toolrl_match_score(
  gt_calls: Sequence[Mapping[str, Any]],
  pred_calls: Sequence[Mapping[str, Any]],
  *,
  matching: str = "optimal",
) -> tuple[float, float]:
  """ToolRL's match score of predicted calls P against ground truth G.

      r_name  = |N_G & N_P| / |N_G | N_P|                  (tool names)
      r_param = sum_j |keys(G_j) & keys(P_j)| / |keys(G_j) | keys(P_j)|
      r_value = sum_j sum_{k in keys(G_j)} 1[G_j[k] = P_j[k]]
      S       = r_name + r_param + r_value,
      S_max   = 1 + sum_j (1 + |keys(G_j)|)

  over a matching of each ground-truth call G_j to at most one predicted
  call P_j of the same name: ``"optimal"`` maximises S (the paper's
  optimal matching as we read it in summaries: not verified), and
  ``"greedy"`` takes the ground-truth calls in order, each the best unused
  prediction (the official code). Names count as multisets (the code's
  `match_score`).

  Returns:
    (S, S_max).
  """
  checks.one_of("matching", matching, _MATCHINGS)
  gt = [dict(x) for x in gt_calls]
  pred = [dict(x) for x in pred_calls]
  score = _jaccard([x["name"] for x in gt], [x["name"] for x in pred])
  s_max = 1.0 + sum(1.0 + len(x["arguments"]) for x in gt)
  pairs = np.asarray(
    [[_pair_score(g, p) for p in pred] for g in gt], np.float64
  ).reshape(len(gt), len(pred))
  if matching == "optimal" and pairs.size:
    rows, cols = optimize.linear_sum_assignment(pairs, maximize=True)
    score += float(pairs[rows, cols].sum())
  elif pairs.size:
    used: set[int] = set()
    for j in range(len(gt)):
      best, best_i = 0.0, -1
      for i in range(len(pred)):
        if i not in used and pairs[j, i] > best:
          best, best_i = pairs[j, i], i
      if best_i >= 0:
        used.add(best_i)
        score += best
  return score, s_max


def toolrl_correctness(
  gt_calls: Sequence[Mapping[str, Any]],
  pred_calls: Optional[Sequence[Mapping[str, Any]]],
  *,
  matching: str = "optimal",
  max_reward: float = 3.0,
) -> float:
  """ToolRL's correctness reward R_correct = 2 R_max S / S_max - R_max,
  in [-R_max, R_max] ([-3, 3] in the paper); -R_max when the prediction
  has no parseable calls (``pred_calls`` None or empty), 0 when the ground
  truth has no calls (the official code)."""
  checks.positive(max_reward=max_reward)
  if not gt_calls:
    return 0.0
  if not pred_calls:
    return -max_reward
  score, s_max = toolrl_match_score(gt_calls, pred_calls, matching=matching)
  return 2.0 * max_reward * score / s_max - max_reward


def toolrl_format(
  text: str,
  *,
  has_calls: bool,
  has_response: bool,
  one_block: bool = True,
) -> bool:
  """ToolRL's format check of one completion (R_format = 1 if true).

  The stripped text must be ``<think>...</think>``, a newline, then what the
  ground truth holds: tool calls ``<tool_call>\\n...\\n</tool_call>``, a
  ``<response>...</response>`` (exactly one), or the calls, a newline and
  the response; nothing after the think block when it holds neither. With
  ``one_block`` (the official code) the calls sit in exactly one block,
  otherwise in one or more Hermes blocks separated by newlines. This is the
  official code's regular expressions and tag counts, checked by a
  linear-time scan.
  """
  text = text.strip()
  if not text.startswith("<think>"):
    return False
  if has_response and (
    text.count("<response>") != 1 or text.count("</response>") != 1
  ):
    return False
  if not has_calls and not has_response:
    return text.endswith("</think>") and len(text) >= len("<think></think>")
  if has_calls:
    n = text.count(_OPEN)
    if n == 0 or n != text.count(_CLOSE) or (one_block and n != 1):
      return False
  at = text.find(_OPEN if has_calls else "<response>")
  if not text[:at].endswith("</think>\n") or at < len("<think></think>\n"):
    return False
  rest = text[at:]
  if has_calls:
    rest = _after_blocks(rest)
    if rest is None:
      return False
    if has_response:
      if not rest.startswith("\n"):
        return False
      rest = rest[1:]
  if has_response:
    return rest.startswith("<response>") and rest.endswith("</response>")
  return rest == ""


def _after_blocks(rest: str) -> Optional[str]:
  """What follows the newline-separated blocks "<tool_call>\\n...\\n
  </tool_call>" at the start of `rest`; None if they are malformed."""
  while True:
    if not rest.startswith(_OPEN + "\n"):
      return None
    close = rest.find(_CLOSE)
    body = rest[len(_OPEN) : close]
    if close < 0 or len(body) < 2 or not body.endswith("\n") or _OPEN in body:
      return None
    rest = rest[close + len(_CLOSE) :]
    if not rest.startswith("\n" + _OPEN):
      return rest
    rest = rest[1:]


def toolrl(
  *,
  key: str = "tool_calls",
  response_key: str = "response",
  matching: str = "optimal",
  max_reward: float = 3.0,
  check_format: bool = True,
  one_block: bool = True,
) -> RewardFn:
  """ToolRL's reward: R = R_format + R_correct, in [-3, 4].

  R_format in {0, 1} is `toolrl_format` against the layout the ground
  truth implies; R_correct in [-3, 3] is `toolrl_correctness` of the calls
  parsed from the completion against ``metadata[key]`` (a list of
  ``{"name", "arguments"}`` dicts, or text with ``<tool_call>`` blocks).
  ``metadata[response_key]`` non-empty means the ground truth also answers
  in a ``<response>`` block. For multi-turn transcripts (observations in
  the text) set ``check_format=False``: the format check reads one
  assistant message.

  Args:
    key: the metadata field of the ground-truth calls.
    response_key: the metadata field whose presence asks for a response.
    matching: "optimal" (the paper) or "greedy" (the official code).
    max_reward: R_max of the correctness term (3; 1 is the paper's
      "equal max" ablation).
    check_format: add the format reward.
    one_block: the format's calls sit in a single ``<tool_call>`` block.

  Returns:
    A reward function `fn(samples) -> RewardResult`; ``parsed`` is False
    where the completion's tool calls could not be parsed.

  References:
    Qian et al., "ToolRL: Reward is All Tool Learning Needs", arXiv
    2504.13958, Sec. 3.3. Checked against the official code
    (qiancheng0/ToolRL `verl/utils/reward_score/rlla.py`: `match_score`,
    `compute_tool_call_reward`, `customize_format_reward_func`, ranges
    [0, 1] and [-3, 3]). The code matches each ground-truth call greedily
    in order; the paper's optimal matching is the default and the code's
    ``matching="greedy"``. The paper's text itself was read only through
    summaries.
  """
  checks.one_of("matching", matching, _MATCHINGS)
  checks.positive(max_reward=max_reward)

  def reward(samples: Samples) -> RewardResult:
    values, parsed = [], []
    for i, (text, meta) in enumerate(zip(samples.texts, samples.metadata)):
      if key not in meta:
        raise ValueError(
          f"toolrl reads metadata[{key!r}] (the ground-truth tool calls);"
          f" sample {i} has only {sorted(meta)}."
        )
      gt = _ground_truth(meta[key], i)
      pred = _parse_calls(text)
      parsed.append(pred is not None)
      r = toolrl_correctness(gt, pred, matching=matching, max_reward=max_reward)
      if check_format:
        r += float(
          toolrl_format(
            text,
            has_calls=bool(gt),
            has_response=bool(meta.get(response_key)),
            one_block=one_block,
          )
        )
      values.append(r)
    return RewardResult(
      np.asarray(values, np.float32), np.asarray(parsed, bool)
    )

  return reward


# ---------------------------------------------------------------------------
# BATS (arXiv 2511.17006): the Budget Tracker.
# ---------------------------------------------------------------------------


def budget_note(
  used: int | Mapping[str, int], budget: int | Mapping[str, int]
) -> str:
  """BATS's Budget Tracker line: the tool-call budget used and remaining.

  Appended to each tool observation so that the agent always sees what it
  has left, e.g. ``budget_note(3, 10)``::

      <budget>
      Tool Call Budget Used: 3, Tool Call Budget Remaining: 7
      </budget>

  or one line per tool for mappings (``budget_note({"search": 3},
  {"search": 10, "browse": 5})``: "Search Budget Used: 3, Search Budget
  Remaining: 7", "Browse Budget Used: 0, ..."). Remaining is clamped at 0.

  Inference-only: BATS (Liu et al., "Budget-Aware Tool-Use Enables
  Effective Agent Scaling", arXiv 2511.17006) trains nothing; its Budget
  Tracker is this prompt-level plug-in, and BATS proper adds budget-aware
  planning and self-verification prompts (not built). Recipe: an
  environment counts the calls of each episode and returns
  ``observation + "\\n" + budget_note(calls, budget)`` from its step, and
  refuses (an error observation) or ends the episode once the budget is
  spent; it can be used in training episodes too. The tag and wording
  follow the paper's description (per-tool used / remaining counts); its
  exact prompt text could not be read here.

  Args:
    used: calls made so far (an int, or tool name -> int).
    budget: the budget (an int, or tool name -> int; with mappings every
      tool of `used` must have a budget).

  Returns:
    The note, a str.
  """
  if isinstance(used, Mapping) != isinstance(budget, Mapping):
    raise ValueError(
      "budget_note: used and budget must both be ints or both be mappings"
      f" of tool name -> int; got {used!r} and {budget!r}."
    )
  if isinstance(budget, Mapping):
    unknown = sorted(set(used) - set(budget))
    if unknown:
      raise ValueError(
        f"budget_note: tools {unknown} have calls but no budget; budget"
        f" has {sorted(budget)}."
      )
    items = [(str(t), used.get(t, 0), b) for t, b in budget.items()]
  else:
    items = [("tool call", used, budget)]
  lines = []
  for name, u, b in items:
    for what, x in (("used", u), ("budget", b)):
      if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0:
        raise ValueError(
          f"budget_note: {what} of {name!r} must be an int >= 0; got {x!r}."
        )
    label = re.sub(r"\s+", " ", name).strip().title()
    lines.append(
      f"{label} Budget Used: {u}, {label} Budget Remaining: {max(b - u, 0)}"
    )
  return "<budget>\n" + "\n".join(lines) + "\n</budget>"
