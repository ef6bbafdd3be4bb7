"""Train a tabular policy to add two digits with any rljax preset.

The smallest complete RL loop over rljax's algorithm layer: sample G answers
per prompt, score them, `prepare` the batch, differentiate `loss`, apply optax.
The policy is a table of logits [prompt, position, token] (no language model),
so a run takes seconds on a CPU:

  python experiments/tabular_arithmetic.py --algo grpo --steps 100
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import rljax

EOS, VOCAB, T = 10, 11, 3  # digits 0-9, end of sequence; answers <= 2 digits


def targets() -> np.ndarray:
  """[100, T] the answer tokens of every prompt a + b, padded after EOS."""
  out = np.full((100, T), EOS)
  for p in range(100):
    digits = [int(c) for c in str(p // 10 + p % 10)]
    out[p, : len(digits)] = digits
  return out


def completion_mask(tokens):
  """1 up to and including the first EOS."""
  is_eos = tokens == EOS
  return (jnp.cumsum(is_eos, -1) - is_eos == 0).astype(jnp.float32)


def rewards(tokens, answer_P):
  mask = completion_mask(tokens)
  match = jnp.where(mask > 0, tokens == answer_P[:, None, :], True)
  return jnp.all(match, -1).astype(jnp.float32)


def logp_of(params, prompts_P, tokens_PGT):
  logits = jax.nn.log_softmax(params[prompts_P], -1)  # [P, T, V]
  return jnp.take_along_axis(logits[:, None], tokens_PGT[..., None], -1)[..., 0]


def make_step(algo, optimizer, group_size):
  @jax.jit
  def step(params, opt_state, algo_state, prompts_P, answer_PT, key):
    logits = params[prompts_P][:, None].repeat(group_size, 1)  # [P, G, T, V]
    tokens = jax.random.categorical(key, logits)
    greedy = jnp.argmax(params[prompts_P], -1)[:, None]
    batch = rljax.Batch(
      mask_PGT=completion_mask(tokens),
      rewards_PG=rewards(tokens, answer_PT),
      old_logp_PGT=logp_of(params, prompts_P, tokens),
      old_values_PGT=jnp.zeros(tokens.shape),  # no critic in this demo
      baseline_rewards_P=rewards(greedy, answer_PT)[:, 0],
    )
    batch, algo_state = algo.prepare(batch, algo_state)

    def loss_fn(p):
      loss, metrics = algo.loss(
        logp_of(p, prompts_P, tokens), batch, algo_state
      )
      return loss.value, metrics

    grads, metrics = jax.grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    metrics = rljax.finalize(metrics) | {"reward": batch.rewards_PG.mean()}
    return optax.apply_updates(params, updates), opt_state, algo_state, metrics

  return step


def greedy_accuracy(params, answers):
  greedy = jnp.argmax(params, -1)[:, None]
  return float(rewards(greedy, jnp.asarray(answers)).mean())


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--algo", default="grpo", choices=sorted(rljax.algorithms.PRESETS)
  )
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--prompts", type=int, default=32)
  parser.add_argument("--group-size", type=int, default=8)
  parser.add_argument("--lr", type=float, default=0.3)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)

  answers = targets()
  algo = rljax.algorithms.get(args.algo)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(args.lr))
  params = jnp.zeros((100, T, VOCAB))
  opt_state, algo_state = optimizer.init(params), algo.init()
  step = make_step(algo, optimizer, args.group_size)
  key = jax.random.key(args.seed)
  before = greedy_accuracy(params, answers)
  start = time.perf_counter()
  for i in range(args.steps):
    key, k_prompts, k_sample = jax.random.split(key, 3)
    prompts = jax.random.choice(k_prompts, 100, (args.prompts,), replace=False)
    params, opt_state, algo_state, m = step(
      params,
      opt_state,
      algo_state,
      prompts,
      jnp.asarray(answers)[prompts],
      k_sample,
    )
    if i % 10 == 0 or i == args.steps - 1:
      print(
        f"step {i:4d}  reward {float(m['reward']):.3f}  loss {float(m['loss']):+.2e}"
        f"  clip {float(m['clip_frac_low'] + m['clip_frac_high']):.3f}"
      )
  after = greedy_accuracy(params, answers)
  print(
    f"{args.algo}: greedy accuracy {before:.2f} -> {after:.2f}"
    f" in {time.perf_counter() - start:.1f} s"
  )
  return before, after


if __name__ == "__main__":
  main()
