"""Synthetic batches and models for tests, notebooks and benchmarks."""

import functools
import os

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from rljax._src.base import Batch
from rljax._src.examples import random_batch  # noqa: F401 (re-exported)
from rljax.models._config import ModelConfig
from rljax.models._transformer import Transformer


def use_compilation_cache(directory: os.PathLike | str) -> None:
  """Keep every compiled program in `directory` (JAX's persistent
  compilation cache), for this process and the processes it starts.

  A test that compiles what an earlier test, a subprocess or an earlier run
  compiled then loads it from disk instead. JAX keys each entry on the
  program itself, the jax and jaxlib versions, the XLA flags, the compile
  options and the devices, so a changed program or toolchain misses: the
  cache cannot serve a stale program. Every program is kept (JAX's default
  keeps those that took a second or more), since most test programs compile
  in less and the same ones recur across tests. There is no size cap (JAX's
  eviction reads every entry's size at every write: quadratic over a test
  run's ten thousand programs); a full test run adds about 70 MB, and
  deleting the directory is always safe. Settings already in the
  environment win.
  """
  settings = {  # environment variable: (value, its type in jax.config)
    "JAX_COMPILATION_CACHE_DIR": (str(directory), str),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": ("0", float),
  }
  for name, (value, kind) in settings.items():
    value = os.environ.setdefault(name, value)  # subprocesses inherit it
    jax.config.update(name.lower(), kind(value))


def perturbed_logp(batch: Batch, seed: int = 1, scale: float = 0.3):
  """Current-policy log-probs near `batch.old_logp_PGT` (ratios around 1)."""
  rng = np.random.default_rng(seed)
  noise = rng.normal(0.0, scale, size=batch.shape)
  return (np.asarray(batch.old_logp_PGT, np.float64) + noise).astype(
    np.asarray(batch.old_logp_PGT).dtype
  )


def random_model(
  config: ModelConfig, *, seed: int = 0, cls=Transformer, scale: float = 0.3
):
  """A `cls(config)` with N(0, scale) weights and norm weights around 1.

  Built abstractly and filled from numpy, so no per-parameter init program
  is compiled (random init compiles one per shape: seconds on CPU). The
  large scale makes every parameter matter in a parity test.
  """
  model = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(seed)
  for path, node in nnx.iter_graph(model):
    if isinstance(node, nnx.Param):
      shift = 1.0 if "norm" in str(path[-1]) else 0.0
      value = shift + scale * rng.standard_normal(node.shape)
      node.set_value(jnp.asarray(value.astype(jnp.dtype(node.dtype))))
  return model


def tiny_model(vocab_size: int, *, max_position_embeddings: int = 64):
  """A random 2-layer model (d = 32, 4 heads over 2 KV heads) over a
  `vocab_size`-token vocabulary, for sampler and episode tests."""
  config = ModelConfig(
    vocab_size=vocab_size,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    max_position_embeddings=max_position_embeddings,
  )
  return random_model(config, scale=0.5)


def jit_model_fn(fn):
  """jax.jit of ``fn(model, *args)`` at XLA optimisation level 0.

  Tiny test programs compile several times faster that way on CPU; the
  model is split so that its structure is static and its weights traced.
  """

  @functools.partial(
    jax.jit,
    static_argnums=0,
    compiler_options={"xla_backend_optimization_level": 0},
  )
  def run(graphdef, state, *args):
    return fn(nnx.merge(graphdef, state), *args)

  return lambda model, *args: run(*nnx.split(model), *args)


# Overrides that shrink an arithmetic config (configs/grpo.py, ...) to a run
# that is mostly compilation: a 1-layer model of width 16, 8 prompts x 4
# samples, 2 warm-start steps, no TensorBoard or plot.
TINY_RUN = (
  "model.hidden_size=16",
  "model.num_layers=1",
  "model.num_heads=2",
  "model.num_kv_heads=1",
  "model.intermediate_size=32",
  "train.prompts_per_step=8",
  "train.warm_start_steps=2",
  "train.warm_start_batch=8",
  "train.eval_prompts=8",
  "sampler.num_samples=4",
  "output.tensorboard=False",
  "output.plot=False",
)


def tiny_run_config(path, directory, *overrides: str):
  """The config file at `path`, shrunk by `TINY_RUN`, writing to
  `directory`, with further ``section.field=value`` overrides."""
  from rljax.training import load_config
  from rljax.training import override

  config = load_config(path)
  tiny = TINY_RUN
  if config.kind != "rl":  # no warm start before a post-training run
    tiny = tuple(t for t in TINY_RUN if not t.startswith("train.warm_start"))
  return override(config, [*tiny, f"output.directory={directory}", *overrides])


# Settings for the test batch's G = 4 (Polychromic's sets of 4 would be the
# whole group, whose set advantage is zero by definition).
PRESET_KWARGS = {
  "polychromic": {"set_size": 2},
  # BRPO: one trace, one budget of 2 tokens, 3 summaries = G rows
  "brpo": {"budgets": (2,), "num_summaries": 3},
}


def preset(name: str):
  """`rljax.algorithms.get(name)` with the settings `preset_batch`'s
  G = 4 needs (`PRESET_KWARGS`)."""
  from rljax import algorithms

  return algorithms.get(name, **PRESET_KWARGS.get(name, {}))


def _agent_extras(batch, rng, turns=3):
  """The agent data layout (rljax.envs) of a batch: each completion's
  tokens in turns of two, some rows reaching the last turn (SeeUPO)."""
  mask = np.asarray(batch.mask_PGT) > 0
  t = np.arange(batch.shape[2])
  turn_ids = np.where(mask, np.minimum(t // 2, turns - 1), -1).astype(np.int32)
  taken = (turn_ids.max(-1) + 1).astype(np.int32)
  past = np.arange(turns) >= taken[..., None]
  rewards = np.where(past, 0.0, rng.normal(size=past.shape)).astype(np.float32)
  states = np.where(past, -1, rng.integers(0, 2, past.shape)).astype(np.int32)
  calls = np.where(past, 0, rng.integers(0, 3, past.shape)).astype(np.int32)
  # A tree per group: samples 0 and 1 share their first action.
  nodes = np.arange(np.prod(past.shape), dtype=np.int32).reshape(past.shape)
  nodes[:, 1, 0] = nodes[:, 0, 0]
  return dict(
    turn_ids_PGT=turn_ids,
    turns_PG=taken,
    turn_rewards_PG=rewards,
    state_ids_PG=states,
    tool_calls_PG=calls,
    tool_errors_PG=np.minimum(calls, rng.integers(0, 2, past.shape)),
    node_ids_PG=np.where(past, -1, nodes),
  )


def preset_batch(seed: int, prompts: int = 4) -> Batch:
  """A random batch with the side data presets may read, as a run's
  `Trainer(annotate=...)` writes it: answer-cluster ids (EMPO, COPO,
  SEED-GRPO), the first tool call's position (ASPO; -1 = none), the
  number of tool calls (HDPO), and each sample's stream as the Trainer
  writes it for a group strategy (ICPO, AEPO, HBPO) and a segment tree's
  ancestor ids (TreePO)."""
  batch = random_batch(seed, prompts=prompts)
  rng = np.random.default_rng(seed)
  pg = batch.shape[:2]
  return batch.with_extra(
    **_agent_extras(batch, rng),
    answer_ids_PG=rng.integers(0, 3, pg),
    tool_position_PG=rng.integers(-1, 5, pg),
    stream_PG=np.tile([0, 0, 1, 4], pg[1] // 4 + 1)[None, : pg[1]].repeat(
      pg[0], 0
    ),
    from_stream_PG=np.tile([0.0, 0, 0, 1], pg[1] // 4 + 1)[
      None, : pg[1]
    ].repeat(pg[0], 0),
    tree_PG=rng.integers(-1, 2, pg + (2,)).astype(np.int32),  # TreePO
    # SPO-chain (rollouts.SegmentRollouts): segment starts, their values,
    # the tokens below the probability threshold
    spo_cuts_PGT=rng.integers(0, 2, batch.shape).astype(np.int32),
    spo_values_PGT=rng.random(batch.shape).astype(np.float32),
    spo_low_prob_PGT=rng.integers(0, 2, batch.shape).astype(np.int32),
    # SPO-tree (rollouts.SegmentTree): each token's tree level (segments
    # of 2 tokens, 2 levels)
    spo_depth_PGT=np.where(
      np.asarray(batch.mask_PGT) > 0,
      np.minimum(np.arange(batch.shape[2]) // 2, 1) + 1,
      0,
    ).astype(np.int32),
    # Delethink (rollouts.MarkovianChunks): 2 traces of 2 chunks per group
    trace_PG=np.tile([0, 0, 1, 1], (pg[0], pg[1] // 4)).astype(np.int32),
    chunk_PG=np.tile([0, 1, 0, 1], (pg[0], pg[1] // 4)).astype(np.int32),
    # BRPO (rollouts.AnytimeBudgets): a thinking row, 3 summaries of its
    # first 2 tokens
    anytime_trace_PG=np.zeros(pg, np.int32),
    anytime_budget_PG=np.tile([-1, 0, 0, 0], (pg[0], 1)).astype(np.int32),
    anytime_length_PG=np.tile([0, 2, 2, 2], (pg[0], 1)).astype(np.int32),
    anytime_chunk_PGT=np.where(
      (np.arange(batch.shape[2]) < 2)[None, None]
      & (np.arange(pg[1]) == 0)[None, :, None],
      0,
      -1,
    )
    .repeat(pg[0], 0)
    .astype(np.int32),
  )
