"""`EpisodeRollouts`: the group strategy that samples agent episodes."""

from collections.abc import Callable
from typing import Optional

import numpy as np

from rljax import rollouts
from rljax._src.errors import UserError
from rljax.envs._base import Environment
from rljax.envs._episodes import run_episodes
from rljax.envs._render import Renderer


class EpisodeRollouts(rollouts.GroupStrategy):
  """Each sample of a group is a multi-turn episode of an environment.

  The trainer uses it for a task with an ``environment`` (or with
  ``sampler.groups='episodes'``): the step's token budget
  (``sampler.max_new_tokens``) is the episode's completion budget, actions
  and observations included, and each policy turn gets at most
  `turn_tokens` of it. The batch carries the agent data layout in
  ``Batch.extra`` (see `rljax.envs`), so the loss and the KL see only the
  policy's tokens and turn-level estimators find the turns.

  Args:
    environment: the factory of a fresh `Environment` per episode (a class
      or function of no arguments); None: the task's ``environment``.
    max_turns: the most actions per episode (the turn axis of the side
      arrays); None: the environment's ``max_turns``.
    turn_tokens: the most tokens of one policy turn; None: the step's
      whole budget.
    overlap: run environment steps in threads while decoding goes on
      (False: one after another, between decoding segments).
    workers: threads for environment steps.
    step_timeout: seconds an environment step may take before its episode
      ends (None: no limit; tools have their own limits).
    branch: a branching rule for trees of episodes (see
      `rljax.envs.run_episodes`); None: G independent episodes.
    initial: with `branch`, the episodes each group starts with (the rest
      of its G come from branching); None: all G.
    counterfactual: InfoPO's placeholder text (e.g.
      `rljax.transforms.INFOPO_PLACEHOLDER`, "No information found."):
      after sampling, the policy scores each action with the observation
      before it replaced by the placeholder
      (`rljax.transforms.infopo_counterfactual_logprobs`, one forward pass
      per turn), into ``Batch.extra["infopo_cf_logp_PGT"]`` for
      `rljax.transforms.infopo_advantages`; None: no such pass.
  """

  def __init__(
    self,
    environment: Optional[Callable[[], Environment]] = None,
    *,
    max_turns: Optional[int] = None,
    turn_tokens: Optional[int] = None,
    overlap: bool = True,
    workers: int = 8,
    step_timeout: Optional[float] = None,
    branch: Optional[Callable] = None,
    initial: Optional[int] = None,
    counterfactual: Optional[str] = None,
  ):
    for name, value in (
      ("initial", initial),
      ("max_turns", max_turns),
      ("turn_tokens", turn_tokens),
      ("step_timeout", step_timeout),
    ):
      if value is not None and not value > 0:
        raise ValueError(f"{name} must be > 0 (or None); got {value!r}.")
    if workers < 1:
      raise ValueError(f"workers must be >= 1; got {workers!r}.")
    self.environment = environment
    self.max_turns = max_turns
    self.turn_tokens = turn_tokens
    self.overlap = bool(overlap)
    self.workers = int(workers)
    self.step_timeout = step_timeout
    self.branch = branch
    self.initial = initial
    self.counterfactual = counterfactual
    self.renderer: Optional[Renderer] = None
    self.last_stats: dict = {}

  def prepare(self, task) -> "EpisodeRollouts":
    make = self.environment or getattr(task, "environment", None)
    if make is None:
      raise UserError(
        f"task {getattr(task, 'name', task)!r} has no environment; give"
        " EpisodeRollouts(environment=...) or a task made with one (e.g."
        " tasks.get('calculator'))."
      )
    bound = EpisodeRollouts(
      make,
      max_turns=self.max_turns or getattr(make(), "max_turns", 1),
      turn_tokens=self.turn_tokens,
      overlap=self.overlap,
      workers=self.workers,
      step_timeout=self.step_timeout,
      branch=self.branch,
      initial=self.initial,
      counterfactual=self.counterfactual,
    )
    bound.renderer = self.renderer
    return bound

  def bind(self, tokenizer, *, chat: bool) -> "EpisodeRollouts":
    self.renderer = Renderer(tokenizer, chat=chat)
    return self

  def draw(
    self,
    engine,
    model,
    prompts,
    counts,
    *,
    key,
    max_new_tokens,
    width,
    temperature,
    groups=(),
    **unused,
  ):
    del prompts, unused
    if self.renderer is None or self.environment is None:
      raise UserError(
        "EpisodeRollouts must be bound to the run's task and tokenizer"
        " (strategy.prepare(task).bind(tokenizer, chat=...)); the Trainer"
        " does this."
      )
    episodes = run_episodes(
      engine,
      model,
      self.renderer,
      self.environment,
      [group.example for group in groups],
      counts if self.initial is None else np.minimum(counts, self.initial),
      key=key,
      group_size=int(np.max(counts, initial=1)),
      width=width,
      budget=max_new_tokens,
      turn_tokens=self.turn_tokens or max_new_tokens,
      max_turns=int(self.max_turns or 1),
      temperature=temperature,
      overlap=self.overlap,
      workers=self.workers,
      step_timeout=self.step_timeout,
      branch=self.branch,
    )
    self.last_stats = episodes.stats
    extra = dict(episodes.extra)
    if self.counterfactual is not None:
      extra["infopo_cf_logp_PGT"] = self._counterfactual(
        model, episodes, temperature
      )
    return rollouts.Drawn(episodes.rollout, extra)

  def _counterfactual(self, model, episodes, temperature) -> np.ndarray:
    """InfoPO's log-probs with each action's preceding observation
    replaced by the placeholder, [P, G, T]."""
    from rljax import transforms  # noqa: PLC0415 - only InfoPO runs need it

    r, x = episodes.rollout, episodes.extra
    p, g, t = np.shape(r.tokens_PGT)
    flat = lambda a: np.asarray(a).reshape(p * g, -1)  # noqa: E731
    placeholder = self.renderer.tokenizer.encode(
      self.counterfactual, add_bos=False
    )
    _, cf = transforms.infopo_counterfactual_logprobs(
      model,
      np.concatenate([flat(r.prompt_tokens_PGS), flat(r.tokens_PGT)], -1),
      np.concatenate([flat(r.prompt_mask_PGS), flat(r.mask_PGT)], -1),
      flat(x["turn_ids_PGT"]),
      flat(x["loss_mask_PGT"]),
      placeholder,
      num_turns=int(self.max_turns or 1),
      temperature=temperature,
    )
    return np.asarray(cf, np.float32).reshape(p, g, t)
