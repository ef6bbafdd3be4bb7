"""ReMix's mix-policy replay: part of each group is a past policy's samples.

ReMix (Reincarnating Mix-policy Proximal Policy Gradient; Liang et al.,
2025, arXiv 2507.06892, "Squeeze the Soaked Sponge") trains on rollouts of
the current policy together with rollouts of the last few policies; each
replayed sample keeps the log-probs of the policy that drew it, so the loss
can use r = pi_theta / mu (`rljax.transforms.remix`).
"""

from collections.abc import Sequence
import dataclasses
from typing import Optional

import numpy as np

from rljax.rollouts._base import Group
from rljax.rollouts._base import GroupStrategy
from rljax.rollouts._base import Member
from rljax.rollouts._base import Scores
from rljax.rollouts._base import State

#: Batch.extra["stream_PG"] of a replayed sample (a past policy's rollout)
REPLAYED = 6


def _check_int(name: str, value, low: int) -> None:
  if not isinstance(value, (int, np.integer)) or value < low:
    raise ValueError(f"{name}={value!r}; it must be an int >= {low}.")


@dataclasses.dataclass(frozen=True)
class MixPolicyReplay(GroupStrategy):
  """ReMix's mix-policy groups: fresh samples plus replayed past samples.

  The state keeps, per prompt id, every valid sample of the last `window`
  steps that the policy of its step drew itself (replayed samples are not
  stored again): its completion token ids, their sampler log-probs
  (``Rollout.logp_PGT``, the behaviour policy mu) and full-distribution
  log-probs, and the step. At step s a group whose prompt has stored
  samples of steps s - window .. s - 1 gets up to `num_replayed` of them
  (at most the group's count minus one, so a fresh sample stays), drawn
  without replacement by a generator seeded with (seed, s, prompt id), in
  place of its last samples: ``Member(prefix=ids, prefix_logp=mu)``. A
  stored completion ends with the stop id (or fills the budget), so the
  engine samples nothing more for it; its ``rollout_logp_PGT`` is mu and
  ``Batch.extra["stream_PG"]`` is `REPLAYED` (6). The replayed sample is
  scored again like a fresh one. Replay is per prompt (a group's replayed
  samples answer its own prompt, so the group advantage compares them),
  so it happens only when a prompt returns within `window` steps (a
  small training set, several passes); the paper mixes whole batches of
  past policies' data into the update instead.

  From step `reincarnate_at` on (policy reincarnation) nothing is replayed:
  training is on-policy again. The paper also makes the reincarnated model
  the new base of the KL constraint; `rljax.transforms.remix` switches its
  KL to the base alone at the same step.

  References:
    ReMix, arXiv 2507.06892 (catalog row 2.72): mix-policy proximal policy
    gradient on data of the current and past policies with an
    update-to-data ratio > 1; policy reincarnation mid-way. Checked
    against the abstract (arXiv, ICLR 2026 submission) and the project
    page: the three components. Not verified: the buffer window, the share
    of replayed samples and how they are chosen (the official repository,
    AnitaLeungxx/ReMix-Off-Policy-RFT, holds evaluation code only), so the
    defaults are ours.

  Args:
    window: steps of past samples kept (k).
    num_replayed: replayed samples per group.
    reincarnate_at: the step from which the groups are on-policy; None:
      never.
    seed: seeds the choice of replayed samples.
  """

  window: int = 2
  num_replayed: int = 4
  reincarnate_at: Optional[int] = None
  seed: int = 0

  def __post_init__(self):
    _check_int("window", self.window, 1)
    _check_int("num_replayed", self.num_replayed, 1)
    if self.reincarnate_at is not None:
      _check_int("reincarnate_at", self.reincarnate_at, 0)

  def init(self) -> State:
    return {"buffers": {}}

  def replaying(self, step: int) -> bool:
    """Whether step `step` replays (before the reincarnation step)."""
    return self.reincarnate_at is None or step < self.reincarnate_at

  def stored(self, state: State, prompt_id: int, step: int) -> list:
    """The prompt's stored samples young enough for step `step`: entries
    ``[step, ids, logp, full_logp]``, oldest first."""
    entries = state["buffers"].get(str(prompt_id), [])
    return [e for e in entries if step - self.window <= e[0] < step]

  def plan(self, group: Group, step: int, state: State) -> list[Member]:
    n = group.num_samples
    entries = self.stored(state, group.prompt_id, step)
    k = min(self.num_replayed, n - 1, len(entries))
    if not self.replaying(step) or k < 1:
      return [Member()] * n
    rng = np.random.default_rng([self.seed, step, group.prompt_id])
    chosen = sorted(rng.choice(len(entries), size=k, replace=False))
    replayed = [
      Member(
        prefix=tuple(entries[i][1]),
        prefix_logp=tuple(entries[i][2]),
        prefix_full_logp=tuple(entries[i][3]),
        stream=REPLAYED,
      )
      for i in chosen
    ]
    return [Member()] * (n - k) + replayed

  def update(
    self, groups: Sequence[Group], scores: Scores, step: int, state: State
  ) -> State:
    r = scores.rollout
    if r is None:
      raise ValueError(
        "MixPolicyReplay.update needs Scores.rollout (the scored tokens and"
        " sampler log-probs); build Scores with rollout=."
      )
    tokens, mask = np.asarray(r.tokens_PGT), np.asarray(r.mask_PGT) > 0
    logp, full = np.asarray(r.logp_PGT), np.asarray(r.full_logp_PGT)
    buffers = {
      key: [e for e in entries if e[0] > step - self.window]
      for key, entries in state["buffers"].items()
    }
    for p, group in enumerate(groups):
      for g in np.flatnonzero(scores.valid[p]):
        member = scores.members[p][g]
        if member is None or member.stream == REPLAYED:
          continue
        m = mask[p, g]
        buffers.setdefault(str(group.prompt_id), []).append(
          [
            int(step),
            [int(t) for t in tokens[p, g][m]],
            [float(x) for x in logp[p, g][m]],
            [float(x) for x in full[p, g][m]],
          ]
        )
    return {"buffers": {k: v for k, v in buffers.items() if v}}
