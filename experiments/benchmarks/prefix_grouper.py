"""Prefix Grouper: GRPO train-step time and memory, grouped vs normal.

One GRPO training step's forward + backward (the gradient of the GRPO loss
w.r.t. every parameter; no optimizer) on P prompts of S tokens with G
completions of T tokens each, prompts 4x longer than completions:

* normal: `rljax.training.completion_logprobs` on the [P G, S + T] rows,
  every sample's prompt encoded again (the default train path);
* grouped: the same with ``prefix_grouper=True``
  (`rljax.models.grouped_completion_logprobs`): each prompt encoded once,
  its keys / values shared by its G completions.

The model is SmolLM2-135M's shape (D = 576, F = 1536, 9 query / 3 key-value
heads of 64) with random weights, cut to --layers of its 30 layers and a
--vocab of its 49,152 tokens so that a CPU step takes seconds (the default
4 layers and 8,192 tokens keep the layers' share of the FLOPs close to the
full model's: 3:1 against its 3.7:1). float32, the chunked log-prob
schedule (the CPU default).

Memory is XLA's temporary allocation of the compiled step
(``memory_analysis().temp_size_in_bytes``: neither inputs nor outputs).
The work expected: tokens through the layers, P G (S + T) normal against
P (S + G T) grouped (3.3x fewer at the defaults), and vocabulary
projections, P G (S + T - 1) against P G T (the normal path projects the
prompt positions too, then keeps the last T). Time: after a warm-up call, the two steps
run in turns (the order alternating) --repeats times; the report gives the
median normal / grouped time ratio and its range, and writes
docs/figures/prefix_grouper.json. `uptime` is printed first: the CPU is
shared.

Run: python experiments/benchmarks/prefix_grouper.py [--quick]
"""

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# pallas_kernels lives at the repository root, next to rljax.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from flax import nnx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rljax import algorithms  # noqa: E402
from rljax import testing  # noqa: E402
from rljax.models import ModelConfig  # noqa: E402
from rljax.training import Sequences  # noqa: E402
from rljax.training import completion_logprobs  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parents[2] / "docs" / "figures"
MIB = 2**20
SMOLLM2 = ModelConfig(
  vocab_size=49152,
  hidden_size=576,
  intermediate_size=1536,
  num_layers=30,
  num_heads=9,
  num_kv_heads=3,
  head_dim=64,
  rope_theta=100_000.0,
  rms_norm_eps=1e-5,
)


def workload(p, g, s, t, vocab, seed=0):
  """Shared-prompt sequences (prompts of 3/4 to all of S real tokens,
  left-padded; completions of T/2 to T tokens) and a prepared GRPO batch."""
  rng = np.random.default_rng(seed)
  prompt_mask = np.arange(s) >= rng.integers(0, s // 4 + 1, (p, 1))
  lengths = rng.integers(t // 2, t + 1, (p, g, 1))
  mask = np.concatenate(
    [np.repeat(prompt_mask[:, None], g, 1), np.arange(t) < lengths], -1
  ).astype(np.int32)
  prompt = np.repeat(rng.integers(1, vocab, (p, 1, s)), g, 1)
  tokens = np.concatenate([prompt, rng.integers(1, vocab, (p, g, t))], -1)
  seqs = Sequences(jnp.asarray(tokens * mask), jnp.asarray(mask))
  algorithm = algorithms.get("grpo")
  batch = testing.random_batch(seed, prompts=p, samples=g, tokens=t)
  batch = batch._replace(
    mask_PGT=mask[..., s:].astype(np.float32), old_logp_PGT=None
  )
  state = algorithm.init()
  batch, state = algorithm.prepare(batch, state)
  return algorithm, state, seqs, batch


def grpo_grad(graph, algorithm, width, grouped, params, state, seqs, batch):
  """grad of the GRPO loss's numerator w.r.t. the parameters."""

  def loss(params):
    logp, entropy = completion_logprobs(
      nnx.merge(graph, params),
      seqs,
      width,
      temperature=1.0,
      prefix_grouper=grouped,
    )
    out, _ = algorithm.loss(
      logp, batch, state, entropy_PGT=entropy, key=jax.random.key(0)
    )
    return out.num

  return jax.grad(loss)(params)


def compile_steps(config, args):
  """{name: (compiled step, its arguments, temp MiB)}."""
  model = testing.random_model(config, scale=0.02)
  graph, params = nnx.split(model)
  algorithm, state, seqs, batch = workload(
    args.prompts, args.samples, args.prompt_len, args.completion_len,
    config.vocab_size,
  )  # fmt: skip
  call = (params, state, seqs, batch)
  steps = {}
  for name, grouped in (("normal", False), ("grouped", True)):
    step = functools.partial(
      grpo_grad, graph, algorithm, args.completion_len, grouped
    )
    start = time.perf_counter()
    compiled = jax.jit(step).lower(*call).compile()
    jax.block_until_ready(compiled(*call))  # warm-up
    temp = compiled.memory_analysis().temp_size_in_bytes / MIB
    print(
      f"[{name}] compiled + warm-up {time.perf_counter() - start:.1f} s;"
      f" temp {temp:.1f} MiB",
      flush=True,
    )
    steps[name] = (compiled, call, temp)
  return steps, params


def interleaved_times(steps, repeats):
  """{name: [wall seconds]}, the two steps taking turns."""
  names = list(steps)
  times = {name: [] for name in names}
  for r in range(repeats):
    for name in names if r % 2 == 0 else names[::-1]:
      compiled, call = steps[name][:2]
      start = time.perf_counter()
      jax.block_until_ready(compiled(*call))
      times[name].append(time.perf_counter() - start)
      print(f"run {r + 1} {name}: {times[name][-1]:.2f} s", flush=True)
  return times


def max_grad_difference(steps):
  """Largest |grouped - normal| gradient entry over the largest entry."""
  grads = {n: steps[n][0](*steps[n][1]) for n in steps}
  diff = max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(
      jax.tree.leaves(grads["grouped"]), jax.tree.leaves(grads["normal"])
    )
  )
  scale = max(
    float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(grads["normal"])
  )
  return diff / scale


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--vocab", type=int, default=8192)
  parser.add_argument("--prompts", type=int, default=1)
  parser.add_argument("--samples", type=int, default=8)
  parser.add_argument("--prompt_len", type=int, default=256)
  parser.add_argument("--completion_len", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args()
  if args.quick:
    args.layers, args.vocab, args.prompt_len, args.completion_len = (
      1,
      512,
      32,
      8,
    )
    args.repeats = 2
  load = subprocess.run(["uptime"], capture_output=True, text=True).stdout
  print("uptime:", load.strip(), flush=True)
  config = dataclasses.replace(
    SMOLLM2, num_layers=args.layers, vocab_size=args.vocab
  )
  steps, params = compile_steps(config, args)
  times = interleaved_times(steps, args.repeats)
  ratios = np.asarray(times["normal"]) / np.asarray(times["grouped"])
  p, g = args.prompts, args.samples
  s, t = args.prompt_len, args.completion_len
  report = {
    "uptime_before": load.strip(),
    "cpu_count": os.cpu_count(),
    "jax": jax.__version__,
    "device": str(jax.devices()[0]),
    "model": "SmolLM2-135M shape, random weights, float32",
    "config": dataclasses.asdict(config),
    "parameters": int(sum(x.size for x in jax.tree.leaves(params))),
    "settings": vars(args),
    "seconds": times,
    "median_seconds": {n: float(np.median(t)) for n, t in times.items()},
    "speedup_median": float(np.median(ratios)),
    "speedup_range": [float(ratios.min()), float(ratios.max())],
    "temp_mib": {n: steps[n][2] for n in steps},
    "memory_ratio": steps["normal"][2] / steps["grouped"][2],
    "layer_tokens": {
      "normal": p * g * (s + t),
      "grouped": p * (s + g * t),
    },
    "vocab_projections": {"normal": p * g * (s + t - 1), "grouped": p * g * t},
    "max_grad_difference_relative": max_grad_difference(steps),
  }
  if not args.quick:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "prefix_grouper.json").write_text(json.dumps(report, indent=2))
  m = report["median_seconds"]
  print(
    f"P={args.prompts} G={args.samples} S={args.prompt_len}"
    f" T={args.completion_len}, {args.layers} layers, vocab {args.vocab}:"
    f" step normal {m['normal']:.2f} s, grouped {m['grouped']:.2f} s;"
    f" speedup median {report['speedup_median']:.2f}x (range"
    f" {report['speedup_range'][0]:.2f}-{report['speedup_range'][1]:.2f});"
    f" temp memory {report['temp_mib']['normal']:.0f} -> "
    f"{report['temp_mib']['grouped']:.0f} MiB"
    f" ({report['memory_ratio']:.2f}x less); tokens through the layers"
    f" {p * g * (s + t)} -> {p * (s + g * t)};"
    f" max relative gradient difference"
    f" {report['max_grad_difference_relative']:.1e}",
    flush=True,
  )


if __name__ == "__main__":
  main()
