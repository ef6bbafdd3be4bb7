"""Group strategies: how the samples of a step's groups are produced.

By default a group is G samples of its prompt at the run's temperature. A
`GroupStrategy` changes that in two places: `plan` gives each sample of a
group its own recipe before sampling (a `Member`: another prompt to sample
from, the prompt the update conditions on, a temperature, or a given
completion instead of a sampled one), and `revise` looks at the scored
groups and asks for replacements (hints for groups that all failed, a
stored success), round after round until it asks for none. The trainer
samples each round with the rollout engine, scores the new samples and
writes them into the batch; which recipe made each sample reaches the
algorithm as ``Batch.extra["stream_PG"]`` (the members' ``stream``).
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from rljax import sampling
from rljax.sampling import Rollout

#: Batch.extra["stream_PG"] values of the built-in strategies (`Member.stream`)
PLAIN, PRIVILEGED, HINTED, INJECTED, EXPLORE = range(5)

State = dict[str, Any]  # JSON values and numpy arrays (checkpointed)
# (rollout [R, N], rows: the group of each row) -> total rewards [R, N]
Scorer = Callable[[Rollout, Sequence[int]], np.ndarray]


class Member(NamedTuple):
  """The recipe of one sample of a group.

  Attributes:
    prompt: the text to sample from; None: the task's prompt.
    train_prompt: the text the update conditions on; None: `prompt`. A
      sample drawn from a prompt with privileged context (a hint, a policy
      document, demonstrations) and trained on the plain prompt is
      off-policy: its ``rollout_logp_PGT`` is the sampler's, under the
      privileged prompt.
    completion: a given completion text instead of a sampled one (a ground
      truth, a stored success); its tokens get ``rollout_logp_PGT`` 0
      (behaviour probability 1: the sampler did not draw them).
    temperature: the sampling temperature; None: the run's.
    stream: an int tag of the recipe (``Batch.extra["stream_PG"]``).
    only_if_correct: a replacement (`GroupStrategy.revise`) that enters the
      group only if it is correct; otherwise the sample it would replace
      stays.
    max_new_tokens: this sample's generation budget (at most the step's);
      None: the step's.
    prefix: completion tokens the sample starts with (a rollout paused in
      an earlier step, a replayed one); the engine prefills the prompt and
      the prefix and samples on, within the budget, unless the prefix
      already ends with a stop id or fills the budget.
    prefix_logp: the prefix tokens' sampler log-probs ``rollout_logp_PGT``
      (the policy that drew them); None: 0 (given, not sampled).
    prefix_full_logp: their log-probs under the full distribution; None:
      0.
  """

  prompt: Optional[str] = None
  train_prompt: Optional[str] = None
  completion: Optional[str] = None
  temperature: Optional[float] = None
  stream: int = 0
  only_if_correct: bool = False
  max_new_tokens: Optional[int] = None
  prefix: Optional[tuple] = None
  prefix_logp: Optional[tuple] = None
  prefix_full_logp: Optional[tuple] = None


class Group(NamedTuple):
  """A group as `GroupStrategy.plan` and `revise` see it."""

  example: Mapping[str, Any]  # the task example
  prompt: str  # the task's prompt text for it
  prompt_id: int  # its index in the training set
  num_samples: int  # the samples it gets (the prompt sampler's count)


class Scores(NamedTuple):
  """The scored samples of every group (the whole global batch) for
  `GroupStrategy.revise` and `update`; samples past a group's count are
  invalid and hold zeros."""

  rewards: np.ndarray  # float32 [P, G] total reward
  correct: np.ndarray  # bool [P, G] the task's first reward > 0
  valid: np.ndarray  # bool [P, G]
  members: list[list[Member]]  # [P][G] the recipe of each sample
  completions: list[list[str]]  # [P][G] decoded completion texts
  # [P, G] the sampled tokens' mean -log p under the full distribution at
  # their temperature: an unbiased estimate of the sample's mean token
  # entropy under its sampling distribution (0 for given completions)
  surprise: np.ndarray
  # the scored [P, G] rollout (tokens, masks, sampler log-probs), to store
  # or continue samples
  rollout: Optional[Rollout] = None


class Drawn(NamedTuple):
  """What `GroupStrategy.draw` returns (a plain ``(rollout, extra)`` pair
  also does)."""

  rollout: Rollout  # [P, G]
  extra: dict = {}  # named side arrays for Batch.extra (_PG layouts)
  # the groups the rows belong to, when they are not the step's new
  # prompts (groups carried over from earlier steps); None: those
  groups: Optional[list] = None
  state: Optional[State] = None  # the strategy's state after drawing


class GroupStrategy:
  """Builds the samples of each group (see the module docstring).

  A strategy is a function of its state, like a prompt sampler: `init`
  makes the state, `update` learns from each step's final groups, and the
  trainer checkpoints it (JSON values and numpy arrays) and calls the
  methods with the same global batch on every process, so their results
  must be deterministic (randomness from the state or the step).
  """

  #: the most rounds of `revise` per step
  max_rounds: int = 1

  def prepare(self, task) -> "GroupStrategy":
    """This strategy bound to the run's `rljax.tasks.Task` (for strategies
    that draw on the training set); the trainer calls it once. Default:
    itself."""
    del task
    return self

  def bind(self, tokenizer, *, chat: bool) -> "GroupStrategy":
    """This strategy bound to the run's tokenizer, for strategies that
    decode or encode text between decoding rounds (agent episodes); `chat`
    says whether prompts are chat-templated. The trainer calls it once,
    after `prepare`. Default: itself."""
    del tokenizer, chat
    return self

  def init(self) -> State:
    """The state before the first step (default: empty)."""
    return {}

  def new_prompts(self, batch: int, state: State) -> int:
    """How many new prompts the prompt sampler picks this step for a batch
    of `batch` groups (default: `batch`; a strategy that carries groups
    across steps asks for fewer, or more to fill its pool)."""
    del state
    return batch

  def draw(
    self,
    engine,
    model,
    prompts: Sequence[Sequence[int]],
    counts: np.ndarray,
    *,
    key: jax.Array,
    max_new_tokens: int,
    width: int,
    temperature: float,
    groups: Sequence[Group] = (),
    step: int = 0,
    state: Optional[State] = None,
    batch: Optional[int] = None,
    score: Optional[Scorer] = None,
  ) -> Optional[Drawn]:
    """Sample the groups itself with the engine (trees of forks, ...):
    the [P, G] `Rollout` of the unpadded prompt token lists `prompts`
    (``counts`` samples each; `groups` describes them) and named side
    arrays for ``Batch.extra`` (``_PG`` layouts, e.g. a tree's ancestor
    ids), as a `Drawn`; None (the default): the groups are the members of
    `plan`. A strategy that keeps groups across steps returns the `batch`
    groups it trains (`Drawn.groups`) and its new state.

    The rollout's prompts are what the update conditions on, row by row
    (a sample drawn from a longer context may train on another one); the
    trainer left-pads them to the run's prompt width. `state` is read-only
    here: `update` returns the next one. `score(rollout, rows)` gives the
    task's total reward of each sample of an [R, N] rollout whose row r
    samples ``groups[rows[r]]`` (for samples that only value a state, such
    as Monte Carlo continuations)."""
    del engine, model, prompts, counts, key, max_new_tokens, width
    del temperature, groups, step, state, batch, score
    return None

  def scoring_rollout(self, rollout: Rollout, extra: dict) -> Rollout:
    """The rollout the task's rewards score in place of a drawn one (e.g.
    each chunk row scored as its whole trace); the batch keeps the drawn
    one. Default: `rollout`."""
    del extra
    return rollout

  def plan(self, group: Group, step: int, state: State) -> list[Member]:
    """The members of `group` (``group.num_samples`` of them) before any
    sampling. Default: plain samples."""
    del step, state
    return [Member()] * group.num_samples

  def revise(
    self,
    groups: Sequence[Group],
    scores: Scores,
    step: int,
    round_: int,
    state: State,
  ) -> dict[tuple[int, int], Member]:
    """Replacements after scoring round `round_` (0 = the planned samples):
    ``{(p, g): Member}`` resamples sample g of group p with the member's
    recipe. Default: none."""
    del groups, scores, step, round_, state
    return {}

  def update(
    self, groups: Sequence[Group], scores: Scores, step: int, state: State
  ) -> State:
    """The state after the step's final groups (default: unchanged)."""
    del groups, scores, step
    return state


def sample_members(
  engine: sampling.Engine,
  model,
  encode,
  members: Sequence[Sequence[Optional[Member]]],
  prompts: Sequence[str],
  *,
  key: jax.Array,
  max_new_tokens: int,
  width: int,
  temperature: float,
  encode_completion,
) -> Rollout:
  """A [P, G] `Rollout` of the given members (None: an empty sample).

  `encode(texts) -> (tokens [n, S], mask [n, S])` left-pads prompt texts;
  `encode_completion(text) -> ids` tokenizes a given completion (with its
  stop token). Members of group p that sample from the same prompt share
  its cache (one `Engine.add` per prompt, prefix and budget, a temperature
  per sample); sample (p, g) of a sampled member draws with key
  ``fold_in(fold_in(key, p), k)``'s children, k counting the group's
  distinct (sampling prompt, prefix, budget) triples in sorted order. A
  member's prefix starts its completion (the engine prefills it after the
  prompt and samples on, its budget counting the prefix). Prompt tokens
  are each sample's ``train_prompt``.
  """
  p, g = len(members), max(len(m) for m in members)
  members = [list(row) + [None] * (g - len(row)) for row in members]
  sample_text = [
    [None if m is None else (m.prompt or prompts[i]) for m in row]
    for i, row in enumerate(members)
  ]
  train_text = [
    [
      prompts[i] if m is None else (m.train_prompt or m.prompt or prompts[i])
      for m in row
    ]
    for i, row in enumerate(members)
  ]
  texts = sorted({t for row in sample_text + train_text for t in row if t})
  tokens_nS, mask_nS = encode(texts)
  index = {t: j for j, t in enumerate(texts)}
  out = sampling.RolloutBuilder(p, g, width)
  requests = []
  for i, row in enumerate(members):
    key_i = jax.random.fold_in(key, i)
    by_prompt: dict[tuple, list[int]] = {}
    for j, m in enumerate(row):
      if m is None:
        continue
      if m.completion is not None:
        out.put_tokens(i, j, encode_completion(m.completion))
        continue
      budget = min(m.max_new_tokens or max_new_tokens, max_new_tokens)
      prefix = tuple(int(t) for t in m.prefix or ())
      if prefix:
        out.put_tokens(
          i,
          j,
          prefix,
          m.prefix_logp,
          m.prefix_full_logp,
          truncated=len(prefix) >= budget,
        )
        if len(prefix) >= budget or prefix[-1] in engine.stop_ids:
          continue
      by_prompt.setdefault((sample_text[i][j], prefix, budget), []).append(j)
    for k, (key_k, slots) in enumerate(sorted(by_prompt.items())):
      text, prefix, budget = key_k
      row_tokens = tokens_nS[index[text]][mask_nS[index[text]] > 0]
      row_tokens = list(row_tokens) + list(prefix)
      budget -= len(prefix)
      temps = [
        temperature if row[j].temperature is None else row[j].temperature
        for j in slots
      ]
      seqs = engine.add(
        row_tokens,
        key=jax.random.fold_in(key_i, k),
        max_new_tokens=budget,
        num_samples=len(slots),
        temperature=temps,
        shard=i * engine.shards // p,
      )
      requests += [(i, j, s, len(prefix)) for j, s in zip(slots, seqs)]
  engine.run(model)
  for i, j, seq, n in requests:
    out.put_after(i, j, seq, n)
  rows = np.asarray([[index[t] for t in row] for row in train_text])
  return out.rollout(tokens_nS[rows], mask_nS[rows])


def splice(rollout: Rollout, new: Rollout, slots) -> Rollout:
  """`rollout` with samples `slots` ((p, g) pairs) taken from `new`."""
  if not slots:
    return rollout
  fields = {}
  for f in Rollout._fields:
    if getattr(rollout, f) is None:  # an optional field (routing_PGLWK)
      fields[f] = None
      continue
    a, b = np.array(getattr(rollout, f)), np.asarray(getattr(new, f))
    for i, j in slots:
      a[i, j] = b[i, j]
    fields[f] = a
  return Rollout(**fields)
