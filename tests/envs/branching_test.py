"""Trees of agent episodes: the ARPO, AEPO and PORTool rules on hand-made
points, AEPO's pre-monitoring, `sibling_groups` on hand-built trees and
against `transforms.portool_advantages_of`, trees grown by `run_episodes`
with a tiny random model and a tool-calling toy environment (budgets,
shared trunks, determinism), the strategies and the configs."""

import math
import pathlib
import types

import jax
import numpy as np
import pytest

import rljax
from rljax import algorithms
from rljax import envs
from rljax import rollouts
from rljax import sampling
from rljax import testing
from rljax import transforms
from rljax.training import Trainer
from rljax.training import load_config
from rljax.training import validate

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
V = 16  # vocabulary of the hand-made points: log V = 4 ln 2
LN2 = math.log(2.0)


def point(
  entropy=0.5,
  first=0.5,
  *,
  group=0,
  turn=1,
  tokens=(3, 4),
  calls=None,
  leaves=1,
  budget=4,
):
  """A `BranchPoint`: a probe point (no step) unless `calls` is given."""
  step = None if calls is None else envs.Step("b=", tool_calls=calls)
  return envs.BranchPoint(
    group=group,
    turn=turn,
    action=envs.Action("", tuple(tokens), turn),
    step=step,
    entropy=entropy,
    first_entropy=first,
    tool_calls=calls or 0,
    leaves=leaves,
    budget=budget,
  )


# --- ARPO -------------------------------------------------------------------


def test_arpo_decision_by_hand():
  # k = 4, V = 16: ΔH = 4 (H - H0) / (4 ln 2) = (H - H0) / ln 2.
  # H - H0 = ln 2 -> ΔH = 1; P = alpha + 0.2 * 1.
  rule = lambda alpha: envs.ARPOBranching(  # noqa: E731
    alpha=alpha, beta=0.2, tau=0.5, branches=2, k=4, vocab_size=V
  )
  up = point(entropy=0.5 + LN2)
  assert rule(0.31).delta_entropy(up) == pytest.approx(1.0)
  assert rule(0.31).probability(up) == pytest.approx(0.51)
  assert rule(0.31)(up) == 2  # 0.51 > 0.5: fork Z = 2
  assert rule(0.29)(up) == 0  # 0.49
  # H - H0 = -ln 2 -> ΔH = -1: P = alpha - 0.2.
  down = point(entropy=0.5 - LN2)
  assert rule(0.71)(down) == 2  # 0.51
  assert rule(0.69)(down) == 0  # 0.49
  assert rule(0.31).probe_tokens == 4


def test_arpo_forks_only_after_tool_calls_and_within_the_budget():
  rule = envs.ARPOBranching(alpha=1.0, k=4, probe=False, vocab_size=V)
  assert rule.probe_tokens == 0
  assert rule(point(calls=1)) == 1
  assert rule(point(calls=0)) == 0  # an observation without a tool call
  assert rule(point(calls=1, leaves=4, budget=4)) == 0  # the group is full
  # Probe points do not say; they count as after a tool call.
  assert envs.ARPOBranching(alpha=1.0, k=4, vocab_size=V)(point()) == 1


def test_arpo_drawn_alpha_forks_with_the_codes_probability():
  # alpha ~ U[0, 1) per point: P(fork) = P(U > tau - beta ΔH), i.e.
  # clip(1 - tau + beta ΔH, 0, 1) (the official code's U - w ΔH <= 0.5).
  rule = envs.ARPOBranching(beta=0.2, tau=0.5, k=4, vocab_size=V, seed=3)
  n = 4000
  for delta, want in [(0.0, 0.5), (1.5, 0.8), (-1.5, 0.2), (5.0, 1.0)]:
    h = 0.5 + delta * LN2
    forks = [rule(point(entropy=h, tokens=(i, i + 1))) for i in range(n)]
    assert np.mean(forks) == pytest.approx(want, abs=0.03)
  # Deterministic per point; the salt (the step) changes the draws.
  points = [point(tokens=(i,)) for i in range(200)]
  first = [rule(x) for x in points]
  assert first == [rule(x) for x in points]
  rule.reset(salt=7)
  assert first != [rule(x) for x in points]


def test_arpo_errors():
  with pytest.raises(ValueError, match="needs vocab_size"):
    envs.ARPOBranching()(point())
  with pytest.raises(ValueError, match="alpha must be in"):
    envs.ARPOBranching(alpha=1.5)
  with pytest.raises(ValueError, match="branches must be"):
    envs.ARPOBranching(branches=0)
  with pytest.raises(ValueError, match="k must be"):
    envs.ARPOBranching(k=0)
  with pytest.raises(ValueError, match="beta must be a finite"):
    envs.ARPOBranching(beta=float("nan"))


# --- AEPO -------------------------------------------------------------------


def test_aepo_penalises_consecutive_branching_by_hand():
  # alpha 0.6, ΔH = 0: P = 0.6 (1 - 0.05 l), l = the group's consecutive
  # forking turns before this one.
  rule = envs.AEPOBranching(alpha=0.6, gamma=0.2, k=4, vocab_size=V)
  # turn 0: l 0, P .6; 1: l 1, .57; 2: .54; 3: .51; all fork.
  for turn, want in enumerate([0.6, 0.57, 0.54, 0.51]):
    assert rule.probability(point(turn=turn)) == pytest.approx(want)
    assert rule(point(turn=turn)) == 1
  # turn 4: l 4, P = .6 * .8 = .48 <= .5: no fork, which resets l.
  assert rule.probability(point(turn=4)) == pytest.approx(0.48)
  assert rule(point(turn=4)) == 0
  assert rule.consecutive(0, 5) == 0 and rule(point(turn=5)) == 1
  assert rule.consecutive(1, 4) == 0  # groups count apart
  # A full group forks nothing and records nothing.
  assert rule(point(turn=6, leaves=4)) == 0
  assert rule.consecutive(0, 7) == 0
  rule.reset()
  assert rule.consecutive(0, 4) == 0
  # The entropy term: ΔH = 1, gamma .2: (.35 + .2) * 1 = .55.
  rule = envs.AEPOBranching(alpha=0.35, gamma=0.2, k=4, vocab_size=V)
  assert rule.probability(point(entropy=0.5 + LN2)) == pytest.approx(0.55)
  with pytest.raises(ValueError, match="penalty must be"):
    envs.AEPOBranching(penalty=-0.1)


def np_initial(root, tool, size, beta):
  """m = G sigmoid(beta (H_root - H_tool)), floored + 1, within [1, G]."""
  out = []
  for r, t, g in zip(root, tool, size):
    m = math.floor(g / (1.0 + math.exp(-beta * (r - t)))) + 1
    out.append(min(max(m, 1), g))
  return out


def test_aepo_initial_rollouts():
  # G = 8, beta .5: sigmoid(1) = .7310586 -> 5.85 -> 6; sigmoid(-1) =
  # .2689414 -> 2.15 -> 3; sigmoid(0) -> 4 + 1 = 5; saturated: 8 and 1.
  got = envs.aepo_initial_rollouts(
    [2.0, 0.0, 1.0, 100.0, -100.0], [0.0, 2.0, 1.0, 0.0, 0.0], 8
  )
  np.testing.assert_array_equal(got, [6, 3, 5, 8, 1])
  rng = np.random.default_rng(0)
  root, tool = rng.normal(size=(2, 50)) * 3
  size = rng.integers(1, 17, 50)
  np.testing.assert_array_equal(
    envs.aepo_initial_rollouts(root, tool, size, beta=0.7),
    np_initial(root, tool, size, 0.7),
  )
  with pytest.raises(ValueError, match="must be \\[P\\]"):
    envs.aepo_initial_rollouts([1.0, 2.0], [1.0], 8)


def test_aepo_window_entropies_by_hand():
  # Sample 0: action 0 with -log p 1, 2, 3, an observation (masked),
  # action 1 with .5, .5, 4; k = 2, log 16 = 2.7725887:
  # H_root = (1 + 2) / 2.7726 = 1.0820, H_tool = (.5 + .5) / 2.7726.
  # Sample 1: one action (-log p 1): H_tool falls back to H_root.
  logp = -np.array(
    [[[1, 2, 3, 0, 0, 0.5, 0.5, 4], [1, 0, 0, 0, 0, 0, 0, 0]]], np.float32
  )
  mask = np.array([[[1, 1, 1, 0, 0, 1, 1, 1], [1, 0, 0, 0, 0, 0, 0, 0]]])
  turns = np.array([[[0, 0, 0, 0, 0, 1, 1, 1], [0, -1, -1, -1] + [-1] * 4]])
  root, tool = envs.aepo_window_entropies(logp, mask, turns, k=2, vocab_size=V)
  log_v = math.log(V)
  np.testing.assert_allclose(root, [[3 / log_v, 1 / log_v]], rtol=1e-6)
  np.testing.assert_allclose(tool, [[1 / log_v, 1 / log_v]], rtol=1e-6)


# --- PORTool and the tree's forks --------------------------------------------


def test_portool_rule():
  rule = envs.PORToolBranching(branching=3)
  assert rule.probe_tokens == 0
  assert rule(point(calls=1)) == 2  # f = 3 children: 2 extra branches
  assert rule(point(calls=0)) == 0
  assert rule(point(calls=2, leaves=4, budget=4)) == 0
  with pytest.raises(ValueError, match="branching must be"):
    envs.PORToolBranching(branching=1)


# g0, g1 share nodes 0 -> 1 and fork at turn 2 (2 | 3); g2 shares node 0
# and forks at turn 1 (4 | 1), then ends; g3 is another first step (5).
HAND_TREE = np.array([[[0, 1, 2], [0, 1, 3], [0, 4, -1], [5, 6, 7]]], np.int32)


def test_sibling_groups_by_hand():
  # Forks in (sample, turn) order: the root (0), under node 0 (1), under
  # node 1 (2), under node 5 (3), under node 6 (4).
  np.testing.assert_array_equal(
    envs.sibling_groups(HAND_TREE),
    [[[0, 1, 2], [0, 1, 2], [0, 1, -1], [0, 3, 4]]],
  )
  # Two prompts: ids go on counting; each prompt has its own root.
  shifted = np.where(HAND_TREE >= 0, HAND_TREE + 10, -1)
  two = np.concatenate([HAND_TREE, shifted])
  forks = envs.sibling_groups(two)
  assert forks[1, 0, 0] == 5 and forks[1, 3, 2] == 9
  assert set(forks[0].ravel()) & set(forks[1].ravel()) == {-1}


def test_sibling_groups_errors():
  with pytest.raises(ValueError, match="int array"):
    envs.sibling_groups(HAND_TREE.astype(np.float32))
  with pytest.raises(ValueError, match="after a missing"):
    envs.sibling_groups(np.array([[[0, -1, 2]]]))
  with pytest.raises(ValueError, match="two parents"):
    envs.sibling_groups(np.array([[[0, 2], [1, 2]]]))


def random_trees(rng, p, g, n):
  """Node ids of random trees in the runner's layout (unique in the batch,
  equal ids sharing their earlier steps)."""
  ids = np.full((p, g, n), -1, np.int32)
  for i, j in np.ndindex(p, g):
    node = 0
    for t in range(rng.integers(1, n + 1)):
      node = node * 3 + int(rng.integers(3)) + 1
      ids[i, j, t] = node * 64 + i
  return ids


def np_fork_advantages(steps, fork_ids, node_ids):
  """R(s) - mean over the fork's distinct nodes (each counted once) of
  R, from `sibling_groups`' fork ids; 0 at a fork of one node."""
  out = np.zeros(steps.shape)
  for p in range(steps.shape[0]):
    for f in set(fork_ids[p].ravel()) - {-1}:
      where = np.argwhere(fork_ids[p] == f)
      value = {}
      for g, t in where:
        value.setdefault(node_ids[p, g, t], []).append(steps[p, g, t])
      mean = {k: np.mean(v) for k, v in value.items()}
      if len(mean) < 2:
        continue
      centre = np.mean(list(mean.values()))
      for g, t in where:
        out[p, g, t] = mean[node_ids[p, g, t]] - centre
  return out


def test_portool_advantages_read_the_forks_of_the_runners_tree():
  # The transform finds siblings from node ids itself (parents at t - 1);
  # they are exactly the forks `sibling_groups` names.
  rng = np.random.default_rng(4)
  ids = random_trees(rng, 3, 8, 3)
  on = ids >= 0
  steps = np.where(on, rng.normal(size=ids.shape), 0.0).astype(np.float32)
  # A node's samples share its step reward (as portool_step_rewards_of).
  for p in range(3):
    for node in set(ids[p][on[p]]):
      steps[p][ids[p] == node] = steps[p][ids[p] == node][0]
  rewards = rng.normal(size=(3, 8)).astype(np.float32)
  _, fork = jax.jit(
    lambda r, s, i: transforms.portool_advantages_of(r, s, i, normalize="mean")
  )(rewards, steps, ids)
  want = np_fork_advantages(steps, envs.sibling_groups(ids), ids)
  np.testing.assert_allclose(fork, want, atol=1e-5)
  assert np.abs(want).sum() > 0


# --- trees of episodes on the engine ------------------------------------------


class Toy(envs.Environment):
  """Three turns: actions 0 and 1 call a tool (observation "b=", the call
  failing when the action has a "0"); action 2 answers, reward 1 when it
  has a "1"."""

  max_turns = 3
  first_call = 1  # tool calls of action 0

  def reset(self, example):
    return envs.Start(example["question"])

  def step(self, action):
    if action.turn < 2:
      calls = self.first_call if action.turn == 0 else 1
      errors = int("0" in action.text) if calls else 0
      return envs.Step("b=", tool_calls=calls, tool_errors=errors)
    return envs.Step(reward=float("1" in action.text), done=True)


class ThinksFirst(Toy):
  """Action 0 gets an observation without calling a tool."""

  first_call = 0


QUESTIONS = [{"question": "a1="}, {"question": "a23="}]


@pytest.fixture(scope="module")
def engine(model):
  """One engine for the module's runs (a new one compiles for seconds)."""
  return sampling.Engine(
    model.config,
    slots=4,
    page_size=4,
    segment=4,
    max_length=48,
    stop_ids=(1,),
  )


def grow(
  model,
  tokenizer,
  engine,
  rule,
  *,
  env=Toy,
  counts=(2, 2),
  size=4,
  **kw,
):
  kw = {"key": jax.random.key(3), "overlap": False} | kw
  return envs.run_episodes(
    engine,
    model,
    envs.Renderer(tokenizer, chat=False),
    env,
    QUESTIONS,
    list(counts),
    width=24,
    turn_tokens=4,
    max_turns=3,
    group_size=size,
    branch=rule,
    **kw,
  )


def shared_prefix(r, x, p, a, b, turn):
  """Samples a and b of group p have equal tokens through `turn`'s
  observation."""
  ids = x["turn_ids_PGT"][p, a]
  n = int(((ids >= 0) & (ids <= turn)).sum())
  return np.array_equal(r.tokens_PGT[p, a, :n], r.tokens_PGT[p, b, :n])


def test_portool_tree_forks_at_tool_calls_within_the_budget(
  model, tokenizer, engine
):
  out = grow(model, tokenizer, engine, envs.PORToolBranching())
  r, x = out.rollout, out.extra
  # Each group's 2 first episodes fork once after their first tool call:
  # 4 samples, and the budget stops the forks at turn 1.
  np.testing.assert_array_equal(r.sample_mask_PG, np.ones((2, 4)))
  nodes, forks = x["node_ids_PG"], envs.sibling_groups(x["node_ids_PG"])
  for p in range(2):
    first = list(nodes[p, :, 0])
    assert sorted(first.count(v) for v in set(first)) == [2, 2]
    for a in range(4):
      (b,) = [j for j in range(4) if j != a and first[j] == first[a]]
      assert shared_prefix(r, x, p, a, b, turn=0)  # action 0 and "b="
      assert nodes[p, a, 1] != nodes[p, b, 1]  # then each its own
      assert forks[p, a, 1] == forks[p, b, 1]  # siblings under one fork
    assert np.all(x["turns_PG"][p] == 3)
  # Wider forks never exceed G.
  out = grow(
    model, tokenizer, engine, envs.PORToolBranching(branching=5), size=3
  )
  assert out.rollout.sample_mask_PG.sum(-1).tolist() == [3, 3]


def test_no_fork_after_an_action_without_a_tool_call(model, tokenizer, engine):
  out = grow(
    model,
    tokenizer,
    engine,
    envs.PORToolBranching(),
    env=ThinksFirst,
    counts=(1, 1),
  )
  x = out.extra
  # Each group's episode forks after its second action only: 2 samples
  # that share actions 0 and 1.
  np.testing.assert_array_equal(out.rollout.sample_mask_PG.sum(-1), [2, 2])
  nodes = x["node_ids_PG"]
  assert np.all(nodes[:, 0, :2] == nodes[:, 1, :2])
  assert np.all(nodes[:, 0, 2] != nodes[:, 1, 2])


def test_arpo_probe_tree_shares_the_probed_tokens(model, tokenizer, engine):
  # alpha 1: every probe point k = 2 tokens after a tool result forks,
  # until the group has 3 samples.
  rule = envs.ARPOBranching(alpha=1.0, k=2, vocab_size=tokenizer.vocab_size)
  out = grow(model, tokenizer, engine, rule, counts=(1, 1), size=3)
  r, x = out.rollout, out.extra
  np.testing.assert_array_equal(r.sample_mask_PG.sum(-1), [3, 3])
  for p in range(2):
    nodes = x["node_ids_PG"][p]
    assert len(set(nodes[:, 0])) == 1  # one first action
    # Samples 0 and 1 forked 2 tokens into action 1: they share them but
    # action 1 is a node of each.
    ids = x["turn_ids_PGT"][p, 0]
    start = int(np.argmax(ids == 1))
    np.testing.assert_array_equal(
      r.tokens_PGT[p, 0, : start + 2], r.tokens_PGT[p, 1, : start + 2]
    )
    assert nodes[0, 1] != nodes[1, 1]


def test_trees_are_deterministic(model, tokenizer, engine):
  def run():
    rule = envs.ARPOBranching(k=2, vocab_size=tokenizer.vocab_size, seed=1)
    return grow(model, tokenizer, engine, rule)

  a, b = run(), run()
  np.testing.assert_array_equal(a.rollout.tokens_PGT, b.rollout.tokens_PGT)
  for k in a.extra:
    np.testing.assert_array_equal(a.extra[k], b.extra[k])


# --- the strategies -------------------------------------------------------------


def _draw(strategy, model, tokenizer, engine, key=3, counts=(4, 4)):
  bound = strategy.prepare(None).bind(tokenizer, chat=False)
  groups = [types.SimpleNamespace(example=q) for q in QUESTIONS]
  drawn = bound.draw(
    engine,
    model,
    [tokenizer.encode(q["question"]) for q in QUESTIONS],
    np.array(counts),
    key=jax.random.key(key),
    max_new_tokens=24,
    width=24,
    temperature=1.0,
    groups=groups,
  )
  return bound, drawn


def test_arpo_strategy_grows_trees_from_half_the_group(
  model, tokenizer, engine
):
  strategy = rollouts.get(
    "arpo", environment=Toy, k=2, turn_tokens=4, overlap=False
  )
  assert isinstance(strategy, envs.BranchingEpisodes)
  assert isinstance(strategy.branch, envs.ARPOBranching)
  bound, drawn = _draw(strategy, model, tokenizer, engine)
  assert bound.branch.vocab_size == tokenizer.vocab_size  # from bind
  assert bound.last_stats["initial"] == 4  # 2 of 4 per group
  size = np.asarray(drawn.rollout.sample_mask_PG).sum(-1)
  assert np.all(size <= 4) and np.all(size >= 2)
  assert bound.last_stats["branched"] == size.sum() - 4
  np.testing.assert_array_equal(
    drawn.extra["fork_ids_PG"], envs.sibling_groups(drawn.extra["node_ids_PG"])
  )
  # The same step (key) repeats the tree: the rule's salt is the key's.
  _, again = _draw(strategy, model, tokenizer, engine)
  np.testing.assert_array_equal(
    again.rollout.tokens_PGT, drawn.rollout.tokens_PGT
  )
  with pytest.raises(ValueError, match="use k < turn_tokens"):
    envs.arpo_episodes(Toy, k=4, turn_tokens=4)


def test_aepo_strategy_premonitors_the_initial_episodes(
  model, tokenizer, engine
):
  strategy = envs.aepo_episodes(
    Toy, k=2, turn_tokens=4, overlap=False, beta=0.5
  )
  bound, drawn = _draw(strategy, model, tokenizer, engine)
  # The monitor: one episode per group on its own key, H over 2 tokens.
  probe = envs.run_episodes(
    engine,
    model,
    bound.renderer,
    Toy,
    QUESTIONS,
    [1, 1],
    key=jax.random.fold_in(jax.random.key(3), 1 << 30),
    width=24,
    turn_tokens=4,
    max_turns=3,
    overlap=False,
  )
  root, tool = envs.aepo_window_entropies(
    probe.rollout.full_logp_PGT,
    probe.extra["loss_mask_PGT"],
    probe.extra["turn_ids_PGT"],
    k=2,
    vocab_size=tokenizer.vocab_size,
  )
  want = envs.aepo_initial_rollouts(root[:, 0], tool[:, 0], 4)
  assert bound.last_stats["initial"] == want.sum()
  size = np.asarray(drawn.rollout.sample_mask_PG).sum(-1)
  assert np.all(size >= want) and np.all(size <= 4)
  off = envs.aepo_episodes(Toy, k=2, turn_tokens=4, monitor=False, initial=1)
  bound, _ = _draw(off, model, tokenizer, engine)
  assert bound.last_stats["initial"] == 2


def test_portool_strategy_reaches_the_advantage(model, tokenizer, engine):
  # The whole chain on a drawn tree: portool_advantages reading the
  # runner's node_ids_PG equals A_traj + A_fork built from fork_ids_PG.
  strategy = rollouts.get("portool", environment=Toy, turn_tokens=4)
  _, drawn = _draw(strategy, model, tokenizer, engine)
  r, x = drawn.rollout, drawn.extra
  mask = np.asarray(r.mask_PGT) * x["loss_mask_PGT"]
  valid = np.asarray(r.sample_mask_PG)
  returns = x["episode_return_PG"]
  batch = rljax.Batch(
    mask_PGT=mask, sample_mask_PG=valid, rewards_PG=returns
  ).with_extra(**x)
  stage = transforms.portool_advantages(tree="node_ids_PG", normalize="mean")
  out, _ = stage.prepare(batch, ())
  ok = ((x["tool_calls_PG"] > 0) & (x["tool_errors_PG"] == 0)).astype(float)
  steps = np.asarray(
    transforms.portool_step_rewards_of(
      (returns > 0).astype(np.float32), x["node_ids_PG"], ok, valid
    )
  )
  fork = np_fork_advantages(steps, x["fork_ids_PG"], x["node_ids_PG"])
  traj = np.asarray(rljax.advantages.grpo(returns, valid))
  turns = x["turn_ids_PGT"]
  want = traj[..., None] * mask
  for p, g, t in zip(*np.nonzero((turns >= 0) & (mask > 0))):
    want[p, g, t] += fork[p, g, turns[p, g, t]]
  np.testing.assert_allclose(out.advantages_PGT, want, atol=1e-5)
  assert valid.sum() > valid.shape[0] * 2  # the groups branched


# --- configs ------------------------------------------------------------------


@pytest.mark.parametrize(
  "name,groups,rule,preset",
  [
    ("arpo", "arpo", envs.ARPOBranching, "episode_grpo"),
    ("aepo_agentic", "aepo", envs.AEPOBranching, "aepo_agentic"),
    ("portool", "portool", envs.PORToolBranching, "portool"),
  ],
)
def test_configs_load(name, groups, rule, preset):
  config = validate(load_config(str(CONFIGS / f"{name}.py")))
  assert config.task.name == "calculator"
  assert config.sampler.groups == groups
  assert config.algorithm.name == preset
  strategy = rollouts.get(groups, **config.sampler.groups_kwargs)
  assert isinstance(strategy.branch, rule)


@pytest.mark.slow
def test_arpo_config_trains_one_step(tmp_path):
  config = testing.tiny_run_config(
    CONFIGS / "arpo.py", tmp_path, "train.steps=1"
  )
  assert "episode_grpo" in algorithms.PRESETS
  trainer = Trainer(config, task=None)
  trainer.step(0)
  extra = trainer._last.extra
  size = np.asarray(trainer._last.rollout.sample_mask_PG).sum(-1)
  assert np.all(size <= config.sampler.num_samples)
  assert extra["fork_ids_PG"].shape == extra["node_ids_PG"].shape
  # 8 prompts x 4 samples: 2 episodes per group start from the question.
  assert isinstance(trainer.groups, envs.BranchingEpisodes)
  assert trainer.groups.last_stats["initial"] == 8 * 2
  assert trainer.groups.branch.vocab_size == trainer.tokenizer.vocab_size
