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
iteration, which keeps compile time flat for deep models).

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
"""

import argparse
import functools
import logging
import os
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
from rljax.training import update  # noqa: E402
from rljax.training._build import init_model  # noqa: E402
from rljax.training._build import init_state  # noqa: E402

P, G, S, T = 8, 4, 16, 32
VOCAB, D, LAYERS, HEADS, HEAD_DIM, MLP = 64, 64, 2, 4, 16, 128
BOS, NEVER = 1, VOCAB  # NEVER: an id outside the vocabulary (EOS, pad)
TARGET, LR, EPS, BETA = 7, 1e-3, 0.2, 0.0


def prompt_ids(seed: int = 0) -> np.ndarray:
  """[P, S] prompt ids: BOS then S - 1 random ids in [2, VOCAB)."""
  rng = np.random.default_rng(seed)
  body = rng.integers(2, VOCAB, (P, S - 1))
  return np.concatenate([np.full((P, 1), BOS), body], 1).astype(np.int32)


def reward_ids(tokens_NT: np.ndarray) -> np.ndarray:
  """Fraction of tokens equal to TARGET, per row."""
  return (np.asarray(tokens_NT) == TARGET).mean(-1).astype(np.float32)


# --- rljax -----------------------------------------------------------------


def rljax_setup():
  """(models, algorithm, initial state, jitted prepare, jitted update)."""
  config = ModelConfig(
    vocab_size=VOCAB,
    hidden_size=D,
    intermediate_size=MLP,
    num_layers=LAYERS,
    num_heads=HEADS,
    num_kv_heads=HEADS,
    head_dim=HEAD_DIM,
    tie_embeddings=True,
    max_position_embeddings=S + T,
    scan_unroll=LAYERS,  # Tunix's model loops over its layers in Python
  )
  model = init_model(Transformer, config, seed=0)
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
  step = jax.jit(
    functools.partial(update, models, algorithm, UpdateSpec(T)),
    donate_argnums=0,
  )
  return models, algorithm, state, jax.jit(algorithm.prepare), step


def rljax_iteration(setup, state, prompts, key):
  """Rollout, reward, advantages and one update.

  Returns (new state, rollout seconds, update seconds).
  """
  models, _, _, prepare, step = setup
  start = time.perf_counter()
  policy = nnx.merge(models.policy, state.policy.params)
  rollout = sampling.generate(
    policy,
    prompts,
    np.ones_like(prompts),
    key=jax.random.fold_in(key, 0),
    max_new_tokens=T,
    num_samples=G,
    temperature=1.0,
  )
  rewards = reward_ids(np.asarray(rollout.tokens_PGT).reshape(P * G, T))
  middle = time.perf_counter()
  seqs = Sequences(
    jnp.concatenate([rollout.prompt_tokens_PGS, rollout.tokens_PGT], -1),
    jnp.concatenate([rollout.prompt_mask_PGS, rollout.mask_PGT], -1),
  )
  batch = Batch(
    mask_PGT=rollout.mask_PGT.astype(jnp.float32),
    rewards_PG=jnp.asarray(rewards.reshape(P, G)),
  )
  batch, algo_state = prepare(batch, state.policy.algo_state)
  state = state._replace(policy=state.policy._replace(algo_state=algo_state))
  state, _ = step(state, seqs, batch, jax.random.fold_in(key, 1))
  state = jax.block_until_ready(state)
  return state, middle - start, time.perf_counter() - middle


# --- Tunix -----------------------------------------------------------------


class WordTokenizer:
  """Ids <-> words "t<id>"; pad and EOS are an id the model cannot emit."""

  def encode(self, text: str, **kwargs) -> list[int]:
    return [int(w[1:]) for w in text.split()]

  def decode(self, ids, **kwargs) -> str:
    return " ".join(f"t{int(i)}" for i in ids)

  def bos_id(self) -> int:
    return BOS

  def eos_id(self) -> int:
    return NEVER

  def pad_id(self) -> int:
    return NEVER


def tunix_reward(prompts, completions, **kwargs):
  """Fraction of completion tokens equal to TARGET (from the text)."""
  del prompts, kwargs
  target = f"t{TARGET}"
  return [
    sum(w == target for w in c.split()) / max(len(c.split()), 1)
    for c in completions
  ]


def tunix_learner(steps: int):
  from tunix.models.llama3 import model as llama3
  from tunix.rl import rl_cluster as rl_cluster_lib
  from tunix.rl.grpo import grpo_learner
  from tunix.rl.rollout import base_rollout

  auto = jax.sharding.AxisType.Auto
  mesh = jax.make_mesh(
    (1, 1), ("fsdp", "tp"), axis_types=(auto, auto), devices=jax.devices()[:1]
  )
  config = llama3.ModelConfig(
    num_layers=LAYERS,
    vocab_size=VOCAB,
    embed_dim=D,
    hidden_dim=MLP,
    num_heads=HEADS,
    head_dim=HEAD_DIM,
    num_kv_heads=HEADS,
    rope_theta=10_000,
    norm_eps=1e-6,
    weight_tying=True,
  )
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
      max_tokens_to_generate=T,
      max_prompt_length=S,
      kv_cache_size=S + T,
      temperature=1.0,
      top_p=1.0,
      top_k=None,
      eos_tokens=[NEVER],
      data_type=jnp.float32,
    ),
  )
  cluster = rl_cluster_lib.RLCluster(
    actor=model, tokenizer=WordTokenizer(), cluster_config=cluster_config
  )
  algo = grpo_learner.GRPOConfig(
    num_generations=G,
    num_iterations=1,
    beta=BETA,
    epsilon=EPS,
    loss_agg_mode="sequence-mean-token-mean",
  )
  return grpo_learner.GRPOLearner(
    rl_cluster=cluster, algo_config=algo, reward_fns=tunix_reward
  )


PHASES = ("iteration", "rollout", "update")  # timed per side


class Interleaved:
  """Tunix's dataset: each batch it hands out first runs one rljax iteration.

  Both sides then alternate iteration by iteration under the same machine
  load. Tunix pulls its next batch inside its global step, so the rljax
  time spent there is subtracted from that step's time.
  """

  def __init__(self, iters: int):
    self.setup = rljax_setup()
    self.state, self.prompts = self.setup[2], prompt_ids()
    self.key = jax.random.key(0)
    self.left = iters + 1
    self.rljax = {phase: [] for phase in PHASES}
    self.tunix = {phase: [] for phase in PHASES}
    self.inside = 0.0  # rljax seconds run since the program started
    tokenizer = WordTokenizer()
    texts = [tokenizer.decode(row[1:]) for row in self.prompts]
    self.batch = {"prompts": np.array(texts)}

  def __iter__(self):
    return self

  def __next__(self):
    if not self.left:
      raise StopIteration
    self.left -= 1
    i = len(self.rljax["iteration"])
    self.state, rollout, update_s = rljax_iteration(
      self.setup, self.state, self.prompts, jax.random.fold_in(self.key, i)
    )
    for phase, seconds in zip(PHASES, (rollout + update_s, rollout, update_s)):
      self.rljax[phase].append(seconds)
    self.inside += rollout + update_s
    return self.batch

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


def run(iters: int):
  """(rljax, Tunix): seconds per phase, iteration 0 (compiles) first."""
  data = Interleaved(iters)
  learner = tunix_learner(iters + 1)
  data.time_steps(learner)
  learner.train(data)
  return data.rljax, data.tunix


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--iters", type=int, default=10)
  args = parser.parse_args()
  logging.getLogger("absl").setLevel(logging.WARNING)
  sides = dict(zip(("rljax", "Tunix 0.1.7"), run(args.iters)))
  print(
    f"\nGRPO iteration, P={P} x G={G}, S={S}, T={T}, vocab {VOCAB}, d={D},"
    f" {LAYERS} layers, float32, {jax.devices()[0].platform}, jax"
    f" {jax.__version__}, {args.iters} timed iterations (medians and best"
    " exclude the first, which compiles)\n"
  )
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
  rl, tx = values.values()
  ratios = " | ".join(f"{b / a:.2f}" for a, b in zip(rl, tx))
  print(f"| ratio Tunix / rljax | {ratios} |")


if __name__ == "__main__":
  main()
