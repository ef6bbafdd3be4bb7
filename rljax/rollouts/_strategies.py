"""The seed papers' group strategies: privileged-context streams, a second
temperature stream, hints for groups that all failed, injected ground
truths and replayed successes."""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
from typing import Any, Optional

import numpy as np

from rljax._src import checks
from rljax.rollouts._anytime import AnytimeBudgets
from rljax.rollouts._base import EXPLORE
from rljax.rollouts._base import HINTED
from rljax.rollouts._base import INJECTED
from rljax.rollouts._base import PLAIN
from rljax.rollouts._base import PRIVILEGED
from rljax.rollouts._base import Group
from rljax.rollouts._base import GroupStrategy
from rljax.rollouts._base import Member
from rljax.rollouts._base import Scores
from rljax.rollouts._base import State
from rljax.rollouts._budgets import BudgetSubgroups
from rljax.rollouts._instructions import InstructionPopulation
from rljax.rollouts._markovian import MarkovianChunks
from rljax.rollouts._partial import PartialRollouts
from rljax.rollouts._replay import MixPolicyReplay
from rljax.rollouts._seeding import ICLSeeding
from rljax.rollouts._segment_tree import SegmentTree
from rljax.rollouts._segments import SegmentRollouts
from rljax.rollouts._trees import TreeRollouts

Text = str | Callable[[Mapping[str, Any]], Optional[str]]


def _text(source: Text, example: Mapping[str, Any]) -> Optional[str]:
  """An example field's value (`source` a field name) or `source(example)`."""
  if callable(source):
    return source(example)
  value = example.get(source)
  return None if value is None else str(value)


def _check_count(name: str, value: int, low: int = 0) -> None:
  if not isinstance(value, (int, np.integer)) or value < low:
    raise ValueError(f"{name}={value!r}; it must be an int >= {low}.")


@dataclasses.dataclass(frozen=True)
class PrivilegedContext(GroupStrategy):
  """Part of each group sampled with privileged context in the prompt and
  trained without it.

  The last `num_privileged` samples of every group are drawn from
  ``context(example) + separator + prompt`` (or the prompt followed by the
  context, ``position="after"``) and trained on the plain prompt, so they
  are off-policy for the update: their ``rollout_logp_PGT`` is the
  sampler's under the privileged prompt, and ``Batch.extra["stream_PG"]``
  marks them `PRIVILEGED` (1) for transforms that treat them apart. The
  group advantage is over the union, as in both papers.

  * TriMPI / PolicyRollout (catalog row 1.54; Multimodal Policy
    Internalization): the context is the policy document the model must
    internalize (``context="policy"``, an example field).
  * ICPO (row 1.90; In-Context Steered Policy Optimization, arXiv
    2510.26519): the context is in-context demonstrations ("implicit expert
    forcing"); `icpo_demonstrations` builds them from training examples and
    `rljax.transforms.icpo_shaping` applies its reject sampling, expert
    bonus and policy shaping to stream 1.

  Args:
    context: an example field holding the context text, or a callable
      example -> text (None: that group gets plain samples only).
    num_privileged: samples per group drawn with the context (at most the
      group's count minus one, so each group keeps an on-policy sample).
    separator: text between context and prompt.
    position: "before" or "after" the prompt.
  """

  context: Text = "context"
  num_privileged: int = 1
  separator: str = "\n"
  position: str = "before"

  def __post_init__(self):
    _check_count("num_privileged", self.num_privileged, 1)
    checks.one_of("position", self.position, ("before", "after"))

  def plan(self, group: Group, step: int, state: State) -> list[Member]:
    del step, state
    n = group.num_samples
    extra = _text(self.context, group.example)
    k = min(self.num_privileged, n - 1)
    if extra is None or k < 1:
      return [Member()] * n
    prompt = (
      extra + self.separator + group.prompt
      if self.position == "before"
      else group.prompt + self.separator + extra
    )
    privileged = Member(
      prompt=prompt, train_prompt=group.prompt, stream=PRIVILEGED
    )
    return [Member()] * (n - k) + [privileged] * k


@dataclasses.dataclass(frozen=True)
class InContextDemos(GroupStrategy):
  """ICPO's implicit expert forcing: `PrivilegedContext` whose context is
  `num_demos` solved training examples (`icpo_demonstrations`), bound to
  the run's task by `prepare`.

  Defaults of the official scripts (Celine-hxy/ICPO, ``verl/recipe/
  icpo``): 1 demonstration, 1 of the group's 8 samples conditioned on it
  and trained on the plain query (``hint.enabled``). The code draws the
  demonstration at random from a cache of solved problems; here it is
  the training examples after the query's index, deterministic.
  """

  num_demos: int = 1
  num_privileged: int = 1
  separator: str = "\n"

  def __post_init__(self):
    _check_count("num_demos", self.num_demos, 1)
    _check_count("num_privileged", self.num_privileged, 1)

  def prepare(self, task) -> GroupStrategy:
    return PrivilegedContext(
      context=icpo_demonstrations(
        task.train,
        task.format_prompt,
        num_demos=self.num_demos,
        separator=self.separator,
      ),
      num_privileged=self.num_privileged,
      separator=self.separator,
    )


def icpo_demonstrations(
  examples: Sequence[Mapping[str, Any]],
  format_prompt: Callable[[Mapping[str, Any]], str],
  *,
  num_demos: int = 2,
  separator: str = "\n",
) -> Callable[[Mapping[str, Any]], str]:
  """ICPO's in-context demonstrations: a callable example -> text of
  `num_demos` solved examples (prompt then answer), chosen from `examples`
  by the example's index (deterministic, never the example itself), for
  `PrivilegedContext(context=...)`."""
  _check_count("num_demos", num_demos, 1)
  if len(examples) <= num_demos:
    raise ValueError(
      f"icpo_demonstrations needs more than num_demos={num_demos} examples;"
      f" got {len(examples)}."
    )

  def context(example):
    start = int(example.get("index", 0)) % len(examples)
    picked, i = [], start
    while len(picked) < num_demos:
      i = (i + 1) % len(examples)
      demo = examples[i]
      if demo.get("question") != example.get("question"):
        picked.append(format_prompt(demo) + str(demo["answer"]))
    return separator.join(picked)

  return context


@dataclasses.dataclass(frozen=True)
class TemperatureStream(GroupStrategy):
  """AEPO's second stream: extra samples at a temperature chosen from the
  policy's entropy.

  The last `num_extra` samples of each group are drawn at ``high`` when the
  previous step's token entropy was below ``target`` and at ``low``
  otherwise (the first step uses ``high``); ``Batch.extra["stream_PG"]``
  marks them `EXPLORE` (4), and `rljax.transforms.aepo_stream_advantages`
  gives them the REINFORCE term
  ``alpha * E_{o ~ pi^T}[grad log pi(o|q) R(q, o)]`` while the group
  advantage uses the on-policy samples.

  The entropy is estimated from the on-policy samples of the step, as the
  mean over sampled tokens of -log p at the sampling temperature (an
  unbiased estimate of the mean token entropy). The stream's
  ``rollout_logp_PGT`` are at its temperature while the update scores every
  sample at the run's: importance corrections against the sampler
  (``transforms.icepop``, ``token_tis``) would see the difference, so
  AEPO's preset uses none.

  References:
    Arbitrary Entropy Policy Optimization (AEPO), arXiv 2510.08141
    (catalog row 2.59): grad J = grad J_GRPO + alpha
    E_{q, o ~ pi_theta^T}[grad log pi_theta(o|q) R(q, o)], T = T_high if
    H(pi_old) < H_target else T_low.
    Checked against 597358816/AEPO (``verl/trainer/ray_trainer.py``):
    T_high 1.2, T_low 0.8, H_target 0.5 (``entropy_base``; the paper's
    best run used 0.75), H the previous update's -mean log-prob of sampled
    tokens. The code differs from the paper's added term: it resamples a
    quarter of the prompts at T, keeps samples with advantage > 0.05 with
    advantage 1, and puts up to 60 of them in place of on-policy rows
    (an implicit alpha of about 60 / batch); we follow the paper (a
    separate stream with weight alpha, on top of the GRPO samples).
  """

  num_extra: int = 4
  target: float = 0.5
  high: float = 1.2
  low: float = 0.8

  def __post_init__(self):
    _check_count("num_extra", self.num_extra, 1)
    if not 0 < self.low < self.high:
      raise ValueError(
        f"low={self.low}, high={self.high}: need 0 < low < high."
      )
    if not self.target > 0:
      raise ValueError(f"target={self.target}; it must be > 0.")

  def init(self) -> State:
    return {"entropy": None}

  def temperature(self, state: State) -> float:
    """The extra stream's temperature for the state's last entropy."""
    h = state.get("entropy")
    return self.high if h is None or h < self.target else self.low

  def plan(self, group: Group, step: int, state: State) -> list[Member]:
    del step
    n = group.num_samples
    k = min(self.num_extra, n - 1)
    if k < 1:
      return [Member()] * n
    extra = Member(temperature=self.temperature(state), stream=EXPLORE)
    return [Member()] * (n - k) + [extra] * k

  def update(
    self, groups: Sequence[Group], scores: Scores, step: int, state: State
  ) -> State:
    del groups, step
    plain = (
      np.asarray(
        [
          [m is not None and m.stream == PLAIN for m in row]
          for row in scores.members
        ]
      )
      & scores.valid
    )
    if not plain.any():
      return state
    return {**state, "entropy": float(np.mean(scores.surprise[plain]))}


def _all_failed(scores: Scores, p: int) -> bool:
  return bool(scores.valid[p].any() and not scores.correct[p].any())


@dataclasses.dataclass(frozen=True)
class TieredHints(GroupStrategy):
  """Scaf-GRPO: hints for groups that all failed, tier after tier.

  From step `exempt_steps` on, a group with no correct sample gets
  `num_replaced` of its failed samples resampled with the first hint tier
  in the prompt; a hinted sample enters the group only if it is correct.
  Groups still without a success try the next tier, and so on (one round
  per tier). The hinted successes are trained on the hinted prompt
  (``train_on="hinted"``: conditioning on the hint, the official script's
  setting) or on the plain prompt (``"plain"``: off-policy, the sampler's
  log-probs under the hinted prompt; the code's ``replace_hint_prompt``);
  ``Batch.extra["stream_PG"]`` marks them `HINTED` (2). The loss is plain
  GRPO over the augmented group.

  References:
    Scaf-GRPO, arXiv 2510.19807 (catalog row 1.26): if sum_i R_i = 0 after
    the exemption period, for tier h in (knowledge, planning, solution):
    regenerate with q + hint_h until success and replace a failed rollout
    with the hinted success.
    Checked against dvlab-research/Scaf-GRPO (``hint_mix_grpo/trainer/
    ray_trainer.py``): all-fail = every reward 0; exemption 50 steps in
    the shipped script (our default); one replaced rollout; the hint in
    the trained prompt. The code differs from the paper: it samples every
    hint level at once (knowledge and solution tiers, each revealing 1-4
    parts; planning commented out) and keeps the lowest successful level;
    we follow the paper's tier-by-tier escalation (give finer levels as
    more tiers to get the code's granularity).

  Args:
    hints: example fields (or callables example -> text) of the tiers, in
      order; a missing hint skips its tier.
    exempt_steps: steps before hints start.
    num_replaced: failed samples resampled per group and tier.
    train_on: "hinted" or "plain".
    template: how a hint joins the prompt (``{prompt}``, ``{hint}``).
  """

  hints: Sequence[Text] = ("hint_knowledge", "hint_planning", "hint_solution")
  exempt_steps: int = 50
  num_replaced: int = 1
  train_on: str = "hinted"
  template: str = "{prompt}\nHint: {hint}\n"

  def __post_init__(self):
    if not self.hints:
      raise ValueError("hints is empty; give at least one tier.")
    _check_count("exempt_steps", self.exempt_steps)
    _check_count("num_replaced", self.num_replaced, 1)
    checks.one_of("train_on", self.train_on, ("hinted", "plain"))
    object.__setattr__(self, "hints", tuple(self.hints))

  @property
  def max_rounds(self) -> int:
    return len(self.hints)

  def revise(self, groups, scores, step, round_, state):
    del state
    if step < self.exempt_steps:
      return {}
    out = {}
    for p, group in enumerate(groups):
      if not _all_failed(scores, p):
        continue
      hint = _text(self.hints[round_], group.example)
      if hint is None:
        continue
      prompt = self.template.format(prompt=group.prompt, hint=hint)
      member = Member(
        prompt=prompt,
        train_prompt=prompt if self.train_on == "hinted" else group.prompt,
        stream=HINTED,
        only_if_correct=True,
      )
      failed = np.flatnonzero(scores.valid[p] & ~scores.correct[p])
      for g in failed[-self.num_replaced :]:
        out[(p, int(g))] = member
    return out


@dataclasses.dataclass(frozen=True)
class SolutionHints(GroupStrategy):
  """GHPO: a group that all failed is posed again with a prefix of its
  reference solution, a longer one each round.

  Round r (r = 0, 1, ...) resamples every sample of each group still
  without a correct one from the prompt followed by the first
  ``round(w_r |solution|)`` characters of the solution,
  ``w_r = fractions[r]``, and trains on that hinted prompt;
  ``Batch.extra["stream_PG"]`` marks the samples `HINTED` (2).

  References:
    GHPO, Guided Hybrid Policy Optimization, arXiv 2507.10628 (catalog row
    2.100): if sum_i r_i = 0 then x <- x + hint(solution[: omega
    |solution|]). Checked against hkgc-1/GHPO (``src/ghpo/
    ghpo_trainer.py``): all-wrong = every accuracy reward <= 0; omega
    escalates 0.25, 0.5, 0.75 within the step while the group stays
    all-wrong (our default), cut by characters; the whole group is
    regenerated and trained on the hinted prompt, no importance term.
  """

  solution: Text = "solution"
  fractions: Sequence[float] = (0.25, 0.5, 0.75)
  template: str = (
    "{prompt}\nThe following text is the beginning part of the answer,"
    " which you can refer to: {hint}\n"
  )

  def __post_init__(self):
    fractions = tuple(float(f) for f in self.fractions)
    if not fractions or not all(0 < f <= 1 for f in fractions):
      raise ValueError(
        f"fractions={self.fractions!r}; give increasing values in (0, 1]."
      )
    if list(fractions) != sorted(fractions):
      raise ValueError(f"fractions={fractions} must increase.")
    object.__setattr__(self, "fractions", fractions)

  @property
  def max_rounds(self) -> int:
    return len(self.fractions)

  def hint(self, solution: str, round_: int) -> str:
    """The first round(w_r * n) of the solution's n characters."""
    return solution[: round(self.fractions[round_] * len(solution))]

  def revise(self, groups, scores, step, round_, state):
    del step, state
    out = {}
    for p, group in enumerate(groups):
      if not _all_failed(scores, p):
        continue
      solution = _text(self.solution, group.example)
      if not solution:
        continue
      prompt = self.template.format(
        prompt=group.prompt, hint=self.hint(solution, round_)
      )
      member = Member(prompt=prompt, train_prompt=prompt, stream=HINTED)
      for g in np.flatnonzero(scores.valid[p]):
        out[(p, int(g))] = member
    return out


@dataclasses.dataclass(frozen=True)
class InjectAnswer(GroupStrategy):
  """A given completion (a ground truth, a demonstration) in the group.

  ``when="always"`` puts it in place of each group's last sample before
  sampling (TempSamp-R1's ground-truth member); ``when="no_success"`` puts
  it in place of a failed sample of each group that all failed (DaGRPO's
  off-policy anchors for queries without a positive). It is not sampled:
  its ``rollout_logp_PGT`` is 0 (behaviour probability 1) and
  ``Batch.extra["stream_PG"]`` marks it `INJECTED` (3); it is scored like
  any sample.

  References:
    TempSamp-R1 (catalog row 2.23): group = {y_1..y_{G-1}} + {y_GT}.
    DaGRPO (row 2.5): off-policy anchors for hard queries with no
    positive sample.

  Args:
    completion: an example field, or a callable example -> text.
    when: "always" or "no_success".
  """

  completion: Text = "answer"
  when: str = "always"

  def __post_init__(self):
    checks.one_of("when", self.when, ("always", "no_success"))

  def plan(self, group: Group, step: int, state: State) -> list[Member]:
    del step, state
    n = group.num_samples
    text = _text(self.completion, group.example)
    if self.when != "always" or text is None or n < 2:
      return [Member()] * n
    return [Member()] * (n - 1) + [Member(completion=text, stream=INJECTED)]

  def revise(self, groups, scores, step, round_, state):
    del step, round_, state
    if self.when != "no_success":
      return {}
    out = {}
    for p, group in enumerate(groups):
      text = _text(self.completion, group.example)
      if text is None or not _all_failed(scores, p):
        continue
      g = int(np.flatnonzero(scores.valid[p])[-1])
      out[(p, g)] = Member(completion=text, stream=INJECTED)
    return out


@dataclasses.dataclass(frozen=True)
class ReplaySuccesses(GroupStrategy):
  """ARPO's replay: a stored success replaces a sample of a group that
  (almost) all failed.

  The state keeps, per prompt id, the last `buffer_size` completions that
  scored above `success_above` (first in, first out), updated after each
  step with the step's sampled (not replayed) completions. A group whose
  rewards have standard deviation below `std_below` and mean below
  `mean_below`, and whose prompt has stored successes, gets one of them
  (chosen by a generator seeded with the step and the prompt id) in place
  of its first sample; off-policy with no importance correction
  (``rollout_logp_PGT`` 0, stream `INJECTED` 3).

  References:
    ARPO, Agentic Replay Policy Optimization, arXiv 2505.16282 (catalog row
    1.94). Checked against dvlab-research/ARPO (``verl/trainer/
    ray_trainer.py::apply_replay``, ``replay_buffer.py``): the trigger
    std < 0.05 and mean < 0.2, one success replacing the first rollout,
    a per-task FIFO buffer of 8 entries with reward > 0.1, filled after
    the replay from the batch's own rollouts; our defaults. The catalog's
    reading "max_i R_i = 0" is ``mean_below`` at the smallest reward.
  """

  buffer_size: int = 8
  success_above: float = 0.1
  std_below: float = 0.05
  mean_below: float = 0.2
  seed: int = 0

  def __post_init__(self):
    _check_count("buffer_size", self.buffer_size, 1)

  def init(self) -> State:
    return {"buffers": {}}

  def revise(self, groups, scores, step, round_, state):
    del round_
    out = {}
    for p, group in enumerate(groups):
      stored = state["buffers"].get(str(group.prompt_id))
      valid = scores.valid[p]
      if not stored or not valid.any():
        continue
      r = scores.rewards[p][valid]
      if not (r.std() < self.std_below and r.mean() < self.mean_below):
        continue
      rng = np.random.default_rng([self.seed, step, group.prompt_id])
      text = stored[int(rng.integers(len(stored)))]
      g = int(np.flatnonzero(valid)[0])
      out[(p, g)] = Member(completion=text, stream=INJECTED)
    return out

  def update(self, groups, scores, step, state):
    del step
    buffers = {k: list(v) for k, v in state["buffers"].items()}
    for p, group in enumerate(groups):
      for g in np.flatnonzero(scores.valid[p]):
        member = scores.members[p][g]
        if member is None or member.stream == INJECTED:
          continue
        if scores.rewards[p, g] > self.success_above:
          texts = buffers.setdefault(str(group.prompt_id), [])
          texts.append(scores.completions[p][int(g)])
          del texts[: -self.buffer_size]
    return {"buffers": buffers}


STRATEGIES = {
  "privileged": PrivilegedContext,
  "tree": TreeRollouts,
  "segments": SegmentRollouts,
  "segment_tree": SegmentTree,
  "icpo_demos": InContextDemos,
  "temperature_stream": TemperatureStream,
  "tiered_hints": TieredHints,
  "solution_hints": SolutionHints,
  "inject_answer": InjectAnswer,
  "replay": ReplaySuccesses,
  "budget_subgroups": BudgetSubgroups,
  "anytime": AnytimeBudgets,
  "markovian": MarkovianChunks,
  "partial": PartialRollouts,
  "mix_policy_replay": MixPolicyReplay,
  "instructions": InstructionPopulation,
  "icl_seeding": ICLSeeding,
}


# The strategies of packages that build on this one (the agent strategies
# of `rljax.envs`): they `register` them when imported, since this package
# never imports them.
_REGISTERED: dict[str, Callable[..., GroupStrategy]] = {}


def register(strategies: Mapping[str, Callable[..., GroupStrategy]]) -> None:
  """Let `get` build more group strategies by name (``sampler.groups``).

  A package that builds on this one registers its strategies when it is
  imported: ``import rljax.envs`` registers the agent strategies
  (``"episodes"``, ``"arpo"``, ...; the trainer imports `rljax.envs`). A
  name of `STRATEGIES` cannot be registered; registering a name again
  replaces its factory.
  """
  taken = sorted(set(strategies) & set(STRATEGIES))
  if taken:
    raise ValueError(
      f"group strategies {taken} are built in (STRATEGIES); use other names."
    )
  _REGISTERED.update(strategies)


def get(name: str, **kwargs) -> GroupStrategy:
  """A group strategy by name (``sampler.groups`` in a config): one of
  `STRATEGIES` or a `register`ed one, e.g. the agent strategies of
  `rljax.envs` (``"episodes"``, ...) once ``rljax.envs`` is imported."""
  known = {**STRATEGIES, **_REGISTERED}
  if name not in known:
    hint = "" if _REGISTERED else "; import rljax.envs for the agent ones"
    raise ValueError(
      f"unknown group strategy {name!r}; known: {sorted(known)}{hint}."
    )
  return known[name](**kwargs)
