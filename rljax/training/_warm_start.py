"""A short supervised warm start: teach a scratch model the answer format.

Cross-entropy on the answer tokens (and EOS) of task examples (their
"demonstration" when they have one: an agent task's whole transcript),
prompt tokens unscored, with its own Adam; the RL optimizer starts fresh
afterwards.
"""

from collections.abc import Iterator

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rljax.tokenizers import Tokenizer
from rljax.training._step import Sequences
from rljax.training._step import completion_logprobs


def answer_batch(
  tokenizer: Tokenizer, task, examples, prompt_width: int, answer_width: int
) -> tuple[Sequences, np.ndarray]:
  """[P, 1, S + T] prompt + answer + EOS sequences and the answer mask."""
  prompts = [task.format_prompt(e) for e in examples]
  tokens_PS, mask_PS = tokenizer.encode_batch(prompts, max_length=prompt_width)
  answers = [
    tokenizer.encode(str(e.get("demonstration", e["answer"])), add_bos=False)
    + [tokenizer.eos_id]
    for e in examples
  ]
  tokens_PT = np.zeros((len(examples), answer_width), np.int32)
  mask_PT = np.zeros_like(tokens_PT)
  for i, answer in enumerate(answers):
    answer = answer[:answer_width]
    tokens_PT[i, : len(answer)] = answer
    mask_PT[i, : len(answer)] = 1
  seqs = Sequences(
    tokens_PGL=np.concatenate([tokens_PS, tokens_PT], -1)[:, None],
    mask_PGL=np.concatenate([mask_PS, mask_PT], -1)[:, None],
  )
  return seqs, mask_PT[:, None].astype(np.float32)


def warm_start(
  graphdef,
  params,
  batches: Iterator,
  *,
  steps: int,
  learning_rate: float,
  answer_width: int,
):
  """`steps` Adam steps of answer cross-entropy; returns params, losses."""
  opt = optax.adam(learning_rate)

  @jax.jit
  def step(params, opt_state, seqs, mask):
    def loss(params):
      model = nnx.merge(graphdef, params)
      logp, _ = completion_logprobs(
        model, seqs, answer_width, temperature=1.0, schedule="chunked"
      )
      return -jnp.sum(logp * mask) / jnp.maximum(jnp.sum(mask), 1.0)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  opt_state = opt.init(params)
  losses = []
  for _ in range(steps):
    seqs, mask = next(batches)
    params, opt_state, value = step(params, opt_state, seqs, mask)
    losses.append(float(value))
  return params, losses


def warm_start_model(model, task, tokenizer, config) -> list[float]:
  """The optional supervised warm start of `model`, in place, from the
  ``train.warm_start_*`` of a `RunConfig` (scratch models); its losses."""
  t = config.train
  if not t.warm_start_steps:
    return []
  data = task.train.shuffle(seed=t.seed + 1).repeat()
  data = data.batch(t.warm_start_batch, batch_fn=list).to_iter_dataset()
  batches = (
    answer_batch(
      tokenizer,
      task,
      examples,
      config.task.max_prompt_tokens,
      config.sampler.max_new_tokens,
    )
    for examples in data
  )
  params, losses = warm_start(
    nnx.graphdef(model),
    nnx.state(model),
    batches,
    steps=t.warm_start_steps,
    learning_rate=t.warm_start_lr,
    answer_width=config.sampler.max_new_tokens,
  )
  nnx.update(model, params)
  return losses
