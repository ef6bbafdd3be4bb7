"""Tree rollouts: each group's samples are the leaves of a tree of segments
that fork at fixed depths (TreePO's segment trees, Polychromic vines), a
fixed number of ways or, as in TreePO's sampler, by a leaf budget that
passes from ended branches to surviving ones, with a fallback that regrows
a group from its finished leaves."""

from collections.abc import Sequence
import dataclasses
from typing import Optional

import jax
import numpy as np

from rljax import sampling
from rljax.rollouts._base import GroupStrategy
from rljax.sampling import Rollout

_ENDED = ("stop_id", "stop_rule")
#: how `sample_trees` splits a prompt's fork budget among its live nodes
DIVERGENCES = (
  "fixed",
  "even",
  "logprob",
  "inverse_logprob",
  "mean_logprob",
  "inverse_mean_logprob",
  "segment_logprob",
  "inverse_segment_logprob",
)
#: where a fallback branch restarts (None: no fallback)
FALLBACKS = (None, "random", "from_start")
#: which finished leaves a fallback may restart from
FALLBACK_LEAVES = ("stopped", "any")
_FALLBACK_KEY = 2**31 - 1  # fold_in tag of a prompt's fallback stream


def divergence_forks(
  scores_N,
  *,
  forks_N,
  freed: int,
  done: int,
  leaves: int,
  policy: str = "even",
  temperature: float = 1.0,
) -> np.ndarray:
  """TreePO's adaptive divergence: the forks of each of a prompt's N live
  nodes after a round of segments (arXiv 2508.17445, the official sampler's
  ``by_fixed_div`` budget with its ``fixed_avg`` and log-prob weighted
  divergence policies).

  The round's budget passes the forks of the branches that ended to the
  survivors, within what is left of the group's leaves::

    B = max(min(leaves - done, sum_n forks_n + freed), N)

  ``even`` (the code's ``fixed_avg``) gives each node floor(B / N) and the
  last node the remainder too. The weighted policies give each node 1 and
  split the other B - N by largest remainders of the weights
  ``w = softmax(s (score - min score) / temperature)``, ties to the
  earlier node; s = -1 (``logprob``, ``mean_logprob``,
  ``segment_logprob``: the least likely path, "local uncertainty", branches
  most) or +1 (the ``inverse_`` variants).

  Args:
    scores_N: each live node's log-prob statistic (unused by ``even``).
    forks_N: each live node's nominal forks (``branching`` at its depth;
      the code's ``fixed_step_div`` k).
    freed: the nominal forks of the nodes that ended this round (k per
      ended node in the code).
    done: the prompt's finished leaves, this round's included.
    leaves: the group's leaf budget (the code's ``max_width``).
    policy: ``even`` or one of the weighted policies (`DIVERGENCES`).
    temperature: the weights' softmax temperature.

  Returns:
    int64 [N] forks, each >= 1, summing to B.
  """
  scores = np.asarray(scores_N, np.float64).reshape(-1)
  n = scores.size
  if policy not in DIVERGENCES[1:]:
    raise ValueError(
      f"policy={policy!r}; use one of {DIVERGENCES[1:]} (fixed branching"
      " needs no budget)."
    )
  if not temperature > 0:
    raise ValueError(f"temperature={temperature}; it must be > 0.")
  budget = max(min(leaves - done, int(np.sum(forks_N)) + freed), n)
  if n == 0:
    return np.zeros(0, np.int64)
  if policy == "even":
    out = np.full(n, budget // n, np.int64)
    out[-1] += budget % n
    return out
  sign = 1.0 if policy.startswith("inverse_") else -1.0
  z = sign * (scores - scores.min()) / temperature
  w = np.exp(z - z.max())
  w /= w.sum()
  raw = w * (budget - n)
  base = np.floor(raw).astype(np.int64)
  order = np.argsort(-(raw - base), kind="stable")
  base[order[: budget - n - int(base.sum())]] += 1
  return 1 + base


@dataclasses.dataclass
class _Node:
  """A tree node: its prompt, its ids at depths 1..d, its sequence, and the
  completion tokens it continues (a fallback's re-prefilled prefix)."""

  prompt: int
  path: list
  seq: object  # sampling.Sequence
  head: tuple = ((), (), ())  # tokens, logp, full_logp before seq's
  bounds: tuple = ()  # completion lengths at its ancestors' ends

  @property
  def depth(self) -> int:
    return len(self.path)

  def arrays(self):
    """(tokens, logp, full_logp) of its whole completion."""
    s = self.seq
    return (
      list(self.head[0]) + list(s.completion),
      list(self.head[1]) + list(s.logp),
      list(self.head[2]) + list(s.full_logp),
    )

  def score(self, divergence: str) -> float:
    """The log-prob statistic of `divergence` (sampler log-probs)."""
    if divergence.endswith("segment_logprob"):
      s = self.seq
      lp = s.logp[s.turn_start - s.prompt_length :]
      return float(np.mean(lp)) if lp else 0.0
    lp = self.arrays()[1]
    if not lp:
      return 0.0
    return float(np.mean(lp) if "mean" in divergence else np.sum(lp))


def _check_options(branching, leaves, divergence, fallback, fallback_leaves):
  if not branching or min(branching) < 1:
    raise ValueError(
      f"branching={list(branching)}; give the forks at each depth, each >= 1."
    )
  if divergence not in DIVERGENCES:
    raise ValueError(f"divergence={divergence!r}; use one of {DIVERGENCES}.")
  if fallback not in FALLBACKS:
    raise ValueError(f"fallback={fallback!r}; use one of {FALLBACKS}.")
  if fallback_leaves not in FALLBACK_LEAVES:
    raise ValueError(
      f"fallback_leaves={fallback_leaves!r}; use one of {FALLBACK_LEAVES}."
    )
  if divergence == "fixed":
    if fallback is not None:
      raise ValueError(
        f"fallback={fallback!r} with fixed divergence; a fallback fills the"
        " leaf budget of an adaptive divergence (e.g. divergence='even',"
        " leaves=G), fixed forks could overrun it."
      )
    if leaves is not None and leaves != int(np.prod(branching)):
      raise ValueError(
        f"leaves={leaves} with fixed divergence; fixed branching makes"
        f" prod(branching) = {int(np.prod(branching))} leaves (leave leaves"
        " None, or pick an adaptive divergence such as 'even')."
      )
    return int(np.prod(branching))
  if leaves is None or leaves < branching[0]:
    raise ValueError(
      f"leaves={leaves} with divergence={divergence!r}; give the group's"
      f" leaf budget, at least branching[0] = {branching[0]}."
    )
  return int(leaves)


def sample_trees(
  engine: sampling.Engine,
  model,
  prompts: Sequence[Sequence[int]],
  *,
  key: jax.Array,
  branching: Sequence[int],
  segment: int,
  max_new_tokens: int,
  width: int,
  temperature: float,
  leaves: Optional[int] = None,
  divergence: str = "fixed",
  divergence_temperature: float = 1.0,
  fallback: Optional[str] = None,
  fallback_leaves: str = "stopped",
) -> tuple[Rollout, np.ndarray]:
  """One tree of samples per prompt, in group layout.

  A prompt's first segment is drawn ``branching[0]`` times (at most
  `segment` tokens each). Rounds of segments follow: a node that ended
  (stop id or rule), ran out of budget or is at the last depth D =
  len(branching) is a leaf; every other node forks, its children sharing
  their ancestors' KV cache; the last depth's nodes run to the end of the
  `max_new_tokens` budget. How many forks (`divergence`):

  * ``fixed``: ``branching[d]`` per node at depth d; G = prod(branching)
    leaves at most.
  * adaptive (TreePO's sampler, arXiv 2508.17445): the prompt's live nodes
    share a budget of ``min(leaves - done, k (N + F))`` forks
    (`divergence_forks`; k = ``branching[d]``, N live nodes, F nodes that
    ended this round, done = its leaves so far), evenly or by log-prob
    weights; G = `leaves`, never exceeded.

  Fallback (the code's ``tree_fallback_policy``): once a prompt has no
  node left to run and fewer than G leaves, its finished leaves (those that
  ended with a stop id or rule, ``fallback_leaves="stopped"``, the code's
  ``soft_boxed_and_eos``, or all, ``"any"``; none: the prompt itself) in
  random order each restart ``branching[j]`` branches (fewer at the end of
  the budget) from their ancestor at depth j, j uniform over the segments
  they span (``"random"``, at most D - 1) or 0 (``"from_start"``, one
  leaf only), until the budget is spent. A restarted branch re-prefills
  its ancestor's prefix (that cache was freed when it forked) and counts
  as its new child; its prefix keeps the ancestor's log-probs.

  The leaves of prompt p, depth-first, are its samples; a tree with fewer
  than G leaves leaves the rest invalid in ``sample_mask_PG``. Node j of a
  node's children draws with ``fold_in(node key, j)``; the roots' parent
  is the prompt with key ``fold_in(key, p)``; prompt p's fallback picks
  and keys come from ``fold_in(fold_in(key, p), 2**31 - 1)``.

  Returns:
    (the `Rollout`, tree_PGD int32 [P, G, D]: the id of each leaf's
    ancestor at depths 1..D, unique within its prompt, -1 below a leaf
    that ended earlier and for invalid samples).
  """
  branching = [int(b) for b in branching]
  g = _check_options(branching, leaves, divergence, fallback, fallback_leaves)
  if int(segment) < 1:
    raise ValueError(f"segment={segment}; it must be >= 1.")
  if max_new_tokens > width:
    raise ValueError(
      f"max_new_tokens={max_new_tokens} exceeds the rollout width {width}."
    )
  trees = _Trees(
    engine,
    prompts,
    key,
    branching,
    g,
    segment=segment,
    max_new_tokens=max_new_tokens,
    temperature=temperature,
    divergence=divergence,
    divergence_temperature=divergence_temperature,
    fallback=fallback,
    fallback_leaves=fallback_leaves,
  )
  active = trees.plant()
  while active:
    engine.run(model)
    live, freed = trees.settle(active)
    active = trees.fork(live, freed)
    if fallback is not None:
      active += trees.regrow({n.prompt for n in active})
  done = [[n for n, _ in d] for d in trees.done]
  return _assemble(prompts, done, g, len(branching), width)


@dataclasses.dataclass(eq=False)
class _Trees:
  """The growing trees of one `sample_trees` call: the nodes of each
  prompt so far (`counter`), its finished leaves (`done`, each with
  whether it ended) and its fallback streams."""

  engine: sampling.Engine
  prompts: Sequence[Sequence[int]]
  key: jax.Array
  branching: list
  g: int
  segment: int
  max_new_tokens: int
  temperature: float
  divergence: str
  divergence_temperature: float
  fallback: Optional[str]
  fallback_leaves: str

  def __post_init__(self):
    p = len(self.prompts)
    self.depth = len(self.branching)
    self.counter = [0] * p
    self.done: list[list] = [[] for _ in range(p)]  # finished leaves
    self.fallbacks = [0] * p  # fallback adds per prompt
    self.rngs: dict = {}

  def budget(self, d, left):
    """The tokens of a node at depth d, with `left` tokens left."""
    return left if d == self.depth else min(self.segment, left)

  def _node(self, i, path, seq, head=((), (), ()), bounds=()) -> _Node:
    """A new node of prompt i, its id the prompt's next."""
    node = _Node(i, path + [self.counter[i]], seq, head, bounds)
    self.counter[i] += 1
    return node

  def plant(self) -> list[_Node]:
    """Queue each prompt's ``branching[0]`` roots; returns them."""
    engine, p = self.engine, len(self.prompts)
    active = []  # nodes queued for this round, in creation order
    for i, prompt in enumerate(self.prompts):
      for s in engine.add(
        list(prompt),
        key=jax.random.fold_in(self.key, i),
        max_new_tokens=self.budget(1, self.max_new_tokens),
        num_samples=self.branching[0],
        temperature=self.temperature,
        keep=self.depth > 1,
        shard=i * engine.shards // p,
      ):
        active.append(self._node(i, [], s))
    return active

  def settle(self, active: list[_Node]) -> tuple[list, list]:
    """After a round: finish the nodes that are leaves (ended, out of
    budget or at the last depth); returns each prompt's live nodes and
    the nominal forks its leaves freed."""
    p, depth = len(self.prompts), self.depth
    live: list[list] = [[] for _ in range(p)]
    freed = [0] * p
    for node in active:
      seq = node.seq
      ended = sampling.REASONS[seq.stop_reason] in _ENDED
      left = self.max_new_tokens - len(node.arrays()[0])
      if node.depth == depth or ended or left <= 0:
        self.done[node.prompt].append((node, ended))
        freed[node.prompt] += self.branching[min(node.depth, depth - 1)]
        if seq.keep:
          self.engine.release(seq)
      else:
        live[node.prompt].append(node)
    return live, freed

  def fork(self, live: list[list], freed: list[int]) -> list[_Node]:
    """Queue the children of every live node (as many as `divergence`
    gives it); returns them."""
    active = []
    for i, nodes in enumerate(live):
      if not nodes:
        continue
      for node, k in zip(nodes, self._forks(i, nodes, freed[i])):
        n_tokens = len(node.arrays()[0])
        d = node.depth + 1
        for s in self.engine.fork(
          node.seq,
          int(k),
          max_new_tokens=self.budget(d, self.max_new_tokens - n_tokens),
          keep=d < self.depth,
        ):
          active.append(
            self._node(i, node.path, s, node.head, node.bounds + (n_tokens,))
          )
        self.engine.release(node.seq)
    return active

  def _forks(self, i: int, nodes: list[_Node], freed: int):
    """The forks of prompt i's live `nodes`."""
    nominal = [self.branching[n.depth] for n in nodes]
    if self.divergence == "fixed":
      return nominal
    return divergence_forks(
      [n.score(self.divergence) for n in nodes],
      forks_N=nominal,
      freed=freed,
      done=len(self.done[i]),
      leaves=self.g,
      policy=self.divergence,
      temperature=self.divergence_temperature,
    )

  def regrow(self, running: set) -> list[_Node]:
    """Queue the fallback restarts of each prompt with no node `running`
    and fewer than G leaves; returns them."""
    engine, p, depth = self.engine, len(self.prompts), self.depth
    active = []
    for i in range(p):
      if i in running or len(self.done[i]) >= self.g:
        continue
      stream = jax.random.fold_in(
        jax.random.fold_in(self.key, i), _FALLBACK_KEY
      )
      if i not in self.rngs:
        self.rngs[i] = np.random.default_rng(
          np.asarray(jax.random.key_data(stream)).tolist()
        )
      starts = _fallback_starts(
        [
          leaf
          for leaf, ended in self.done[i]
          if ended or self.fallback_leaves == "any"
        ],
        self.g - len(self.done[i]),
        self.branching,
        self.fallback,
        self.rngs[i],
      )
      for j, n, head, path, bounds in starts:
        for s in engine.add(
          list(self.prompts[i]) + list(head[0]),
          key=jax.random.fold_in(stream, self.fallbacks[i]),
          max_new_tokens=self.budget(j + 1, self.max_new_tokens - len(head[0])),
          num_samples=n,
          temperature=self.temperature,
          keep=j + 1 < depth,
          shard=i * engine.shards // p,
        ):
          active.append(self._node(i, path, s, head, bounds))
        self.fallbacks[i] += 1
    return active


def _fallback_starts(candidates, remaining, branching, fallback, rng):
  """(cut depth j, branches, head, path, bounds) of each fallback restart
  of a prompt: its candidate leaves in random order, each cut back to a
  segment boundary, ``branching[j]`` branches each (fewer at the end of
  the `remaining` budget)."""
  depth = len(branching)
  order = [candidates[c] for c in rng.permutation(len(candidates))]
  if not order or fallback == "from_start":
    order = [None]  # the prompt itself
  out = []
  for leaf in order:
    if leaf is None:
      j = 0
    else:
      # The code's "random": a uniform segment boundary of the leaf's
      # completion, at most D - 1 segments deep.
      blocks = len(leaf.bounds) + 1
      j = min(int(rng.integers(0, blocks)), depth - 1)
    n = min(branching[j], remaining)
    if leaf is None or j == 0:
      head, path, bounds = ((), (), ()), [], ()
    else:
      b = leaf.bounds[j - 1]
      tokens, logp, full_logp = leaf.arrays()
      head = (tokens[:b], logp[:b], full_logp[:b])
      path, bounds = list(leaf.path[:j]), leaf.bounds[:j]
    out.append((j, n, head, path, bounds))
    remaining -= n
    if remaining <= 0:
      break
  return out


def _assemble(prompts, done, g, depth, width):
  """The [P, G] rollout and tree_PGD of each prompt's leaves, depth-first."""
  p = len(prompts)
  out = sampling.RolloutBuilder(p, g, width)
  tree = np.full((p, g, depth), -1, np.int32)
  for i, group in enumerate(done):
    if len(group) > g:
      raise RuntimeError(f"prompt {i} grew {len(group)} leaves > {g}.")
    for j, node in enumerate(sorted(group, key=lambda n: n.path)):
      if node.head[0]:
        out.put_tokens(i, j, *node.head)
        out.put_after(i, j, node.seq, len(node.head[0]))
      else:
        out.put(i, j, node.seq)
      tree[i, j, : node.depth] = node.path
  width_s = max(len(x) for x in prompts)
  tokens = np.zeros((p, width_s), np.int32)
  mask = np.zeros((p, width_s), np.int32)
  for i, prompt in enumerate(prompts):  # left-padded
    tokens[i, width_s - len(prompt) :] = prompt
    mask[i, width_s - len(prompt) :] = 1
  rollout = out.rollout(
    np.broadcast_to(tokens[:, None], (p, g, width_s)),
    np.broadcast_to(mask[:, None], (p, g, width_s)),
  )
  return rollout, tree


@dataclasses.dataclass(frozen=True)
class TreeRollouts(GroupStrategy):
  """Each group's samples are the leaves of a segment tree
  (`sample_trees`); ``Batch.extra["tree_PG"]`` holds each leaf's
  ancestors ([P, G, D]) for tree advantages.

  * TreePO (catalog row 2.46, arXiv 2508.17445): segments of a fixed
    length forking at each depth, leaves sharing their prefixes' cache;
    with `rljax.transforms.treepo_advantages`. `TreeRollouts.treepo` is
    the official training script's sampler: k = 2 forks, 14 segments of
    512 tokens, 16 leaves shared out by the ``even`` divergence (the
    code's ``fixed_avg`` with ``by_fixed_div``), ``random`` fallback to
    leaves that stopped (``soft_boxed_and_eos``).
  * Polychromic vines (row 2.26, arXiv 2509.25424): several rollouts from
    the same intermediate states (``branching=(n, k)``), with
    `rljax.transforms.polychromic_advantages`.

  The group's sample count (``sampler.num_samples``) must be the leaf
  budget: prod(branching) for ``fixed`` divergence, else `leaves`.

  Args:
    branching: forks at each depth (the first: the prompt's first
      segments; adaptive divergence: each depth's k).
    segment: tokens per segment before the next fork (the last depth runs
      to the end of the budget).
    leaves: the group's leaf budget for an adaptive divergence (the code's
      ``max_width``, its rollout n); None with ``fixed``.
    divergence: ``fixed`` (default), ``even`` or a log-prob weighted policy
      (`DIVERGENCES`, `divergence_forks`).
    divergence_temperature: the weighted policies' softmax temperature.
    fallback: None (default), ``random`` or ``from_start``: regrow a group
      whose branches all ended early from its finished leaves.
    fallback_leaves: ``stopped`` or ``any``: the leaves a fallback
      restarts from.
  """

  branching: Sequence[int] = (2, 2, 2)
  segment: int = 64
  leaves: Optional[int] = None
  divergence: str = "fixed"
  divergence_temperature: float = 1.0
  fallback: Optional[str] = None
  fallback_leaves: str = "stopped"

  def __post_init__(self):
    branching = tuple(int(b) for b in self.branching)
    _check_options(
      branching,
      self.leaves,
      self.divergence,
      self.fallback,
      self.fallback_leaves,
    )
    if int(self.segment) < 1:
      raise ValueError(f"segment={self.segment}; it must be >= 1.")
    if not self.divergence_temperature > 0:
      raise ValueError(
        f"divergence_temperature={self.divergence_temperature}; it must be > 0."
      )
    object.__setattr__(self, "branching", branching)

  @classmethod
  def treepo(
    cls, *, leaves: int = 16, depth: int = 14, segment: int = 512
  ) -> "TreeRollouts":
    """The official TreePO training script's sampler (k = 2 forks per
    live node, ``even`` divergence, ``random`` fallback to stopped
    leaves), with its 16 leaves, 14 segments of 512 tokens by default."""
    return cls(
      branching=(2,) * depth,
      segment=segment,
      leaves=leaves,
      divergence="even",
      fallback="random",
    )

  @property
  def num_leaves(self) -> int:
    if self.divergence == "fixed":
      return int(np.prod(self.branching))
    return int(self.leaves)

  def draw(self, engine, model, prompts, counts, **kwargs):
    for k in ("groups", "step", "state", "batch", "score"):
      kwargs.pop(k, None)
    counts = np.asarray(counts)
    if np.any(counts != self.num_leaves):
      how = (
        f"branching {self.branching}"
        if self.divergence == "fixed"
        else f"leaves={self.leaves}"
      )
      raise ValueError(
        f"TreeRollouts with {how} makes {self.num_leaves} leaves per group;"
        f" the prompt sampler gave {counts.min()}..{counts.max()} samples"
        f" (set sampler.num_samples = {self.num_leaves})."
      )
    rollout, tree = sample_trees(
      engine,
      model,
      prompts,
      branching=self.branching,
      segment=self.segment,
      leaves=None if self.divergence == "fixed" else self.leaves,
      divergence=self.divergence,
      divergence_temperature=self.divergence_temperature,
      fallback=self.fallback,
      fallback_leaves=self.fallback_leaves,
      **kwargs,
    )
    return rollout, {"tree_PG": tree}
