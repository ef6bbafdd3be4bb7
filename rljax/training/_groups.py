"""A step's rollout built by a `rljax.rollouts.GroupStrategy`.

Every process runs the strategy on the whole global batch (the engine
samples the global batch on every process anyway), scores it, and keeps
its own rows, so the strategy's decisions and state agree across hosts.
"""

from collections.abc import Sequence

import jax
import numpy as np

from rljax import rollouts
from rljax._src.errors import UserError
from rljax.training import _hosts
from rljax.training import _rollout


def sample_groups(
  strategy: rollouts.GroupStrategy,
  state: rollouts.State,
  *,
  engine,
  model,
  tokenizer,
  task,
  prompt_ids: Sequence[int],
  counts: np.ndarray,
  key: jax.Array,
  step: int,
  prompt_width: int,
  chat: bool,
  max_new_tokens: int,
  width: int,
  temperature: float,
  mesh=None,
  batch=None,
):
  """(this process's `Scored` rows, the strategy's new state).

  `prompt_ids` are the step's new prompts (`counts` samples each); the
  batch has `batch` groups (default: one per new prompt), which a
  strategy that carries groups across steps chooses itself (`Drawn`)."""
  examples = [task.train[int(i)] for i in prompt_ids]
  prompts = [task.format_prompt(e) for e in examples]
  groups = [
    rollouts.Group(e, t, int(i), int(n))
    for e, t, i, n in zip(examples, prompts, prompt_ids, counts)
  ]
  batch = len(groups) if batch is None else batch
  g = int(np.max(counts)) if len(counts) else 0
  members = []
  for group in groups:
    planned = list(strategy.plan(group, step, state))
    if len(planned) != group.num_samples or not all(
      isinstance(m, rollouts.Member) for m in planned
    ):
      raise UserError(
        f"{type(strategy).__name__}.plan returned {len(planned)} members for"
        f" a group of {group.num_samples} samples; it must return that many"
        " rollouts.Member."
      )
    members.append(planned + [None] * (g - len(planned)))

  def encode(texts):
    try:
      return _rollout.encode_prompts(tokenizer, texts, prompt_width, chat=chat)
    except ValueError as e:
      raise UserError(
        f"a prompt of {type(strategy).__name__} cannot be encoded: {e} A"
        " hinted or augmented prompt longer than"
        f" task.max_prompt_tokens={prompt_width} needs a larger one."
      ) from e

  def encode_completion(text):
    ids = tokenizer.encode(text, add_bos=False)
    return list(ids) + list(tokenizer.stop_ids[:1])

  def sample(members, round_key):
    out = rollouts.sample_members(
      engine,
      model,
      encode,
      members,
      prompts,
      key=round_key,
      max_new_tokens=max_new_tokens,
      width=width,
      temperature=temperature,
      encode_completion=encode_completion,
    )
    engine.close()
    return out

  def score(rollout):
    streams = np.asarray(
      [[0 if m is None else m.stream for m in row] for row in members],
      np.int32,
    )
    scored = _rollout.score_rollout(
      strategy.scoring_rollout(rollout, extra),
      tokenizer,
      task,
      examples,
      prompts,
      prompt_ids=prompt_ids,
      streams=streams,
      extra=extra,
    )
    return scored._replace(rollout=rollout)

  def score_rows(rollout, rows):
    """The total rewards of an [R, N] rollout of groups `rows`."""
    rows = [int(i) for i in rows]
    return _rollout.score_rollout(
      rollout,
      tokenizer,
      task,
      [examples[i] for i in rows],
      [prompts[i] for i in rows],
    ).rewards_PG

  if prompts:
    tokens_PS, mask_PS = encode(prompts)
  else:  # a strategy with enough groups carried over takes no new prompt
    tokens_PS = mask_PS = np.zeros((0, prompt_width), np.int32)
  drawn = strategy.draw(
    engine,
    model,
    [row[m > 0].tolist() for row, m in zip(tokens_PS, mask_PS)],
    np.asarray(counts),
    key=jax.random.fold_in(key, 0),
    max_new_tokens=max_new_tokens,
    width=width,
    temperature=temperature,
    groups=groups,
    step=step,
    state=state,
    batch=batch,
    score=score_rows,
  )
  extra = {}
  if drawn is None:
    rollout = sample(members, jax.random.fold_in(key, 0))
  else:
    drawn = rollouts.Drawn(*drawn)
    rollout, extra = drawn.rollout, drawn.extra
    engine.close()
    if drawn.groups is not None:  # the groups it trains
      groups = list(drawn.groups)
      examples = [gr.example for gr in groups]
      prompts = [gr.prompt for gr in groups]
      prompt_ids = np.asarray([gr.prompt_id for gr in groups], np.int64)
      g = np.shape(rollout.tokens_PGT)[1]
      members = [[rollouts.Member()] * gr.num_samples for gr in groups]
      members = [row + [None] * (g - len(row)) for row in members]
      tokens_PS, mask_PS = encode(prompts)
    if drawn.state is not None:
      state = drawn.state
    if len(groups) != batch:
      raise UserError(
        f"{type(strategy).__name__}.draw returned {len(groups)} groups for"
        f" a batch of {batch}."
      )
    rollout = rollout._replace(
      routing_PGLWK=None,  # routed other prompt slots: route freely
      **_fit_prompts(
        rollout.prompt_tokens_PGS,
        rollout.prompt_mask_PGS,
        tokens_PS,  # the run's prompt width; empty rows: the group's
        mask_PS,
        type(strategy).__name__,
      ),
    )
  scored = score(rollout)
  for round_ in range(strategy.max_rounds):
    wanted = strategy.revise(
      groups, _scores(scored, members), step, round_, state
    )
    if not wanted:
      break
    for i, j in wanted:
      if not (0 <= i < len(groups) and 0 <= j < groups[i].num_samples):
        raise UserError(
          f"{type(strategy).__name__}.revise asked for sample ({i}, {j}),"
          " outside the batch's groups and their sample counts."
        )
    new = sample(
      [[wanted.get((i, j)) for j in range(g)] for i in range(len(groups))],
      jax.random.fold_in(key, round_ + 1),
    )
    before = rollout
    rollout = rollouts.splice(rollout, new, list(wanted))
    old_members = [list(row) for row in members]
    for (i, j), m in wanted.items():
      members[i][j] = m
    scored = score(rollout)
    correct = _scores(scored, members).correct
    undo = [
      (i, j)
      for (i, j), m in wanted.items()
      if m.only_if_correct and not correct[i, j]
    ]
    if undo:  # failed conditional replacements: the samples they replaced
      rollout = rollouts.splice(rollout, before, undo)
      for i, j in undo:
        members[i][j] = old_members[i][j]
      scored = score(rollout)
  state = strategy.update(groups, _scores(scored, members), step, state)
  if mesh is not None:  # this process's rows
    rows = _hosts.own_rows(mesh, len(groups))
    scored = _rollout.take_groups([scored], np.arange(len(groups))[rows])
  return scored, state


def _fit_prompts(tokens_PGS, mask_PGS, group_PS, group_mask_PS, name):
  """A drawn rollout's prompts left-padded to the run's prompt width (that
  of the groups' prompts `group_PS`); an empty row gets its group's."""
  tokens_PGS, mask_PGS = np.asarray(tokens_PGS), np.asarray(mask_PGS) > 0
  width = group_PS.shape[1]
  lengths = mask_PGS.sum(-1)
  if lengths.size and lengths.max() > width:
    raise UserError(
      f"{name}.draw made a prompt of {lengths.max()} tokens, over"
      f" task.max_prompt_tokens={width}; raise it."
    )
  p, g, _ = tokens_PGS.shape
  tokens = np.zeros((p, g, width), np.int32)
  mask = np.zeros((p, g, width), np.int32)
  for i in range(p):
    for j in range(g):
      row = tokens_PGS[i, j][mask_PGS[i, j]]
      if not len(row):
        row = group_PS[i][np.asarray(group_mask_PS[i]) > 0]
      tokens[i, j, width - len(row) :] = row
      mask[i, j, width - len(row) :] = 1
  return {"prompt_tokens_PGS": tokens, "prompt_mask_PGS": mask}


def _scores(scored, members) -> rollouts.Scores:
  r = scored.rollout
  p, g, _ = r.tokens_PGT.shape
  valid = np.asarray(r.sample_mask_PG) > 0
  mask = np.asarray(r.mask_PGT, np.float32)
  correct = np.asarray(scored.scores.values_NK)[:, 0].reshape(p, g) > 0
  return rollouts.Scores(
    rewards=np.where(valid, scored.rewards_PG, 0.0).astype(np.float32),
    correct=correct & valid,
    valid=valid,
    members=[list(row) for row in members],
    completions=[scored.completions[i * g : (i + 1) * g] for i in range(p)],
    surprise=-np.sum(r.full_logp_PGT * mask, -1) / np.maximum(mask.sum(-1), 1),
    rollout=r,
  )
