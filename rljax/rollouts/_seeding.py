"""XRPO's in-context seeding: groups that all failed are sampled again with
solved examples from the run's own verified successes in the prompt."""

from collections.abc import Callable, Sequence
import dataclasses
from typing import Optional

import numpy as np

from rljax._src import checks
from rljax.rollouts._base import HINTED
from rljax.rollouts._base import GroupStrategy
from rljax.rollouts._base import Member
from rljax.rollouts._base import Scores
from rljax.rollouts._base import State

# (query prompt, stored prompt) -> similarity; higher is closer
Similarity = Callable[[str, str], float]


def ngram_similarity(a: str, b: str, *, n: int = 3) -> float:
  """Jaccard similarity of the character n-gram sets of `a` and `b` (the
  whole string when it is shorter than n); 1 for equal texts."""
  if n < 1:
    raise ValueError(f"n={n!r}; it must be an int >= 1.")

  def grams(s: str) -> set:
    return {s[i : i + n] for i in range(max(len(s) - n + 1, 1))}

  x, y = grams(a), grams(b)
  return len(x & y) / len(x | y)


@dataclasses.dataclass(frozen=True)
class ICLSeeding(GroupStrategy):
  """XRPO's in-context (ICL) seeding of prompts with zero reward.

  After a group is sampled and scored, a group with no correct sample gets
  its last ``max(1, round(fraction * n))`` samples (n: its valid samples)
  drawn again from an ICL prompt: the `num_demos` stored successes most
  similar to the group's prompt (`similarity` of the prompt texts; ties:
  the most recently stored), each its prompt followed by its correct
  completion cut to `max_solution_chars`, joined by `separator`, then the
  group's prompt. The seeded samples are trained on that ICL prompt
  (``train_on="seeded"``: on-policy given the demonstrations) or on the
  plain prompt (``"plain"``: off-policy, their ``rollout_logp_PGT`` the
  sampler's under the ICL prompt); ``Batch.extra["stream_PG"]`` marks
  them `HINTED` (2), and they enter the group whether or not they are
  correct (the group advantage is over the union). A group with nothing
  retrieved keeps its zero-shot samples.

  The corpus is the state: after every step, each correct sample adds
  ``(prompt id, prompt, completion)`` (one entry per prompt, the latest;
  at most `corpus_size`, oldest dropped first). A prompt's own earlier
  success is skipped unless ``include_self`` (it would hand the model its
  answer).

  References:
    XRPO: Pushing the limits of GRPO with Targeted Exploration and
    Exploitation, arXiv 2510.06672 (catalog row 1.17): "addresses
    stagnation on zero-reward prompts through an in-context seeding
    strategy that injects curated exemplars" (abstract). Read from the
    abstract and the public OpenReview reviews (the paper's method section
    and the official code, UIUC-MLSys/XRPO, were not readable here):
    seeding is for prompts all of whose rollouts failed, the examples come
    from an evolving corpus of verified successes retrieved by embedding
    similarity (Qwen3-Embedding-8B), K = 2 of them (our default), overly
    long solutions truncated, and a prompt with nothing retrieved falls
    back to its zero-shot form. Not verified: how many of a group's
    rollouts are seeded (`fraction`), whether the update conditions on the
    examples (`train_on`; the default keeps the ICL prompt, the prompt the
    samples were drawn from), the prompt template (`separator`), the
    truncation length, and the similarity (character n-grams stand in for
    the embedding model; pass your own).

  Args:
    num_demos: stored successes per ICL prompt (K).
    fraction: share of a failed group's valid samples drawn again seeded.
    train_on: "seeded" or "plain".
    separator: text between the examples and before the prompt.
    max_solution_chars: a stored completion's length cap in the prompt
      (None: whole).
    corpus_size: the most stored successes.
    include_self: whether a prompt may be seeded with its own success.
    similarity: (prompt, stored prompt) -> score; default
      `ngram_similarity`.
  """

  num_demos: int = 2
  fraction: float = 0.5
  train_on: str = "seeded"
  separator: str = "\n\n"
  max_solution_chars: Optional[int] = None
  corpus_size: int = 1024
  include_self: bool = False
  similarity: Similarity = ngram_similarity

  def __post_init__(self):
    for name in ("num_demos", "corpus_size"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}={value!r}; it must be an int >= 1.")
    if not 0 < self.fraction <= 1:
      raise ValueError(f"fraction={self.fraction!r}; it must be in (0, 1].")
    checks.one_of("train_on", self.train_on, ("seeded", "plain"))
    cap = self.max_solution_chars
    if cap is not None and (not isinstance(cap, (int, np.integer)) or cap < 1):
      raise ValueError(
        f"max_solution_chars={cap!r}; give an int >= 1, or None for whole"
        " solutions."
      )

  def init(self) -> State:
    return {"corpus": []}

  def icl_prompt(self, prompt: str, prompt_id: int, state: State):
    """The ICL prompt of `prompt` from the state's corpus; None when
    nothing can be retrieved."""
    corpus = [
      e for e in state["corpus"] if self.include_self or e[0] != prompt_id
    ]
    if not corpus:
      return None
    score = [self.similarity(prompt, e[1]) for e in corpus]
    order = sorted(range(len(corpus)), key=lambda i: (-score[i], -i))
    demos = []
    for i in order[: self.num_demos]:
      solution = corpus[i][2][: self.max_solution_chars]
      demos.append(corpus[i][1] + solution)
    return self.separator.join(demos + [prompt])

  def revise(self, groups, scores: Scores, step, round_, state):
    del step, round_
    out = {}
    for p, group in enumerate(groups):
      valid = np.flatnonzero(scores.valid[p])
      if not valid.size or scores.correct[p].any():
        continue
      prompt = self.icl_prompt(group.prompt, group.prompt_id, state)
      if prompt is None:
        continue
      member = Member(
        prompt=prompt,
        train_prompt=prompt if self.train_on == "seeded" else group.prompt,
        stream=HINTED,
      )
      k = max(1, round(self.fraction * valid.size))
      for g in valid[-k:]:
        out[(p, int(g))] = member
    return out

  def update(self, groups: Sequence, scores: Scores, step, state):
    del step
    corpus = {int(e[0]): list(e) for e in state["corpus"]}
    for p, group in enumerate(groups):
      for g in np.flatnonzero(scores.valid[p] & scores.correct[p]):
        entry = [group.prompt_id, group.prompt, scores.completions[p][int(g)]]
        corpus.pop(group.prompt_id, None)  # re-inserted as the newest
        corpus[group.prompt_id] = entry
    return {"corpus": list(corpus.values())[-self.corpus_size :]}
