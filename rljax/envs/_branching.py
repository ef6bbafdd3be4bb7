"""Trees of agent episodes: ARPO's and AEPO's entropy-triggered branching
after tool calls, PORTool's tool-call trees, and the group strategy that
grows them.

A rule is a ``run_episodes(branch=...)`` hook: at each `BranchPoint` (an
observation, or ``probe_tokens`` tokens into the next action) it returns
how many extra branches to fork, and the runner clips that to what the
group's budget G leaves. `BranchingEpisodes` starts `initial` episodes per
group and lets branching fill the rest of G; ``node_ids_PG`` records the
tree and `sibling_groups` its forks (``fork_ids_PG``).

Entropies. The runner reports a window's mean surprise (-log p of the
sampled tokens under the full distribution), an unbiased estimate of the
mean token entropy there; ARPO's and AEPO's code use the exact entropy of
the logits (over vLLM's top-10 log-probs) summed over a segment's first
k = 20 tokens and divided by log V. Here a window's entropy is that sum
estimated from the mean, H = k mean(-log p) / log V.

Randomness. Where the papers draw a random number, the rules hash (seed,
the step's salt, group, turn, the point's action tokens) instead, so that
every process decides alike whatever the timing; `BranchingEpisodes` sets
the salt from the step's key.
"""

from collections.abc import Callable
import copy
import hashlib
import inspect
import math
from typing import Optional, Protocol

import jax
from jax.typing import ArrayLike
import numpy as np

from rljax.envs._base import Environment
from rljax.envs._episodes import BranchPoint
from rljax.envs._episodes import run_episodes
from rljax.envs._strategy import EpisodeRollouts

_MONITOR = 1 << 30  # fold_in tag of AEPO's pre-monitoring episodes


class BranchRule(Protocol):
  """What `BranchingEpisodes` needs of a rule."""

  probe_tokens: int

  def reset(self, salt: int = 0) -> None:
    """Start a new batch (forget per-batch state; vary the hash)."""

  def __call__(self, point: BranchPoint) -> int:
    """Extra branches to fork at `point`."""


def _uniform(*parts) -> float:
  """A number in [0, 1) from a hash of `parts` (equal on every host)."""
  digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
  return int.from_bytes(digest, "big") / 2.0**64


def _salt(key: jax.Array) -> int:
  """An integer from a PRNG key's bits."""
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  data = np.asarray(key).tobytes()
  return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _check_int(name: str, value, low: int) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"{name} must be an int >= {low}; got {value!r}.")
  if value < low:
    raise ValueError(f"{name} must be >= {low}; got {value!r}.")


def _check_real(name: str, value) -> None:
  if not isinstance(value, (int, float)) or not math.isfinite(value):
    raise ValueError(f"{name} must be a finite number; got {value!r}.")


class _EntropyRule:
  """The parts ARPO's and AEPO's rules share: where they decide, the
  normalised entropy change and the base probability alpha."""

  def __init__(self, alpha, tau, branches, k, probe, vocab_size, seed):
    if alpha is not None:
      _check_real("alpha", alpha)
      if not 0.0 <= alpha <= 1.0:
        raise ValueError(
          f"alpha must be in [0, 1], or None to draw it per point; got"
          f" {alpha!r}."
        )
    _check_real("tau", tau)
    _check_int("branches", branches, 1)
    _check_int("k", k, 1)
    if vocab_size is not None:
      _check_int("vocab_size", vocab_size, 2)
    self.alpha, self.tau, self.branches = alpha, float(tau), int(branches)
    self.k, self.probe, self.vocab_size = int(k), bool(probe), vocab_size
    self.seed, self.salt = int(seed), 0

  @property
  def probe_tokens(self) -> int:
    """k: decide k tokens into the next action; 0: at the observation."""
    return self.k if self.probe else 0

  def reset(self, salt: int = 0) -> None:
    """Start a new batch; `salt` varies the drawn alphas between steps."""
    self.salt = int(salt)

  def delta_entropy(self, point: BranchPoint) -> float:
    """ΔH_t = k (H_t - H_initial) / log V (see the module docstring)."""
    if self.vocab_size is None:
      raise ValueError(
        f"{type(self).__name__} needs vocab_size (its entropies are"
        " normalised by log V): pass vocab_size=tokenizer.vocab_size, or"
        " use it through a BranchingEpisodes strategy, which sets it from"
        " the run's tokenizer."
      )
    scale = self.k / math.log(self.vocab_size)
    return scale * (point.entropy - point.first_entropy)

  def base(self, point: BranchPoint) -> float:
    """alpha, or a uniform draw from a hash of the point when None."""
    if self.alpha is not None:
      return float(self.alpha)
    tokens = tuple(int(t) for t in point.action.tokens)
    return _uniform(self.seed, self.salt, point.group, point.turn, tokens)

  def eligible(self, point: BranchPoint) -> bool:
    """Room in the group, and a tool call before the point. Observation
    points report the answered action's calls; probe points do not, and
    count as after a tool call (as every observation of a
    `ToolEnvironment` is)."""
    if point.leaves >= point.budget:
      return False
    return point.step is None or point.tool_calls > 0


class ARPOBranching(_EntropyRule):
  """ARPO's entropy-based adaptive rollout (arXiv 2507.19849, Eqs. 4-5).

  After a tool call, with H_t the entropy of the k tokens the policy
  writes after the tool's response and H_initial that of the first k
  tokens of the episode's first action::

    ΔH_t = Normalize(H_t - H_initial) = k (H_t - H_initial) / log V
    P_t  = alpha + beta ΔH_t
    fork Z = `branches` partial rollouts if P_t > tau

  within the group's budget M = G, N = ``initial`` episodes starting from
  the prompt (`BranchingEpisodes`; the paper's M = 16, N = 8). H is the
  runner's mean surprise, an unbiased estimate of the mean token entropy
  (ARPO uses the exact entropy of the logits). ``alpha=None`` (default)
  draws alpha uniformly in [0, 1) per point, as the official code does
  (``random.random()``), so that P(fork) = clip(1 - tau + beta ΔH_t); a
  number makes the rule a fixed entropy threshold. The draw is a hash of
  (seed, the step's salt, group, turn, the point's tokens), the same on
  every host.

  ``probe=True`` (default) decides k tokens into the action after the
  tool's response (the paper's section 3.1: after a tool call the policy
  generates k tokens and their entropy is measured), and the branches
  share those k tokens; ``probe=False`` decides at the
  observation from the entropy of the action that made the call, which is
  what the official code does (its branch follows the tool result, its
  entropy is the current segment's first 20 tokens, so ΔH = 0 at the
  first call). Observation points without a tool call never fork.

  Checked: the official code (RUC-NLPIR/ARPO,
  ``vllm_rollout_with_tools.py`` and the run scripts: 16 rollouts, 8
  initial, beam size 2, i.e. Z = 1, ``branch_probability`` 0.5, entropy
  weight 0.2, entropy over the first 20 tokens over log V). The code
  forks when U - beta ΔH <= b, the paper's form with tau = 1 - b (equal
  at the default 0.5); it decides each of the Z branches with its own
  draw (here one decision forks Z) and refills a group whose branches all
  ended with new global samples (here the group keeps fewer samples, the
  rest invalid). The paper's equations were read in a detailed summary
  (not the PDF); its best beta in the ablation is about 0.4.

  Args:
    alpha: the base probability, or None to draw it per point.
    beta: the entropy weight.
    tau: the threshold.
    branches: Z, extra branches per decision.
    k: tokens in each entropy window.
    probe: decide k tokens into the next action (False: at the
      observation).
    vocab_size: V of the normalisation (the strategy sets it).
    seed: varies the drawn alphas.
  """

  def __init__(
    self,
    *,
    alpha: Optional[float] = None,
    beta: float = 0.2,
    tau: float = 0.5,
    branches: int = 1,
    k: int = 20,
    probe: bool = True,
    vocab_size: Optional[int] = None,
    seed: int = 0,
  ):
    super().__init__(alpha, tau, branches, k, probe, vocab_size, seed)
    _check_real("beta", beta)
    self.beta = float(beta)

  def probability(self, point: BranchPoint) -> float:
    """P_t = alpha + beta ΔH_t."""
    return self.base(point) + self.beta * self.delta_entropy(point)

  def __call__(self, point: BranchPoint) -> int:
    if not self.eligible(point):
      return 0
    return self.branches if self.probability(point) > self.tau else 0


class AEPOBranching(_EntropyRule):
  """AEPO's entropy-balanced adaptive rollout (arXiv 2510.14545): ARPO's
  rule with a penalty on consecutive branching::

    P_t = (alpha + gamma ΔH_t) (1 - P(l)),   P(l) = penalty l
    fork `branches` partial rollouts if P_t > tau

  l counts the consecutive turns t - 1, t - 2, ... at which the group
  forked (the official code counts, per prompt, the consecutive decoding
  rounds in which it forked, with P(l) = 0.05 l floored at 0; a round is a
  turn here). ΔH_t, alpha, `k`, `probe` and the determinism are as in
  `ARPOBranching`. The budget split between initial episodes and branches
  (AEPO's entropy pre-monitoring) is `AEPOEpisodes`'. Call `reset` before
  each batch (`BranchingEpisodes` does): the consecutive counts are per
  batch.

  Checked: the official AEPO code (``AEPO/verl_aepo_entropy/.../
  vllm_rollout_with_tools.py``: ``prob = random() + w ΔH``, times
  ``1 - 0.05 consecutive_branches``, clipped to [0, 1], fork when >= 0.5;
  entropy weight 0.2, beam size 2) and the paper's form from summaries of
  its section 3; the paper's own P(l) and defaults were not read.

  Args:
    alpha: the base probability, or None to draw it per point.
    gamma: the entropy weight.
    tau: the threshold.
    branches: extra branches per decision.
    penalty: P(l) = penalty l.
    k: tokens in each entropy window.
    probe: decide k tokens into the next action (False: at the
      observation).
    vocab_size: V of the normalisation (the strategy sets it).
    seed: varies the drawn alphas.
  """

  def __init__(
    self,
    *,
    alpha: Optional[float] = None,
    gamma: float = 0.2,
    tau: float = 0.5,
    branches: int = 1,
    penalty: float = 0.05,
    k: int = 20,
    probe: bool = True,
    vocab_size: Optional[int] = None,
    seed: int = 0,
  ):
    super().__init__(alpha, tau, branches, k, probe, vocab_size, seed)
    _check_real("gamma", gamma)
    _check_real("penalty", penalty)
    if penalty < 0:
      raise ValueError(f"penalty must be >= 0; got {penalty!r}.")
    self.gamma, self.penalty = float(gamma), float(penalty)
    self._forked: dict[int, set[int]] = {}

  def reset(self, salt: int = 0) -> None:
    super().reset(salt)
    self._forked = {}

  def consecutive(self, group: int, turn: int) -> int:
    """l: how many of turns turn - 1, turn - 2, ... in a row the group
    forked at."""
    forked = self._forked.get(group, set())
    count = 0
    while turn - 1 - count in forked:
      count += 1
    return count

  def probability(self, point: BranchPoint) -> float:
    """P_t = (alpha + gamma ΔH_t) (1 - P(l))."""
    keep = max(
      0.0, 1.0 - self.penalty * self.consecutive(point.group, point.turn)
    )
    return (self.base(point) + self.gamma * self.delta_entropy(point)) * keep

  def __call__(self, point: BranchPoint) -> int:
    if not self.eligible(point) or self.probability(point) <= self.tau:
      return 0
    self._forked.setdefault(point.group, set()).add(point.turn)
    return self.branches


class PORToolBranching:
  """PORTool's tool-call tree (arXiv 2510.26020): each tool-call step is a
  node with up to f = `branching` children.

  At every observation that answers a tool call, the episode forks
  f - 1 extra branches while the group has room (the runner caps the group
  at G), so a group of ``initial`` first steps grows to G leaves that
  share their first tool-call steps. `sibling_groups` gives the forks and
  `rljax.transforms.portool_advantages` the fork-relative advantages
  (pass it ``tree="node_ids_PG"``).

  Differs from the paper's sampler (read in its abstract and a summary:
  n first steps, then f candidate forks of every unfinished trajectory of
  which n - n_c are kept), which keeps n trajectories alive by dropping
  candidates; forks here only add branches, so the first forks take the
  budget. The paper's f was not read.

  Args:
    branching: f, the children of a forking step.
  """

  probe_tokens = 0

  def __init__(self, *, branching: int = 2):
    _check_int("branching", branching, 2)
    self.branching = int(branching)

  def reset(self, salt: int = 0) -> None:
    """Nothing to reset (the rule has no state)."""
    del salt

  def __call__(self, point: BranchPoint) -> int:
    if point.tool_calls <= 0 or point.leaves >= point.budget:
      return 0
    return self.branching - 1


def sibling_groups(node_ids_PGN: ArrayLike) -> np.ndarray:
  """The fork of each step of a tree of episodes.

  Step t of sample g (``node_ids_PGN[p, g, t]``, equal ids: one shared
  action, -1 past the episode) is a child of its step t - 1 (the prompt's
  root for t = 0); its fork id names that parent, so the siblings of a
  step are the steps with its fork id and another node id (samples with
  its node id share it). A fork whose steps are all one node compares
  nothing. Ids count from 0 in (prompt, sample, turn) order.

  Args:
    node_ids_PGN: [P, G, N] int node ids (the runner's ``node_ids_PG``).

  Returns:
    [P, G, N] int32 fork ids, -1 past each episode.
  """
  ids = np.asarray(node_ids_PGN)
  if ids.ndim != 3 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(
      "node_ids_PGN must be an int array [P, G, N] (the runner's"
      f" node_ids_PG); got dtype {ids.dtype} and shape {ids.shape}."
    )
  out = np.full(ids.shape, -1, np.int32)
  forks: dict[tuple, int] = {}
  parent_of: dict[tuple, int] = {}
  for p, g, t in zip(*np.nonzero(ids >= 0)):
    parent = int(ids[p, g, t - 1]) if t else -1
    if t and parent < 0:
      raise ValueError(
        f"node_ids_PGN[{p}, {g}] has a step at turn {t} after a missing"
        " one; steps must be contiguous from turn 0."
      )
    node = (int(p), int(t), int(ids[p, g, t]))
    if parent_of.setdefault(node, parent) != parent:
      raise ValueError(
        f"node_ids_PGN: node {node[2]} of prompt {p} at turn {t} has two"
        " parents; equal node ids must share their earlier steps (a tree)."
      )
    out[p, g, t] = forks.setdefault((int(p), int(t), parent), len(forks))
  return out


def aepo_window_entropies(
  full_logp_PGT: ArrayLike,
  loss_mask_PGT: ArrayLike,
  turn_ids_PGT: ArrayLike,
  *,
  k: int,
  vocab_size: int,
) -> tuple[np.ndarray, np.ndarray]:
  """AEPO's pre-monitoring entropies of episodes: H_root and mean H_tool.

  H_root is the entropy of the first k tokens of the first action (the
  policy's uncertainty about the question); H_tool the mean over the later
  actions (each follows a tool's response) of the entropy of their first k
  tokens. A window's entropy is the sum of its tokens' surprise -log p
  over log V (the official code sums the top-10 entropy of each token
  over log V). An episode with one action gets H_tool = H_root (as the
  code does).

  Args:
    full_logp_PGT: [P, G, T] log-probs of the sampled tokens under the full
      distribution (``Rollout.full_logp_PGT``).
    loss_mask_PGT: [P, G, T] 1 on the policy's tokens.
    turn_ids_PGT: [P, G, T] the turn of each token (-1: padding).
    k: tokens per window.
    vocab_size: V.

  Returns:
    (H_root_PG, H_tool_PG) float64.
  """
  _check_int("k", k, 1)
  _check_int("vocab_size", vocab_size, 2)
  logp = np.asarray(full_logp_PGT, np.float64)
  mask = np.asarray(loss_mask_PGT) > 0
  turns = np.asarray(turn_ids_PGT)
  if not logp.shape == mask.shape == turns.shape or logp.ndim != 3:
    raise ValueError(
      "full_logp_PGT, loss_mask_PGT and turn_ids_PGT must be [P, G, T] of"
      f" one shape; got {logp.shape}, {mask.shape} and {turns.shape}."
    )
  root = np.zeros(logp.shape[:2])
  tool = np.zeros(logp.shape[:2])
  for p, g in np.ndindex(*logp.shape[:2]):
    windows = [
      -logp[p, g][mask[p, g] & (turns[p, g] == t)][:k].sum()
      for t in range(int(turns[p, g].max(initial=-1)) + 1)
    ]
    windows = [w / math.log(vocab_size) for w in windows] or [0.0]
    root[p, g] = windows[0]
    tool[p, g] = np.mean(windows[1:]) if len(windows) > 1 else windows[0]
  return root, tool


def aepo_initial_rollouts(
  h_root_P: ArrayLike,
  h_tool_P: ArrayLike,
  group_size_P: ArrayLike,
  *,
  beta: float = 0.5,
) -> np.ndarray:
  """AEPO's entropy pre-monitoring: the episodes m of each group that start
  from the question; branching may fill the other G - m.

    m = G sigmoid(beta (H_root - mean H_tool)),

  rounded as the official code does (floor + 1, within [1, G]): a question
  more uncertain than the tool responses gets more global samples, tool
  responses more uncertain than the question leave more to branches.
  beta = 0.5 is the code's; the paper's own value was not read.

  Args:
    h_root_P: [P] the question's entropy (`aepo_window_entropies`).
    h_tool_P: [P] the mean entropy after tool responses.
    group_size_P: [P] (or a scalar) G, each group's samples.
    beta: the sensitivity.

  Returns:
    [P] int64 m.
  """
  _check_real("beta", beta)
  root = np.asarray(h_root_P, np.float64)
  tool = np.asarray(h_tool_P, np.float64)
  size = np.broadcast_to(np.asarray(group_size_P), root.shape)
  if root.shape != tool.shape or root.ndim != 1:
    raise ValueError(
      "h_root_P and h_tool_P must be [P] of one shape; got"
      f" {root.shape} and {tool.shape}."
    )
  sigma = 1.0 / (1.0 + np.exp(-beta * (root - tool)))
  return np.clip(np.floor(size * sigma).astype(np.int64) + 1, 1, size)


class BranchingEpisodes(EpisodeRollouts):
  """Agent episodes that grow as trees (ARPO, AEPO, PORTool).

  Each group of G samples starts `initial` episodes from the prompt
  (None: half of G, ARPO's N = 8 of M = 16) and the `branch` rule forks
  the rest at its points (clipped to G; a group whose branches end early
  keeps fewer samples). Each step resets the rule with a salt from the
  step's key, sets an entropy rule's ``vocab_size`` from the tokenizer
  when it has none, and adds ``fork_ids_PG`` (`sibling_groups`) to the
  batch next to the runner's ``node_ids_PG``. Other arguments are
  `EpisodeRollouts`'.
  """

  def __init__(
    self,
    environment: Optional[Callable[[], Environment]] = None,
    *,
    branch: BranchRule,
    initial: Optional[int] = None,
    **kwargs,
  ):
    if not callable(branch) or not callable(getattr(branch, "reset", None)):
      raise TypeError(
        "branch must be a rule with reset(salt) and __call__(point), e.g."
        f" envs.ARPOBranching(); got {type(branch).__name__}."
      )
    super().__init__(environment, branch=branch, initial=initial, **kwargs)
    probe = int(branch.probe_tokens)
    if self.turn_tokens is not None and probe >= self.turn_tokens:
      raise ValueError(
        f"the rule decides {probe} tokens into an action (k), but turns"
        f" have at most turn_tokens={self.turn_tokens}: use k <"
        " turn_tokens, or probe=False to decide at observations."
      )

  def prepare(self, task) -> "BranchingEpisodes":
    bound = super().prepare(task)
    out = copy.copy(self)
    out.environment, out.max_turns = bound.environment, bound.max_turns
    return out

  def bind(self, tokenizer, *, chat: bool) -> "BranchingEpisodes":
    super().bind(tokenizer, chat=chat)
    rule = self.branch
    if isinstance(rule, _EntropyRule) and rule.vocab_size is None:
      rule.vocab_size = int(tokenizer.vocab_size)
    return self

  def initial_counts(self, engine, model, counts, **run) -> np.ndarray:
    """The episodes each group starts with (`initial`, or half of G)."""
    del engine, model, run
    counts = np.asarray(counts, np.int64)
    if self.initial is not None:
      return np.minimum(counts, int(self.initial))
    return np.maximum(counts // 2, 1)

  def draw(self, engine, model, prompts, counts, *, key, **run):
    self.branch.reset(_salt(key))
    starts = self.initial_counts(engine, model, counts, key=key, **run)
    # EpisodeRollouts starts min(counts, initial) episodes per group; a
    # per-group array passes AEPO's pre-monitored counts through it.
    fixed, self.initial = self.initial, starts
    try:
      drawn = super().draw(engine, model, prompts, counts, key=key, **run)
    finally:
      self.initial = fixed
    nodes = drawn.extra["node_ids_PG"]
    extra = {**drawn.extra, "fork_ids_PG": sibling_groups(nodes)}
    samples = int(np.asarray(drawn.rollout.sample_mask_PG).sum())
    self.last_stats = {
      **self.last_stats,
      "initial": int(starts.sum()),
      "branched": samples - int(starts.sum()),
    }
    return drawn._replace(extra=extra)


class AEPOEpisodes(BranchingEpisodes):
  """AEPO's dynamic entropy-balanced rollout (arXiv 2510.14545): entropy
  pre-monitoring, then `AEPOBranching`.

  With ``monitor=True`` each step first runs one episode per group (no
  branching, its own key) and sets the group's initial episodes to
  `aepo_initial_rollouts` of its `aepo_window_entropies` (windows of the
  rule's k tokens); the rest of G is left to branching. ``monitor=False``
  uses the fixed `initial` (the official run scripts' default,
  ``ENABLE_DYNAMIC_ROLLOUTS=False``). The monitoring episodes are not
  trained on (the code's are not either).
  """

  def __init__(
    self,
    environment: Optional[Callable[[], Environment]] = None,
    *,
    branch: AEPOBranching,
    monitor: bool = True,
    beta: float = 0.5,
    **kwargs,
  ):
    _check_real("beta", beta)
    super().__init__(environment, branch=branch, **kwargs)
    self.monitor, self.beta = bool(monitor), float(beta)

  def initial_counts(self, engine, model, counts, **run) -> np.ndarray:
    if not self.monitor:
      return super().initial_counts(engine, model, counts, **run)
    examples = [group.example for group in run["groups"]]
    budget = run["max_new_tokens"]
    probe = run_episodes(
      engine,
      model,
      self.renderer,
      self.environment,
      examples,
      [1] * len(examples),
      key=jax.random.fold_in(run["key"], _MONITOR),
      width=run["width"],
      budget=budget,
      turn_tokens=self.turn_tokens or budget,
      max_turns=int(self.max_turns or 1),
      temperature=run["temperature"],
      overlap=self.overlap,
      workers=self.workers,
      step_timeout=self.step_timeout,
    )
    root, tool = aepo_window_entropies(
      probe.rollout.full_logp_PGT,
      probe.extra["loss_mask_PGT"],
      probe.extra["turn_ids_PGT"],
      k=self.branch.k,
      vocab_size=self.branch.vocab_size or self.renderer.tokenizer.vocab_size,
    )
    return aepo_initial_rollouts(root[:, 0], tool[:, 0], counts, beta=self.beta)


def _split(rule_cls, kwargs: dict) -> tuple:
  """(`rule_cls` made of its keyword arguments in `kwargs`, the others)."""
  names = inspect.signature(rule_cls).parameters
  mine = {k: v for k, v in kwargs.items() if k in names}
  return rule_cls(**mine), {k: v for k, v in kwargs.items() if k not in names}


def arpo_episodes(environment=None, **kwargs) -> BranchingEpisodes:
  """Strategy "arpo": `BranchingEpisodes` with an `ARPOBranching` of the
  rule's keywords (alpha, beta, tau, branches, k, probe, seed); the other
  keywords (initial, turn_tokens, ...) are the strategy's."""
  rule, rest = _split(ARPOBranching, kwargs)
  return BranchingEpisodes(environment, branch=rule, **rest)


def aepo_episodes(environment=None, **kwargs) -> AEPOEpisodes:
  """Strategy "aepo": `AEPOEpisodes` (monitor, beta, initial, ...) with an
  `AEPOBranching` of the rule's keywords (alpha, gamma, tau, branches,
  penalty, k, probe, seed)."""
  rule, rest = _split(AEPOBranching, kwargs)
  return AEPOEpisodes(environment, branch=rule, **rest)


def portool_episodes(environment=None, **kwargs) -> BranchingEpisodes:
  """Strategy "portool": `BranchingEpisodes` with a `PORToolBranching` of
  its keyword (branching); the others are the strategy's."""
  rule, rest = _split(PORToolBranching, kwargs)
  return BranchingEpisodes(environment, branch=rule, **rest)


#: the tree strategies by name (``sampler.groups``)
TREE_STRATEGIES: dict[str, Callable[..., BranchingEpisodes]] = {
  "arpo": arpo_episodes,
  "aepo": aepo_episodes,
  "portool": portool_episodes,
}
