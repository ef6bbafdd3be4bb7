"""The text games: GridWorld and Sokoban rules by hand, shortest solutions
against an independent search over the environments' own steps, the
generators (determinism, disjoint splits), episodes on the engine with a
tiny random model, the task's rewards, and configs/gigpo_grid.py."""

import pathlib

import jax
import numpy as np
import pytest

from rljax import envs
from rljax import rewards
from rljax import sampling
from rljax import tasks
from rljax import testing
from rljax.tokenizers import Tokenizer
from rljax.training import Trainer
from rljax.training import load_config
from rljax.training import validate

CONFIG = (
  pathlib.Path(__file__).resolve().parents[2] / "configs" / "gigpo_grid.py"
)


def _act(text, turn=0):
  return envs.Action(text=text, tokens=(), turn=turn)


def _play(env, moves):
  return [env.step(_act(m, t)) for t, m in enumerate(moves)]


# --- the rules, by hand -------------------------------------------------------


@pytest.mark.parametrize(
  "text,move",
  [
    ("U", "U"),
    (" r\n", "R"),
    ("down", "D"),
    ("Left.", "L"),
    ("I go left, then left", "L"),
    ("UR", None),  # two moves in one turn
    ("up or down", None),
    ("", None),
    ("<pad>", None),
    ("upward", None),  # words, not substrings
  ],
)
def test_parse_move(text, move):
  assert envs.parse_move(text) == move


def test_grid_world_rules_by_hand():
  # A . #      row 0: the agent, floor, a wall
  # . # .      row 1: a wall in the middle
  # . . G      row 2: the goal bottom right
  env = envs.GridWorld(max_turns=10, invalid_penalty=0.25)
  start = env.reset({"layout": "A.#/.#./..G"})
  assert start == envs.Start("A.#/.#./..G:", state="A.#/.#./..G")
  steps = _play(env, ["U", "R", "R", "D", "no idea", "L", "D", "D"])
  # U: off the board, R: a step, R: the wall, D: the middle wall, an invalid
  # turn (-0.25), L: back, D, D: down the left column.
  states = [s.state for s in steps]
  assert states == [
    "A.#/.#./..G",
    ".A#/.#./..G",
    ".A#/.#./..G",
    ".A#/.#./..G",
    ".A#/.#./..G",
    "A.#/.#./..G",
    "..#/A#./..G",
    "..#/.#./A.G",
  ]
  assert [s.reward for s in steps] == [0, 0, 0, 0, -0.25, 0, 0, 0]
  assert not any(s.done for s in steps)
  assert all(s.observation == s.state + ":" for s in steps)
  last = _play(env, ["R", "right"])
  assert [s.state for s in last] == ["..#/.#./.AG", "..#/.#./..A"]
  assert [(s.reward, s.done) for s in last] == [(0.0, False), (1.0, True)]


def test_step_penalty_keeps_the_solving_turn_positive():
  env = envs.GridWorld(step_penalty=0.05)
  env.reset({"layout": "AG"})
  assert _play(env, ["L", "x", "R"]) == [
    envs.Step("AG:", -0.05, False, "AG"),
    envs.Step("AG:", -0.1, False, "AG"),
    envs.Step(".A:", 0.95, True, ".A"),
  ]


def test_sokoban_pushes_the_box_onto_the_target():
  env = envs.Sokoban()
  assert env.reset({"layout": "AB.T/...."}).state == "AB.T/...."
  steps = _play(env, ["R", "R"])
  # The agent walks into the box, the box moves one cell, then onto T.
  assert [s.state for s in steps] == [".ABT/....", "..A*/...."]
  assert [(s.reward, s.done) for s in steps] == [(0.0, False), (1.0, True)]


def test_sokoban_blocked_pushes_and_the_agent_on_the_target():
  # ....   R: the box is against a wall (no move); D: onto the target
  # AB#.   ("+"); R; U: pushes the box up; U: would push it off the board
  # T...   (no move); L; D: onto "+" again.
  env = envs.Sokoban()
  env.reset({"layout": "..../AB#./T..."})
  steps = _play(env, ["R", "D", "R", "U", "U", "L", "D"])
  assert [s.state for s in steps] == [
    "..../AB#./T...",
    "..../.B#./+...",
    "..../.B#./TA..",
    ".B../.A#./T...",
    ".B../.A#./T...",
    ".B../A.#./T...",
    ".B../..#./+...",
  ]
  assert not any(s.done or s.reward for s in steps)


def test_sokoban_deadlock_ends_the_episode():
  # ..T    the agent pushes the box up into the top-left corner, which is
  # B..    not the target: it can never move again.
  # A..
  layout = {"layout": "..T/B../A.."}
  env = envs.Sokoban(deadlock_penalty=0.5)
  env.reset(layout)
  (step,) = _play(env, ["U"])
  assert (step.state, step.reward, step.done) == ("B.T/A../...", -0.5, True)
  env = envs.Sokoban(end_on_deadlock=False, deadlock_penalty=0.5)
  env.reset(layout)
  assert _play(env, ["U"])[0][1:3] == (0.0, False)
  # A corner that is the target is solved, not dead.
  env = envs.Sokoban()
  env.reset({"layout": "T../B../A.."})
  assert _play(env, ["U"])[0][1:3] == (1.0, True)


def test_bad_layouts_and_settings_get_clear_errors():
  for layout, match in [
    ("A./.G.", "equal, non-zero length"),
    ("", "equal, non-zero length"),
    ("A.x/..G", r"symbols '#\.AG' only"),
    ("AA/.G", "exactly one each of an agent and a goal"),
    ("A./..", "exactly one each"),
  ]:
    with pytest.raises(ValueError, match=match):
      envs.GridWorld().reset({"layout": layout})
  with pytest.raises(ValueError, match="an agent, a target and a box"):
    envs.Sokoban().reset({"layout": "A.T/..."})
  with pytest.raises(ValueError, match="is solved"):
    envs.Sokoban().reset({"layout": "A*/.."})
  with pytest.raises(ValueError, match=r"needs example\['layout'\]"):
    envs.GridWorld().reset({"question": "A.G"})
  with pytest.raises(ValueError, match="step before reset"):
    envs.GridWorld().step(_act("U"))
  with pytest.raises(ValueError, match="step_penalty must be in"):
    envs.GridWorld(step_penalty=1.0)
  with pytest.raises(ValueError, match="invalid_penalty must be >= 0"):
    envs.Sokoban(invalid_penalty=-0.1)
  with pytest.raises(ValueError, match="max_turns must be"):
    envs.GridWorld(max_turns=0)
  for kwargs, match in [
    ({"size": 2}, "size must be an int in"),
    ({"wall_fraction": 0.9}, "wall_fraction must be in"),
    ({"min_moves": 0}, "min_moves must be"),
    ({"max_moves": 9, "max_turns": 8}, r"max_moves must be in .* = \[2, 8\]"),
    ({"test_size": 0}, "test_size must be"),
    ({"step_penalty": -1}, "step_penalty must be in"),
  ]:
    with pytest.raises(ValueError, match=match):
      tasks.grid_world(**kwargs)
  # No 3x3 grid has a shortest path of 8 moves.
  with pytest.raises(ValueError, match="no layout of size 3"):
    tasks.grid_world(size=3, min_moves=8, max_moves=8, max_turns=8)


# --- shortest solutions -------------------------------------------------------


def _shortest(make_env, layout):
  """Breadth-first search over the environment's own steps (states are the
  drawings): the fewest turns that earn a positive reward, None if none."""
  frontier, seen = [layout], {layout}
  depth = 0
  while frontier:
    depth += 1
    following = []
    for drawing in frontier:
      for move in "UDLR":
        env = make_env()
        env.reset({"layout": drawing})
        step = env.step(_act(move))
        if step.reward > 0:
          return depth
        if not step.done and step.state not in seen:
          seen.add(step.state)
          following.append(step.state)
    frontier = following
  return None


def test_solvers_by_hand():
  # The wall column in the middle forces the way round the left side:
  # A..#
  # .#..     DDDRRR (6 moves); nothing shorter passes the walls.
  # ..#.
  # ...G
  assert envs.solve_grid_world("A..#/.#../..#./...G") == "DDDRRR"
  assert envs.solve_grid_world("A#G") is None
  # Push right twice: "RR". The box cannot be pushed past the wall: None.
  assert envs.solve_sokoban("AB.T/....") == "RR"
  assert envs.solve_sokoban("A.B#/...T") is None
  assert _shortest(envs.Sokoban, "A.B#/...T") is None


@pytest.mark.parametrize(
  "make_task,make_env",
  [
    (lambda: tasks.grid_world(test_size=10), envs.GridWorld),
    (lambda: tasks.sokoban(test_size=10), envs.Sokoban),
  ],
  ids=["grid_world", "sokoban"],
)
def test_generated_layouts_are_solved_in_their_fewest_moves(
  make_task, make_env
):
  task = make_task()
  examples = [task.train[i] for i in range(12)] + list(task.test)
  for e in examples:
    assert e["question"] == e["layout"] and e["answer"] == e["solution"][0]
    assert e["moves"] == len(e["solution"]) == _shortest(make_env, e["layout"])
    env = make_env()
    env.reset(e)
    steps = _play(env, e["solution"])
    assert [s.done for s in steps] == [False] * (e["moves"] - 1) + [True]
    assert steps[-1].reward == 1.0
    # The demonstration is the episode's text: moves and observations.
    text = "".join(
      m + ("" if s.done else s.observation)
      for m, s in zip(e["solution"], steps)
    )
    assert e["demonstration"] == text
  moves = [e["moves"] for e in examples]
  low, high = (2, 6) if make_env is envs.GridWorld else (3, 8)
  assert low <= min(moves) and max(moves) <= high


def test_generators_are_deterministic_and_the_splits_disjoint():
  a = tasks.grid_world(size=3, test_size=30, max_moves=4)
  b = tasks.get("grid_world", size=3, test_size=30, max_moves=4)
  train = [a.train[i]["layout"] for i in range(400)]
  assert train == [b.train[i]["layout"] for i in range(400)]
  test = [e["layout"] for e in a.test]
  assert test == [e["layout"] for e in b.test]
  assert len(set(test)) == 30  # distinct
  assert "demonstration" not in tasks.grid_world(stop_at_move=False).train[0]
  assert not set(test) & set(train)
  # The test split is a prefix of a longer one; another seed, other layouts.
  longer = tasks.grid_world(size=3, test_size=60, max_moves=4).test
  assert [longer[i]["layout"] for i in range(30)] == test
  other = tasks.grid_world(size=3, test_size=30, max_moves=4, seed=1)
  assert [e["layout"] for e in other.test] != test
  assert [a.test[i]["index"] for i in range(3)] == [0, 1, 2]
  assert {a.train[i]["split"] for i in range(3)} == {"train"}
  # Sokoban's too.
  s = tasks.sokoban(test_size=5)
  assert [e["layout"] for e in s.test] == [
    e["layout"] for e in tasks.sokoban(test_size=5).test
  ]
  assert not {e["layout"] for e in s.test} & {
    s.train[i]["layout"] for i in range(100)
  }


def test_alphabets_cover_prompts_and_moves():
  for task in (tasks.grid_world(test_size=5), tasks.sokoban(test_size=5)):
    examples = [task.train[i] for i in range(50)]
    texts = [task.format_prompt(e) + e["demonstration"] for e in examples]
    assert set("".join(texts)) | set("UDLR") <= set(task.alphabet)
    assert task.format_prompt(task.test[0]) == task.test[0]["layout"] + ":"
    assert task.environment().reset(task.test[0]).prompt == (
      task.format_prompt(task.test[0])
    )


# --- rewards ------------------------------------------------------------------


def test_solved_and_optimal_rewards():
  task = tasks.grid_world(test_size=5)
  spec = {name: fn for name, fn, _ in task.rewards}
  assert [w for *_, w in task.rewards] == [1.0, 0.0, 0.0]
  # Episode 0 solved in 3 turns (its shortest), episode 1 in 4 (one wasted
  # turn), episode 2 never (invalid turns only).
  turn_rewards = np.array(
    [[0, 0, 1, 0], [0, -0.1, 0, 1], [-0.1, -0.1, -0.1, -0.1]], np.float32
  )
  samples = rewards.Samples(
    texts=["", "", ""],
    num_tokens=np.zeros(3),
    truncated=np.zeros(3, bool),
    metadata=[{"moves": 3}] * 3,
    extra={
      "turn_rewards_PG": turn_rewards,
      "turns_PG": np.array([3, 4, 4]),
      "episode_return_PG": turn_rewards.sum(-1),
    },
  )
  np.testing.assert_array_equal(spec["solved"](samples), [1, 1, 0])
  np.testing.assert_array_equal(spec["optimal"](samples), [1, 0, 0])
  np.testing.assert_allclose(spec["return"](samples), [1, 0.9, -0.4])
  with pytest.raises(ValueError, match="turn_rewards_PG"):
    spec["solved"](samples._replace(extra=None))


# --- episodes on the engine ---------------------------------------------------


def test_episodes_carry_the_agent_data_layout(tiny_model):
  task = tasks.grid_world(size=3, max_turns=3, max_moves=3, test_size=4)
  tokenizer = Tokenizer.from_characters(task.alphabet)
  model = tiny_model(tokenizer.vocab_size)
  engine = sampling.Engine(
    model.config,
    slots=8,
    page_size=4,
    segment=4,
    max_length=48,
    stop_ids=tokenizer.stop_ids,
  )
  examples = [task.train[0], task.train[1], task.train[0]]
  assert examples[0]["layout"] != examples[1]["layout"]
  out = envs.run_episodes(
    engine,
    model,
    envs.Renderer(tokenizer, chat=False),
    task.environment,
    examples,
    [4, 4, 4],
    key=jax.random.key(0),
    width=32,
    turn_tokens=2,
    max_turns=3,
  )
  r, x = out.rollout, out.extra
  ids_of: dict = {}
  moves = 0
  for p, example in enumerate(examples):
    for g in range(4):
      env = task.environment()
      state = env.reset(example).state
      turn_ids = x["turn_ids_PGT"][p, g]
      k = int(x["turns_PG"][p, g])
      for t in range(k):
        tokens = r.tokens_PGT[p, g][turn_ids == t]
        sampled = x["loss_mask_PGT"][p, g][turn_ids == t] > 0
        action = [int(i) for i in tokens[sampled] if i not in (1,)]
        text = tokenizer.decode(action, skip_special=False)
        # stop_at_move: a turn ends at its first move letter.
        letters = [i for i, c in enumerate(text) if c in "UDLR"]
        assert letters in ([], [len(text) - 1])
        ids_of.setdefault(state, set()).add(int(x["state_ids_PG"][p, g, t]))
        step = env.step(_act(text, t))
        assert step.done <= (t == k - 1)  # done ends the episode
        moves += envs.parse_move(text) is not None
        assert x["turn_rewards_PG"][p, g, t] == np.float32(step.reward)
        observation = tokenizer.decode([int(i) for i in tokens[~sampled]])
        assert observation == ("" if t == k - 1 else step.state + ":")
        state = step.state
      assert (k == 3) or step.done  # an episode ends by its turns or done
      assert np.all(x["state_ids_PG"][p, g, k:] == -1)
      assert x["episode_return_PG"][p, g] == x["turn_rewards_PG"][p, g].sum()
  # Equal boards, equal ids (across prompts too); different boards differ.
  assert all(len(ids) == 1 for ids in ids_of.values())
  assert len({i for ids in ids_of.values() for i in ids}) == len(ids_of)
  assert x["state_ids_PG"][0, 0, 0] == x["state_ids_PG"][2, 3, 0]
  assert x["state_ids_PG"][0, 0, 0] != x["state_ids_PG"][1, 0, 0]
  assert moves > 0  # the random model made some valid moves
  assert np.all(x["tool_calls_PG"] == 0)


# --- the config ---------------------------------------------------------------


def test_the_config_loads_and_its_budget_holds_every_turn():
  config = validate(load_config(CONFIG))
  assert config.algorithm.name == "gigpo"
  assert config.task.name == "grid_world"
  assert config.sampler.engine == "continuous"
  assert config.sampler.groups == "episodes"
  turn = config.sampler.groups_kwargs["turn_tokens"]
  task = tasks.get(config.task.name, **config.task.kwargs)
  prompt = len(task.format_prompt(task.train[0]))
  turns = task.environment().max_turns
  assert prompt <= config.task.max_prompt_tokens
  # Every turn's action and every observation (as long as the prompt) fit
  # the episode's budget; prompt and budget fit the model.
  assert turns * turn + (turns - 1) * prompt <= config.sampler.max_new_tokens
  budget = config.task.max_prompt_tokens + config.sampler.max_new_tokens
  assert budget <= config.model.max_position_embeddings
  assert task.train[0]["answer"] in "UDLR"  # the warm start's target


@pytest.mark.slow  # about a minute of CPU, mostly compilation
def test_the_config_trains_one_step(tmp_path):
  config = testing.tiny_run_config(CONFIG, tmp_path, "train.steps=1")
  trainer = Trainer(config)
  metrics = trainer.step(0)
  last = trainer._last
  assert np.isfinite(metrics["loss"])
  assert {"reward/solved", "reward/optimal"} <= set(metrics)
  assert last.extra["turn_rewards_PG"].shape[-1] == 8
  np.testing.assert_allclose(
    last.rewards_PG, last.extra["episode_return_PG"], atol=1e-6
  )
  # Each group's episodes start on one board: one anchor state.
  first = last.extra["state_ids_PG"][..., 0]
  assert np.all(first >= 0) and np.all(first == first[:, :1])
