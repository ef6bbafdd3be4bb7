"""What a `Trainer` step samples: the prompts, the rollouts, the feedback.

The prompt sampler chooses each step's global batch of prompts (their
number of samples and sampling settings); every process samples its own
rows (`RunSampler`: plain groups, a group strategy's, agent episodes) and
the prompt sampler hears how the whole batch scored.
"""

import functools
import threading
from typing import Any, NamedTuple

import numpy as np

from rljax import sampling
from rljax import selection
from rljax._src.errors import UserError
from rljax.training import _groups
from rljax.training import _hosts
from rljax.training import _rollout
from rljax.training._config import RunConfig
from rljax.training._trainer_setup import from_config


class Prompts(NamedTuple):
  """A step's prompts: this process's prompt ids and examples, every
  prompt's number of samples, the step's sampling settings, and the
  sampler's whole `selection.Selection`."""

  ids: list
  examples: list
  counts: np.ndarray
  settings: dict
  chosen: selection.Selection


def no_prompts() -> Prompts:
  """A step that takes no new prompt (groups carried over fill it)."""
  chosen = selection.Selection(np.zeros(0, np.int64), np.zeros(0, np.int32))
  return Prompts([], [], chosen.num_samples, {}, chosen)


def checked_selection(config: RunConfig, chosen, size, sampler, num_prompts):
  """The prompt sampler's choice of `size` prompts, checked (`UserError`s
  name the sampler and the fix)."""
  chosen = from_config(
    "prompts",
    selection.check_selection,
    chosen,
    size,
    num_prompts,
    sampler.max_samples,
    type(sampler).__name__,
    config.sampler.max_new_tokens,
  )
  counts = chosen.num_samples
  g = sampler.max_samples
  if config.sampler.engine == "static" and np.any(counts != g):
    raise UserError(
      f"the prompt sampler gave {counts.min()}..{counts.max()} samples per"
      f" prompt (max_samples {g}); sampler.engine='static' samples the"
      " same number for every prompt: use sampler.engine='continuous'."
    )
  return chosen


def engine_settings(config: RunConfig) -> dict:
  """The rollout engine's slots, pages and lengths for `config`."""
  c, s = config, config.sampler
  return dict(
    slots=s.slots or c.train.prompts_per_step * s.num_samples,
    page_size=s.page_size,
    segment=s.segment,
    max_length=c.task.max_prompt_tokens + s.max_new_tokens,
  )


def _one_at_a_time(method):
  """`method` under the sampler's lock: an asynchronous run's producer and
  the trainer's evaluation share the engines, and take turns."""

  @functools.wraps(method)
  def locked(self, *args, **kwargs):
    with self.lock:
      return method(self, *args, **kwargs)

  return locked


class RunSampler:
  """How a run samples its policy: plain groups, a group strategy's, or
  agent episodes, scored; the continuous-batching engines are made once
  per sampling setting (their KV pools are dropped after each rollout).
  One rollout runs at a time (`lock`)."""

  def __init__(self, config: RunConfig, tokenizer, task, mesh, groups):
    self.config = config
    self.tokenizer = tokenizer
    self.task = task
    self.mesh = mesh
    self.groups = groups
    self._engines = {}
    self.lock = threading.RLock()

  def engine(self, model_config, greedy=False, top_k=None, top_p=None):
    """The continuous-batching engine for these sampling settings."""
    key = (greedy, top_k, top_p)
    if key not in self._engines:
      self._engines[key] = from_config(
        "sampler",
        sampling.Engine,
        model_config,
        **engine_settings(self.config),
        top_k=top_k,
        top_p=top_p,
        greedy=greedy,
        stop_ids=self.tokenizer.stop_ids,
        mesh=self.mesh,
      )
    return self._engines[key]

  @_one_at_a_time
  def sample(
    self,
    policy,
    examples,
    key,
    *,
    global_rows=None,
    budget=None,
    **sampler_kwargs,
  ):
    """Sample and score this process's `examples` (rows of a global batch
    of `global_rows` prompts, ``train.prompts_per_step`` by default), with
    at most `budget` new tokens (default and width: the config's)."""
    c = self.config
    if c.sampler.engine == "continuous":
      sampler_kwargs["engine"] = self.engine(
        policy.config,
        sampler_kwargs.pop("greedy", False),
        sampler_kwargs.pop("top_k", None),
        sampler_kwargs.pop("top_p", None),
      )
    return _rollout.sample_and_score(
      policy,
      self.tokenizer,
      self.task,
      examples,
      key=key,
      prompt_width=c.task.max_prompt_tokens,
      chat=c.model.chat_template,
      mesh=self.mesh,
      global_rows=global_rows or c.train.prompts_per_step,
      max_new_tokens=budget or c.sampler.max_new_tokens,
      width=c.sampler.max_new_tokens,
      **sampler_kwargs,
    )

  @_one_at_a_time
  def episodes(self, policy, examples, key, *, greedy=False, **sampler_kwargs):
    """Agent episodes of the global `examples` (every process runs them
    all, as the engine samples the global batch), scored; this process's
    rows."""
    return _rollout.sample_episodes(
      self.groups,
      self.engine(policy.config, greedy),
      policy,
      self.tokenizer,
      self.task,
      examples,
      key=key,
      width=self.config.sampler.max_new_tokens,
      mesh=self.mesh,
      **sampler_kwargs,
    )

  @_one_at_a_time
  def strategy_groups(
    self, policy, groups_state, prompts: Prompts, key, *, step, temperature
  ):
    """The group strategy's scored rollout of the step's new `prompts`
    (this process's rows) and its new state."""
    c, s = self.config, self.config.sampler
    return _groups.sample_groups(
      self.groups,
      groups_state,
      engine=self.engine(policy.config, False, s.top_k, s.top_p),
      model=policy,
      tokenizer=self.tokenizer,
      task=self.task,
      prompt_ids=prompts.chosen.prompt_ids,
      counts=prompts.counts,
      key=key,
      step=step,
      prompt_width=c.task.max_prompt_tokens,
      chat=c.model.chat_template,
      max_new_tokens=prompts.settings.get("max_new_tokens", s.max_new_tokens),
      width=s.max_new_tokens,
      temperature=temperature,
      mesh=self.mesh,
      batch=c.train.prompts_per_step,
    )


def feedback(scored, mesh, rows: int, step: int) -> selection.Feedback:
  """How the global batch of `rows` prompts scored (every process the same,
  gathered from this process's rows of `scored`)."""
  r = scored.rollout
  p, g, _ = r.tokens_PGT.shape
  local = (
    np.asarray(scored.prompt_ids_P, np.int64),
    np.asarray(scored.rewards_PG, np.float32),
    np.asarray(scored.scores.values_NK)[:, 0].reshape(p, g) > 0,
    np.asarray(r.mask_PGT).sum(-1).astype(np.int32),
    np.asarray(r.sample_mask_PG) > 0,
  )
  ids, rewards, correct, lengths, valid = _hosts.gather_rows(local, mesh, rows)
  return selection.Feedback(
    prompt_ids=ids,
    rewards=np.where(valid, rewards, 0.0),
    correct=correct & valid,
    lengths=np.where(valid, lengths, 0),
    valid=valid,
    step=step,
  )


def sample_settings(config: RunConfig, prompts: Prompts, g: int) -> dict:
  """The keyword arguments of a plain (no group strategy) step's rollout:
  every rollout has G = the sampler's max_samples (one compiled update)."""
  s = config.sampler
  sizes: dict[str, Any] = {} if s.engine == "static" else {"group_size": g}
  counts = prompts.counts
  return dict(
    prompt_ids=prompts.ids,
    num_samples=g if np.all(counts == g) else counts,
    top_k=s.top_k,
    top_p=s.top_p,
    budget=prompts.settings.get("max_new_tokens"),
    **sizes,
  )
