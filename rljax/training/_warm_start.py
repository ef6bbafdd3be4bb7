"""A short supervised warm start: teach a scratch model the answer format.

Cross-entropy on the answer tokens (and EOS) of task examples (their
"demonstration" when they have one: an agent task's whole transcript),
prompt tokens unscored, with its own Adam; the RL optimizer starts fresh
afterwards. Each batch is only as wide as its longest answer (rounded up to
`WIDTH_BUCKET` tokens): trailing padding changes no score of a causal model,
so it is not computed.

With ``train.warm_start_cache`` the warm-started policy is kept in that
directory under a key of everything it depends on (the step's program, the
initial parameters, the first batch, the step count and the devices), and a
later run with the same key restores it instead of training again.
"""

from collections.abc import Iterator
import hashlib
import itertools
import logging

from flax import nnx
import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rljax import checkpointing
from rljax._src.errors import UserError
from rljax.tokenizers import Tokenizer
from rljax.training._step import Sequences
from rljax.training._step import completion_logprobs

logger = logging.getLogger("rljax")

# Answer widths are rounded up to a multiple of this: a few programs, not
# one per longest answer.
WIDTH_BUCKET = 8


def answer_batch(
  tokenizer: Tokenizer, task, examples, prompt_width: int, answer_width: int
) -> tuple[Sequences, np.ndarray]:
  """[P, 1, S + W] prompt + answer + EOS sequences and the [P, 1, W] answer
  mask, W the longest answer rounded up to `WIDTH_BUCKET` (at most
  `answer_width`; longer answers are cut)."""
  prompts = [task.format_prompt(e) for e in examples]
  tokens_PS, mask_PS = tokenizer.encode_batch(prompts, max_length=prompt_width)
  answers = [
    tokenizer.encode(str(e.get("demonstration", e["answer"])), add_bos=False)
    + [tokenizer.eos_id]
    for e in examples
  ]
  longest = max(len(a) for a in answers)
  width = min(answer_width, -(-longest // WIDTH_BUCKET) * WIDTH_BUCKET)
  tokens_PT = np.zeros((len(examples), width), np.int32)
  mask_PT = np.zeros_like(tokens_PT)
  for i, answer in enumerate(answers):
    answer = answer[:width]
    tokens_PT[i, : len(answer)] = answer
    mask_PT[i, : len(answer)] = 1
  seqs = Sequences(
    tokens_PGL=np.concatenate([tokens_PS, tokens_PT], -1)[:, None],
    mask_PGL=np.concatenate([mask_PS, mask_PT], -1)[:, None],
  )
  return seqs, mask_PT[:, None].astype(np.float32)


def _adam_step(graphdef, learning_rate: float):
  """(optimizer, jitted step): one Adam step of answer cross-entropy."""
  opt = optax.adam(learning_rate)

  @jax.jit
  def step(params, opt_state, seqs, mask):
    def loss(params):
      model = nnx.merge(graphdef, params)
      logp, _ = completion_logprobs(
        model, seqs, mask.shape[-1], temperature=1.0, schedule="chunked"
      )
      return -jnp.sum(logp * mask) / jnp.maximum(jnp.sum(mask), 1.0)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  return opt, step


def warm_start(
  graphdef,
  params,
  batches: Iterator,
  *,
  steps: int,
  learning_rate: float,
):
  """`steps` Adam steps of answer cross-entropy on `batches` of (seqs,
  mask); returns params, losses."""
  opt, step = _adam_step(graphdef, learning_rate)
  opt_state = opt.init(params)
  losses = []
  for _ in range(steps):
    seqs, mask = next(batches)
    params, opt_state, value = step(params, opt_state, seqs, mask)
    losses.append(value)  # not read each step: the host runs ahead
  return params, [float(v) for v in jax.device_get(losses)]


def cache_key(graphdef, params, first_batch, config) -> str:
  """The hex key of a warm start: the first step's program (model, loss,
  optimizer, shapes), the initial parameters, the first batch, the task and
  seed, the step count and the devices."""
  t = config.train
  opt, step = _adam_step(graphdef, t.warm_start_lr)
  program = step.lower(params, opt.init(params), *first_batch).as_text()
  digest = hashlib.sha256(program.encode())
  for leaf in jax.tree.leaves((params, first_batch)):
    digest.update(np.asarray(leaf).tobytes())
  devices = jax.devices()
  digest.update(
    repr(
      (config.task, t.seed, t.warm_start_steps, t.warm_start_batch)
      + (devices[0].platform, devices[0].device_kind, len(devices))
    ).encode()
  )
  return digest.hexdigest()[:32]


def _cached(directory: str, key: str, params, train):
  """(params, losses) from the cache, or from `train()` then written to it
  (a failed write is logged and the run goes on)."""
  if jax.process_count() > 1:
    raise UserError(
      "train.warm_start_cache is for single-process runs (each process would"
      " write the same entry); leave it empty in a multi-host run."
    )
  path = f"{directory}/{key}"
  with checkpointing.Checkpointer(path, keep=1, async_save=False) as ckpt:
    if ckpt.all_steps():
      restored = ckpt.restore(params, restore_data=False)
      logger.info("warm start restored from %s", path)
      return restored.state, list(restored.metadata["losses"])
    params, losses = train()
    try:
      ckpt.save(0, params, metadata={"losses": losses}, force=True)
      ckpt.wait()
    except Exception as error:  # noqa: BLE001 - the cache is optional
      logger.warning("warm start not cached in %s: %s", path, error)
  return params, losses


def warm_start_model(model, task, tokenizer, config) -> list[float]:
  """The optional supervised warm start of `model`, in place, from the
  ``train.warm_start_*`` of a `RunConfig` (scratch models); its losses."""
  t = config.train
  if not t.warm_start_steps:
    return []
  data = task.train.shuffle(seed=t.seed + 1).repeat()
  # One thread a few batches ahead: grain's default (16 threads, 500
  # elements ahead) fills its buffer with whole batches, competing with the
  # training step for the GIL and the cores.
  data = data.batch(t.warm_start_batch, batch_fn=list).to_iter_dataset(
    grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)
  )
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
  graphdef, params = nnx.graphdef(model), nnx.state(model)
  first = next(batches)

  def train():
    return warm_start(
      graphdef,
      params,
      itertools.chain([first], batches),
      steps=t.warm_start_steps,
      learning_rate=t.warm_start_lr,
    )

  if t.warm_start_cache:
    key = cache_key(graphdef, params, first, config)
    params, losses = _cached(t.warm_start_cache, key, params, train)
  else:
    params, losses = train()
  nnx.update(model, params)
  return losses
