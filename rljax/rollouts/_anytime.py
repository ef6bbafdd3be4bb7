"""AnytimeReasoner's rollouts: thinking traces cut at token budgets, with a
forced summary after each cut."""

from collections.abc import Sequence
import dataclasses
from typing import Optional

import jax
import numpy as np

from rljax import sampling
from rljax.rollouts._base import GroupStrategy
from rljax.sampling import Rollout

#: the official code's budgets for an 8000-token thinking window and
#: ``n_budget_support=4`` (``set_training_split_plan``)
PAPER_BUDGETS = (2000, 4000, 6000, 8000)


def _ids(name: str, ids) -> tuple:
  ids = tuple(ids)
  if not ids or not all(
    isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0
    for t in ids
  ):
    raise ValueError(
      f"{name}={ids!r}; give the forced text as token ids (ints >= 0), e.g."
      f" {name}=tuple(tokenizer.encode('</think>', add_bos=False))."
    )
  return tuple(int(t) for t in ids)


def _layout(p: int, n: int, s: int, a: int, width: int):
  """The extras of the [P, N (1 + S A)] layout, before any token is known."""
  g = n * (1 + s * a)
  trace = np.full((p, g), -1, np.int32)
  budget = np.full((p, g), -1, np.int32)
  trace[:, :n] = np.arange(n)
  rows = n + np.arange(n * s * a)
  trace[:, rows] = np.arange(n * s * a) // (s * a)
  budget[:, rows] = (np.arange(n * s * a) // a) % s
  return {
    "anytime_trace_PG": trace,
    "anytime_budget_PG": budget,
    "anytime_length_PG": np.zeros((p, g), np.int32),
    "anytime_chunk_PGT": np.full((p, g, width), -1, np.int32),
  }


def sample_anytime(
  engine: sampling.Engine,
  model,
  prompts: Sequence[Sequence[int]],
  *,
  key: jax.Array,
  num_traces: int,
  budgets: Sequence[int],
  num_summaries: int,
  marker: Sequence[int],
  cut_marker: Optional[Sequence[int]] = None,
  summary_tokens: int,
  width: int,
  temperature: float,
) -> tuple[Rollout, dict[str, np.ndarray]]:
  """N thinking traces per prompt and A forced summaries at each budget.

  Each prompt's `num_traces` thinking traces are drawn in one
  `Engine.add` (sharing the prompt's cache) with key ``fold_in(fold_in(key,
  p), 0)``, up to ``budgets[-1]`` tokens or a stop id. At budget b_s a trace
  is cut to its first L_s = min(b_s, length) tokens and A =
  `num_summaries` summaries are sampled from ``prompt + thinking[:L_s] +
  forced text``, at most `summary_tokens` each: `cut_marker` after a cut
  (the trace went on past b_s, or filled the last budget without
  stopping), `marker` after a trace that ended by itself (its stop id is
  dropped: the forced text ends the thinking instead; a stop rule's text
  stays). Budgets past a trace's end share its whole thinking as one
  prefix (A summaries per budget, all from that prefix), as in the
  official code. The summaries of one prefix share its cache (one
  `Engine.add`, key ``fold_in(fold_in(fold_in(key, p), 1), i S + s)`` for
  trace i's first budget s with that prefix). They cannot share the
  trace's own pages: `Engine.extend` turns the kept sequence itself into
  one continuation and `Engine.fork`'s children sample at once, with no
  forced text in between, so each (trace, cut) prefix is prefilled once
  (prefill, not decode: the official code relies on vLLM's prefix cache
  for the same reuse).

  Returns:
    (the [P, G] `Rollout`, extras) with G = N (1 + S A): rows 0..N-1 are the
    thinking traces (prompt: the prompt; completion: the thinking), row N +
    (i S + s) A + a is summary a of trace i at budget s (prompt: the prompt,
    thinking[:L_s] and the forced text; completion: the summary). The
    extras are the layout ``rljax.transforms.brpo_advantages`` reads
    (``anytime_trace_PG``, ``anytime_budget_PG``, ``anytime_length_PG``
    (L_s on summary rows, the thinking's length on thinking rows) and
    ``anytime_chunk_PGT``).
  """
  budgets = [int(b) for b in budgets]
  n, a = int(num_traces), int(num_summaries)
  marker = list(marker)
  cut = marker if cut_marker is None else list(cut_marker)
  if budgets[-1] > width or summary_tokens > width:
    raise ValueError(
      f"budgets[-1]={budgets[-1]} and summary_tokens={summary_tokens} must"
      f" fit the rollout width {width} (sampler.max_new_tokens)."
    )
  traces = _draw_traces(
    engine, model, prompts, key, n, budgets[-1], temperature
  )
  return _draw_summaries(
    engine,
    model,
    prompts,
    traces,
    key,
    budgets=budgets,
    markers=(marker, cut),
    num_traces=n,
    num_summaries=a,
    summary_tokens=summary_tokens,
    width=width,
    temperature=temperature,
  )


def _draw_traces(engine, model, prompts, key, n, max_new_tokens, temperature):
  """Each prompt's `n` thinking traces (one `Engine.add` per prompt)."""
  p = len(prompts)
  traces = []
  for i, prompt in enumerate(prompts):
    traces.append(
      engine.add(
        list(prompt),
        key=jax.random.fold_in(jax.random.fold_in(key, i), 0),
        max_new_tokens=max_new_tokens,
        num_samples=n,
        temperature=temperature,
        shard=i * engine.shards // p,
      )
    )
  engine.run(model)
  return traces


def _draw_summaries(
  engine,
  model,
  prompts,
  traces,
  key,
  *,
  budgets,
  markers,
  num_traces,
  num_summaries,
  summary_tokens,
  width,
  temperature,
):
  """The rollout and extras of the traces and their summaries, A per
  budget, those of one (trace, cut) prefix drawn in one `Engine.add`
  (`markers`: the forced texts after an ended and after a cut trace)."""
  p, s = len(prompts), len(budgets)
  n, a = num_traces, num_summaries
  extra = _layout(p, n, s, a, width)
  out = sampling.RolloutBuilder(p, n * (1 + s * a), width)
  prefixes = [[None] * (n * (1 + s * a)) for _ in range(p)]
  requests = []
  for i, prompt in enumerate(prompts):
    key_i = jax.random.fold_in(jax.random.fold_in(key, i), 1)
    for t, seq in enumerate(traces[i]):
      out.put(i, t, seq)
      prefixes[i][t] = list(prompt)
      size = len(seq.completion)
      extra["anytime_length_PG"][i, t] = size
      chunks = np.searchsorted(budgets, np.arange(size), "right")
      extra["anytime_chunk_PGT"][i, t, :size] = chunks
      for length, slots, tail in _cuts(seq, budgets, *markers):
        prefix = list(prompt) + tail
        rows = [n + (t * s + b) * a + k for b in slots for k in range(a)]
        seqs = engine.add(
          prefix,
          key=jax.random.fold_in(key_i, t * s + slots[0]),
          max_new_tokens=summary_tokens,
          num_samples=len(rows),
          temperature=temperature,
          shard=i * engine.shards // p,
        )
        for row, sub in zip(rows, seqs):
          prefixes[i][row] = prefix
          extra["anytime_length_PG"][i, row] = length
          requests.append((i, row, sub))
  engine.run(model)
  for i, row, sub in requests:
    out.put(i, row, sub)
  return out.rollout(*_left_pad(prefixes)), extra


def _cuts(seq, budgets, marker, cut) -> list:
  """(L, the budgets cut at L, thinking[:L] + forced text) for each
  distinct cut L = min(b_s, length) of a drawn thinking."""
  thinking = list(seq.completion)
  reason = sampling.REASONS[seq.stop_reason]
  ended = reason in ("stop_id", "stop_rule")
  if reason == "stop_id":  # the forced text ends the thinking instead
    thinking = thinking[:-1]
  by_length: dict[int, list[int]] = {}
  for b, budget in enumerate(budgets):
    by_length.setdefault(min(budget, len(thinking)), []).append(b)
  return [
    (n, slots, thinking[:n] + (marker if ended and n == len(thinking) else cut))
    for n, slots in by_length.items()
  ]


def _left_pad(prefixes):
  """[P, G, S] left-padded prompt tokens and mask of each row."""
  p, g = len(prefixes), len(prefixes[0])
  w = max(len(x) for row in prefixes for x in row)
  tokens = np.zeros((p, g, w), np.int32)
  mask = np.zeros((p, g, w), np.int32)
  for i, row in enumerate(prefixes):
    for j, x in enumerate(row):
      tokens[i, j, w - len(x) :] = x
      mask[i, j, w - len(x) :] = 1
  return tokens, mask


@dataclasses.dataclass(frozen=True)
class AnytimeBudgets(GroupStrategy):
  """AnytimeReasoner's thinking budgets and forced summaries
  (`sample_anytime`), for `rljax.transforms.brpo_advantages` (preset
  ``brpo``).

  A group of G = N (1 + S A) rows holds N thinking traces and, for each
  trace and budget, A summaries forced after the thinking cut at that
  budget (the group's sample count ``sampler.num_samples`` fixes N). The
  thinking rows train the thinking policy (each token with the advantage
  of its budget chunk); the summary rows, whose prompt is the question,
  the cut thinking and the forced text, train the summary policy; the
  trainer scores every row on its completion, so a summary row's reward
  is that of the summary alone (the official reward reads only the
  summary), and the thinking rows' rewards are not used.

  References:
    Qi et al., "Optimizing Anytime Reasoning via Budget Relative Policy
    Optimization", arXiv 2505.13438 (catalog row 1.82). Checked against
    the official code (sail-sg/AnytimeReasoner 7e3f5bb,
    verl/trainer/ppo/brpo.py ``sample_partial_cot`` and ``LLM.__post_process``,
    verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py): the thinking
    stops at ``</think>`` or at the largest budget; the budgets are
    ``[8000 / n * i for i in 1..n]``; a cut thinking is followed by
    ``"...\\n\\n...\\n\\n</think>"`` and ``"\\n\\n**Final Answer**\\n"``, a
    finished one (ending in ``</think>``) by the latter only; budgets past
    a thinking's end share its full thinking; ``n_summary`` summaries of at
    most 118 tokens per cut; the inserted text is not trained. The paper's
    body could not be read here (only its abstract), so the layout follows
    the code. Difference: the code packs a trace and its summaries into
    one row with a tree attention mask; here each summary is its own row
    (its prompt re-reads the cut thinking), which costs forward compute,
    not a different loss (each thinking token is trained once, in its
    thinking row).

  Args:
    marker: token ids forced after a thinking that ended by itself (the
      code's ``"\\n\\n**Final Answer**\\n"`` after ``</think>``); with the
      engine's stop ids ending the thinking, that stop id is dropped. Ids,
      not text: `draw` has no tokenizer (encode it with the run's).
    budgets: the thinking budgets b_1 < ... < b_S in tokens; the last is
      the thinking's length limit (<= ``sampler.max_new_tokens``).
    num_summaries: A, summaries per cut (the code's ``n_summary``: 4 in
      the main runs, 1 for the GRPO baseline).
    cut_marker: token ids forced after a cut thinking (the code's
      ``"...\\n\\n...\\n\\n</think>\\n\\n**Final Answer**\\n"``); None:
      `marker`.
    summary_tokens: the most tokens of a summary (the code's 128 - 10).
  """

  marker: Sequence[int]
  budgets: Sequence[int] = PAPER_BUDGETS
  num_summaries: int = 4
  cut_marker: Optional[Sequence[int]] = None
  summary_tokens: int = 118

  def __post_init__(self):
    budgets = tuple(self.budgets)
    if not budgets or not all(
      isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 1
      for b in budgets
    ):
      raise ValueError(
        f"budgets={self.budgets!r}; give thinking budgets as ints >= 1, e.g."
        f" {PAPER_BUDGETS}."
      )
    if any(x >= y for x, y in zip(budgets, budgets[1:])):
      raise ValueError(
        f"budgets={budgets} must be strictly increasing, e.g. {PAPER_BUDGETS}."
      )
    for name in ("num_summaries", "summary_tokens"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r}; it must be an int >= 1.")
    object.__setattr__(self, "budgets", tuple(int(b) for b in budgets))
    object.__setattr__(self, "marker", _ids("marker", self.marker))
    if self.cut_marker is not None:
      object.__setattr__(
        self, "cut_marker", _ids("cut_marker", self.cut_marker)
      )

  @property
  def rows_per_trace(self) -> int:
    """1 thinking row + S A summary rows."""
    return 1 + len(self.budgets) * self.num_summaries

  def draw(
    self,
    engine,
    model,
    prompts,
    counts,
    *,
    key,
    max_new_tokens,
    width,
    temperature,
    **unused,
  ):
    del unused  # groups, step, state, batch: not needed
    counts = np.asarray(counts)
    k = self.rows_per_trace
    if len(counts) and (np.any(counts != counts[0]) or counts[0] % k):
      raise ValueError(
        f"AnytimeBudgets with {len(self.budgets)} budgets and"
        f" {self.num_summaries} summaries lays out N x {k} rows per group;"
        f" the prompt sampler gave {counts.min()}..{counts.max()} samples"
        f" (set sampler.num_samples to a multiple of {k}, e.g. {4 * k} for"
        " 4 traces)."
      )
    if self.budgets[-1] > max_new_tokens:
      raise ValueError(
        f"budgets[-1]={self.budgets[-1]} exceeds sampler.max_new_tokens="
        f"{max_new_tokens}; raise it or lower the budgets."
      )
    if self.summary_tokens > width:
      raise ValueError(
        f"summary_tokens={self.summary_tokens} exceeds the rollout width"
        f" {width}; lower it or raise sampler.max_new_tokens."
      )
    return sample_anytime(
      engine,
      model,
      prompts,
      key=key,
      num_traces=int(counts[0]) // k if len(counts) else 1,
      budgets=self.budgets,
      num_summaries=self.num_summaries,
      marker=self.marker,
      cut_marker=self.cut_marker,
      summary_tokens=self.summary_tokens,
      width=width,
      temperature=temperature,
    )
