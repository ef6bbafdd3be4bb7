"""One GRPO iteration (rollout + reward + update): rljax vs Google's Tunix.

Both sides run in this one process, on CPU, float32, on the same toy
Llama-style decoder (tied embeddings, RMSNorm, RoPE, SwiGLU; vocab 64,
d=64, 2 layers, 4 heads of 16, MLP 128: the same shapes and FLOPs; the
weights are random and differ) and the same batch: P=8 prompts of S=16
tokens (a BOS and 15 random ids), G=4 samples each, T=32 new tokens.
Neither side can stop early: the EOS id is 64, outside the vocabulary, so
every completion has exactly T tokens and a full mask on both sides (Tunix
also treats sampled pad ids as padding, so its pad id is 64 too). Sampling
is plain softmax at temperature 1 (no top-k, no top-p). The reward is the
fraction of completion tokens equal to 7, computed on the host on both
sides. The loss is GRPO with beta = 0 (no KL, so neither side needs a
reference model), eps = 0.2, advantages (r - mean) / (std + eps) per group,
each sequence's token mean averaged over sequences, one SGD step
(lr 1e-3) per iteration, single epoch and minibatch (on-policy: ratio 1).

``--model smollm2`` runs the same iteration on SmolLM2-135M's shape (30
layers, d=576, 9 heads of 64 with 3 key/value heads, MLP 1536, vocab
49152, tied embeddings; random weights, written by rljax with
`rljax.checkpoints.save_hf` and read by Tunix's safetensors loader, so
both sides start from the same model) with P=4 prompts of 16-32 tokens
(lengths differ), G=4, T=64, and lengths that differ: the stop id 2's
embedding row is set so that the model stops with a mean chance of 4% per
token (`tune_stop`; most completions end early, a few run to 64). The
reward is the fraction of even ids in the completion. rljax samples with
its rollout engine there (the Trainer's default sampler: continuous
batching, so rows that stopped cost nothing), Tunix with its vanilla
sampler (a static batch until every row stopped); both update on the
[16, S + T] batch. ``--prefix-grouper`` also times rljax with the
prefix grouper (each group's prompt encoded once in the update; the same
loss and gradients), interleaved in the same run.

Per iteration each side does:

* rljax: `rljax.sampling.generate` (jitted; prefill of the P prompts into a
  KV cache of S + T slots, copied to the G rows, then a `lax.while_loop`
  over the P * G rows), the reward on the host, `algorithm.prepare`
  (group advantages, jitted), and `rljax.training.update` (jitted: one
  forward + backward over the [P * G, S + T] sequences and the optimizer
  step). Like `rljax.training.Trainer.step`, but without its metrics and
  checkpoint bookkeeping.
* Tunix: one global step of `GRPOLearner.train` with the "vanilla" rollout
  engine (its `Sampler`: tokenizes the prompt strings, prefills all
  P * G rows (the learner repeats each prompt G times before sampling), a
  jitted `lax.while_loop` decode over a KV cache of S + T slots,
  detokenizes), the reward function on the decoded text, the GRPO
  advantages in numpy, and its actor trainer's jitted train step (forward +
  backward over [P * G, S + T] and the optimizer step) with its metric
  logging. With beta = 0 and num_iterations = 1 Tunix computes neither
  reference nor old log-probs, as rljax does; actor and rollout share one
  model (same mesh), so no weight sync.

The two sides alternate iteration by iteration, so both see the same load
on a shared machine: Tunix's dataset is an iterator whose every batch first
runs one rljax iteration. Tunix's iteration is timed around
`RLLearner._run_global_step` (wrapped), the whole of its work for one step,
minus the rljax iteration that its data pull ran inside it; its rollout
around `RLCluster.generate` and its update around `RLCluster.update_actor`.
rljax's rollout is `generate` plus the reward, its update the advantages
plus `update`. Times exclude compilation: the first iteration (compile +
run) is reported separately; the table shows the median and best of the
later iterations.

Both models loop over their 2 layers unrolled: Tunix's in Python, rljax's
with `ModelConfig(scan_unroll=2)` (the default, 1, scans one layer per
iteration, which keeps compile time flat for deep models). On SmolLM2's
shape rljax scans its 30 layers (the default) unless ``--unroll``.

Design differences that remain (not removable by configuration):
* Tunix prefills P * G prompt rows, rljax P (it copies the cache). With
  S = 16 and T = 32 the prefill is a small part of the rollout.
* Tunix works from strings: it tokenizes prompts and detokenizes every
  completion to text for the reward; rljax rewards here read token ids.
  (`rljax.training.Trainer` also decodes to text; here the reward needs none.)
* Tunix logs metrics each step (host transfers); rljax returns its metrics
  as device arrays and this benchmark does not read them.

Tunix needs its own environment (it pins its own dependencies):
  python3 -m venv /tmp/tunix-venv
  /tmp/tunix-venv/bin/pip install google-tunix==0.1.7
  /tmp/tunix-venv/bin/pip install -e . --no-deps
  /tmp/tunix-venv/bin/pip install chex gguf math-verify matplotlib
Run: /tmp/tunix-venv/bin/python experiments/benchmarks/tunix_grpo.py [--iters N]
       [--model smollm2 [--prefix-grouper] [--unroll] [--tuned]]
       [--out times.json]
"""

import argparse
import dataclasses
import functools
import json
import logging
import os
import pathlib
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from flax import nnx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from rljax import algorithms  # noqa: E402
from rljax import sampling  # noqa: E402
from rljax import sharding  # noqa: E402
from rljax._src.base import Batch  # noqa: E402
from rljax.models import ModelConfig  # noqa: E402
from rljax.models import Transformer  # noqa: E402
from rljax.training import Models  # noqa: E402
from rljax.training import Sequences  # noqa: E402
from rljax.training import UpdateSpec  # noqa: E402
from rljax.training import _packing  # noqa: E402
from rljax.training import pack_plan  # noqa: E402
from rljax.training import update  # noqa: E402
from rljax.training._build import init_model  # noqa: E402
from rljax.training._build import init_state  # noqa: E402
from rljax.training._packing import spans  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Shape:
  """The benchmark's model and batch (module docstring)."""

  p: int  # prompts
  g: int  # samples per prompt
  s: int  # prompt width (the longest prompt)
  t: int  # new tokens at most
  vocab: int
  d: int
  layers: int
  heads: int
  kv_heads: int
  head_dim: int
  mlp: int
  rope_theta: float
  norm_eps: float
  min_prompt: int  # prompts have min_prompt..s tokens
  eos: int  # the stop id (and Tunix's pad id when it equals vocab)
  pad: int
  p_stop: float  # mean chance of the stop id per sampled token (0: never)
  sampler: str  # rljax's: "static" (`generate`) or "engine"


SHAPES = {
  # Neither side can stop early: EOS is outside the vocabulary.
  "toy": Shape(
    p=8, g=4, s=16, t=32, vocab=64, d=64, layers=2, heads=4, kv_heads=4,
    head_dim=16, mlp=128, rope_theta=10_000.0, norm_eps=1e-6,
    min_prompt=16, eos=64, pad=64, p_stop=0.0, sampler="static",
  ),
  # SmolLM2-135M's shape (random weights, the same on both sides).
  "smollm2": Shape(
    p=4, g=4, s=32, t=64, vocab=49152, d=576, layers=30, heads=9,
    kv_heads=3, head_dim=64, mlp=1536, rope_theta=100_000.0, norm_eps=1e-5,
    min_prompt=16, eos=2, pad=0, p_stop=0.04, sampler="engine",
  ),
}  # fmt: skip
BOS, TARGET, LR, EPS, BETA = 1, 7, 1e-3, 0.2, 0.0


def prompt_ids(shape: Shape, seed: int = 0) -> list[list[int]]:
  """P prompts: BOS then random ids in [3, vocab), min_prompt..s long."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(shape.min_prompt, shape.s + 1, shape.p)
  return [[BOS] + rng.integers(3, shape.vocab, n - 1).tolist() for n in lengths]


def left_pad(prompts, width: int):
  tokens = np.zeros((len(prompts), width), np.int32)
  mask = np.zeros((len(prompts), width), np.int32)
  for i, ids in enumerate(prompts):
    tokens[i, width - len(ids) :], mask[i, width - len(ids) :] = ids, 1
  return tokens, mask


def rewarded(shape: Shape, ids) -> np.ndarray:
  """Which ids earn reward: TARGET (toy) or every even id (larger
  vocabularies, where one id would almost never be sampled)."""
  ids = np.asarray(ids)
  return ids == TARGET if shape.vocab <= 64 else ids % 2 == 0


def reward_ids(shape: Shape, tokens_NT, mask_NT) -> np.ndarray:
  """Fraction of a completion's tokens that earn reward, per row."""
  mask = np.asarray(mask_NT) > 0
  hits = (rewarded(shape, tokens_NT) & mask).sum(-1)
  return (hits / np.maximum(mask.sum(-1), 1)).astype(np.float32)


# --- rljax -----------------------------------------------------------------


def rljax_config(
  shape: Shape, unroll: bool = False, update_unroll: bool = False
) -> ModelConfig:
  return ModelConfig(
    vocab_size=shape.vocab,
    hidden_size=shape.d,
    intermediate_size=shape.mlp,
    num_layers=shape.layers,
    num_heads=shape.heads,
    num_kv_heads=shape.kv_heads,
    head_dim=shape.head_dim,
    rope_theta=shape.rope_theta,
    rms_norm_eps=shape.norm_eps,
    tie_embeddings=True,
    max_position_embeddings=shape.s + shape.t,
    # Tunix's model loops over its layers in Python; a deep model scans
    # (rljax's default, which keeps its compile time flat) unless `unroll`.
    scan_unroll=shape.layers if unroll or shape.layers <= 4 else 1,
    # The update's forward and backward alone (the engine keeps its scan).
    update_unroll=shape.layers if update_unroll else 0,
  )


def tune_stop(model: Transformer, shape: Shape) -> None:
  """Make the stop id likely enough that completions end at different
  lengths (mean chance `p_stop` per token), and the pad id unlikely.

  The tied embedding row of the stop id becomes alpha u, u the mean
  direction of the final hidden states at which the model samples its
  completions of the benchmark's prompts (their distribution does not
  depend on the stop id's row as long as no stop was drawn), alpha set by
  bisection; the pad id's row becomes -alpha u. Both sides then load these
  weights, so their completions have the same length distribution."""
  if not shape.p_stop:
    return
  tokens, mask = left_pad(prompt_ids(shape), shape.s)
  out = sampling.generate(
    model,
    tokens,
    mask,
    key=jax.random.key(1),
    max_new_tokens=shape.t,
    num_samples=shape.g,
  )
  ids, seen = (
    jnp.concatenate(parts, -1).reshape(shape.p * shape.g, -1)
    for parts in (
      (out.prompt_tokens_PGS, out.tokens_PGT),
      (out.prompt_mask_PGS, jnp.ones_like(out.tokens_PGT)),
    )
  )
  hidden, _ = jax.jit(lambda m, x, k: m.hidden_states(x, k))(model, ids, seen)
  # the states that sample completion tokens: the last prompt position on
  h = np.asarray(hidden[:, shape.s - 1 : -1], np.float64).reshape(-1, shape.d)
  u = h.mean(0) / np.linalg.norm(h.mean(0))
  embed = np.asarray(model.embed[...], np.float64)
  rest = np.delete(embed, [shape.eos, shape.pad], axis=0)
  base = np.logaddexp.reduce(h @ rest.T, axis=-1)  # the other ids' logits

  def mean_p(alpha):
    z = alpha * (h @ u)
    return float(np.mean(np.exp(z - np.logaddexp(z, base))))

  lo, hi = 0.0, 1e3
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if mean_p(mid) < shape.p_stop else (lo, mid)
  embed[shape.eos], embed[shape.pad] = lo * u, -lo * u
  model.embed[...] = jnp.asarray(embed, model.embed[...].dtype)


def rljax_setup(
  shape: Shape,
  prefix_grouper: bool = False,
  unroll: bool = False,
  schedule: str = "auto",
  packed: bool = False,
):
  """(models, algorithm, initial state, jitted prepare, jitted update,
  engine or None, the initial model). With `prefix_grouper` the update
  encodes each group's prompt once (`UpdateSpec.prefix_grouper`, the
  Trainer's ``model.prefix_grouper``: the same loss and gradients). With
  `packed` it runs on packed rows of real tokens (`rljax.training.Packing`,
  the Trainer's ``train.max_tokens_per_microbatch``; `packed_update`) with
  its layers unrolled (``model.update_unroll``; the engine keeps its
  scan)."""
  config = rljax_config(shape, unroll, update_unroll=packed)
  model = init_model(Transformer, config, seed=0)
  tune_stop(model, shape)
  algorithm = algorithms.grpo(eps=EPS, kl_coef=BETA)
  models = Models(nnx.graphdef(model), None, optax.sgd(LR), None)
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  state, _ = init_state(
    model,
    reference=False,
    critic=None,
    models=models,
    algorithm=algorithm,
    mesh=mesh,
  )
  spec = UpdateSpec(shape.t, prefix_grouper=prefix_grouper, schedule=schedule)
  step = jax.jit(
    functools.partial(update, models, algorithm, spec), donate_argnums=0
  )
  if packed:
    step = packed_update(models, algorithm, spec, shape, state)
  engine = None
  if shape.sampler == "engine":
    engine = sampling.Engine(
      config,
      slots=shape.p * shape.g,
      max_length=shape.s + shape.t,
      stop_ids=[shape.eos],
    )
  return (
    models,
    algorithm,
    state,
    jax.jit(algorithm.prepare),
    step,
    engine,
    model,
  )


def useful_update_flops(shape: Shape, prompts, completions) -> float:
  """Forward + backward FLOPs of an update over the real tokens only (3x
  the forward: 2 x the matmul weights per token, the LM head included, and
  causal attention), the work any implementation must do; `completions`:
  the P * G completion lengths, G per prompt in order."""
  d, h, kv, hd = shape.d, shape.heads, shape.kv_heads, shape.head_dim
  per_layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * shape.mlp
  weights = shape.layers * per_layer + d * shape.vocab
  total = 0.0
  for i, c in enumerate(completions):
    n = len(prompts[i // shape.g]) + int(c)
    attention = shape.layers * 2 * 2 * h * hd * n * (n + 1) / 2
    total += 3 * (2 * weights * n + attention)
  return total


def matmul_peak(n: int = 2048) -> float:
  """This machine's float32 matmul FLOP/s (best of 5 [n, n] products)."""
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  jax.block_until_ready(f(a))
  best = float("inf")
  for _ in range(5):
    start = time.perf_counter()
    jax.block_until_ready(f(a))
    best = min(best, time.perf_counter() - start)
  return 2 * n**3 / best


def packed_update(models, algorithm, spec, shape, state):
  """``step(state, seqs, batch, key)`` on packed rows, planned as the
  Trainer plans them (`rljax.training.pack_plan`: first fit, the rows
  rounded up to one of 8 sizes per power of two). Every row count the
  batch can need (1 to P * G: each sample fits one row) is compiled here,
  on a copy of `state`, so no timed iteration compiles; the computed /
  real token ratio of each call is appended to ``step.ratios``."""
  jitted = jax.jit(
    functools.partial(update, models, algorithm, spec), donate_argnums=0
  )
  length = shape.s + shape.t

  def step(state, seqs, batch, key):
    mask = np.asarray(seqs.mask_PGL)
    packing = pack_plan(spans(mask), length=length, completion_width=shape.t)
    step.ratios.append(packing.computed_tokens() / int(np.count_nonzero(mask)))
    return jitted(state, seqs, batch, key, packing)

  step.ratios = []
  p, g = shape.p, shape.g
  seqs = Sequences(
    jnp.ones((p, g, length), jnp.int32), jnp.ones((p, g, length), jnp.int32)
  )
  batch = Batch(
    mask_PGT=jnp.ones((p, g, shape.t), jnp.float32),
    rewards_PG=jnp.zeros((p, g), jnp.float32),
  )
  batch, _ = algorithm.prepare(batch, state.policy.algo_state)
  short = np.zeros((p, g, 2), np.int64)
  short[..., 1] = 1  # one-token samples: any row count holds them
  for rows in sorted({_packing.bucket(r) for r in range(1, p * g + 1)}):
    packing = pack_plan(
      short, length=length, completion_width=shape.t, rows=rows
    )
    copy = jax.tree.map(jnp.copy, state)
    jax.block_until_ready(jitted(copy, seqs, batch, jax.random.key(0), packing))
  return step


def rljax_iteration(setup, shape, state, prompts, key):
  """Rollout, reward, advantages and one update.

  Returns (new state, rollout seconds, update seconds, completion lengths).
  """
  models, _, _, prepare, step, engine, _ = setup
  p, g, t = shape.p, shape.g, shape.t
  tokens, mask = left_pad(prompts, shape.s)
  start = time.perf_counter()
  policy = nnx.merge(models.policy, state.policy.params)
  sample = dict(
    key=jax.random.fold_in(key, 0),
    max_new_tokens=t,
    num_samples=g,
    temperature=1.0,
  )
  if engine is None:
    stop = [shape.eos] if shape.p_stop else []  # toy: an id it cannot emit
    rollout = sampling.generate(policy, tokens, mask, stop_ids=stop, **sample)
  else:
    rollout = sampling.rollout(engine, policy, tokens, mask, **sample)
  done_NT = np.asarray(rollout.mask_PGT).reshape(p * g, t)
  rewards = reward_ids(
    shape, np.asarray(rollout.tokens_PGT).reshape(p * g, t), done_NT
  )
  middle = time.perf_counter()
  seqs = Sequences(
    jnp.concatenate([rollout.prompt_tokens_PGS, rollout.tokens_PGT], -1),
    jnp.concatenate([rollout.prompt_mask_PGS, rollout.mask_PGT], -1),
  )
  batch = Batch(
    mask_PGT=jnp.asarray(rollout.mask_PGT, jnp.float32),
    rewards_PG=jnp.asarray(rewards.reshape(p, g)),
  )
  batch, algo_state = prepare(batch, state.policy.algo_state)
  state = state._replace(policy=state.policy._replace(algo_state=algo_state))
  state, _ = step(state, seqs, batch, jax.random.fold_in(key, 1))
  state = jax.block_until_ready(state)
  lengths = done_NT.sum(-1)
  return state, middle - start, time.perf_counter() - middle, lengths


# --- Tunix -----------------------------------------------------------------


class WordTokenizer:
  """Ids <-> words "t<id>"."""

  def __init__(self, shape: Shape):
    self.shape = shape

  def encode(self, text: str, **kwargs) -> list[int]:
    return [int(w[1:]) for w in text.split()]

  def decode(self, ids, **kwargs) -> str:
    return " ".join(f"t{int(i)}" for i in ids)

  def bos_id(self) -> int:
    return BOS

  def eos_id(self) -> int:
    return self.shape.eos

  def pad_id(self) -> int:
    return self.shape.pad


def tunix_reward(shape: Shape):
  """The reward of `reward_ids`, from the completion text."""

  def reward(prompts, completions, **kwargs):
    del prompts, kwargs
    out = []
    for c in completions:
      ids = [int(w[1:]) for w in c.split()]
      ids = [i for i in ids if i not in (shape.eos, shape.pad)]
      out.append(float(rewarded(shape, ids).mean()) if ids else 0.0)
    return out

  return reward


def tunix_learner(shape: Shape, steps: int, rljax_model: Transformer, reward):
  import tempfile

  from tunix.models.llama3 import model as llama3
  from tunix.models.llama3 import params as llama3_params
  from tunix.rl import rl_cluster as rl_cluster_lib
  from tunix.rl.grpo import grpo_learner
  from tunix.rl.rollout import base_rollout

  from rljax import checkpoints

  auto = jax.sharding.AxisType.Auto
  mesh = jax.make_mesh(
    (1, 1), ("fsdp", "tp"), axis_types=(auto, auto), devices=jax.devices()[:1]
  )
  config = llama3.ModelConfig(
    num_layers=shape.layers,
    vocab_size=shape.vocab,
    embed_dim=shape.d,
    hidden_dim=shape.mlp,
    num_heads=shape.heads,
    head_dim=shape.head_dim,
    num_kv_heads=shape.kv_heads,
    rope_theta=int(shape.rope_theta),
    norm_eps=shape.norm_eps,
    weight_tying=True,
  )
  if shape.p_stop:  # the same weights as rljax's (the stop id tuned)
    with tempfile.TemporaryDirectory() as tmp:
      checkpoints.save_hf(rljax_model, tmp)
      model = llama3_params.create_model_from_safe_tensors(
        tmp, config, mesh, dtype=jnp.float32
      )
  else:
    model = llama3.Llama3(config, rngs=nnx.Rngs(0))
  roles = rl_cluster_lib.Role
  cluster_config = rl_cluster_lib.ClusterConfig(
    role_to_mesh={
      roles.ACTOR: mesh,
      roles.REFERENCE: mesh,
      roles.ROLLOUT: mesh,
    },
    rollout_engine="vanilla",
    offload_to_cpu=False,
    training_config=rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optax.sgd(LR),
      eval_every_n_steps=10**9,
      max_steps=steps,
    ),
    rollout_config=base_rollout.RolloutConfig(
      max_tokens_to_generate=shape.t,
      max_prompt_length=shape.s,
      kv_cache_size=shape.s + shape.t,
      temperature=1.0,
      top_p=1.0,
      top_k=None,
      eos_tokens=[shape.eos],
      data_type=jnp.float32,
    ),
  )
  cluster = rl_cluster_lib.RLCluster(
    actor=model, tokenizer=WordTokenizer(shape), cluster_config=cluster_config
  )
  algo = grpo_learner.GRPOConfig(
    num_generations=shape.g,
    num_iterations=1,
    beta=BETA,
    epsilon=EPS,
    loss_agg_mode="sequence-mean-token-mean",
  )
  return grpo_learner.GRPOLearner(
    rl_cluster=cluster, algo_config=algo, reward_fns=reward
  )


PHASES = ("iteration", "rollout", "update")  # timed per side


class Interleaved:
  """Tunix's dataset: each batch it hands out first runs one rljax iteration.

  Both sides then alternate iteration by iteration under the same machine
  load. Tunix pulls its next batch inside its global step, so the rljax
  time spent there is subtracted from that step's time.
  """

  def __init__(self, shape: Shape, iters: int, variants: dict):
    self.shape = shape
    # rljax variants: name -> rljax_setup options; each its own state
    self.setups = {v: rljax_setup(shape, **o) for v, o in variants.items()}
    self.states = {v: setup[2] for v, setup in self.setups.items()}
    self.prompts = prompt_ids(shape)
    self.key = jax.random.key(0)
    self.left = iters + 1
    self.rljax = {v: {phase: [] for phase in PHASES} for v in variants}
    self.tunix = {phase: [] for phase in PHASES}
    self.lengths = {"rljax": [], "Tunix": []}  # completion lengths
    self.completions = {}  # variant -> each iteration's completion lengths
    self.inside = 0.0  # rljax seconds run since the program started
    tokenizer = WordTokenizer(shape)
    texts = [tokenizer.decode(row[1:]) for row in self.prompts]
    self.batch = {"prompts": np.array(texts)}

  def __iter__(self):
    return self

  def __next__(self):
    if not self.left:
      raise StopIteration
    self.left -= 1
    for v, setup in self.setups.items():
      times = self.rljax[v]
      self.states[v], rollout, update_s, lengths = rljax_iteration(
        setup,
        self.shape,
        self.states[v],
        self.prompts,
        jax.random.fold_in(self.key, len(times["iteration"])),
      )
      for phase, t in zip(PHASES, (rollout + update_s, rollout, update_s)):
        times[phase].append(t)
      if v == next(iter(self.setups)):
        self.lengths["rljax"] += lengths.tolist()
      self.completions.setdefault(v, []).append(lengths.tolist())
      self.inside += rollout + update_s
    return self.batch

  def reward(self):
    """Tunix's reward function; it records the completions' lengths."""
    shape, score = self.shape, tunix_reward(self.shape)

    def reward(prompts, completions, **kwargs):
      for c in completions:  # the stop id counts, as in rljax's mask
        ids = [int(w[1:]) for w in c.split()]
        self.lengths["Tunix"].append(
          sum(i != shape.pad for i in ids[: shape.t])
        )
      return score(prompts, completions, **kwargs)

    return reward

  def _timed(self, fn, phase, model):
    """`fn` that appends its own time, less rljax's, to tunix[phase]."""

    def timed(*args, **kwargs):
      start, inside = time.perf_counter(), self.inside
      out = fn(*args, **kwargs)
      jax.block_until_ready(nnx.state(model))
      spent = time.perf_counter() - start - (self.inside - inside)
      self.tunix[phase].append(spent)
      return out

    return timed

  def time_steps(self, learner):
    """Time Tunix's global step (rollout, reward, update) and two parts."""
    cluster = learner.rl_cluster
    model = cluster.actor_trainer.model
    learner._run_global_step = self._timed(
      learner._run_global_step, "iteration", model
    )
    cluster.generate = self._timed(cluster.generate, "rollout", model)
    cluster.update_actor = self._timed(cluster.update_actor, "update", model)


def run(shape: Shape, iters: int, variants: dict):
  """({rljax variant: times}, Tunix times, lengths): seconds per phase,
  iteration 0 (compiles) first, and the completion lengths of each side."""
  data = Interleaved(shape, iters, variants)
  model = next(iter(data.setups.values()))[-1]
  learner = tunix_learner(shape, iters + 1, model, data.reward())
  data.time_steps(learner)
  learner.train(data)
  # Each variant's update: useful FLOP/s per timed iteration.
  for name, per_iteration in data.completions.items():
    times = data.rljax[name]["update"]
    data.lengths[f"{name} useful update GFLOP/s"] = [
      useful_update_flops(shape, data.prompts, c) / t / 1e9
      for c, t in zip(per_iteration[1:], times[1:])
    ]
  # Packed variants: computed / real tokens of each update.
  for name, setup in data.setups.items():
    if hasattr(setup[4], "ratios"):
      data.lengths[f"{name} computed/real tokens"] = setup[4].ratios
  return data.rljax, data.tunix, data.lengths


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--iters", type=int, default=10)
  parser.add_argument("--model", choices=sorted(SHAPES), default="toy")
  parser.add_argument(
    "--sampler",
    choices=("static", "engine"),
    default=None,
    help="rljax's sampler (default: the shape's; module docstring)",
  )
  parser.add_argument(
    "--prefix-grouper",
    action="store_true",
    help="also time rljax with the prefix grouper (interleaved)",
  )
  parser.add_argument(
    "--unroll",
    action="store_true",
    help="rljax loops over its layers unrolled, as Tunix does (the"
    " default scans them; compiles take longer)",
  )
  parser.add_argument(
    "--tuned",
    action="store_true",
    help="also time rljax tuned for a CPU: the prefix grouper, dense"
    " log-probs (logits materialised, as Tunix does; the default chunks"
    " the vocabulary and recomputes in the backward pass) and unrolled"
    " layers",
  )
  parser.add_argument(
    "--packed",
    action="store_true",
    help="also time rljax updating on packed rows of real tokens, its"
    " update's layers unrolled (the engine keeps its scan)",
  )
  parser.add_argument("--out", default=None, help="write the times (JSON)")
  args = parser.parse_args()
  shape = SHAPES[args.model]
  if args.sampler:
    shape = dataclasses.replace(shape, sampler=args.sampler)
  logging.getLogger("absl").setLevel(logging.WARNING)
  load = os.getloadavg()
  peak = matmul_peak()
  tag = ", layers unrolled" if args.unroll else ""
  variants = {f"rljax{tag}": dict(unroll=args.unroll)}
  if args.prefix_grouper:
    variants[f"rljax, prefix grouper{tag}"] = dict(
      prefix_grouper=True, unroll=args.unroll
    )
  if args.tuned:
    variants["rljax, tuned"] = dict(
      prefix_grouper=True, unroll=True, schedule="dense"
    )
  if args.packed:
    variants["rljax, packed"] = dict(packed=True)
  rl, tx, lengths = run(shape, args.iters, variants)
  sides = {**rl, "Tunix 0.1.7": tx}
  print(
    f"\nGRPO iteration ({args.model}), P={shape.p} x G={shape.g}, prompts"
    f" {shape.min_prompt}-{shape.s} tokens, T={shape.t}, vocab {shape.vocab},"
    f" d={shape.d}, {shape.layers} layers, float32,"
    f" {jax.devices()[0].platform}, jax {jax.__version__}, rljax sampler"
    f" {shape.sampler}, load before {load[0]:.2f}, {args.iters} timed"
    " iterations (medians and best exclude the first, which compiles)"
  )
  for side, n in lengths.items():
    if n and side.endswith("computed/real tokens"):
      print(
        f"{side}: median {np.median(n):.2f}, range {min(n):.2f}-{max(n):.2f}"
      )
    elif n and side.endswith("GFLOP/s"):
      print(
        f"{side}: median {np.median(n):.1f} ({np.median(n) * 1e9 / peak:.0%}"
        f" of the {peak / 1e9:.1f} GFLOP/s float32 matmul peak measured"
        f" here), range {min(n):.1f}-{max(n):.1f}"
      )
    elif n:
      print(
        f"{side} completion lengths: mean {np.mean(n):.1f}, median"
        f" {np.median(n):.0f}, at the cap {np.mean(np.asarray(n) >= shape.t):.0%}"
      )
  print()
  columns = {
    "first iteration s": lambda t: t["iteration"][0],
    "iteration median ms": lambda t: (
      1e3 * statistics.median(t["iteration"][1:])
    ),
    "iteration best ms": lambda t: 1e3 * min(t["iteration"][1:]),
    "rollout median ms": lambda t: 1e3 * statistics.median(t["rollout"][1:]),
    "update median ms": lambda t: 1e3 * statistics.median(t["update"][1:]),
  }
  values = {name: [f(t) for f in columns.values()] for name, t in sides.items()}
  print("| | " + " | ".join(columns) + " |")
  print("|---|" + "---:|" * len(columns))
  for name, row in values.items():
    print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in row) + " |")
  tunix = values["Tunix 0.1.7"]
  for name in rl:
    ratios = " | ".join(f"{y / x:.2f}" for x, y in zip(values[name], tunix))
    print(f"| ratio Tunix / {name} | {ratios} |")
  for name, t in rl.items():
    per = [y / x for x, y in zip(t["iteration"][1:], tx["iteration"][1:])]
    print(
      f"per-iteration ratio Tunix / {name}: median"
      f" {statistics.median(per):.2f}, range {min(per):.2f}-{max(per):.2f}"
    )
  if args.out:
    record = {
      "model": args.model,
      "shape": dataclasses.asdict(shape),
      "load_before": load,
      "matmul_peak_flop_per_s": peak,
      "jax": jax.__version__,
      "rljax": rl,
      "tunix": tx,
      "lengths": lengths,
    }
    pathlib.Path(args.out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
  main()
