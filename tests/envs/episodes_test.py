"""Multi-turn episodes on the engine: turn-by-turn equality, the agent data
layout, overlap, errors, time-outs and budgets, and a trainer step."""

import pathlib
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import envs
from rljax import models
from rljax import sampling
from rljax import tasks
from rljax import testing
from rljax.training import Trainer

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "grpo.py"


class Counter(envs.Environment):
  """Three turns; the observation after turn t is "b<t>=", the reward 1
  when the action contains a "1"; the state is the last action's first
  character (so equal actions reach equal states)."""

  max_turns = 3

  def reset(self, example):
    return envs.Start(example["question"], state="start")

  def step(self, action):
    return envs.Step(
      observation=f"b{action.turn}=",
      reward=float("1" in action.text),
      state=action.text[:1],
    )


def _engine(model, **kwargs):
  kwargs = {
    "slots": 4,
    "page_size": 4,
    "segment": 4,
    "max_length": 48,
    "stop_ids": (1,),
  } | kwargs
  return sampling.Engine(model.config, **kwargs)


def _run(model, tokenizer, env=Counter, engine=None, **kwargs):
  kwargs = {
    "key": jax.random.key(3),
    "width": 24,
    "turn_tokens": 4,
    "max_turns": 3,
  } | kwargs
  return envs.run_episodes(
    engine or _engine(model),
    model,
    envs.Renderer(tokenizer, chat=False),
    env,
    [{"question": "a1="}, {"question": "a23="}],
    [2, 2],
    **kwargs,
  )


def test_episodes_equal_decoding_their_turns_one_by_one(model, tokenizer):
  out = _run(model, tokenizer)
  r, extra = out.rollout, out.extra
  engine = _engine(model)
  key = jax.random.key(3)
  for p, question in enumerate(["a1=", "a23="]):
    seqs = engine.add(
      tokenizer.encode(question),
      key=jax.random.fold_in(jax.random.fold_in(key, p), 0),
      max_new_tokens=4,
      num_samples=2,
      keep=True,
    )
    engine.run(model)
    for turn in range(3):
      for seq in seqs:
        if turn < 2:
          obs = tokenizer.encode(f"b{turn}=")
          engine.extend(seq, obs, max_new_tokens=4)
      if turn < 2:
        engine.run(model)
    for g, seq in enumerate(seqs):
      n = len(seq.completion)
      np.testing.assert_array_equal(r.tokens_PGT[p, g, :n], seq.completion)
      # The same float32 log-probs batched differently (four episodes in
      # the engine's slots at once, or their turns one by one), so XLA may
      # order the reductions differently: a sum of n terms of size ~|x|
      # moves by up to ~n * eps32 * |x| (eps32 = 1.2e-7). Here |logp| <= ~4
      # and n <= 64 (hidden 32, MLP 64, <= 48 attended positions, ~30
      # tokens): ~3e-5 at worst; 2-3e-6 seen. A wrong token or cache
      # position is off by more than 1e-2.
      np.testing.assert_allclose(r.logp_PGT[p, g, :n], seq.logp, atol=2e-5)
      # Exactly the sampled tokens enter the loss.
      np.testing.assert_array_equal(
        extra["loss_mask_PGT"][p, g, :n], seq.sampled
      )
      assert extra["loss_mask_PGT"][p, g, n:].sum() == 0
  assert np.all(extra["turns_PG"] == 3)
  assert out.stats["episodes"] == 4 and out.stats["turns"] == 12


def test_sampled_log_probs_are_the_models_on_the_whole_episode(
  model, tokenizer
):
  # Teacher-forcing the whole episode (prompt, actions, observations)
  # gives the sampled tokens' log-probs: the cache kept across turns and
  # the prefilled observations are exactly the context.
  out = _run(model, tokenizer)
  r = out.rollout
  for p, g in [(0, 0), (1, 1)]:
    prompt = r.prompt_tokens_PGS[p, g][r.prompt_mask_PGS[p, g] > 0]
    n = int(r.mask_PGT[p, g].sum())
    whole = np.concatenate([prompt, r.tokens_PGT[p, g, :n]])
    logp, _ = models.token_logprobs(
      model, jnp.asarray(whole)[None], schedule="dense"
    )
    ref = np.asarray(logp[0, len(prompt) :])
    sampled = out.extra["loss_mask_PGT"][p, g, :n] > 0
    np.testing.assert_allclose(
      r.full_logp_PGT[p, g, :n][sampled], ref[sampled], atol=2e-5
    )


def test_the_agent_data_layout(model, tokenizer):
  out = _run(model, tokenizer)
  r, x = out.rollout, out.extra
  text = lambda ids: tokenizer.decode(ids)  # noqa: E731
  for p in range(2):
    for g in range(2):
      n = int(r.mask_PGT[p, g].sum())
      turn_ids = x["turn_ids_PGT"][p, g]
      assert np.all(turn_ids[n:] == -1) and np.all(turn_ids[:n] >= 0)
      for t in range(3):
        tokens = r.tokens_PGT[p, g][turn_ids == t]
        action = tokens[x["loss_mask_PGT"][p, g][turn_ids == t] > 0]
        obs = tokens[x["loss_mask_PGT"][p, g][turn_ids == t] == 0]
        assert text(obs) == (f"b{t}=" if t < 2 else "")
        assert x["turn_rewards_PG"][p, g, t] == float("1" in text(action))
      assert x["episode_return_PG"][p, g] == x["turn_rewards_PG"][p, g].sum()
  # State ids: "start" is one id for every episode's first action; later
  # ones are equal exactly when the previous actions start alike.
  states = x["state_ids_PG"]
  assert np.all(states[:, :, 0] == 0)  # "start", the first state seen
  for p in range(2):
    for g in range(2):
      for t in range(1, 3):  # equal ids exactly for equal first characters
        action = r.tokens_PGT[p, g][
          (x["turn_ids_PGT"][p, g] == t - 1) & (x["loss_mask_PGT"][p, g] > 0)
        ]
        for q in range(2):
          for h in range(2):
            other = r.tokens_PGT[q, h][
              (x["turn_ids_PGT"][q, h] == t - 1)
              & (x["loss_mask_PGT"][q, h] > 0)
            ]
            same = text(action)[:1] == text(other)[:1]
            assert (states[p, g, t] == states[q, h, t]) == same
  assert np.all(x["tool_calls_PG"] == 0)


@pytest.mark.slow  # default-run time; run with -m slow
def test_overlapped_and_serial_steps_give_the_same_episodes(model, tokenizer):
  a = _run(model, tokenizer, overlap=True)
  b = _run(model, tokenizer, overlap=False)
  np.testing.assert_array_equal(a.rollout.tokens_PGT, b.rollout.tokens_PGT)
  np.testing.assert_array_equal(a.rollout.mask_PGT, b.rollout.mask_PGT)
  # Other packings of the decode rows round differently.
  np.testing.assert_allclose(a.rollout.logp_PGT, b.rollout.logp_PGT, atol=1e-5)
  for k in a.extra:
    np.testing.assert_array_equal(a.extra[k], b.extra[k])


def test_more_episodes_than_the_pool_holds_evict_idle_ones(model, tokenizer):
  # One slot and pages for one sequence: the episodes waiting for their
  # environment give their pages back and are re-prefilled later.
  small = _engine(model, slots=1, num_pages=14)
  a = _run(model, tokenizer, engine=small)
  b = _run(model, tokenizer)
  np.testing.assert_array_equal(a.rollout.tokens_PGT, b.rollout.tokens_PGT)
  assert small.stats["evicted"] > 0
  assert small.pages_in_use() == 0


class Broken(Counter):
  def step(self, action):
    if action.turn == 1:
      raise RuntimeError("the environment broke")
    return super().step(action)


class Slow(Counter):
  def step(self, action):
    if action.turn == 1:
      time.sleep(5)
    return super().step(action)


@pytest.mark.slow  # default-run time; run with -m slow
def test_a_failing_or_slow_step_ends_its_episode_not_the_run(model, tokenizer):
  out = _run(model, tokenizer, env=Broken)
  assert out.stats["env_errors"] == 4
  assert np.all(out.extra["turns_PG"] == 2)
  assert np.all(out.extra["turn_rewards_PG"][:, :, 1:] == 0)
  out = _run(model, tokenizer, env=Slow, step_timeout=0.5)
  assert out.stats["env_seconds"] < 2.5  # not the 5 s the steps sleep
  assert out.stats["env_timeouts"] == 4
  assert np.all(out.extra["turns_PG"] == 2)


def test_the_context_budget_truncates_episodes_cleanly(model, tokenizer):
  out = _run(model, tokenizer, budget=7, width=24)
  mask = out.rollout.mask_PGT
  assert mask.sum(-1).max() <= 7
  assert np.all(out.rollout.truncated_PG)  # 3 turns of up to 4 never fit
  # No observation is cut: each episode ends with a whole action.
  last = (mask.sum(-1) - 1).clip(0)
  loss = np.take_along_axis(out.extra["loss_mask_PGT"], last[..., None], -1)
  assert np.all(loss == 1)


@pytest.mark.slow  # default-run time; run with -m slow
def test_steps_overlap_with_decoding(model, tokenizer):
  # Each step sleeps 0.3 s; four episodes of three turns run their steps
  # concurrently, well under the 12 x 0.3 s that serial steps take.
  class Sleepy(Counter):
    def step(self, action):
      time.sleep(0.3)
      return super().step(action)

  threads = []

  class Spy(Sleepy):
    def step(self, action):
      threads.append(threading.get_ident())
      return super().step(action)

  out = _run(model, tokenizer, env=Spy, overlap=True, workers=4)
  assert len(set(threads)) > 1
  assert out.stats["env_seconds"] < 12 * 0.3


@pytest.mark.slow  # default-run time; run with -m slow
def test_trainer_trains_on_an_environment(tmp_path):
  task = tasks.get("arithmetic")
  task = tasks.Task(
    name="counter",
    train=task.train,
    test=task.test,
    rewards=(("return", envs_reward(), 1.0),),
    format_prompt=task.format_prompt,
    alphabet="".join(sorted(set(task.alphabet) | set("ab="))),
    environment=Counter,
  )
  config = testing.tiny_run_config(
    CONFIG,
    tmp_path,
    "train.steps=1",
    "sampler.engine=continuous",
    "sampler.max_new_tokens=24",
  )
  trainer = Trainer(config, task=task)
  trainer.step(0)
  last = trainer._last
  assert last.extra["turn_rewards_PG"].shape[-1] == 3
  assert np.any(last.extra["turns_PG"] > 1)
  np.testing.assert_array_equal(
    last.rewards_PG, last.extra["episode_return_PG"]
  )


def envs_reward():
  from rljax import rewards

  return rewards.episode_return()


def test_bad_environments_get_clear_errors(model, tokenizer):
  class NoStart(Counter):
    def reset(self, example):
      return "a1="

  with pytest.raises(TypeError, match="must return envs.Start"):
    _run(model, tokenizer, env=NoStart)
  with pytest.raises(ValueError, match="max_turns"):
    _run(model, tokenizer, max_turns=0)


class ForkFirst:
  """Forks one extra branch of group 0's episodes after their first
  observation (an observation point)."""

  probe_tokens = 0

  def __init__(self):
    self.points = []

  def __call__(self, point):
    self.points.append(point)
    return 1 if point.group == 0 and point.turn == 0 else 0


def test_branches_share_the_trunk_and_continue_independently(model, tokenizer):
  rule = ForkFirst()
  out = envs.run_episodes(
    _engine(model),
    model,
    envs.Renderer(tokenizer, chat=False),
    Counter,
    [{"question": "a1="}, {"question": "a23="}],
    [1, 1],
    key=jax.random.key(3),
    width=24,
    turn_tokens=4,
    max_turns=3,
    group_size=3,
    branch=rule,
  )
  r, x = out.rollout, out.extra
  # Group 0: one episode forked after turn 0 -> 2 samples (the budget of 3
  # caps further forks of the branches' own turn-0 points: none happen);
  # group 1 never forks.
  np.testing.assert_array_equal(r.sample_mask_PG, [[1, 1, 0], [1, 0, 0]])
  nodes = x["node_ids_PG"]
  assert nodes[0, 0, 0] == nodes[0, 1, 0]  # the shared first action
  assert nodes[0, 0, 1] != nodes[0, 1, 1]
  first = x["turn_ids_PGT"][0, 0] == 0
  n = int(first.sum())
  np.testing.assert_array_equal(r.tokens_PGT[0, 0, :n], r.tokens_PGT[0, 1, :n])
  assert x["turns_PG"][0, 1] == 3
  # Each branch's later tokens are the model's: teacher forcing agrees.
  for j in range(2):
    prompt = r.prompt_tokens_PGS[0, j][r.prompt_mask_PGS[0, j] > 0]
    m = int(r.mask_PGT[0, j].sum())
    whole = np.concatenate([prompt, r.tokens_PGT[0, j, :m]])
    logp, _ = models.token_logprobs(
      model, jnp.asarray(whole)[None], schedule="dense"
    )
    sampled = x["loss_mask_PGT"][0, j, :m] > 0
    np.testing.assert_allclose(
      r.full_logp_PGT[0, j, :m][sampled],
      np.asarray(logp[0, len(prompt) :])[sampled],
      atol=2e-5,
    )
  assert rule.points[0].step is not None and rule.points[0].budget == 3


class ProbeFork:
  probe_tokens = 2

  def __call__(self, point):
    assert point.step.observation == f"b{point.turn - 1}="
    assert len(point.action.tokens) == 2
    return 1 if point.leaves < 2 else 0


def test_probe_points_fork_inside_the_next_action(model, tokenizer):
  out = envs.run_episodes(
    _engine(model),
    model,
    envs.Renderer(tokenizer, chat=False),
    Counter,
    [{"question": "a1="}],
    [1],
    key=jax.random.key(5),
    width=24,
    turn_tokens=4,
    max_turns=3,
    group_size=2,
    branch=ProbeFork(),
  )
  r, x = out.rollout, out.extra
  assert r.sample_mask_PG.sum() == 2
  # The branches share the first action, the observation and the probe's
  # 2 tokens of the second action, which is one action of each branch.
  ids = x["turn_ids_PGT"]
  start = int(np.argmax(ids[0, 0] == 1))  # action 1's first token
  shared = start + 2
  np.testing.assert_array_equal(
    r.tokens_PGT[0, 0, :shared], r.tokens_PGT[0, 1, :shared]
  )
  assert np.all(x["loss_mask_PGT"][0, :, start:shared] == 1)
  assert tokenizer.decode(r.tokens_PGT[0, 0, start - 3 : start]) == "b0="
  assert x["node_ids_PG"][0, 0, 1] != x["node_ids_PG"][0, 1, 1]


@pytest.mark.slow  # default-run time; run with -m slow
def test_infopo_counterfactual_pass_reaches_the_batch(model, tokenizer):
  from rljax import rollouts
  from rljax import transforms

  class Task:
    environment = Counter

  strategy = envs.EpisodeRollouts(turn_tokens=4, counterfactual="ab")
  strategy = strategy.prepare(Task())
  strategy = strategy.bind(tokenizer, chat=False)
  groups = [rollouts.Group({"question": "a1="}, "a1=", 0, 2)]
  drawn = strategy.draw(
    _engine(model),
    model,
    [tokenizer.encode("a1=")],
    np.array([2]),
    key=jax.random.key(0),
    max_new_tokens=24,
    width=24,
    temperature=1.0,
    groups=groups,
  )
  r, x = drawn.rollout, drawn.extra
  cf = x["infopo_cf_logp_PGT"]
  assert cf.shape == r.tokens_PGT.shape
  flat = lambda a: np.asarray(a).reshape(2, -1)  # noqa: E731
  logp, want = transforms.infopo_counterfactual_logprobs(
    model,
    np.concatenate([flat(r.prompt_tokens_PGS), flat(r.tokens_PGT)], -1),
    np.concatenate([flat(r.prompt_mask_PGS), flat(r.mask_PGT)], -1),
    flat(x["turn_ids_PGT"]),
    flat(x["loss_mask_PGT"]),
    tokenizer.encode("ab"),
    num_turns=3,
  )
  np.testing.assert_allclose(cf.reshape(2, -1), want, atol=1e-6)
  # Actions after the first see another context: their log-probs change.
  later = (x["turn_ids_PGT"] >= 1) & (x["loss_mask_PGT"] > 0)
  assert np.any(np.abs(cf - np.asarray(logp).reshape(cf.shape))[later] > 1e-4)
