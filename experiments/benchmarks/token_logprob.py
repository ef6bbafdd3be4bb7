"""Fused token log-probs and SAPO loss: memory and time, dense vs chunked.

Forward + backward of sum(logp) + 0.1 sum(entropy) w.r.t. the hidden states
and the unembedding, float32, at N=8192, D=1024, V=32768 and at Qwen's
151,936 vocabulary with N=2048:

* dense: `pallas_kernels.token_logprob(schedule="dense")`, materialised
  [N, V] logits and plain autodiff (the oracle);
* chunked: the pure-XLA schedule (CPU default), saved logsumexp and logits
  recomputed in [block_n, block_v] tiles in the backward.

Then the fused SAPO loss (`policy_loss(loss="sapo")`, forward + backward of
sum(loss)) against the same chunked `token_logprob` followed by the separate
`rljax.losses.sapo`. The Pallas schedules are left out: on CPU they only run
under the interpreter (about 1.5 ms per grid step), which says nothing about
speed.

Memory is XLA's temporary allocation (`memory_analysis().temp_size_in_bytes`
of the compiled step: neither inputs nor outputs). Time is the best of
--repeats runs after one warm-up (compilation excluded), the four steps
taking turns; the table gives wall seconds and, in brackets, this process's
CPU seconds (steadier on a shared machine). Prints a markdown
table. Run: python experiments/benchmarks/token_logprob.py [--quick]
"""

import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# pallas_kernels lives at the repository root, next to rljax.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pallas_kernels as pk  # noqa: E402
from rljax import losses  # noqa: E402

SHAPES = [(8192, 1024, 32768), (2048, 1024, 151936)]
QUICK_SHAPES = [(512, 128, 4096), (256, 128, 15000)]
MIB = 2**20


def inputs(n, d, v, seed=0):
  """Hidden states, unembedding, targets and SAPO's per-token inputs."""
  keys = jax.random.split(jax.random.key(seed), 5)
  hidden = jax.random.normal(keys[0], (n, d), jnp.float32)
  unembed = jax.random.normal(keys[1], (d, v), jnp.float32) / np.sqrt(d)
  targets = jax.random.randint(keys[2], (n,), 0, v)
  old = -jax.random.uniform(keys[3], (n,), minval=5.0, maxval=15.0)
  adv = jax.random.normal(keys[4], (n,))
  return hidden, unembed, targets, old, adv, jnp.ones((n,))


def logprob_step(schedule):
  """grad of sum(logp) + 0.1 sum(entropy) w.r.t. (hidden, unembed)."""

  def loss(hidden, unembed, targets, *_):
    logp, entropy = pk.token_logprob(
      hidden, unembed, targets, schedule=schedule
    )
    return jnp.sum(logp) + 0.1 * jnp.sum(entropy)

  return jax.grad(loss, (0, 1))


def fused_sapo_step(hidden, unembed, targets, old, adv, mask):
  """grad of sum(SAPO loss), the loss fused with the log-probs."""
  fn = lambda h, w: pk.policy_loss(h, w, targets, old, adv, mask)[0].sum()
  return jax.grad(fn, (0, 1))(hidden, unembed)


def separate_sapo_step(hidden, unembed, targets, old, adv, mask):
  """grad of sum(SAPO loss): chunked token_logprob, then rljax.losses.sapo."""

  def fn(h, w):
    logp, _ = pk.token_logprob(h, w, targets, schedule="chunked")
    return losses.sapo(logp, old, adv, mask).loss.sum()

  return jax.grad(fn, (0, 1))(hidden, unembed)


def compile_step(step, args):
  """(compiled step, its temporary MiB), warmed up once."""
  compiled = jax.jit(step).lower(*args).compile()
  jax.block_until_ready(compiled(*args))
  return compiled, compiled.memory_analysis().temp_size_in_bytes / MIB


def best_times(compiled, args, repeats):
  """{step: (best wall seconds, best process CPU seconds)}, round-robin.

  The 2-core CPU is shared with other jobs, so the steps take turns (in a
  rotating order) rather than running back to back, and the CPU time of
  this process is kept too: it moves far less than wall time when another
  job takes a core.
  """
  names = list(compiled)
  best = {name: (float("inf"), float("inf")) for name in names}
  for r in range(repeats):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      wall, cpu = time.perf_counter(), time.process_time()
      jax.block_until_ready(compiled[name](*args))
      wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
      best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
  return best


def run_shape(shape, repeats):
  """{step name: (temporary MiB, best seconds)} for one (N, D, V)."""
  args = inputs(*shape)
  steps = {
    "dense": logprob_step("dense"),
    "chunked": logprob_step("chunked"),
    "SAPO separate": separate_sapo_step,
    "SAPO fused": fused_sapo_step,
  }
  compiled, temp = {}, {}
  for name, step in steps.items():
    compiled[name], temp[name] = compile_step(step, args)
  best = best_times(compiled, args, repeats)
  results = {name: (temp[name], *best[name]) for name in steps}
  print(f"  {shape}: {results}", file=sys.stderr, flush=True)
  return results


def _row(shape, r):
  """One table row; times as wall s (CPU s)."""
  t = lambda a: f"{r[a][1]:.2f} ({r[a][2]:.2f})"
  q = lambda a, b: f"{r[a][1] / r[b][1]:.2f} ({r[a][2] / r[b][2]:.2f})"
  dm, cm = r["dense"][0], r["chunked"][0]
  return (
    "| {} | {} | {} |".format(*shape)
    + f" {dm:.0f} | {cm:.0f} | {dm / cm:.1f}x"
    + f" | {t('dense')} | {t('chunked')} | {q('chunked', 'dense')}"
    + f" | {t('SAPO separate')} | {t('SAPO fused')}"
    + f" | {q('SAPO fused', 'SAPO separate')} |"
  )


def table(all_results):
  """Markdown table: one row per shape; times as wall s (CPU s)."""
  lines = [
    "| N | D | V | dense temp MiB | chunked temp MiB | memory dense/chunked"
    " | dense s | chunked s | time chunked/dense | SAPO separate s"
    " | SAPO fused s | time fused/separate |",
    "|" + "---|" * 12,
  ]
  lines += [_row(shape, r) for shape, r in all_results.items()]
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="tiny shapes")
  parser.add_argument("--repeats", type=int, default=3)
  flags = parser.parse_args()
  shapes = QUICK_SHAPES if flags.quick else SHAPES
  blocks = pk.DEFAULT_BLOCKS["chunked"]
  print(
    f"jax {jax.__version__} on {jax.devices()[0].device_kind},"
    f" {os.cpu_count()} CPUs; chunked blocks (block_n, block_v) = {blocks}"
  )
  results = {s: run_shape(s, flags.repeats) for s in shapes}
  print(table(results))


if __name__ == "__main__":
  main()
