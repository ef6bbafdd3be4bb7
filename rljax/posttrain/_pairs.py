"""Preference optimisation: DPO and its family on pairs, offline or online.

A batch of pairs is laid out like a rollout of two samples per prompt:
`Sequences` [P, 2, S + T], the prompt left-padded to ``task.max_prompt_tokens``
(its last S tokens kept), chosen (sample 0) and rejected (sample 1)
right-padded to ``sampler.max_new_tokens`` (truncated beyond; the run logs
the truncated fraction). KTO's unpaired records use the same layout: sample
0 is the labelled completion, sample 1 the NEXT record's completion after
this prompt, the mismatched pair of its KL reference point.
"""

import functools
import logging
import time
from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from rljax import losses
from rljax import sharding
from rljax._src.base import Mean
from rljax._src.errors import UserError
from rljax.models import _lora
from rljax.posttrain import _data
from rljax.posttrain import _encode
from rljax.posttrain import _mechanisms
from rljax.posttrain._mechanisms import best_worst_pairs
from rljax.posttrain._run import PostTrainer
from rljax.posttrain._run import gather
from rljax.posttrain._run import layout
from rljax.training import _hosts
from rljax.training import _rollout
from rljax.training import _trainer_report
from rljax.training._step import Sequences
from rljax.training._step import completion_logprobs

# Losses on summed sequence log-probs against a reference.
_REFERENCED = ("dpo", "robust_dpo", "ipo")
LOSSES = (*_REFERENCED, "simpo", "orpo", "cpo", "kto", "tgdpo")


class PairBlock(NamedTuple):
  """One batch of pairs (or KTO's labelled and mismatched completions)."""

  tokens_PGL: np.ndarray  # int32 [P, 2, S + T]
  mask_PGL: np.ndarray  # int32 [P, 2, S + T]
  keep_P: np.ndarray  # f32 [P]: 1 for a pair that counts
  ref_logp_PG: np.ndarray  # f32 [P, 2]: reference sequence log-probs
  label_P: np.ndarray  # f32 [P]: KTO's desirable flag (1 for pairs)


def pair_objective(
  name: str, kwargs: dict, width: int, schedule: str, graphs=None
):
  """``objective(model, frozen, block) -> (loss sum, metrics)`` of the
  preference loss `name` (one of `LOSSES`) with `kwargs`; for TGDPO
  ``frozen`` holds the weights of its token reward model and reference,
  `graphs` their graph definitions."""
  kwargs = dict(kwargs)
  average = bool(kwargs.pop("average", False))  # IPO as TRL: mean log-probs

  def objective(model, frozen, block):
    seqs = Sequences(block.tokens_PGL, block.mask_PGL)
    logp, _ = completion_logprobs(
      model, seqs, width, temperature=1.0, schedule=schedule
    )
    mask = jnp.asarray(block.mask_PGL[..., -width:], jnp.float32)
    total = losses.sequence_logp(logp, mask)
    length = jnp.sum(mask, -1)
    mean = losses.sequence_logp(logp, mask, average=True)
    ref = block.ref_logp_PG
    if name in _REFERENCED:
      fn = getattr(losses, name)
      if average:
        ref = ref / jnp.maximum(length, 1.0)
        total = mean
      out = fn(total[:, 0], total[:, 1], ref[:, 0], ref[:, 1], **kwargs)
    elif name == "simpo":
      out = losses.simpo(
        total[:, 0], total[:, 1], length[:, 0], length[:, 1], **kwargs
      )
    elif name == "orpo":
      out = losses.orpo(mean[:, 0], mean[:, 1], **kwargs)
    elif name == "cpo":
      out = losses.cpo(
        total[:, 0], total[:, 1], chosen_length=length[:, 0], **kwargs
      )
    elif name == "tgdpo":
      (rm, ref_params), (rm_graph, ref_graph) = frozen, graphs
      rm_logp = completion_logprobs(
        nnx.merge(rm_graph, rm), seqs, width, temperature=1.0, schedule=schedule
      )[0]
      ref_logp = completion_logprobs(
        nnx.merge(ref_graph, ref_params),
        seqs,
        width,
        temperature=1.0,
        schedule=schedule,
      )[0]
      out = losses.tgdpo(
        logp[:, 0],
        logp[:, 1],
        ref_logp[:, 0],
        ref_logp[:, 1],
        rm_logp[:, 0],
        rm_logp[:, 1],
        mask[:, 0],
        mask[:, 1],
        **kwargs,
      )
    else:  # kto
      point = losses.kto_reference_point(
        total[:, 1], ref[:, 1], jnp.asarray(block.keep_P)
      )
      k = losses.kto(total[:, 0], ref[:, 0], block.label_P > 0, point, **kwargs)
      keep = jnp.asarray(block.keep_P)
      return jnp.sum(k.loss * keep), {
        "reward_accuracy": Mean(jnp.sum(k.accuracy * keep), jnp.sum(keep)),
        "reward": Mean(jnp.sum(k.reward * keep), jnp.sum(keep)),
        "kl_reference_point": Mean(point, jnp.float32(1.0)),
        "pairs": Mean(jnp.sum(keep), jnp.float32(0.0)),
      }
    keep = jnp.asarray(block.keep_P)
    n = jnp.sum(keep)
    margin = out.chosen_reward - out.rejected_reward
    return jnp.sum(out.loss * keep), {
      "reward_accuracy": Mean(jnp.sum(out.accuracy * keep), n),
      "reward_margin": Mean(jnp.sum(margin * keep), n),
      "chosen_reward": Mean(jnp.sum(out.chosen_reward * keep), n),
      "rejected_reward": Mean(jnp.sum(out.rejected_reward * keep), n),
      "pairs": Mean(n, jnp.float32(0.0)),
    }

  return objective


class PreferenceRun(PostTrainer):
  """Preference optimisation (``kind="preference"``, ``configs/dpo.py``).

  ``algorithm.name`` is the loss: "dpo" (``label_smoothing``: cDPO),
  "robust_dpo", "ipo" (``average=True``: TRL's mean log-probs), "simpo",
  "orpo", "cpo", "kto" (unpaired records with a ``label``), "tgdpo" (the
  ``teacher`` is its token reward model); ``algorithm.kwargs`` its
  hyperparameters (`rljax.losses`).

  Offline (``data.source`` "jsonl:", "tfds:" or "task" records with
  ``chosen`` and ``rejected``) the reference log-probs of each record are
  computed once, the first time it is drawn, and cached (the reference is
  the frozen initial policy; a resumed run computes them again). Online
  (``data.source="online"``: online DPO, and with
  ``train.reference_resets`` the iterative DPO of DNO, arXiv 2404.03715,
  and VerIPO) each step samples ``sampler.num_samples`` completions of
  each prompt from the current policy, scores them with the task's
  rewards (a verifier or judge is a reward function) and pairs the best
  with the worst (`rljax.posttrain.best_worst_pairs`, ``min_margin`` in
  ``algorithm.kwargs``); a prompt without a margin contributes nothing.
  ``algorithm.kwargs.apo_alpha`` > 0 (APO) extrapolates at each reference
  reset (`rljax.posttrain.apo_extrapolate`).
  """

  KIND = "preference"
  PROGRESS_KEYS = {
    "loss": "loss",
    "reward_accuracy": "acc",
    "eval_accuracy": "eval",
  }
  PLOT_KEYS = ("loss", "reward_accuracy", "reward_margin", "eval_accuracy")

  def _build(self, *args) -> None:
    c = self.config
    self.loss_name = c.algorithm.name
    if self.loss_name not in LOSSES:
      raise UserError(
        f"algorithm.name={self.loss_name!r}: a preference run's loss is one"
        f" of {LOSSES}."
      )
    kwargs = dict(c.algorithm.kwargs)
    self.min_margin = float(kwargs.pop("min_margin", 0.0))
    self.apo_alpha = float(kwargs.pop("apo_alpha", 0.0))
    self.loss_kwargs = kwargs
    self.online = c.data.source == "online"
    self.ref_cache: dict[int, np.ndarray] = {}
    if self.online and self.loss_name == "kto":
      raise UserError(
        "algorithm.name='kto' trains on labelled offline records; set"
        " data.source to them, or use a paired loss online."
      )
    super()._build(*args)

  def _record_kinds(self, config) -> tuple[str, ...]:
    if config.data.source == "online":
      return ()  # the task's prompts, sampled each step
    return ("unpaired",) if config.algorithm.name == "kto" else ("pair",)

  def _prepare(self, records: list, config) -> list:
    """The pairs without those whose chosen and rejected are the same text
    (a constant loss, log 2 for DPO, and no gradient): dropped with one
    warning, counted in each step's ``pairs_dropped_identical``."""
    self.pairs_dropped_identical = 0
    if self._record_kinds(config) != ("pair",):
      return records
    kept = [r for r in records if not identical_pair(r)]
    dropped = self.pairs_dropped_identical = len(records) - len(kept)
    where = f"data.source={config.data.source!r}"
    if records and not kept:
      raise UserError(
        f"{where}: all {dropped} pairs have the same chosen and rejected"
        " completion, which teaches nothing; pair each prompt with two"
        " different completions."
      )
    if dropped:
      logging.getLogger("rljax").warning(
        "%s: dropped %d of %d pairs whose chosen and rejected completions"
        " are the same (a constant loss and no gradient); training on the"
        " other %d.",
        where,
        dropped,
        len(records),
        len(kept),
      )
    return kept

  def _uses_reference(self) -> bool:
    return self.config.algorithm.name in (*_REFERENCED, "kto", "tgdpo")

  def _uses_teacher(self) -> bool:
    return self.config.algorithm.name == "tgdpo"

  # --- data -----------------------------------------------------------------

  def _offline_block(self, ids, records):
    chat = self.config.model.chat_template
    encode = functools.partial(
      _encode.encode_prompt_completion, self.tokenizer, chat=chat
    )
    prompts, first, second, labels = [], [], [], []
    kto = self.loss_name == "kto"
    for i, r in enumerate(records):
      if kto:
        other = records[(i + 1) % len(records)]
        prompt, own = encode(r["prompt"], r["completion"])
        _, mismatched = encode(r["prompt"], other["completion"])
        labels.append(float(bool(r["label"])))
      else:
        prompt, own = encode(r["prompt"], r["chosen"])
        _, mismatched = encode(r["prompt"], r["rejected"])
        labels.append(1.0)
      prompts.append(prompt)
      first.append(own)
      second.append(mismatched)
    tokens, mask, cut = layout(
      prompts,
      [first, second],
      self.config.task.max_prompt_tokens,
      self.config.sampler.max_new_tokens,
    )
    keep = np.ones(len(records), np.float32)
    label = np.asarray(labels, np.float32)
    ref = self._cached_reference(ids, tokens, mask, cacheable=not kto)
    return PairBlock(tokens, mask, keep, ref, label), cut

  def _online_block(self, step, examples):
    key = jax.random.fold_in(jax.random.key(self.config.train.seed), step)
    own = _hosts.own_rows(self.mesh, len(examples))
    scored = self._sample(
      [examples[int(i)] for i in own],
      key,
      num_samples=self.config.sampler.num_samples,
      temperature=self.config.sampler.temperature,
    )
    rewards = gather(self._global(np.asarray(scored.rewards_PG)))
    seqs = gather(self._global(_rollout.sequences(scored.rollout)))
    choice = jax.device_get(
      best_worst_pairs(rewards, min_margin=self.min_margin)
    )
    pairs = np.stack([choice.chosen, choice.rejected], 1)[..., None]
    tokens, mask = (
      np.take_along_axis(np.asarray(x), pairs, 1).astype(np.int32)
      for x in (seqs.tokens_PGL, seqs.mask_PGL)
    )
    keep = np.asarray(choice.keep, np.float32)
    ref = self._cached_reference(None, tokens, mask, cacheable=False)
    self._last = scored
    metrics = {
      "reward": float(np.mean(rewards)),
      "pair_margin": float(np.sum(choice.margin) / max(keep.sum(), 1.0)),
      "pairs_kept": float(keep.mean()),
    }
    label = np.ones(len(keep), np.float32)
    return PairBlock(tokens, mask, keep, ref, label), metrics

  def _cached_reference(self, ids, tokens, mask, *, cacheable) -> np.ndarray:
    """[P, 2] reference sequence log-probs: from the cache where every id
    has them, else computed (and cached when `cacheable`)."""
    p = tokens.shape[0]
    if not self._uses_reference() or self.loss_name == "tgdpo":
      return np.zeros((p, 2), np.float32)
    if (
      cacheable
      and ids is not None
      and all(int(i) in self.ref_cache for i in ids)
    ):
      return np.stack([self.ref_cache[int(i)] for i in ids])
    ref = self.reference_logps(tokens, mask)
    if cacheable and ids is not None:
      for i, row in zip(ids, ref):
        self.ref_cache[int(i)] = row
    return ref

  def reference_logps(self, tokens, mask) -> np.ndarray:
    """[P, 2] summed completion log-probs under the frozen reference."""
    if "reference" not in self._grads:
      graphdef = self.models.policy
      width = self.config.sampler.max_new_tokens
      schedule = self.config.model.logprob_schedule

      @jax.jit
      def score(params, tokens, mask):
        logp, _ = completion_logprobs(
          nnx.merge(graphdef, params),
          Sequences(tokens, mask),
          width,
          temperature=1.0,
          schedule=schedule,
        )
        return losses.sequence_logp(logp, mask[..., -width:])

      self._grads["reference"] = sharding.InMesh(self.mesh, score)
    seqs = self._global_block(Sequences(tokens, mask))
    out = self._grads["reference"](
      self.reference_params(), seqs.tokens_PGL, seqs.mask_PGL
    )
    return np.asarray(gather(out), np.float32)

  # --- the step -------------------------------------------------------------

  def _objective(self):
    """(the frozen weights it reads, the run's pair objective)."""
    frozen = graphs = None
    if self.loss_name == "tgdpo":
      frozen = (self.teacher[1], self.reference_params())
      graphs = (self.teacher[0], self.models.policy)
    return frozen, pair_objective(
      self.loss_name,
      self.loss_kwargs,
      self.config.sampler.max_new_tokens,
      self.config.model.logprob_schedule,
      graphs,
    )

  def _reset_reference(self) -> None:
    """A reference reset (iterative DPO / DNO): the reference becomes the
    current policy, or with APO's ``apo_alpha`` the extrapolated one, which
    the policy continues from too."""
    if self.apo_alpha > 0:
      params = self.state.policy.params
      new = _lora.with_trainable(
        params,
        _mechanisms.apo_extrapolate(
          _lora.trainable(params), self.state.reference, self.apo_alpha
        ),
      )
      self.state = self.state._replace(
        policy=self.state.policy._replace(params=new)
      )
    super()._reset_reference()
    self.ref_cache.clear()

  def step(self, step: int) -> dict[str, float]:
    """One optimizer step on a batch of pairs; returns its metrics."""
    start = time.perf_counter()
    self._step = step
    if step in self.config.train.reference_resets:
      self._reset_reference()
    ids, records = self._next_records(step)
    extra = {}
    if self.online:
      block, extra = self._online_block(step, records)
    else:
      block, extra["truncated"] = self._offline_block(ids, records)
      extra["pairs_dropped_identical"] = float(self.pairs_dropped_identical)
    frozen, objective = self._objective()
    total, grads, metrics = self._accumulate(
      self.loss_name, objective, frozen, [block]
    )
    count = float(metrics["pairs"].num)
    flags = self._apply(grads, total, count)
    out = self._finish(step, start, total, count, metrics, flags)
    out.update(extra)
    return out

  def evaluate_pairs(self, records) -> dict[str, float]:
    """The loss's metrics on held-out pair records (no update): reward
    accuracy and margin of the implicit rewards. Records are taken
    ``train.prompts_per_step`` at a time (the last batch padded with
    repeats that do not count)."""
    batch = self.config.train.prompts_per_step
    frozen, objective = self._objective()
    if "eval" not in self._grads:
      graphdef = self.models.policy
      self._grads["eval"] = sharding.InMesh(
        self.mesh,
        jax.jit(
          lambda params, frozen, block: objective(
            nnx.merge(graphdef, params), frozen, block
          )
        ),
      )
    sums = {}
    for start in range(0, len(records), batch):
      part = list(records[start : start + batch])
      real = len(part)
      part += [part[-1]] * (batch - real)
      block, _ = self._offline_block(None, part)
      block = block._replace(
        keep_P=(np.arange(batch) < real).astype(np.float32)
      )
      _, metrics = self._grads["eval"](
        self.state.policy.params, frozen, self._global_block(block)
      )
      for k, m in jax.device_get(metrics).items():
        num, den = sums.get(k, (0.0, 0.0))
        sums[k] = (num + float(m.num), den + float(m.den))
    return {f"eval_{k}": num / den for k, (num, den) in sums.items() if den > 0}

  def _write_rollouts(self, writer, step: int) -> None:
    if self.online:
      _trainer_report.write_rollouts(writer, step, self._last)


def identical_pair(record) -> bool:
  """Whether a pair record's chosen and rejected are the same text."""
  text = _data.completion_text
  return text(record["chosen"], "chosen") == text(
    record["rejected"], "rejected"
  )


def sample_pairs(
  run, examples, *, key, min_margin: float = 0.0
) -> tuple[list[dict], dict[str, float]]:
  """Pair records built offline from a task's reward: each example's
  ``sampler.num_samples`` completions from ``run``'s current policy (any
  `rljax.training.Trainer`), scored by the task's rewards, the best
  against the worst where their margin is at least `min_margin`
  (`best_worst_pairs`). Single process. Returns the records and the kept
  fraction and mean reward."""
  batch = run.config.train.prompts_per_step
  records, kept, rewards = [], 0, []
  for start in range(0, len(examples), batch):
    part = list(examples[start : start + batch])
    real = len(part)
    part += [part[-1]] * (batch - real)
    scored = run._sample(
      part,
      jax.random.fold_in(key, start),
      num_samples=run.config.sampler.num_samples,
      temperature=run.config.sampler.temperature,
    )
    r = np.asarray(scored.rewards_PG)[:real]
    rewards.append(r)
    choice = jax.device_get(best_worst_pairs(r, min_margin=min_margin))
    g = r.shape[1]
    for i in range(real):
      if not choice.keep[i]:
        continue
      c, r = i * g + int(choice.chosen[i]), i * g + int(choice.rejected[i])
      records.append(
        {
          "prompt": scored.prompts[i],
          "chosen": scored.completions[c],
          "rejected": scored.completions[r],
        }
      )
      kept += 1
  stats = {
    "pairs_kept": kept / max(len(examples), 1),
    "mean_reward": float(np.mean(np.concatenate(rewards))),
  }
  return records, stats
