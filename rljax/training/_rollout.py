"""From prompts to a scored rollout: tokenize, sample, decode, reward.

Host-side glue around the jitted sampler. A group's G samples share their
prompt's example dict as reward metadata.
"""

from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from rljax import envs
from rljax import rewards as rewards_lib
from rljax import sampling
from rljax._src.errors import UserError
from rljax.sampling import Rollout
from rljax.tokenizers import Tokenizer
from rljax.training import _hosts
from rljax.training._step import Sequences


class Scored(NamedTuple):
  """A rollout with its decoded completions and rewards."""

  rollout: Rollout
  examples: list[dict]  # P task examples
  prompts: list[str]  # P prompt texts
  completions: list[str]  # P * G completion texts, prompt-major
  scores: Any  # rljax.rewards.Scores over the P * G samples
  rewards_PG: np.ndarray  # the weighted total, float32
  prompt_ids_P: Optional[np.ndarray] = None  # int32 dataset indices
  streams_PG: Optional[np.ndarray] = None  # int32 `rollouts.Member.stream`
  extra: Optional[dict] = None  # a group strategy's side arrays (_PG...)


def encode_prompts(
  tokenizer: Tokenizer,
  texts: Sequence[str],
  width: int,
  *,
  chat: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """Left-padded [P, width] prompt ids and mask (chat-templated if asked)."""
  if chat:
    texts = [
      tokenizer.apply_chat_template([{"role": "user", "content": t}])
      for t in texts
    ]
  return tokenizer.encode_batch(
    list(texts), max_length=width, add_bos=None if not chat else False
  )


def sample_and_score(
  model,
  tokenizer: Tokenizer,
  task,
  examples: Sequence[dict],
  *,
  key: jax.Array,
  prompt_width: int,
  chat: bool,
  mesh=None,
  global_rows: Optional[int] = None,
  prompt_ids: Optional[Sequence[int]] = None,
  engine: Optional[sampling.Engine] = None,
  width: Optional[int] = None,
  **sampler_kwargs,
) -> Scored:
  """Sample G completions per example and score them with the task.

  With a `mesh`, `examples` are this process's rows of a global batch of
  `global_rows` prompts: sampling runs on the global batch, sharded over
  the mesh's batch axes, and the returned rollout holds this process's rows
  (as numpy), which it decodes and scores. With an `engine` the
  continuous-batching engine samples (its own top-k / top-p / greedy
  settings; `sampler_kwargs` give max_new_tokens, num_samples and
  temperature), else `rljax.sampling.generate`. Completions are padded to
  `width` tokens (default: max_new_tokens).
  """
  prompts = [task.format_prompt(e) for e in examples]
  tokens, mask = encode_prompts(tokenizer, prompts, prompt_width, chat=chat)
  if mesh is not None:
    tokens, mask = _hosts.to_global((tokens, mask), mesh, global_rows)
  if engine is not None:
    rollout = sampling.rollout(
      engine, model, tokens, mask, key=key, width=width, **sampler_kwargs
    )
    engine.close()
    if mesh is not None:  # every process holds the whole batch
      rows = _hosts.own_rows(mesh, rollout.tokens_PGT.shape[0])
      rollout = jax.tree.map(lambda x: np.asarray(x)[rows], rollout)
  else:
    rollout = sampling.generate(
      model,
      tokens,
      mask,
      key=key,
      stop_ids=tokenizer.stop_ids,
      **sampler_kwargs,
    )
    if mesh is not None:
      rollout = _hosts.to_local(rollout, mesh)
    rollout = _pad_completions(rollout, width)
  return score_rollout(
    rollout, tokenizer, task, examples, prompts, prompt_ids=prompt_ids
  )


def sample_episodes(
  strategy,
  engine: sampling.Engine,
  model,
  tokenizer: Tokenizer,
  task,
  examples: Sequence[dict],
  *,
  key: jax.Array,
  width: int,
  mesh=None,
  num_samples: int = 1,
  temperature: float = 1.0,
) -> Scored:
  """`num_samples` agent episodes of each of the global `examples` with a
  bound `rljax.envs.EpisodeRollouts`, scored; with a `mesh`, this
  process's rows (every process runs the whole batch)."""
  episodes = envs.run_episodes(
    engine,
    model,
    strategy.renderer,
    strategy.environment,
    examples,
    [num_samples] * len(examples),
    key=key,
    width=width,
    turn_tokens=strategy.turn_tokens or width,
    max_turns=int(strategy.max_turns or 1),
    temperature=temperature,
    overlap=strategy.overlap,
    workers=strategy.workers,
    step_timeout=strategy.step_timeout,
  )
  engine.close()
  rollout, extra = episodes.rollout, episodes.extra
  rows = np.arange(len(examples))
  if mesh is not None:
    rows = _hosts.own_rows(mesh, len(examples))
    rollout = jax.tree.map(lambda x: np.asarray(x)[rows], rollout)
    extra = {k: np.asarray(v)[rows] for k, v in extra.items()}
  mine = [examples[i] for i in rows]
  prompts = [task.format_prompt(e) for e in mine]
  return score_rollout(rollout, tokenizer, task, mine, prompts, extra=extra)


def score_rollout(
  rollout: Rollout,
  tokenizer: Tokenizer,
  task,
  examples: Sequence[dict],
  prompts: Sequence[str],
  *,
  prompt_ids: Optional[Sequence[int]] = None,
  streams: Optional[np.ndarray] = None,
  extra: Optional[dict] = None,
) -> Scored:
  """Decode and score the valid samples of `rollout` (P = len(examples))."""
  p, g, t = rollout.tokens_PGT.shape
  tokens_NT = np.asarray(rollout.tokens_PGT).reshape(p * g, t)
  mask_NT = np.asarray(rollout.mask_PGT).reshape(p * g, t)
  completions = tokenizer.decode_batch(tokens_NT, mask=mask_NT)
  # Only samples that exist are scored (a prompt may get fewer than G).
  valid = np.flatnonzero(np.asarray(rollout.sample_mask_PG).reshape(-1))
  samples = rewards_lib.Samples(
    texts=[completions[i] for i in valid],
    num_tokens=mask_NT.sum(-1)[valid],
    truncated=np.asarray(rollout.truncated_PG).reshape(-1)[valid],
    metadata=[examples[i // g] for i in valid],
    extra={
      k: np.asarray(v).reshape(p * g, *np.shape(v)[2:])[valid]
      for k, v in (extra or {}).items()
      if k.endswith("_PG")
    }
    or None,
  )
  scores = _spread(rewards_lib.score(samples, task.rewards), valid, p * g)
  return Scored(
    rollout=rollout,
    examples=list(examples),
    prompts=prompts,
    completions=completions,
    scores=scores,
    rewards_PG=np.asarray(scores.total_N, np.float32).reshape(p, g),
    prompt_ids_P=None
    if prompt_ids is None
    else np.asarray(prompt_ids, np.int32),
    streams_PG=streams,
    extra=extra or None,
  )


def _pad_completions(rollout: Rollout, width: Optional[int]) -> Rollout:
  """`rollout` with its completion axis zero-padded to `width`."""
  t = rollout.tokens_PGT.shape[-1]
  if width is None or width == t:
    return rollout
  pad = lambda x: np.pad(np.asarray(x), [(0, 0), (0, 0), (0, width - t)])  # noqa: E731
  routing = rollout.routing_PGLWK  # MoE: its token axis grows too
  if routing is not None:
    routing = np.pad(
      np.asarray(routing), [(0, 0)] * 3 + [(0, width - t)] + [(0, 0)]
    )
  return rollout._replace(
    routing_PGLWK=routing,
    **{f: pad(getattr(rollout, f)) for f in Rollout._fields if f[-3:] == "PGT"},
  )


def _spread(scores, rows: np.ndarray, n: int):
  """Scores of the samples `rows` as scores of all `n` (zeros elsewhere)."""
  if len(rows) == n:
    return scores
  values = np.zeros((n, *np.shape(scores.values_NK)[1:]), np.float32)
  values[rows] = scores.values_NK
  total = np.zeros((n,), np.float32)
  total[rows] = scores.total_N
  return scores._replace(values_NK=values, total_N=total)


def sequences(rollout: Rollout) -> Sequences:
  """Prompt + completion as one [P, G, S + T] sequence per sample."""
  return Sequences(
    tokens_PGL=np.concatenate(
      [np.asarray(rollout.prompt_tokens_PGS), np.asarray(rollout.tokens_PGT)],
      -1,
    ),
    mask_PGL=np.concatenate(
      [np.asarray(rollout.prompt_mask_PGS), np.asarray(rollout.mask_PGT)], -1
    ),
    routing_PGYLK=rollout.routing_PGLWK,
  )


def take_groups(scored: Sequence[Scored], order: np.ndarray) -> Scored:
  """Groups of several rollouts, concatenated, then picked by `order`."""
  cat = lambda xs: np.concatenate([np.asarray(x) for x in xs])  # noqa: E731
  rollout = Rollout(
    *(
      None  # an optional field (e.g. a dense model's routing_PGLWK)
      if getattr(scored[0].rollout, f) is None
      else cat([getattr(s.rollout, f) for s in scored])[order]
      for f in Rollout._fields
    )
  )
  g = scored[0].rewards_PG.shape[1]
  examples = [e for s in scored for e in s.examples]
  prompts = [p for s in scored for p in s.prompts]
  completions = [c for s in scored for c in s.completions]
  values = cat([s.scores.values_NK for s in scored])
  sample_order = (order[:, None] * g + np.arange(g)[None]).reshape(-1)
  scores = scored[0].scores._replace(
    values_NK=values[sample_order],
    total_N=cat([s.scores.total_N for s in scored])[sample_order],
    # Reward means and unparseable rates over everything sampled this step
    # (the rollouts are the same size), not only over the kept groups.
    metrics={
      k: float(np.mean([s.scores.metrics[k] for s in scored]))
      for k in scored[0].scores.metrics
    },
  )
  return Scored(
    rollout=rollout,
    examples=[examples[i] for i in order],
    prompts=[prompts[i] for i in order],
    completions=[completions[i] for i in sample_order],
    scores=scores,
    rewards_PG=cat([s.rewards_PG for s in scored])[order],
    prompt_ids_P=None
    if scored[0].prompt_ids_P is None
    else cat([s.prompt_ids_P for s in scored])[order],
    streams_PG=None
    if scored[0].streams_PG is None
    else cat([s.streams_PG for s in scored])[order],
    extra=None
    if not scored[0].extra
    else {k: cat([s.extra[k] for s in scored])[order] for k in scored[0].extra},
  )


def annotations(annotate, scored: Scored) -> dict[str, np.ndarray]:
  """``annotate(scored)``'s side data for ``Batch.extra``, checked."""
  p, g, _ = scored.rollout.tokens_PGT.shape
  out = annotate(scored)
  if not isinstance(out, dict):
    raise UserError(
      f"Trainer(annotate=...) returned a {type(out).__name__}; it must"
      " return a dict of arrays, e.g. {'answer_ids_PG': ids}."
    )
  shapes = {
    "P": (p,),
    "PG": (p, g),
    "PGT": tuple(scored.rollout.mask_PGT.shape),
  }
  for name, value in out.items():
    lead = shapes.get(name.rsplit("_", 1)[-1])
    value = np.asarray(value)
    if lead is None or value.shape[: len(lead)] != lead:
      raise UserError(
        f"Trainer(annotate=...) returned {name!r} with shape {value.shape};"
        " names end with their layout (_P, _PG or _PGT) and the array's"
        f" leading shape must match this process's rows ({shapes})."
      )
  return {k: np.asarray(v) for k, v in out.items()}
