"""Delethink's chunked traces: reasoning in chunks of bounded context.

A trace is sampled chunk by chunk: the first chunk from the query with a
budget of C tokens; each later chunk from a fresh context, the query plus
a short carryover of the trace so far (its first `keep_head` and last
`keep_tail` tokens), with a budget of C - m tokens (m = keep_head +
keep_tail); the trace ends at a stop token or after `max_chunks` chunks.
Every chunk is a training row with its own prompt.
"""

from collections.abc import Sequence
import dataclasses
from typing import Optional

import jax
import numpy as np

from rljax import sampling
from rljax.rollouts._base import Drawn
from rljax.rollouts._base import GroupStrategy
from rljax.sampling import Rollout

#: engine stop reasons after which a trace goes on with another chunk
_CONTINUE = (sampling.REASONS.index("length"),)


def carryover(trace: Sequence[int], keep_head: int, keep_tail: int) -> list:
  """The next chunk's carryover: the first `keep_head` and the last
  `keep_tail` tokens of the trace so far (all of it when it is shorter
  than both together)."""
  trace = list(trace)
  if len(trace) <= keep_head + keep_tail:
    return trace
  return trace[:keep_head] + trace[len(trace) - keep_tail :]


def sample_chunks(
  engine: sampling.Engine,
  model,
  prompts: Sequence[Sequence[int]],
  *,
  key: jax.Array,
  traces: int,
  max_chunks: int,
  chunk_size: int,
  intermediate_tokens: int,
  keep_head: int,
  keep_tail: int,
  width: int,
  temperature: float,
) -> tuple[Rollout, np.ndarray, np.ndarray, list]:
  """`traces` Delethink traces per prompt, one row per chunk.

  Row ``t * max_chunks + k`` of prompt p is chunk k of trace t. Chunk 0 of
  every trace of p is one `Engine.add` of the prompt (budget `chunk_size`,
  sample t drawing with ``fold_in(fold_in(key, p), 0)``'s child t); chunk
  k >= 1 is a fresh `Engine.add` of prompt + `carryover` (budget
  `intermediate_tokens`, key ``fold_in(fold_in(fold_in(key, p), k), t)``).
  A trace goes on only while its chunks stop at their budget; rows past its
  end are invalid (``sample_mask_PG`` 0). Each row's prompt tokens are its
  own (left-padded to the longest).

  Returns:
    (the [P, traces * max_chunks] `Rollout`, trace_PG and chunk_PG int32
    (-1 for unused rows), and each trace's token list [P][traces]).
  """
  p, g = len(prompts), traces * max_chunks
  out = sampling.RolloutBuilder(p, g, width)
  row_prompts = [[[] for _ in range(g)] for _ in range(p)]
  trace_PG = np.full((p, g), -1, np.int32)
  chunk_PG = np.full((p, g), -1, np.int32)
  tokens = [[[] for _ in range(traces)] for _ in range(p)]
  live = []  # (p, t, sequence) of this level's chunks
  for i, prompt in enumerate(prompts):
    seqs = engine.add(
      list(prompt),
      key=jax.random.fold_in(jax.random.fold_in(key, i), 0),
      max_new_tokens=chunk_size,
      num_samples=traces,
      temperature=temperature,
      shard=i * engine.shards // p,
    )
    live += [(i, t, s) for t, s in enumerate(seqs)]
  for k in range(max_chunks):
    engine.run(model)
    following = []
    for i, t, seq in live:
      j = t * max_chunks + k
      out.put(i, j, seq)
      row_prompts[i][j] = list(seq.tokens[: seq.prompt_length])
      trace_PG[i, j], chunk_PG[i, j] = t, k
      tokens[i][t] += list(seq.completion)
      if k + 1 == max_chunks or seq.stop_reason not in _CONTINUE:
        continue
      carry = carryover(tokens[i][t], keep_head, keep_tail)
      (child,) = engine.add(
        list(prompts[i]) + carry,
        key=jax.random.fold_in(
          jax.random.fold_in(jax.random.fold_in(key, i), k + 1), t
        ),
        max_new_tokens=intermediate_tokens,
        temperature=temperature,
        shard=i * engine.shards // p,
      )
      following.append((i, t, child))
    live = following
  width_s = max(len(x) for row in row_prompts for x in row)
  prompt_PGS = np.zeros((p, g, width_s), np.int32)
  mask_PGS = np.zeros((p, g, width_s), np.int32)
  for i in range(p):
    for j, row in enumerate(row_prompts[i]):
      if row:  # left-padded
        prompt_PGS[i, j, width_s - len(row) :] = row
        mask_PGS[i, j, width_s - len(row) :] = 1
  return out.rollout(prompt_PGS, mask_PGS), trace_PG, chunk_PG, tokens


@dataclasses.dataclass(frozen=True)
class MarkovianChunks(GroupStrategy):
  """Delethink's chunked environment (catalog row 1.87, arXiv 2510.06557).

  Each group holds ``traces`` traces of ``max_chunks`` rows each
  (`sample_chunks`): the prompt sampler's count must be a multiple of
  `max_chunks` (``sampler.num_samples = traces * max_chunks``). The first
  chunk generates up to C = `chunk_size` tokens (default: the run's
  ``sampler.max_new_tokens``); each later chunk restarts from the query
  plus the carryover (first `keep_head` and last `keep_tail` tokens of the
  trace so far) and generates up to `intermediate_tokens` (default C -
  keep_head - keep_tail); so a chunk's context never exceeds query + C.
  Every row's prompt (query + carryover) must fit
  ``task.max_prompt_tokens``. ``Batch.extra["trace_PG"]`` and
  ``["chunk_PG"]`` give each row's trace and chunk index (-1 for unused
  rows) for `rljax.transforms.delethink_advantages` and
  `rljax.transforms.trace_length_norm` (preset ``delethink``).

  The reward of a trace is that of its answer: the trainer scores each row
  on its own completion, so the advantage reads each trace's last chunk
  row. `scoring_rollout` gives every row its whole trace (all chunks'
  tokens) for scoring the trace text instead (see its docstring).

  What was checked, against McGill-NLP/the-markovian-thinker:
  `delethink_tracing_demo.py` (the first chunk gets C new tokens, later
  ones C - m; the prompt is the query, the first 100 tokens of the first
  chunk and the last m of the previous chunk; the trace stops at EOS or
  after I chunks); `verl/experimental/agent_loop/delethink_agent_loop.py`
  with `delethink_trimmers.py` ("progressive") and
  `verl/trainer/config/r1d-1.5b_deepscaler_delethink_24k.yaml`, the
  training run: keep_head 100, keep_tail C/2 - 100, later chunks C/2 new
  tokens, I = 5, C = 8192 (so m = C/2 and the budget C + (I - 1)(C - m) =
  24K); the trimmer keeps the head and tail of (previous carryover + new
  chunk), i.e. the first keep_head and the last keep_tail tokens of the
  trace (`carryover`). The demo is ``keep_head=100, keep_tail=m,
  intermediate_tokens=C - m``; the paper's summaries describe the query
  plus the last m tokens (``keep_head=0``). The paper's own text could not
  be read (only its abstract). Defaults: the training run's.

  Args:
    max_chunks: I, the most chunks of a trace.
    chunk_size: C, the first chunk's budget; None: the run's
      ``max_new_tokens``.
    keep_head: tokens kept from the start of the trace.
    keep_tail: tokens kept from the end of the trace; None: C // 2 -
      keep_head.
    intermediate_tokens: the budget of every later chunk; None: C -
      keep_head - keep_tail.
  """

  max_chunks: int = 5
  chunk_size: Optional[int] = None
  keep_head: int = 100
  keep_tail: Optional[int] = None
  intermediate_tokens: Optional[int] = None

  def __post_init__(self):
    _int("max_chunks", self.max_chunks, 1)
    _int("keep_head", self.keep_head, 0)
    for name in ("chunk_size", "keep_tail", "intermediate_tokens"):
      if getattr(self, name) is not None:
        _int(name, getattr(self, name), 1)

  def budgets(self, max_new_tokens: int) -> tuple[int, int, int]:
    """(C, keep_tail, intermediate_tokens) for a run's budget."""
    c = int(self.chunk_size or max_new_tokens)
    tail = c // 2 - self.keep_head if self.keep_tail is None else self.keep_tail
    if tail < 1:
      raise ValueError(
        f"keep_tail={tail} (C // 2 - keep_head with C={c},"
        f" keep_head={self.keep_head}); the carryover needs at least the"
        " last token: give keep_tail >= 1 or a smaller keep_head."
      )
    inter = self.intermediate_tokens
    if inter is None:
      inter = c - self.keep_head - tail
    if not 1 <= inter <= c:
      raise ValueError(
        f"intermediate_tokens={inter} with C={c}, keep_head="
        f"{self.keep_head}, keep_tail={tail}; a later chunk must generate"
        " 1..C tokens: make keep_head + keep_tail < C or give"
        " intermediate_tokens."
      )
    return c, tail, inter

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
    del unused  # groups, step, state
    counts = np.asarray(counts)
    if counts.size and (
      np.any(counts != counts.flat[0]) or counts.flat[0] % self.max_chunks
    ):
      raise ValueError(
        f"MarkovianChunks lays out traces x max_chunks={self.max_chunks}"
        f" rows per group; the prompt sampler gave {counts.min()}.."
        f"{counts.max()} samples: set sampler.num_samples to a multiple of"
        f" {self.max_chunks} (traces * max_chunks)."
      )
    c, tail, inter = self.budgets(max_new_tokens)
    if c > width:
      raise ValueError(
        f"chunk_size={c} exceeds the rollout width {width}; raise"
        " sampler.max_new_tokens or lower chunk_size."
      )
    rollout, trace, chunk, _ = sample_chunks(
      engine,
      model,
      prompts,
      key=key,
      traces=int(counts.flat[0]) // self.max_chunks if counts.size else 0,
      max_chunks=self.max_chunks,
      chunk_size=c,
      intermediate_tokens=inter,
      keep_head=self.keep_head,
      keep_tail=tail,
      width=width,
      temperature=temperature,
    )
    return Drawn(rollout, {"trace_PG": trace, "chunk_PG": chunk})

  def scoring_rollout(self, rollout: Rollout, extra: dict) -> Rollout:
    """`rollout` with every valid row's completion replaced by its whole
    trace (its chunks' tokens in order, wider than the chunks), for
    scoring: each row then scores as its trace (the official reward
    manager scores the last chunk with the carryover in its prompt, i.e.
    the trace's head and tail and its last chunk; the demo scores the
    whole trace). ``truncated_PG`` is the trace's last chunk's. The
    trainer (`rljax.training` `sample_groups`) does not call it yet: it
    scores each row's own completion, and the advantage reads the last
    chunk's reward."""
    trace, chunk = np.asarray(extra["trace_PG"]), np.asarray(extra["chunk_PG"])
    tokens, mask = np.asarray(rollout.tokens_PGT), np.asarray(rollout.mask_PGT)
    p, g, _ = tokens.shape
    texts, truncated = {}, {}
    for i in range(p):
      for j in np.argsort(np.where(trace[i] >= 0, chunk[i], -1), kind="stable"):
        if trace[i, j] < 0:
          continue
        row = tokens[i, j][mask[i, j] > 0].tolist()
        texts.setdefault((i, trace[i, j]), []).extend(row)
        truncated[i, trace[i, j]] = bool(rollout.truncated_PG[i, j])
    width = max([len(t) for t in texts.values()] + [1])
    out = np.zeros((p, g, width), np.int32)
    out_mask = np.zeros((p, g, width), np.int32)
    out_truncated = np.array(rollout.truncated_PG, bool)
    for (i, t), ids in texts.items():
      rows = trace[i] == t
      out[i, rows, : len(ids)] = ids
      out_mask[i, rows, : len(ids)] = 1
      out_truncated[i, rows] = truncated[i, t]
    zeros = np.zeros((p, g, width), np.float32)
    return rollout._replace(
      tokens_PGT=out,
      mask_PGT=out_mask,
      logp_PGT=zeros,
      full_logp_PGT=zeros,
      truncated_PG=out_truncated,
      routing_PGLWK=None,  # the sampler's routing was of other tokens
    )


def _int(name: str, value, least: int) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"{name}={value!r} must be an int >= {least}.")
  if value < least:
    raise ValueError(f"{name}={value} must be >= {least}.")
