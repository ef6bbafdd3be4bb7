"""INSPO's instruction population, co-evolved with the policy.

INSPO (Instruction-Policy Co-Evolution; Zhou, Wan, Vulić, Korhonen, 2025,
arXiv 2512.01945, "Agentic Policy Optimization via Instruction-Policy
Co-Evolution") keeps a population of system instructions inside the RL
loop: each question is sampled with an instruction drawn by importance,
the rewards score the instruction that produced them, the weakest are
pruned and an LLM proposes replacements.
"""

from collections.abc import Callable, Sequence
import dataclasses
from typing import Optional

import numpy as np

from rljax.rollouts._base import Group
from rljax.rollouts._base import GroupStrategy
from rljax.rollouts._base import Member
from rljax.rollouts._base import Scores
from rljax.rollouts._base import State

#: Batch.extra["stream_PG"] of an instruction-conditioned sample
INSTRUCTED = 7

Proposer = Callable[[list[str], int], Sequence[str]]


def recombine(best: list[str], k: int) -> list[str]:
  """The default proposer: `k` crossovers of the survivors, best first.

  Candidate i joins the first half of ``best[i % n]`` (its first
  ``len // 2`` characters) to the second half of ``best[(i + 1) % n]``
  (from its ``len // 2``-th character); with one survivor it is that
  instruction itself. Deterministic, so every process proposes the same.
  """
  n = len(best)
  if n == 0:
    raise ValueError("recombine needs at least one surviving instruction.")
  out = []
  for i in range(k):
    a, b = best[i % n], best[(i + 1) % n]
    out.append(a[: len(a) // 2] + b[len(b) // 2 :])
  return out


@dataclasses.dataclass(frozen=True)
class InstructionPopulation(GroupStrategy):
  """INSPO's instruction population as a group strategy.

  The state holds the population (texts) and, per instruction, the sum
  and count of the rewards of the valid samples that used it. Its weight
  is w_j = the running mean reward (the mean over the used instructions
  for one not used yet). At step s each group draws one instruction (the
  paper's: one instruction per question, all G samples conditioned on it;
  ``per="sample"`` draws one per sample) from

    p(I_j) = exp(w_j / tau) / sum_k exp(w_k / tau)

  with a generator seeded by (seed, s, prompt id), and samples from
  ``template.format(instruction=I_j, prompt=prompt)``. The update trains
  on that same instruction-conditioned prompt (INSPO's objective samples
  tau ~ pi_old(. | I, q) and optimises pi_theta(. | I, q): the instruction
  is part of the policy's input), so the samples are on-policy;
  ``Batch.extra["stream_PG"]`` is `INSTRUCTED` (7).

  After every `prune_every`-th step (s + 1 divisible by it) the
  `prune_k` instructions of lowest weight (ties: the later one) leave, and
  ``proposer(survivors best first, prune_k)`` returns as many new ones,
  which enter with no rewards. The paper's proposer is an LLM reflecting
  on a replay buffer of low-reward trajectories, whose candidates are
  verified before the best join; that is the user's model, so the default
  here is `recombine` (deterministic crossovers of the survivors), and no
  verification pass is run.

  References:
    INSPO, arXiv 2512.01945 (catalog row 1.106). Checked against the
    abstract (arXiv) and a summary of the method section (population of N
    instructions with importance weights, softmax selection with
    temperature tau_s, GRPO over q ~ D, I ~ p(. | W), tau ~
    pi_old(. | I, q); periodic pruning; LLM proposer with verification).
    Not verified: the exact weight update (the catalog's running mean
    reward is used), the pruning period and count, tau_s; the official
    code (cambridgeltl/inspo) could not be read here. Defaults are ours.

  Args:
    instructions: the initial population (at least `prune_k` + 1).
    template: how an instruction joins the prompt (``{instruction}``,
      ``{prompt}``).
    temperature: tau of the softmax selection (> 0).
    prune_every: steps between prunings.
    prune_k: instructions pruned and proposed each time (0: never).
    proposer: callable (survivors best first, k) -> k new instructions;
      None: `recombine`.
    per: "group" (one instruction per question) or "sample".
    seed: seeds the draws.
  """

  instructions: Sequence[str] = ()
  template: str = "{instruction}\n\n{prompt}"
  temperature: float = 1.0
  prune_every: int = 10
  prune_k: int = 1
  proposer: Optional[Proposer] = None
  per: str = "group"
  seed: int = 0

  def __post_init__(self):
    texts = tuple(self.instructions)
    if not texts or not all(isinstance(t, str) for t in texts):
      raise ValueError(
        f"instructions={self.instructions!r}; give a non-empty sequence of"
        " instruction strings."
      )
    object.__setattr__(self, "instructions", texts)
    if not self.temperature > 0:
      raise ValueError(f"temperature={self.temperature}; it must be > 0.")
    if not isinstance(self.prune_every, int) or self.prune_every < 1:
      raise ValueError(f"prune_every={self.prune_every!r}; give an int >= 1.")
    if not isinstance(self.prune_k, int) or not (
      0 <= self.prune_k < len(texts)
    ):
      raise ValueError(
        f"prune_k={self.prune_k!r}; give an int in [0, {len(texts) - 1}]"
        " (fewer than the population, so some instructions survive)."
      )
    if self.per not in ("group", "sample"):
      raise ValueError(f"per={self.per!r}; choose 'group' or 'sample'.")
    if "{prompt}" not in self.template or "{instruction}" not in self.template:
      raise ValueError(
        f"template={self.template!r} must contain {{instruction}} and"
        " {prompt}."
      )

  def init(self) -> State:
    n = len(self.instructions)
    return {
      "instructions": list(self.instructions),
      "sums": [0.0] * n,
      "counts": [0] * n,
    }

  @staticmethod
  def weights(state: State) -> np.ndarray:
    """w_j: each instruction's mean reward; unused ones get the mean of the
    used ones' (0 if none is used)."""
    sums = np.asarray(state["sums"], np.float64)
    counts = np.asarray(state["counts"], np.float64)
    used = counts > 0
    means = np.divide(sums, counts, out=np.zeros_like(sums), where=used)
    prior = means[used].mean() if used.any() else 0.0
    return np.where(used, means, prior)

  def probabilities(self, state: State) -> np.ndarray:
    """p(I_j) = softmax(w / tau)."""
    z = self.weights(state) / self.temperature
    e = np.exp(z - z.max())
    return e / e.sum()

  def choose(self, group: Group, step: int, state: State) -> np.ndarray:
    """The instruction index of each of the group's samples."""
    rng = np.random.default_rng([self.seed, step, group.prompt_id])
    p = self.probabilities(state)
    draws = 1 if self.per == "group" else group.num_samples
    idx = rng.choice(len(p), size=draws, p=p)
    return np.broadcast_to(idx, (group.num_samples,)).copy()

  def plan(self, group: Group, step: int, state: State) -> list[Member]:
    texts = state["instructions"]
    out = []
    for j in self.choose(group, step, state):
      prompt = self.template.format(instruction=texts[j], prompt=group.prompt)
      out.append(Member(prompt=prompt, train_prompt=prompt, stream=INSTRUCTED))
    return out

  def update(
    self, groups: Sequence[Group], scores: Scores, step: int, state: State
  ) -> State:
    sums = [float(x) for x in state["sums"]]
    counts = [int(x) for x in state["counts"]]
    for p, group in enumerate(groups):
      chosen = self.choose(group, step, state)
      for g in np.flatnonzero(scores.valid[p]):
        sums[chosen[g]] += float(scores.rewards[p, g])
        counts[chosen[g]] += 1
    state = {
      "instructions": list(state["instructions"]),
      "sums": sums,
      "counts": counts,
    }
    if self.prune_k and (step + 1) % self.prune_every == 0:
      state = self.prune(state)
    return state

  def prune(self, state: State) -> State:
    """Drop the `prune_k` lowest-weight instructions and add as many from
    the proposer."""
    w = self.weights(state)
    n = len(w)
    # best first; among equal weights the earlier instruction ranks higher
    order = sorted(range(n), key=lambda j: (-w[j], j))
    keep = sorted(order[: n - self.prune_k])
    best = [state["instructions"][j] for j in order[: n - self.prune_k]]
    proposer = self.proposer or recombine
    new = list(proposer(best, self.prune_k))
    if len(new) != self.prune_k or not all(isinstance(t, str) for t in new):
      raise ValueError(
        f"the proposer returned {new!r}; it must return prune_k="
        f"{self.prune_k} instruction strings."
      )
    return {
      "instructions": [state["instructions"][j] for j in keep] + new,
      "sums": [state["sums"][j] for j in keep] + [0.0] * len(new),
      "counts": [state["counts"][j] for j in keep] + [0] * len(new),
    }
