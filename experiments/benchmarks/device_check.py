"""A five-minute check of rljax on a lent accelerator (GPU or TPU).

Prints, and writes as JSON (``--out``):

1. kernels: the Pallas token log-prob kernel of this backend (Triton on a
   GPU, Mosaic on a TPU; the TPU kernel under the interpreter on a CPU)
   compiles and matches the dense reference, forward (log-probs,
   entropies) and backward (both gradients), float32 and bfloat16;
2. engine: the rollout engine's useful decode tokens/s on the long-tailed
   workload of `rollout_engine.py` against the static decoder's (equal
   rows), their decode steps and time per step, and the engine's tokens/s
   as a share of the memory-bandwidth bound (reading the weights once per
   step of B rows; bandwidth measured here by a copy);
3. update: one jitted forward + backward of the log-probs over [B, L]
   tokens (the update's model work), its FLOPs from XLA's cost analysis,
   and the achieved FLOP/s against this chip's measured matmul peak.

SmolLM2-135M's shape with random weights (bfloat16 on an accelerator);
``--smoke`` shrinks everything to run in seconds on a CPU (the test suite
runs it so this script cannot rot). Stages that fail print the error and
the check goes on.

Run: python experiments/benchmarks/device_check.py [--smoke] [--out f.json]
"""

import argparse
import importlib.util
import json
import pathlib
import statistics
import sys
import time
import traceback

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

import pallas_kernels
from rljax import models
from rljax import sampling
from rljax.training._build import init_model

HERE = pathlib.Path(__file__).resolve().parent


def _rollout_engine():
  """The sibling benchmark (its workload and runners)."""
  spec = importlib.util.spec_from_file_location(
    "rollout_engine", HERE / "rollout_engine.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _timed(fn, repeats: int) -> list[float]:
  """Wall seconds of `repeats` calls of fn() (after one warm-up call)."""
  jax.block_until_ready(fn())
  out = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    out.append(time.perf_counter() - start)
  return out


def check_kernels(smoke: bool) -> dict:
  """Each dtype: the backend's Pallas schedule against dense, values and
  gradients (max abs difference relative to the dense values' scale)."""
  backend = jax.default_backend()
  schedule = {"gpu": "pallas_gpu", "tpu": "pallas_tpu"}.get(
    backend, "pallas_interpret"
  )
  n, d, v = (64, 128, 512) if smoke else (4096, 576, 49152)
  rng = np.random.default_rng(0)
  out = {"schedule": schedule}
  for dtype, tol in ((jnp.float32, 2e-4), (jnp.bfloat16, 3e-2)):
    hidden = jnp.asarray(rng.normal(size=(n, d)) * 0.5, dtype)
    unembed = jnp.asarray(rng.normal(size=(d, v)) * 0.05, dtype)
    targets = jnp.asarray(rng.integers(0, v, n), jnp.int32)

    def loss(h, w, schedule, targets=targets):
      logp, ent = pallas_kernels.token_logprob(h, w, targets, schedule=schedule)
      return jnp.sum(logp) + 0.1 * jnp.sum(ent), (logp, ent)

    results = {}
    for s in (schedule, "dense"):
      fn = jax.jit(
        jax.value_and_grad(lambda h, w, s=s: loss(h, w, s), (0, 1), True)
      )
      (_, (logp, ent)), (gh, gw) = fn(hidden, unembed)
      results[s] = [np.asarray(x, np.float32) for x in (logp, ent, gh, gw)]
    errors = {}
    for name, got, want in zip(
      ("logp", "entropy", "grad_hidden", "grad_unembed"),
      results[schedule],
      results["dense"],
    ):
      scale = max(float(np.abs(want).max()), 1.0)
      errors[name] = float(np.abs(got - want).max()) / scale
    out[jnp.dtype(dtype).name] = {
      "relative_error": errors,
      "ok": all(e <= tol for e in errors.values()),
      "tolerance": tol,
    }
  return out


def _model(smoke: bool, dtype: str):
  if smoke:
    config = models.ModelConfig(
      vocab_size=256,
      hidden_size=64,
      intermediate_size=128,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
      max_position_embeddings=256,
      dtype=dtype,
      param_dtype=dtype,
    )
  else:
    shape = _rollout_engine().smollm2_shape()
    config = models.ModelConfig(
      **{
        **{f: getattr(shape, f) for f in shape.__dataclass_fields__},
        "dtype": dtype,
        "param_dtype": dtype,
      }
    )
  return init_model(models.Transformer, config, seed=0)


def bandwidth(smoke: bool) -> float:
  """Bytes/s of a jitted read-and-write of a 512 MiB array (8 MiB for a
  smoke run; `rollout_engine.bandwidth`)."""
  return _rollout_engine().bandwidth(2**21 if smoke else 2**27)


def matmul_peak(smoke: bool, dtype) -> float:
  """FLOP/s of the best of 5 square matmuls (this chip's measured peak)."""
  n = 512 if smoke else 8192
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x: x @ x)
  best = min(_timed(lambda: f(a), 5))
  return 2 * n**3 / best


def check_engine(smoke: bool, dtype: str) -> dict:
  """Engine vs static decoder on the long-tailed workload (equal rows)."""
  bench = _rollout_engine()
  model = _model(smoke, dtype)
  # The workload's short completions take 4-24 tokens: cap >= 24.
  rows, n, cap = (4, 8, 24) if smoke else (32, 128, 256)
  prompts, budgets = bench.workload(n, cap, model.config.vocab_size)
  pages = -(-(32 + cap) // 16)
  engine = sampling.Engine(
    model.config,
    slots=rows,
    page_size=16,
    num_pages=1 + rows * pages,
    max_length=32 + cap,
  )
  bench.run_static(model, prompts, budgets, rows)  # compiles
  bench.run_engine(engine, model, prompts, budgets)
  times = {"static": [], "engine": []}
  steps = 0
  for _ in range(1 if smoke else 3):  # interleaved
    times["static"].append(bench.run_static(model, prompts, budgets, rows))
    before = engine.stats["decode_steps"]
    times["engine"].append(bench.run_engine(engine, model, prompts, budgets))
    steps = engine.stats["decode_steps"] - before
  static_steps = sum(
    int(budgets[lo : lo + rows].max()) for lo in range(0, n, rows)
  )
  useful = int(budgets.sum())
  weights = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
  bw = bandwidth(smoke)
  engine_s = statistics.median(times["engine"])
  static_s = statistics.median(times["static"])
  limit = rows * bw / weights
  return {
    "rows": rows,
    "useful_tokens": useful,
    "engine_tokens_per_s": useful / engine_s,
    "static_tokens_per_s": useful / static_s,
    "engine_over_static": static_s / engine_s,
    "engine_steps": steps,
    "static_steps": static_steps,
    "engine_ms_per_step": 1e3 * engine_s / max(steps, 1),
    "static_ms_per_step": 1e3 * static_s / max(static_steps, 1),
    "bandwidth_gb_per_s": bw / 1e9,
    "bandwidth_bound_tokens_per_s": limit,
    "engine_share_of_bound": useful / engine_s / limit,
  }


def check_update(smoke: bool, dtype: str) -> dict:
  """Forward + backward of sum(log-probs) over [B, L]: achieved FLOP/s."""
  model = _model(smoke, dtype)
  graphdef, params = nnx.split(model)
  b, length = (4, 64) if smoke else (32, 512)
  tokens = jnp.asarray(
    np.random.default_rng(0).integers(1, model.config.vocab_size, (b, length)),
    jnp.int32,
  )

  def loss(p):
    logp, _ = models.token_logprobs(nnx.merge(graphdef, p), tokens)
    return jnp.sum(logp)

  step = jax.jit(jax.grad(loss))
  compiled = step.lower(params).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  flops = float(cost.get("flops", 0.0))
  seconds = statistics.median(_timed(lambda: step(params), 3 if smoke else 5))
  peak = matmul_peak(smoke, jnp.dtype(dtype))
  return {
    "tokens": b * length,
    "flops": flops,
    "seconds": seconds,
    "achieved_flop_per_s": flops / seconds,
    "matmul_peak_flop_per_s": peak,
    "share_of_peak": flops / seconds / peak,
  }


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--smoke", action="store_true", help="tiny, for CPUs")
  parser.add_argument("--out", default=None, help="write the results (JSON)")
  args = parser.parse_args(argv)
  device = jax.devices()[0]
  dtype = "float32" if device.platform == "cpu" else "bfloat16"
  report = {
    "device": f"{device.platform} {device.device_kind}",
    "devices": jax.device_count(),
    "jax": jax.__version__,
    "date": time.strftime("%Y-%m-%d"),
    "dtype": dtype,
  }
  print(f"device check on {report['device']} x {report['devices']}", flush=True)
  start = time.perf_counter()
  for name, stage in (
    ("kernels", lambda: check_kernels(args.smoke)),
    ("engine", lambda: check_engine(args.smoke, dtype)),
    ("update", lambda: check_update(args.smoke, dtype)),
  ):
    t0 = time.perf_counter()
    try:
      report[name] = stage()
    except Exception as e:  # report and go on: the other stages still count
      traceback.print_exc()
      report[name] = {"error": f"{type(e).__name__}: {e}"}
    report[name]["seconds_taken"] = time.perf_counter() - t0
    print(f"[{name}] {json.dumps(report[name], indent=1)}", flush=True)
  report["seconds"] = time.perf_counter() - start
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
  return report


if __name__ == "__main__":
  sys.exit(0 if "error" not in json.dumps(main()) else 1)
