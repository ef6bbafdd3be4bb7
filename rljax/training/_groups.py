"""A step's rollout built by a `rljax.rollouts.GroupStrategy`.

Every process runs the strategy on the whole global batch (the engine
samples the global batch on every process anyway), scores it, and keeps
its own rows, so the strategy's decisions and state agree across hosts.
"""

from collections.abc import Sequence
import dataclasses
from typing import Any

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
  run = _Groups(
    strategy=strategy,
    engine=engine,
    model=model,
    tokenizer=tokenizer,
    task=task,
    prompt_width=prompt_width,
    chat=chat,
    max_new_tokens=max_new_tokens,
    width=width,
    temperature=temperature,
    groups=groups,
    examples=examples,
    prompts=prompts,
    prompt_ids=prompt_ids,
    g=int(np.max(counts)) if len(counts) else 0,
  )
  batch = len(groups) if batch is None else batch
  run.members = _plan(strategy, groups, step, state, run.g)
  rollout, state = _first_rollout(run, counts, key, step, state, batch)
  scored = _revise(run, rollout, key, step, state)
  state = strategy.update(run.groups, _scores(scored, run.members), step, state)
  if mesh is not None:  # this process's rows
    rows = _hosts.own_rows(mesh, len(run.groups))
    scored = _rollout.take_groups([scored], np.arange(len(run.groups))[rows])
  return scored, state


@dataclasses.dataclass(kw_only=True)
class _Groups:
  """A step's groups (the strategy's, once it draws its own) and how they
  are sampled and scored, shared by the draw, the first round and the
  revisions."""

  strategy: rollouts.GroupStrategy
  engine: Any
  model: Any
  tokenizer: Any
  task: Any
  prompt_width: int
  chat: bool
  max_new_tokens: int
  width: int
  temperature: float
  groups: list
  examples: list
  prompts: list
  prompt_ids: Any
  g: int  # samples per group in the rollout
  members: list = dataclasses.field(default_factory=list)
  extra: dict = dataclasses.field(default_factory=dict)  # the draw's

  def adopt(self, groups, g: int) -> None:
    """The groups a strategy's draw trains, sampled `g` per group."""
    self.groups = list(groups)
    self.examples = [gr.example for gr in self.groups]
    self.prompts = [gr.prompt for gr in self.groups]
    self.prompt_ids = np.asarray([gr.prompt_id for gr in self.groups], np.int64)
    self.g = g
    members = [[rollouts.Member()] * gr.num_samples for gr in self.groups]
    self.members = [row + [None] * (g - len(row)) for row in members]

  def encode(self, texts):
    """Left-padded prompt tokens and mask at the run's prompt width."""
    try:
      return _rollout.encode_prompts(
        self.tokenizer, texts, self.prompt_width, chat=self.chat
      )
    except ValueError as e:
      raise UserError(
        f"a prompt of {type(self.strategy).__name__} cannot be encoded: {e}"
        " A hinted or augmented prompt longer than"
        f" task.max_prompt_tokens={self.prompt_width} needs a larger one."
      ) from e

  def encode_completion(self, text):
    ids = self.tokenizer.encode(text, add_bos=False)
    return list(ids) + list(self.tokenizer.stop_ids[:1])

  def sample(self, members, round_key):
    """A rollout of `members` (None: a slot left empty)."""
    out = rollouts.sample_members(
      self.engine,
      self.model,
      self.encode,
      members,
      self.prompts,
      key=round_key,
      max_new_tokens=self.max_new_tokens,
      width=self.width,
      temperature=self.temperature,
      encode_completion=self.encode_completion,
    )
    self.engine.close()
    return out

  def score(self, rollout):
    """The rollout of the groups, scored, with its members' streams."""
    streams = np.asarray(
      [[0 if m is None else m.stream for m in row] for row in self.members],
      np.int32,
    )
    scored = _rollout.score_rollout(
      self.strategy.scoring_rollout(rollout, self.extra),
      self.tokenizer,
      self.task,
      self.examples,
      self.prompts,
      prompt_ids=self.prompt_ids,
      streams=streams,
      extra=self.extra,
    )
    return scored._replace(rollout=rollout)

  def score_rows(self, rollout, rows):
    """The total rewards of an [R, N] rollout of groups `rows`."""
    rows = [int(i) for i in rows]
    return _rollout.score_rollout(
      rollout,
      self.tokenizer,
      self.task,
      [self.examples[i] for i in rows],
      [self.prompts[i] for i in rows],
    ).rewards_PG


def _plan(strategy, groups, step, state, g: int) -> list:
  """Each group's planned members, padded with None to `g` slots."""
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
  return members


def _first_rollout(run: _Groups, counts, key, step, state, batch):
  """The strategy's draw, or else its planned members sampled: (the
  rollout, the strategy's state)."""
  if run.prompts:
    tokens_PS, mask_PS = run.encode(run.prompts)
  else:  # a strategy with enough groups carried over takes no new prompt
    tokens_PS = mask_PS = np.zeros((0, run.prompt_width), np.int32)
  drawn = run.strategy.draw(
    run.engine,
    run.model,
    [row[m > 0].tolist() for row, m in zip(tokens_PS, mask_PS)],
    np.asarray(counts),
    key=jax.random.fold_in(key, 0),
    max_new_tokens=run.max_new_tokens,
    width=run.width,
    temperature=run.temperature,
    groups=run.groups,
    step=step,
    state=state,
    batch=batch,
    score=run.score_rows,
  )
  if drawn is None:
    return run.sample(run.members, jax.random.fold_in(key, 0)), state
  drawn = rollouts.Drawn(*drawn)
  rollout, run.extra = drawn.rollout, drawn.extra
  run.engine.close()
  if drawn.groups is not None:  # the groups it trains
    run.adopt(drawn.groups, np.shape(rollout.tokens_PGT)[1])
    tokens_PS, mask_PS = run.encode(run.prompts)
  if drawn.state is not None:
    state = drawn.state
  if len(run.groups) != batch:
    raise UserError(
      f"{type(run.strategy).__name__}.draw returned {len(run.groups)} groups"
      f" for a batch of {batch}."
    )
  rollout = rollout._replace(
    routing_PGLWK=None,  # routed other prompt slots: route freely
    **_fit_prompts(
      rollout.prompt_tokens_PGS,
      rollout.prompt_mask_PGS,
      tokens_PS,  # the run's prompt width; empty rows: the group's
      mask_PS,
      type(run.strategy).__name__,
    ),
  )
  return rollout, state


def _revise(run: _Groups, rollout, key, step, state):
  """The rollout scored, after the strategy's rounds of revisions."""
  scored = run.score(rollout)
  for round_ in range(run.strategy.max_rounds):
    wanted = run.strategy.revise(
      run.groups,
      _scores(scored, run.members),
      step,
      round_,
      state,
    )
    if not wanted:
      break
    for i, j in wanted:
      if not (0 <= i < len(run.groups) and 0 <= j < run.groups[i].num_samples):
        raise UserError(
          f"{type(run.strategy).__name__}.revise asked for sample ({i}, {j}),"
          " outside the batch's groups and their sample counts."
        )
    rollout, scored = _replace_samples(
      run, rollout, wanted, jax.random.fold_in(key, round_ + 1)
    )
  return scored


def _replace_samples(run: _Groups, rollout, wanted, key):
  """The rollout with the `wanted` samples resampled, and scored; failed
  conditional replacements are undone."""
  new = run.sample(
    [
      [wanted.get((i, j)) for j in range(run.g)] for i in range(len(run.groups))
    ],
    key,
  )
  before = rollout
  rollout = rollouts.splice(rollout, new, list(wanted))
  old_members = [list(row) for row in run.members]
  for (i, j), m in wanted.items():
    run.members[i][j] = m
  scored = run.score(rollout)
  correct = _scores(scored, run.members).correct
  undo = [
    (i, j)
    for (i, j), m in wanted.items()
    if m.only_if_correct and not correct[i, j]
  ]
  if undo:  # failed conditional replacements: the samples they replaced
    rollout = rollouts.splice(rollout, before, undo)
    for i, j in undo:
      run.members[i][j] = old_members[i][j]
    scored = run.score(rollout)
  return rollout, scored


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
