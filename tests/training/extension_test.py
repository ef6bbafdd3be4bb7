"""The Trainer's side of the extension points: parts built in code (task,
rewards, teacher, annotations), the batch fields it fills, and the behaviour
log-probs of on-policy runs for every stage that reads them."""

import inspect
import pathlib

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import testing
from rljax.training import Trainer
from rljax.training import _build
from rljax.training import _rollout
from rljax.training import completion_logprobs

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
FIELDS = ("old_logp_PGT", "teacher_logp_PGT", "tokens_PGT", "rewards_PG")


def _config(name, directory, *extra):
  return testing.tiny_run_config(
    CONFIGS / f"{name}.py",
    directory,
    "train.mesh=(1, 1, 1)",
    "train.steps=1",
    "train.warm_start_steps=0",
    "sampler.max_new_tokens=6",
    *extra,
  )


def _recorder(fields, p=8, g=4, t=6):
  """A stage whose state is the first batch's `fields`, prompt ids and the
  annotation ``length_PG`` (read, not changed)."""

  def init():
    state = {
      f: jnp.zeros((p, g, t)[: 2 if f.endswith("PG") else 3]) for f in fields
    }
    return {
      **state,
      "ids": jnp.zeros((p,), jnp.int32),
      "length": jnp.zeros((p, g)),
    }

  def prepare(batch, state):
    batch.require(*fields, "prompt_ids_P", by="recorder")
    new = {f: getattr(batch, f).astype(jnp.float32) for f in fields}
    new["ids"] = batch.prompt_ids_P
    new["length"] = batch.get("length_PG", by="recorder").astype(jnp.float32)
    return batch, new

  return rljax.Transform(init, prepare, lambda terms, batch, state: terms)


def _initial_policy(trainer):
  """A copy of the policy (the step donates the state's arrays)."""
  params = jax.tree.map(jnp.copy, trainer.state.policy.params)
  return nnx.merge(trainer.models.policy, params)


def _own_logp(model, scored, width):
  seqs = _rollout.sequences(scored.rollout)
  return completion_logprobs(model, seqs, width, temperature=1.0)[0]


def _contains_seven(samples):
  return np.array([float("7" in text) for text in samples.texts])


@pytest.mark.slow  # default-run time; run with -m slow
def test_parts_built_in_code_and_the_fields_they_fill(tmp_path):
  config = _config("grpo", tmp_path)
  task = rljax.tasks.get("arithmetic", **config.task.kwargs)
  policy, _ = _build.build_policy(
    config.model, task.alphabet, config.train.seed
  )
  grpo = rljax.algorithms.grpo()
  algorithm = rljax.Algorithm(
    rljax.chain(rljax.transforms.icepop(), _recorder(FIELDS), grpo.transform),
    grpo.aggregate,
  )
  trainer = Trainer(
    config,
    algorithm=algorithm,
    task=task,
    rewards=[("seven", _contains_seven, 2.0)],
    teacher=policy,  # the initial policy: its log-probs equal the old ones
    annotate=lambda scored: {"length_PG": scored.rollout.mask_PGT.sum(-1)},
  )
  assert trainer.needs["old_logp_PGT"] and trainer.needs["teacher_logp_PGT"]
  initial = _initial_policy(trainer)
  trainer.step(0)
  seen = jax.device_get(trainer.state.policy.algo_state[1])
  scored = trainer._last
  rollout = scored.rollout
  # On-policy, the behaviour log-probs are the policy's own (not the
  # sampler's), computed by the training pass before the update.
  own = np.asarray(_own_logp(initial, scored, 6))
  mask = np.asarray(rollout.mask_PGT) > 0
  np.testing.assert_allclose(seen["old_logp_PGT"][mask], own[mask], atol=2e-5)
  np.testing.assert_allclose(
    seen["teacher_logp_PGT"][mask], own[mask], atol=2e-5
  )
  np.testing.assert_array_equal(seen["tokens_PGT"], rollout.tokens_PGT)
  np.testing.assert_array_equal(seen["length"], mask.sum(-1))
  # The rewards are the ones given in code, weighted.
  texts = np.array(scored.completions).reshape(8, 4)
  want = 2.0 * np.vectorize(lambda s: float("7" in s))(texts)
  np.testing.assert_array_equal(seen["rewards_PG"], want)
  # Prompt ids are the dataset indices of the prompts.
  for i, example in zip(seen["ids"], scored.examples):
    assert task.train[int(i)] == example


def test_bad_parts_given_in_code_name_the_argument(tmp_path):
  config = _config("grpo", tmp_path)
  with pytest.raises(ValueError, match=r"Trainer\(rewards=...\).*entry"):
    Trainer(config, rewards=[("r", "not a function", 1.0)])
  teacher_reader = rljax.Algorithm(
    rljax.chain(
      _recorder(("teacher_logp_PGT",)), rljax.algorithms.grpo().transform
    ),
    rljax.aggregate.token_mean,
  )
  with pytest.raises(ValueError, match=r"Trainer\(config, teacher=model\)"):
    Trainer(config, algorithm=teacher_reader)
  wrong = testing.random_model(
    rljax.models.ModelConfig(
      vocab_size=3,
      hidden_size=8,
      intermediate_size=8,
      num_layers=1,
      num_heads=2,
      num_kv_heads=1,
      head_dim=4,
    )
  )
  with pytest.raises(ValueError, match="vocabulary size 3"):
    Trainer(config, algorithm=teacher_reader, teacher=wrong)


STAGES_READING_OLD_LOGP = {
  "icepop": lambda: rljax.transforms.icepop(),
  "token_tis": lambda: rljax.transforms.token_tis(),
  "sequence_tis": lambda: rljax.transforms.sequence_tis(),
  "sequence_masked_tis": lambda: rljax.transforms.sequence_masked_tis(),
  "kl_in_reward": lambda: rljax.transforms.kl_in_reward(
    rljax.losses.kl_k1, coef=0.01
  ),
  "adaptive_kl_in_reward": lambda: rljax.transforms.adaptive_kl_in_reward(
    rljax.losses.kl_k1
  ),
  "adaptive_kl_penalty": lambda: rljax.objectives.adaptive_kl_penalty(
    rljax.losses.kl_k3
  ),
}


@pytest.mark.slow
@pytest.mark.parametrize(
  "stage", [*STAGES_READING_OLD_LOGP, "rloo_kl_coef", "ppo_kl_coef"]
)
def test_on_policy_stages_read_the_policys_own_logp(tmp_path, stage):
  name = stage.split("_")[0] if stage.endswith("kl_coef") else "grpo"
  config = _config(name, tmp_path)
  base = (
    rljax.algorithms.get(name, kl_coef=0.01)
    if stage.endswith("kl_coef")
    else rljax.algorithms.grpo()
  )
  extra = (
    [] if stage.endswith("kl_coef") else [STAGES_READING_OLD_LOGP[stage]()]
  )
  algorithm = rljax.Algorithm(
    rljax.chain(*extra, _recorder(("old_logp_PGT",)), base.transform),
    base.aggregate,
  )
  trainer = Trainer(
    config,
    algorithm=algorithm,
    annotate=lambda scored: {"length_PG": scored.rollout.mask_PGT.sum(-1)},
  )
  initial = _initial_policy(trainer)
  metrics = trainer.step(0)
  assert np.isfinite(metrics["loss"])
  seen = jax.device_get(trainer.state.policy.algo_state[len(extra)])
  own = np.asarray(_own_logp(initial, trainer._last, 6))
  mask = np.asarray(trainer._last.rollout.mask_PGT) > 0
  np.testing.assert_allclose(seen["old_logp_PGT"][mask], own[mask], atol=2e-5)


# Presets without a config file of their own: the literature's.
CONFIG_PRESETS = {p.stem for p in CONFIGS.glob("[!_]*.py")}
LITERATURE_PRESETS = sorted(set(rljax.algorithms.PRESETS) - CONFIG_PRESETS)


def _preset(name, num_prompts):
  factory = rljax.algorithms.PRESETS[name]
  params = inspect.signature(factory).parameters
  kwargs = {"num_prompts": num_prompts} if "num_prompts" in params else {}
  return rljax.algorithms.get(name, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("name", LITERATURE_PRESETS)
def test_literature_preset_trains_two_steps(tmp_path, name):
  config = _config("grpo", tmp_path, "train.steps=2", f"algorithm.name={name}")
  task = rljax.tasks.get(config.task.name, **config.task.kwargs)
  algorithm = _preset(name, len(task.train))
  teacher = None
  if _build.needs_field(algorithm, "teacher_logp_PGT"):
    teacher = _build.build_policy(config.model, task.alphabet, seed=7)[0]
  # Side data the literature's judges and tools write: answer clusters
  # (EMPO, COPO, SEED-GRPO); this task has no tools (ASPO, HDPO) and is
  # the one-turn case of the agent data layout (rljax.envs).
  clusters = rljax.rewards.cluster_annotate()

  def annotate(scored):
    mask = np.asarray(scored.rollout.mask_PGT)
    none = np.zeros(mask.shape[:2], np.int32)
    return {
      **clusters(scored),
      "tool_position_PG": none - 1,
      "tool_calls_PG": none[..., None],
      "turn_ids_PGT": np.where(mask > 0, 0, -1).astype(np.int32),
      "turns_PG": none + 1,
      "turn_rewards_PG": np.zeros(mask.shape[:2] + (1,), np.float32),
      "state_ids_PG": none[..., None] - 1,
      "tool_errors_PG": none[..., None],
      "node_ids_PG": (np.arange(none.size).reshape(none.shape))[..., None],
    }

  trainer = Trainer(
    config, algorithm=algorithm, task=task, teacher=teacher, annotate=annotate
  )
  summary = trainer.run()
  assert len(summary["history"]) == 2
  for record in summary["history"]:
    assert np.isfinite(record["loss"]), record


def _success_table(num_prompts):
  """The README's per-prompt running success rate (a PromptTable)."""

  def prepare(batch, table):
    solved = (batch.rewards_PG > 0.5).mean(-1)
    past, _ = table.lookup(batch.prompt_ids_P)
    return batch, table.store(batch.prompt_ids_P, 0.8 * past + 0.2 * solved)

  init = lambda: rljax.PromptTable.create(num_prompts, fill=0.5)  # noqa: E731
  return rljax.Transform(init, prepare, lambda terms, batch, state: terms)


@pytest.mark.slow
def test_per_prompt_state_is_the_same_across_a_resume(tmp_path):
  def run(directory, steps, resume=True):
    config = _config(
      "grpo",
      directory,
      f"train.steps={steps}",
      "output.checkpoint_every=2",
      "train.eval_every=0",
    )
    task = rljax.tasks.get(config.task.name, **config.task.kwargs)
    grpo = rljax.algorithms.grpo()
    algorithm = rljax.Algorithm(
      rljax.chain(grpo.transform, _success_table(len(task.train))),
      grpo.aggregate,
    )
    trainer = Trainer(config, algorithm=algorithm, task=task, resume=resume)
    start = trainer.start_step
    trainer.run()
    return start, jax.device_get(trainer.state.policy.algo_state[1])

  _, whole = run(tmp_path / "whole", 3)
  first, _ = run(tmp_path / "split", 2)
  resumed, split = run(tmp_path / "split", 3)
  assert first == 0 and resumed == 2
  assert int((whole.seen > 0).sum()) >= 16
  np.testing.assert_array_equal(whole.seen, split.seen)
  np.testing.assert_allclose(whole.values, split.values, atol=1e-6)


def _rescore_recorder(p=8, g=4, t=6):
  """A stage that asks for two passes and records them (its state)."""

  def prepare(batch, state):
    return batch, {
      "hot": batch.get("hot_PGT", by="rescore recorder"),
      "ref": batch.get("ref_cold_PGT", by="rescore recorder"),
      "prompt": batch.get("prompt_logp_P", by="rescore recorder"),
    }

  def init():
    return {
      "hot": jnp.zeros((p, g, t)),
      "ref": jnp.zeros((p, g, t)),
      "prompt": jnp.zeros((p,)),
    }

  return rljax.Transform(
    init,
    prepare,
    lambda terms, batch, state: terms,
    rescores=(
      rljax.Rescore("hot_PGT", temperature=2.0),
      rljax.Rescore("ref_cold_PGT", temperature=0.5, model="reference"),
      rljax.Rescore("prompt_logp_P", span="prompt"),
    ),
  )


def _grad_norm_recorder(p=8, g=4):
  def prepare(batch, state):
    return batch, batch.get("g2_PG", by="gradient recorder")

  return rljax.Transform(
    lambda: jnp.zeros((p, g)),
    prepare,
    lambda terms, batch, state: terms,
    rescores=(rljax.Rescore("g2_PG", span="gradient"),),
  )


@pytest.mark.slow  # minutes of CPU: the slow set
def test_rescore_passes_and_step_scale(tmp_path):
  """Each `rljax.Rescore` pass fills Batch.extra: completion log-probs at
  another temperature (policy, reference), a prompt's mean log-prob and
  each sample's squared gradient norm of its summed log-probs; a stage's
  `step_scale` multiplies the update (0: the parameters do not move)."""
  config = _config("grpo", tmp_path)
  grpo = rljax.algorithms.grpo()
  frozen = rljax.Transform(
    lambda: (),
    lambda batch, state: (batch, state),
    lambda terms, batch, state: terms,
    step_scale=lambda state: 0.0,
  )
  algorithm = rljax.Algorithm(
    rljax.chain(
      _rescore_recorder(), _grad_norm_recorder(), grpo.transform, frozen
    ),
    grpo.aggregate,
  )
  trainer = Trainer(config, algorithm=algorithm)
  # The reference is kept for its pass though no stage reads ref_logp_PGT.
  assert trainer.state.reference is not None
  assert not trainer.needs["ref_logp_PGT"]
  before = jax.tree.map(np.array, trainer.state.policy.params)
  initial = _initial_policy(trainer)
  metrics = trainer.step(0)
  assert metrics["step_scale"] == 0.0
  after = jax.tree.map(np.array, trainer.state.policy.params)
  jax.tree.map(np.testing.assert_array_equal, after, before)
  passes = jax.device_get(trainer.state.policy.algo_state[0])
  seqs = _rollout.sequences(trainer._last.rollout)
  mask = np.asarray(trainer._last.rollout.mask_PGT) > 0
  for name, temperature in (("hot", 2.0), ("ref", 0.5)):
    # The initial policy is the reference: both passes score its weights.
    want = completion_logprobs(initial, seqs, 6, temperature=temperature)[0]
    np.testing.assert_allclose(
      passes[name][mask], np.asarray(want)[mask], atol=2e-5
    )
  # The prompt's mean log-prob, its first real token (no context) left out.
  rollout = trainer._last.rollout
  tokens = np.asarray(rollout.prompt_tokens_PGS)[:, 0]
  pmask = np.asarray(rollout.prompt_mask_PGS)[:, 0]
  logp = np.asarray(rljax.models.token_logprobs(initial, tokens, pmask)[0])
  for i in range(tokens.shape[0]):
    real = np.flatnonzero(pmask[i])[1:]
    np.testing.assert_allclose(
      passes["prompt"][i], logp[i, real].mean(), atol=2e-5
    )
  seen = np.asarray(jax.device_get(trainer.state.policy.algo_state[1]))
  seqs = _rollout.sequences(trainer._last.rollout)
  graph, params = nnx.split(initial)
  for p, g in [(0, 0), (3, 2), (7, 3)]:
    tokens = jnp.asarray(seqs.tokens_PGL[p : p + 1, g : g + 1])
    mask = jnp.asarray(seqs.mask_PGL[p : p + 1, g : g + 1], jnp.float32)

    def total(prm, tokens=tokens, mask=mask):
      model = nnx.merge(graph, prm)
      one = type(seqs)(tokens, mask)
      logp = completion_logprobs(model, one, 6, temperature=1.0)[0]
      return jnp.sum(logp * mask[..., -6:])

    grads = jax.grad(total)(params)
    want = sum(float(jnp.sum(x**2)) for x in jax.tree.leaves(grads))
    np.testing.assert_allclose(seen[p, g], want, rtol=2e-4)
