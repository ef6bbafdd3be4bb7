"""Generalized knowledge distillation (GKD): the student matches a frozen
teacher's next-token distributions on a mix of its own samples and the
data's completions."""

import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from rljax import losses
from rljax._src.base import Mean
from rljax._src.errors import UserError
from rljax.posttrain import _encode
from rljax.posttrain._run import PostTrainer
from rljax.posttrain._run import gather
from rljax.posttrain._run import layout
from rljax.training import _hosts
from rljax.training import _rollout
from rljax.training._step import Sequences

_KWARGS = ("beta", "temperature", "lmbda")


def gkd_objective(width: int, beta: float, temperature: float, teacher_graph):
  """``objective(model, teacher_params, seqs) -> (loss sum, metrics)``: the
  token sum of `rljax.losses.gkd_loss` over the last `width` (completion)
  positions of [P, G, L] sequences, both models scoring the same tokens."""

  def objective(model, teacher_params, seqs):
    p, g, length = seqs.tokens_PGL.shape
    tokens = seqs.tokens_PGL.reshape(p * g, length)
    mask = seqs.mask_PGL.reshape(p * g, length)
    start = length - width - 1  # the position that predicts token L - width
    student = model(tokens, mask)[0][:, start:-1]
    teacher_logits = nnx.merge(teacher_graph, teacher_params)(tokens, mask)[0]
    teacher_logits = jax.lax.stop_gradient(teacher_logits[:, start:-1])
    completion = jnp.asarray(mask[:, -width:], jnp.float32)
    loss, metrics = losses.gkd_loss(
      student, teacher_logits, completion, beta=beta, temperature=temperature
    )
    count = jnp.sum(completion)
    metrics = {
      k: Mean(m.num, m.den) for k, m in metrics.items() if isinstance(m, Mean)
    }
    metrics["tokens"] = Mean(count, jnp.float32(0.0))
    return jnp.sum(loss), metrics

  return objective


_ON_POLICY_RECORDS = (
  "on-policy GKD steps (algorithm.kwargs.lmbda > 0) sample the task's"
  " prompts: use data.source='task' or 'online', or set"
  " algorithm.kwargs.lmbda=0 for these records."
)


class DistillRun(PostTrainer):
  """GKD (``kind="distill"``, ``configs/gkd.py``; Agarwal et al., arXiv
  2306.13649): ``algorithm.name="gkd"`` with ``beta`` (the generalized
  JSD's weight: 0 forward KL, 1 reverse KL; default 0.5), ``temperature``
  and ``lmbda``, the fraction of steps whose completions the student samples
  itself (``sampler.num_samples`` per prompt, on-policy); the other steps
  train on the data's completions (the task's "demonstration" or answer,
  or ``completion`` records). The teacher (``config.teacher``, any size,
  the same tokenizer) scores the same tokens; the loss is the token mean of
  the per-token JSD over the whole vocabulary. ``lmbda=1, beta=1`` is
  on-policy reverse-KL distillation; the RL form of it, which also takes a
  reward, is the `rljax.algorithms.opd` preset.
  """

  KIND = "distill"
  PROGRESS_KEYS = {"loss": "loss", "eval_accuracy": "eval"}
  PLOT_KEYS = ("loss", "gkd_top1_agreement", "eval_accuracy")

  def _build(self, *args) -> None:
    c = self.config
    if c.algorithm.name != "gkd":
      raise UserError(
        f"algorithm.name={c.algorithm.name!r}: a distillation run's loss is"
        " 'gkd' (on-policy distillation with a reward is the RL preset"
        " 'opd': kind='rl')."
      )
    unknown = set(c.algorithm.kwargs) - set(_KWARGS)
    if unknown:
      raise UserError(
        f"algorithm.kwargs {sorted(unknown)}: gkd takes {list(_KWARGS)}."
      )
    kwargs = {"beta": 0.5, "temperature": 1.0, "lmbda": 0.5}
    kwargs.update(c.algorithm.kwargs)
    self.beta = float(kwargs["beta"])
    self.gkd_temperature = float(kwargs["temperature"])
    self.lmbda = 1.0 if c.data.source == "online" else float(kwargs["lmbda"])
    if not 0.0 <= self.lmbda <= 1.0:
      raise UserError(
        f"algorithm.kwargs.lmbda={self.lmbda}: must be in [0, 1]."
      )
    if self.lmbda > 0 and "prompt" in self.records[0]:
      raise UserError(_ON_POLICY_RECORDS)  # before the model is built
    super()._build(*args)

  def _record_kinds(self, config) -> tuple[str, ...]:
    if config.data.source in ("task", "online"):
      return ()  # the task's own examples
    return ("prompt_completion",)

  def _records(self, config, task, kinds):
    """The task's own examples for ``data.source`` "task" or "online" (the
    on-policy steps sample their prompts; the others train on their
    "demonstration" or answer), else the records it names."""
    if config.data.source in ("task", "online"):
      return [dict(e) for e in task.train]
    return super()._records(config, task, kinds)

  def _uses_teacher(self) -> bool:
    return True

  def _on_policy(self, step: int) -> bool:
    """Whether `step` trains on the student's own samples (GKD's lambda),
    drawn from the run's seed so a resume draws the same."""
    rng = np.random.default_rng([self.config.train.seed, step, 17])
    return bool(rng.random() < self.lmbda)

  def _data_sequences(self, records) -> Sequences:
    """[P, 1, S + T] prompt + the data's completion of each record."""
    prompts, completions = [], []
    for r in records:
      if "prompt" in r:
        prompt, completion = r["prompt"], r["completion"]
      else:  # a task example
        prompt = self.task.format_prompt(r)
        completion = str(r.get("demonstration", r["answer"]))
      ids, answer = _encode.encode_prompt_completion(
        self.tokenizer, prompt, completion, chat=self.config.model.chat_template
      )
      prompts.append(ids)
      completions.append(answer)
    tokens, mask, _ = layout(
      prompts,
      [completions],
      self.config.task.max_prompt_tokens,
      self.config.sampler.max_new_tokens,
    )
    return Sequences(tokens, mask)

  def _student_sequences(self, step, records) -> Sequences:
    if "prompt" in records[0]:
      raise UserError(_ON_POLICY_RECORDS)
    key = jax.random.fold_in(jax.random.key(self.config.train.seed), step)
    own = _hosts.own_rows(self.mesh, len(records))
    scored = self._sample(
      [records[int(i)] for i in own],
      key,
      num_samples=self.config.sampler.num_samples,
      temperature=self.config.sampler.temperature,
    )
    self._last = scored
    return gather(self._global(_rollout.sequences(scored.rollout)))

  def step(self, step: int) -> dict[str, float]:
    """One optimizer step of GKD; returns its metrics."""
    start = time.perf_counter()
    self._step = step
    _, records = self._next_records(step)
    on_policy = self._on_policy(step)
    if on_policy:
      seqs = self._student_sequences(step, records)
    else:
      seqs = self._data_sequences(records)
    objective = gkd_objective(
      self.config.sampler.max_new_tokens,
      self.beta,
      self.gkd_temperature,
      self.teacher[0],
    )
    total, grads, metrics = self._accumulate(
      "gkd", objective, self.teacher[1], [seqs]
    )
    count = float(metrics["tokens"].num)
    flags = self._apply(grads, total, count)
    out = self._finish(step, start, total, count, metrics, flags)
    out["on_policy"] = float(on_policy)
    return out

  def _write_rollouts(self, writer, step: int) -> None:
    if self._on_policy(step - 1):
      super(PostTrainer, self)._write_rollouts(writer, step)
