"""The base of the post-training runs, and their update.

A post-training run is a `rljax.training.Runner` whose step is its own:
the mesh, the policy and tokenizer, the task's evaluation, checkpoints (the
data position is the prompt sampler's state, over the run's records), the
run lock, logging, the progress bar, plots and the CLI are the Runner's. Its
objective is a sum over examples (or tokens) whose gradient is accumulated
over blocks of a fixed shape and divided by the global count once, so the
update is the same however the examples are split into blocks, packed into
rows or sharded.
"""

from collections.abc import Callable, Sequence
import dataclasses
import functools
import os
import pathlib
import time
from typing import Any, Optional

from flax import nnx
import grain
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

from rljax import checkpoints
from rljax import sharding
from rljax import tasks
from rljax._src.base import Mean
from rljax._src.errors import UserError
from rljax.models import _lora
from rljax.models import merge_lora
from rljax.models import save_peft
from rljax.posttrain import _data
from rljax.training import _hosts
from rljax.training._config import RunConfig
from rljax.training._runner import Runner
from rljax.training._step import _keep_if
from rljax.training._step import all_finite
from rljax.training._trainer_setup import from_config
from rljax.training._validate import validate


def records(
  data, task: tasks.Task, kinds: Sequence[str] = (), *, chat: bool = True
) -> list[dict]:
  """The records ``data`` (a `DataSpec`) names; ``"online"``: the task's
  training examples (prompts to sample from).

  With `kinds` (the record kinds the run trains on) every record is checked
  as it is read, before any model is built: one `UserError` names how many
  are bad and the first one's line (or number), field and fix. `chat`: the
  run renders records with a chat template.
  """
  source = data.source
  where = f"data.source={source!r}"
  if source == "online":
    return [dict(e) for e in task.train]
  if source.startswith("jsonl:"):
    path = source[len("jsonl:") :]
    if not os.path.isfile(path):
      here = "" if os.path.isabs(path) else f" (from {os.getcwd()})"
      raise UserError(
        f"{where}: there is no file {path!r}{here}; write the records"
        " there, one JSON object a line."
      )
    return _data.read_jsonl(path, kinds, chat=chat, where=where)
  if source == "task":
    out = _data.task_records(task, data.split)
  else:
    out = _data.tfds_records(
      source[len("tfds:") :],
      split=data.split,
      data_dir=data.data_dir,
      fields=data.fields or None,
    )
  if kinds:
    _data.check_records(out, kinds, chat=chat, where=where)
  return out


def gather(tree):
  """Every leaf of `tree` as its full global array, on every host."""

  def full(x):
    if getattr(x, "is_fully_addressable", True):
      return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))

  return jax.tree.map(full, tree)


def layout(prompts, completions, prompt_width: int, width: int):
  """[P, G, S + T] int32 tokens and mask of P prompts (id arrays, their
  last S kept, left-padded) each followed by G completions (right-padded,
  cut at T), and the fraction of completions cut. ``completions[g][p]`` is
  completion g of prompt p."""
  s, t, p, g = prompt_width, width, len(prompts), len(completions)
  tokens = np.zeros((p, g, s + t), np.int32)
  mask = np.zeros_like(tokens)
  cut = 0
  for i, prompt in enumerate(prompts):
    prompt = np.asarray(prompt)[-s:]
    for j in range(g):
      completion = np.asarray(completions[j][i])
      cut += len(completion) > t
      completion = completion[:t]
      tokens[i, j, s - len(prompt) : s] = prompt
      mask[i, j, s - len(prompt) : s] = 1
      tokens[i, j, s : s + len(completion)] = completion
      mask[i, j, s : s + len(completion)] = 1
  return tokens, mask, cut / max(p * g, 1)


def _no_records(config: RunConfig, kinds: Sequence[str]) -> str:
  """The error of a run left without records."""
  message = f"data.source={config.data.source!r} holds no records"
  if config.data.source.startswith("jsonl:"):
    message += " (the file is empty)"
  if kinds:
    message += f"; write one record a line, e.g. {_data.EXAMPLES[kinds[0]]}"
  return message + "."


class PostTrainer(Runner):
  """The base of the post-training runs (`SFTRun`, `PreferenceRun`,
  `DistillRun`); see `rljax.training.Runner` for the arguments they share.

  ``records``: the training records in code (dicts, see `rljax.posttrain`)
  instead of those ``config.data`` names. Subclasses implement `step`.
  """

  KIND = ""
  PLOT_KEYS = ("loss", "eval_accuracy")

  def __init__(
    self,
    config: RunConfig,
    *,
    records: Optional[Sequence[dict]] = None,
    task: Optional[tasks.Task] = None,
    **kwargs,
  ):
    config = validate(config)
    if config.kind != self.KIND:
      raise UserError(
        f"kind={config.kind!r}, but {type(self).__name__} runs"
        f" kind={self.KIND!r}; use rljax.posttrain.run_for(config)."
      )
    task = task or from_config(
      "task", tasks.get, config.task.name, **config.task.kwargs
    )
    kinds = self._record_kinds(config)
    if records is None:
      records = from_config("data", self._records, config, task, kinds)
    elif kinds:
      _data.check_records(records, kinds, chat=config.model.chat_template)
    records = self._prepare(list(records), config)
    if not records:
      raise UserError(_no_records(config, kinds))
    self.records = records
    # The run's records are the "training set" the prompt sampler walks, so
    # the data position is checkpointed and a resume is exact.
    task = dataclasses.replace(task, train=grain.MapDataset.source(records))
    super().__init__(config, task=task, **kwargs)
    self._grads = {}

  def _record_kinds(self, config: RunConfig) -> tuple[str, ...]:
    """The record kinds the run trains on, the first preferred (empty: the
    records are the task's examples, not checked)."""
    return ()

  def _records(self, config: RunConfig, task: tasks.Task, kinds) -> list:
    """The records ``config.data`` names, checked against `kinds` (see
    `records`)."""
    chat = config.model.chat_template
    return records(config.data, task, kinds, chat=chat)

  def _prepare(self, records: list, config: RunConfig) -> list:
    """The checked records the run trains on (all of them here)."""
    return records

  def _needs(self) -> dict[str, bool]:
    needs = super()._needs()
    needs["ref_logp_PGT"] = self._uses_reference()
    needs["teacher_logp_PGT"] = self._uses_teacher()
    return needs

  def _uses_reference(self) -> bool:
    return False

  def _uses_teacher(self) -> bool:
    return False

  def _next_records(self, step: int) -> tuple[np.ndarray, list[dict]]:
    """The step's global batch of record ids and records."""
    chosen, self.prompt_state = self.prompt_sampler.select(
      self.prompt_state, step, self.config.train.prompts_per_step
    )
    ids = np.asarray(chosen.prompt_ids)
    return ids, [self.task.train[int(i)] for i in ids]

  def _block_rows(self) -> int:
    """Rows of each block (a multiple of the mesh's batch shards)."""
    rows = self.config.data.rows or self.config.train.prompts_per_step
    try:
      sharding.check_batch("data.rows", rows, self.mesh)
    except ValueError as e:
      raise UserError(str(e)) from e
    return rows

  def _global_block(self, block) -> Any:
    """A global block (every leaf [rows, ...]) from the full host copy that
    every process holds: each takes its own rows."""
    rows = jax.tree.leaves(block)[0].shape[0]
    own = _hosts.own_rows(self.mesh, rows)
    return _hosts.to_global(
      jax.tree.map(lambda x: np.asarray(x)[own], block), self.mesh, rows
    )

  # --- the update ----------------------------------------------------------

  def _sums(self, name: str, objective: Callable):
    """Jitted ``(params, frozen, block) -> ((loss_sum, metrics), grads)`` of
    ``objective(model, frozen, block) -> (loss_sum, {name: Mean})``, where
    ``frozen`` holds models the objective reads without training them (a
    teacher's weights, or None)."""
    if name not in self._grads:
      graphdef = self.models.policy

      def total(trained, params, frozen, block):
        model = nnx.merge(graphdef, _lora.with_trainable(params, trained))
        return objective(model, frozen, block)

      # Gradients of the trainable part only (the adapters, under LoRA).
      grads = jax.value_and_grad(total, has_aux=True)
      self._grads[name] = sharding.InMesh(
        self.mesh,
        jax.jit(
          lambda params, frozen, block: grads(
            _lora.trainable(params), params, frozen, block
          )
        ),
      )
    return self._grads[name]

  def _accumulate(self, name, objective, frozen, blocks) -> tuple:
    """Summed gradients, loss sum and metrics over `blocks`."""
    grad_fn = self._sums(name, objective)
    params = self.state.policy.params
    total = grads = metrics = None
    add = functools.partial(jax.tree.map, jnp.add)
    for block in blocks:
      block = self._global_block(block)
      self._last_call = (grad_fn, params, frozen, block)  # for dry_run
      (loss, parts), g = grad_fn(params, frozen, block)
      if grads is None:
        total, grads, metrics = loss, g, parts
      else:
        total, grads, metrics = total + loss, add(grads, g), add(metrics, parts)
    return total, grads, metrics

  def _apply(self, grads, total, count) -> dict[str, float]:
    """One optimizer step on ``grads / count`` (the mean over the global
    batch); skipped, and flagged, when anything is not finite."""
    if "apply" not in self._grads:
      optimizer = self.models.optimizer

      def apply(state, grads, total, count):
        policy = state.policy
        grads = jax.tree.map(lambda g: g / jnp.maximum(count, 1.0), grads)
        trained = _lora.trainable(policy.params)
        updates, opt_state = optimizer.update(grads, policy.opt_state, trained)
        trained = jax.tree.map(jnp.add, trained, updates)
        params = _lora.with_trainable(policy.params, trained)
        loss_ok = jnp.isfinite(total)
        grads_ok = all_finite(grads)
        params_ok = all_finite(trained)
        ok = loss_ok & grads_ok & params_ok
        new = policy._replace(
          params=params, opt_state=opt_state, step=policy.step + 1
        )
        new = _keep_if(ok, new, policy)
        flags = {
          "nonfinite_loss": ~loss_ok,
          "nonfinite_grads": ~grads_ok,
          "nonfinite_params": ~params_ok,
          "skipped_updates": ~ok,
        }
        return state._replace(policy=new), {
          k: v.astype(jnp.float32) for k, v in flags.items()
        }

      self._grads["apply"] = jax.jit(
        apply,
        in_shardings=(self.shardings, None, None, None),
        out_shardings=(self.shardings, None),
        donate_argnums=0,
      )
    self.state, flags = self._grads["apply"](
      self.state, grads, total, jnp.float32(count)
    )
    return {k: float(v) for k, v in jax.device_get(flags).items()}

  def _finish(self, step, start, total, count, metrics, flags) -> dict:
    """The step's metrics as floats, after the non-finite policy."""
    out = {
      k: float(v.value)
      for k, v in jax.device_get(metrics).items()
      if isinstance(v, Mean)
    }
    out["loss"] = float(total) / max(float(count), 1.0)
    out.update(flags)
    self._check_finite(step, out)
    out["seconds"] = time.perf_counter() - start
    return out

  # --- what the RL loop does differently ------------------------------------

  def run(self, *, steps: Optional[int] = None) -> dict[str, Any]:
    """`Trainer.run`, then the trained policy exported to
    ``<output.directory>/model`` (HF safetensors and tokenizer): the next
    run of a pipeline loads it with ``model.source="hf:<that directory>"``
    (SFT, then preference optimisation or RL). With LoRA the export is the
    merged model, and the adapters in PEFT's format in ``model/adapter``."""
    summary = super().run(steps=steps)
    summary["model"] = self.export(self.directory / "model")
    return summary

  def export(self, directory) -> str:
    """Write the current policy and tokenizer to `directory` (process 0;
    every process takes part in gathering the weights)."""
    params = gather(self.state.policy.params)
    if self._writer:
      model = nnx.merge(self.models.policy, params)
      if _lora.has_adapters(model):
        source = self.config.model.source
        save_peft(model, pathlib.Path(directory) / "adapter", base=source)
        model = merge_lora(model)
      checkpoints.save_hf(model, directory)
      self.tokenizer.save(directory)
    return str(directory)

  def _write_rollouts(self, writer, step: int) -> None:
    """Offline runs sample nothing to write."""

  def _compiled_step(self):
    """The last step's gradient program, compiled (`dry_run`)."""
    grad_fn, *args = self._last_call
    return grad_fn.lower(*args).compile()
